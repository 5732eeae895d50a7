#!/bin/sh
# Kubernetes cordon -> Slurm drain, and back (docs/health.md). Run by slurmctld's reconfigure sidecar
# every round, as SlurmUser, with the list cordon_watch.py keeps: the Slurm nodes whose Kubernetes
# node is cordoned, one a line.
#
#   listed and not drained          -> drain, reason "dualsched:cordon": running jobs finish, none start
#   drained "dualsched:cordon", not listed -> resume
#
# A node drained for any other reason (an admin's, the health check's, an upgrade's) is left as it is.
# No list yet (the watcher has not finished a round): nothing is done.
REASON="dualsched:cordon"
list=${1:?usage: cordon_drain.sh <cordoned-nodes-file>}

[ -r "$list" ] || exit 0
cordoned=" $(tr '\n' ' ' <"$list") "
records=$(scontrol show node --oneliner) || exit 1

printf '%s\n' "$records" | while read -r record; do
    case "$record" in NodeName=*) ;; *) continue ;; esac
    node=${record#NodeName=}
    node=${node%% *}
    state=$(printf '%s\n' "$record" | sed -n 's/.* State=\([^ ]*\).*/\1/p')
    case "+$state+" in *+DRAIN+*) drained=1 ;; *) drained=0 ;; esac
    case "$cordoned" in *" $node "*) listed=1 ;; *) listed=0 ;; esac
    if [ "$listed" = 1 ] && [ "$drained" = 0 ]; then
        scontrol update NodeName="$node" State=DRAIN Reason="$REASON" && echo "$node: cordoned in Kubernetes, drained"
    elif [ "$listed" = 0 ] && [ "$drained" = 1 ]; then
        case "$record" in
            *" Reason=$REASON "* | *" Reason=$REASON") ;;
            *) continue ;;
        esac
        scontrol update NodeName="$node" State=RESUME && echo "$node: uncordoned in Kubernetes, resumed"
    fi
done
