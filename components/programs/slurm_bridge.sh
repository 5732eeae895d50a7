#!/bin/bash
# Runs the Slurm commands the rollout program (slurmd_rollout.py, in the sibling container that holds the
# Kubernetes token and no munge key) asks for, with this container's munge socket. A request is a file
# request-<n> of NUL-separated arguments; the answer, reply-<n>, holds the exit status on its first line,
# then the command's output. Only what the rollout needs runs: sinfo, and `scontrol update nodename=N`
# with a drain (and its reason) or a resume. Anything else, another scontrol subcommand (shutdown,
# job or partition updates: this container is SlurmUser's) included, is refused.
# Usage: slurm_bridge.sh DIR
cd "$1" || exit 1

# allowed COMMAND...: sinfo with any arguments, or exactly a node drain or resume
allowed() {
  case "$1" in
    sinfo) return 0 ;;
    scontrol)
      [ "$2" = update ] && [[ "$3" == nodename=* ]] || return 1
      case "$#:$4" in
        4:state=resume) return 0 ;;
        5:state=drain) [[ "$5" == reason=* ]] ;;
        *) return 1 ;;
      esac ;;
    *) return 1 ;;
  esac
}
trap 'exit 0' TERM  # as PID 1, bash would ignore the kubelet's SIGTERM and wait for the SIGKILL
while :; do
  for request in request-*; do
    [ -e "$request" ] || continue
    mapfile -d '' -t args < "$request"
    rm -f "$request"
    if allowed "${args[@]}"; then
      output=$("${args[@]}" 2>&1); status=$?
    else
      output="refused: ${args[*]:0:3} (only sinfo, and scontrol update nodename=... state=drain|resume)"; status=126
    fi
    printf '%s\n%s\n' "$status" "$output" > ".${request/request/reply}"
    mv ".${request/request/reply}" "${request/request/reply}"
  done
  sleep 0.2
done
