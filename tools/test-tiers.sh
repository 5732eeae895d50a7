#!/usr/bin/env bash
# make test: what every tier needs installed and built, and every tier, in two lanes at once, so that the
# tiers' waits (Slurm jobs, rollouts, a failover, an inference window) and the builds overlap instead of
# adding up.
#   lane 1, in this terminal: the toolchain (make tools: Go builds, about 20 min cold), then the one-node
#     real tier (a control plane and this machine as its node, about 27 min), then the e2e tier (5 min), then
#     half the unit tier (every second test: UNIT_SHARD, tests/conftest.py; 3 min).
#   lane 2, beside it: the venv, Debian's Slurm, checkov and the images (about 15 min cold), the unit tier's
#     other half and the real-Slurm tier (neither needs the toolchain, so on a fresh machine they run while it builds), then
#     the real multi-node tier (about 21 min) once the toolchain is there. Nothing of lane 1 is theirs: the
#     multi-node tier's nodes are namespaced ones with a link bridge, addresses, pod ranges, mounts and
#     cgroups of their own (tools/node.sh: one host node and one set of namespaced nodes per machine, side
#     by side); the Slurm tier's daemons listen on 127.0.0.1 ports of their own under a temporary
#     directory; each tier's control plane has free ports and its own directory (the e2e tier's KWOK nodes
#     too). Logged to build/test-beside.log, shown whole when both lanes have ended (two outputs
#     interleaved would be unreadable).
# The venv, the toolchain and the images lock what they build (flock): a lane that needs what the other is
# building waits for it, and nothing is built twice. Lane 1 leaves Debian's Slurm and checkov to lane 2
# (install-slurm.sh stops Debian's own daemons, which must not happen under the Slurm tier). Every tier runs
# even when another fails; the exit status is non-zero when any build or tier failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MAKE=${MAKE:-make}
LANE=("$MAKE" --no-print-directory -k)
LOG=build/test-beside.log
DIAGNOSTICS=build/diagnostics  # written by a test world whose API server did not answer, whose stack did not come up, or whose Slurm did not answer (tests/e2e/e2e_support.py, tests/node/node_support.py)
mkdir -p build
rm -rf "$DIAGNOSTICS"
started=$(date +%s)

"${LANE[@]}" UNIT_SHARD=1/2 venv slurm-deps checkov images test-unit test-slurm tools test-multinode >"$LOG" 2>&1 &
beside=$!
trap 'kill "$beside" 2>/dev/null' INT TERM
echo "[test] the venv, Debian's Slurm, checkov and the images, then the unit, real-Slurm and multi-node tiers" \
     "run beside the toolchain, the one-node real tier and the e2e tier (log: $LOG)"

"${LANE[@]}" -o slurm-deps -o checkov UNIT_SHARD=2/2 tools venv images test-node test-e2e test-unit
node=$?
if kill -0 "$beside" 2>/dev/null; then echo "[test] one-node real, e2e and half the unit tier done; waiting for the tiers beside them"; fi
wait "$beside"
others=$?

echo "=============================== installs, images, half the unit tier, real-Slurm and multi-node tiers (ran beside; $LOG)"
cat "$LOG"
echo "[test] every build and tier ran in $(( ($(date +%s) - started) / 60 )) min:" \
     "toolchain, one-node real, e2e and half the unit tier $([ $node -eq 0 ] && echo passed || echo FAILED)," \
     "installs, images, the other half of the unit tier, real-Slurm and multi-node tiers $([ $others -eq 0 ] && echo passed || echo FAILED)"
if { [ "$node" -ne 0 ] || [ "$others" -ne 0 ]; } && [ -d "$DIAGNOSTICS" ]; then
  # last, so that the tail of a CI log shows them: the machine and the control plane when an API server stalled, the pods when a stack did not come up, Slurm's daemons when Slurm did not answer
  for file in $(ls -tr "$DIAGNOSTICS"/*.log | head -3); do  # the first ones: the onset
    echo "=============================== $file"
    head -c 20000 "$file"
  done
fi
[ "$node" -eq 0 ] && [ "$others" -eq 0 ]
