#!/bin/bash
# Runs the Slurm commands the rollout program (slurmd_rollout.py, in the sibling container that holds the
# Kubernetes token and no munge key) asks for, with this container's munge socket. A request is a file
# request-<n> of NUL-separated arguments; the answer, reply-<n>, holds the exit status on its first line,
# then the command's output. Only sinfo and scontrol run: a request to run anything else is refused.
# Usage: slurm_bridge.sh DIR
cd "$1" || exit 1
trap 'exit 0' TERM  # as PID 1, bash would ignore the kubelet's SIGTERM and wait for the SIGKILL
while :; do
  for request in request-*; do
    [ -e "$request" ] || continue
    mapfile -d '' -t args < "$request"
    rm -f "$request"
    case "${args[0]}" in
      sinfo|scontrol) output=$("${args[@]}" 2>&1); status=$? ;;
      *) output="refused: ${args[0]} (only sinfo and scontrol)"; status=126 ;;
    esac
    printf '%s\n%s\n' "$status" "$output" > ".${request/request/reply}"
    mv ".${request/request/reply}" "${request/request/reply}"
  done
  sleep 0.2
done
