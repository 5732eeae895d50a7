#!/usr/bin/env bash
# make test: every tier, in two lanes at once, so that the tiers' waits (Slurm jobs, rollouts, a failover)
# overlap instead of adding up.
#   lane 1, in this terminal: the real multi-node tier, then the one-node real tier. Real nodes are one set
#     per machine (tools/node.sh), so these two run one after the other.
#   lane 2, beside it: the unit, real-Slurm and e2e tiers. Nothing of lane 1 is theirs: the Slurm tier's
#     daemons listen on 127.0.0.1 ports of their own under a temporary directory, the e2e tier's control
#     plane has free ports, its own directory and KWOK nodes. Logged to build/test-beside.log, shown whole
#     when both lanes have ended (two pytest outputs interleaved would be unreadable).
# Every tier runs even when another fails; the exit status is non-zero when any tier failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MAKE=${MAKE:-make}
# `make test` has installed and built what the tiers need; neither lane repeats it (install-slurm.sh would
# stop Debian's daemons again while the other lane runs)
TIER=("$MAKE" --no-print-directory -k -o venv -o slurm-deps -o checkov -o tools -o images)
LOG=build/test-beside.log
mkdir -p build
started=$(date +%s)

"${TIER[@]}" test-unit test-slurm test-e2e >"$LOG" 2>&1 &
beside=$!
trap 'kill "$beside" 2>/dev/null' INT TERM
echo "[test] the unit, real-Slurm and e2e tiers run beside the real-node tiers (log: $LOG)"

"${TIER[@]}" test-multinode test-node
nodes=$?
if kill -0 "$beside" 2>/dev/null; then echo "[test] real-node tiers done; waiting for the tiers beside them"; fi
wait "$beside"
others=$?

echo "=============================== the unit, real-Slurm and e2e tiers (ran beside; $LOG)"
cat "$LOG"
echo "[test] every tier ran in $(( ($(date +%s) - started) / 60 )) min:" \
     "real-node tiers $([ $nodes -eq 0 ] && echo passed || echo FAILED)," \
     "unit, real-Slurm and e2e tiers $([ $others -eq 0 ] && echo passed || echo FAILED)"
[ "$nodes" -eq 0 ] && [ "$others" -eq 0 ]
