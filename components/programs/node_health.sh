#!/bin/sh
# Slurm's HealthCheckProgram on every slurmd node (docs/health.md). slurmd runs it as root, with no
# arguments and only SLURMD_NODENAME in its environment, when it starts and whenever slurmctld asks
# (HealthCheckInterval); it kills it after 60 s and only logs its exit status
# (src/slurmd/slurmd/slurmd.c run_script_health_check). So the program acts itself:
#
#   a check fails  -> drain the node, reason "dualsched:health: <what failed>": running jobs finish,
#                     no new job starts. A node already drained for another reason (an admin's, an
#                     upgrade's, a cordon's) is left as it is.
#   all checks pass -> resume the node if, and only if, its drain reason is this program's.
#
# Its settings (node-health.env, next to it) say which checks run and what they expect.
PATH=${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin}
REASON_PREFIX="dualsched:health"

. "${0%/*}/node-health.env" || exit 1
export SLURM_CONF
node=${SLURMD_NODENAME:?slurmd sets SLURMD_NODENAME}
failed=""

fail() {
    failed="${failed:+$failed; }$1"
}

# Device plugins and NVML name GPUs /dev/nvidia<N>, not always 0..N-1: count, do not name them.
check_gpu_devices() {
    present=0
    for device in "$GPU_DEVICE_PREFIX"[0-9]*; do
        [ -c "$device" ] && present=$((present + 1))
    done
    [ "$present" -ge "$GPUS" ] || fail "gpu devices: $present of $GPUS ${GPU_DEVICE_PREFIX}N"
}

# The last mount on the path is the one seen there; a hung file server fails the write in 10 s.
check_shared_mount() {
    options=""
    while read -r _ _ _ _ point mount_options _; do
        [ "$point" = "$SHARED_DIR" ] && options=$mount_options
    done </proc/self/mountinfo
    case ",$options," in
        ,,) fail "$SHARED_DIR not mounted"; return ;;
        *,ro,*) fail "$SHARED_DIR mounted read-only"; return ;;
    esac
    probe="$SHARED_DIR/.dualsched-health-$node"
    timeout 10 sh -c ': >"$1" && rm -f "$1"' sh "$probe" 2>/dev/null || fail "$SHARED_DIR not writable"
}

check_munge() {
    timeout 10 sh -c 'munge -n | unmunge' >/dev/null 2>&1 || fail "munge: no credential from munged"
}

check_nvidia_smi() {
    command -v nvidia-smi >/dev/null 2>&1 || return 0
    timeout 20 nvidia-smi -L >/dev/null 2>&1 || fail "nvidia-smi -L failed"
}

[ "$CHECK_GPU_DEVICES" = 1 ] && check_gpu_devices
[ "$CHECK_SHARED_MOUNT" = 1 ] && check_shared_mount
[ "$CHECK_MUNGE" = 1 ] && check_munge
[ "$CHECK_NVIDIA_SMI" = 1 ] && check_nvidia_smi

# At slurmd's first start, before it registers, scontrol may not read the node yet (seen on the real
# node tier): with every check passed there is nothing to resume then, and the next round acts.
if ! record=$(scontrol show node --oneliner "$node" 2>&1); then
    echo "scontrol show node $node failed: $record${failed:+; not drained: $failed}"
    [ -z "$failed" ]
    exit
fi
state=$(printf '%s\n' "$record" | sed -n 's/.* State=\([^ ]*\).*/\1/p')
case "+$state+" in
    *+DRAIN+*) drained=1 ;;
    *) drained=0 ;;
esac
case "$record" in
    *" Reason=$REASON_PREFIX"*) ours=1 ;;
    *) ours=0 ;;
esac

if [ -n "$failed" ]; then
    echo "$node: $failed"
    if [ "$drained" = 0 ]; then
        scontrol update NodeName="$node" State=DRAIN Reason="$REASON_PREFIX: $failed" || exit 1
        echo "$node: drained"
    fi
    exit 1
fi
if [ "$drained" = 1 ] && [ "$ours" = 1 ]; then
    scontrol update NodeName="$node" State=RESUME || exit 1
    echo "$node: healthy again, resumed"
fi
exit 0
