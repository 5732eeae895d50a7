#!/bin/sh
# Resume a node that Slurm drained because its slurmd registered with less than its slurm.conf line, once a
# registration under its current line is valid (docs/architecture.md). Run by slurmctld's reconfigure sidecar
# every round, as SlurmUser.
#
# A pool change moves a node to another pool's slurmd, or changes its GPU share, CPUs or memory. The new slurmd
# pod can register before slurmctld has read the new slurm.conf (the kubelet refreshes slurmctld's copy within
# about a minute), so against the node's old line: slurmctld marks the node INVALID_REG and drains it with a
# reason of its own (src/slurmctld/node_mgr.c, validate_node_specs; src/interfaces/gres.c), and clears
# INVALID_REG, but not the drain, at the node's first valid registration. Such a node (DRAIN without
# INVALID_REG, one of those reasons) is resumed: the mismatch is gone. A node that still registers short (a lost
# GPU) stays INVALID_REG and drained; a node drained for any other reason is left as it is.
drained=$(sinfo --noheader --Node --states=drain --format='%N|%T|%E') || exit 1

# one line per node and partition: each node once; an INVALID_REG node shows as "inval"
printf '%s\n' "$drained" | sort -u | while IFS='|' read -r node state reason; do
    [ -n "$node" ] && [ "$state" != inval ] || continue
    case "$reason" in
        "gres/"*" count reported lower than configured ("* | "Low socket*core*thread count"* | "Low CPUs"* | \
        "Low RealMemory ("* | "Low TmpDisk"*) ;;
        *) continue ;;
    esac
    scontrol update NodeName="$node" State=RESUME && echo "$node: registers as slurm.conf says now, resumed"
done
