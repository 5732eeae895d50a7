#!/bin/bash
# Submit the batch script in $BATCH_SCRIPT with sbatch and wait for the job, authenticated by the Slurm token
# in $SLURM_TOKEN_FILE (auth/jwt: no munge key in this pod). The token is read again for
# every call because the sidecar renews it; `sbatch --wait` would keep the first one.
# Exit 0 when the job COMPLETED, 1 when it ended in any other state.
# Usage: sbatch_wait.sh [sbatch options...]
set -euo pipefail

slurm() { SLURM_JWT="$(cat "$SLURM_TOKEN_FILE")" "$@"; }

# A controller starting anew (a reconfigure from Slurm 23.11, a failover) takes no connection for a few seconds:
# sbatch never reached it, so submitting again cannot make a second job. Any other refusal ends the Job.
submit() {
    local try
    for try in $(seq 1 "${SBATCH_SUBMIT_TRIES:-30}"); do
        if slurm sbatch --parsable "$@" <<<"$BATCH_SCRIPT" 2>/tmp/sbatch.err; then cat /tmp/sbatch.err >&2; return 0; fi
        cat /tmp/sbatch.err >&2
        grep -q "Unable to contact slurm controller" /tmp/sbatch.err || return 1
        echo "slurmctld took no connection (try $try): submitting again" >&2
        sleep "${SBATCH_WAIT_POLL_SECONDS:-5}"
    done
    return 1
}

job_id="$(submit "$@")"
job_id="${job_id%%;*}"
echo "Submitted batch job $job_id"
while :; do
    if record="$(slurm scontrol show --oneliner job "$job_id" 2>&1)"; then
        state="$(sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' <<<"$record")"
        case "$state" in
            COMPLETED) echo "job $job_id COMPLETED"; exit 0 ;;
            FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|PREEMPTED|BOOT_FAIL|DEADLINE)
                echo "job $job_id ended $state: $record" >&2; exit 1 ;;
        esac
    elif grep -q "Invalid job id" <<<"$record"; then
        echo "job $job_id is no longer known to slurmctld (MinJobAge passed): see sacct" >&2; exit 1
    else
        echo "scontrol: $record" >&2  # a controller restart: keep watching
    fi
    sleep "${SBATCH_WAIT_POLL_SECONDS:-5}"
done
