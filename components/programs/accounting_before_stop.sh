#!/bin/sh
# slurmctld's preStop hook: slurmctld stops once slurmdbd has a record of every job it tracks, or after $1 seconds
# (then it stops anyway, and says which jobs have no record yet). Runs in the slurmctld container, as SlurmUser.
#
# Why: slurmdbd learns of a job in steps. Before Slurm 24.11 a thread of slurmctld that runs every 5 s sends the
# records of jobs slurmdbd has no index for yet (accounting_storage_slurmdbd.c, _set_db_inx_thread; SchedMD removed
# it in 9d5ccd98 for 24.11), and a started job's record (its user, partition, nodes) follows through slurmctld's
# queue to slurmdbd a moment after it starts. A slurmctld stopped in between lost that start: no later message
# resends it, and the job ended recorded as root's with no partition (8 stops in 10 on Slurm 22.05.8 here; seen on
# the real-node tier after `kubectl delete pod slurmctld-0`). tests/slurm/test_controller_stop.py stops it so.
# So: every job slurmctld tracks has a record, and every job it has started has a record that is past PENDING.
# From 24.11 a job's records are queued as slurmctld takes the job and the queue is saved as it stops
# (dbd.messages); the hook stays on every release: it checks rather than trusts that.
limit=${1:-20}
end=$(($(date +%s) + limit))
while :; do
    # every job slurmctld tracks (each array task by its own id) as id:STATE; no job, or no answer: nothing to wait for
    active=$(timeout 5 squeue --all --noheader --format='%A:%T') || exit 0
    [ -n "$active" ] || exit 0
    recorded=$(timeout 5 sacct --allusers --allocations --noheader --parsable2 --format=JobIDRaw,State \
        --jobs="$(printf '%s\n' "$active" | cut -d: -f1 | paste -sd, -)" 2>/dev/null)
    missing=""
    for job in $active; do
        id=${job%%:*}
        record=$(printf '%s\n' "$recorded" | grep -m1 "^$id|")
        case "${job#*:}:$record" in
            *:) missing="$missing $id" ;;                 # no record
            PENDING:*) ;;                                 # pending: its pending record will do
            *:"$id|PENDING") missing="$missing $id" ;;    # started, and slurmdbd has only its pending record
        esac
    done
    [ -n "$missing" ] || exit 0
    if [ "$(date +%s)" -ge "$end" ]; then
        echo "slurmctld stops before slurmdbd has a record of job(s)$missing as slurmctld knows it" >&2
        exit 0
    fi
    sleep 1
done
