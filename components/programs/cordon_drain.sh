#!/bin/sh
# Kubernetes cordon -> Slurm drain, and back (docs/health.md); a node that left a pool it joined by label -> drained,
# then deleted from Slurm (docs/node-pools.md). Run by slurmctld's reconfigure sidecar every round, as SlurmUser, with
# the lists cordon_watch.py keeps: the Slurm nodes whose Kubernetes node is cordoned, and the nodes that left (no
# longer labelled into their pool, or gone from Kubernetes), one a line.
#
#   left, not drained                        -> drain, reason "dualsched:left": running jobs finish, none start
#   left, drained, no job                    -> scontrol delete: gone from Slurm (it joins again when labelled again)
#   cordoned and not drained                 -> drain, reason "dualsched:cordon"
#   drained "dualsched:cordon", not cordoned -> resume
#   drained "dualsched:left", not left, not cordoned -> resume (labelled back before it was deleted)
#
# A node drained for any other reason (an admin's, the health check's, an upgrade's) is left as it is, unless it left.
# No list yet (the watcher has not finished a round): nothing is done with it.
CORDON="dualsched:cordon"
LEFT="dualsched:left"
cordoned_list=${1:?usage: cordon_drain.sh <cordoned-nodes-file> [<left-nodes-file>]}
left_list=${2:-}

[ -r "$cordoned_list" ] || exit 0
cordoned=" $(tr '\n' ' ' <"$cordoned_list") "
left=" "
[ -n "$left_list" ] && [ -r "$left_list" ] && left=" $(tr '\n' ' ' <"$left_list") "
records=$(scontrol show node --oneliner) || exit 1

printf '%s\n' "$records" | while read -r record; do
    case "$record" in NodeName=*) ;; *) continue ;; esac
    node=${record#NodeName=}
    node=${node%% *}
    state=$(printf '%s\n' "$record" | sed -n 's/.* State=\([^ ]*\).*/\1/p')
    case "+$state+" in *+DRAIN+*) drained=1 ;; *) drained=0 ;; esac
    case "$record" in
        *" Reason=$CORDON "* | *" Reason=$CORDON") reason=$CORDON ;;
        *" Reason=$LEFT "* | *" Reason=$LEFT") reason=$LEFT ;;
        *) reason="" ;;
    esac
    case "$left" in *" $node "*)
        if [ "$drained" = 0 ]; then
            scontrol update NodeName="$node" State=DRAIN Reason="$LEFT" && echo "$node: left its pool in Kubernetes, drained"
        else
            # Slurm deletes only a node with no job on it (nor completing) and in no reservation.
            case "+$state+" in
                +IDLE+*COMPLETING* | +DOWN+*COMPLETING*) ;;
                +IDLE+* | +DOWN+*) scontrol delete NodeName="$node" && echo "$node: left its pool in Kubernetes, no job on it: deleted from Slurm" ;;
            esac
        fi
        continue ;;
    esac
    case "$cordoned" in *" $node "*) listed=1 ;; *) listed=0 ;; esac
    if [ "$listed" = 1 ] && [ "$drained" = 0 ]; then
        scontrol update NodeName="$node" State=DRAIN Reason="$CORDON" && echo "$node: cordoned in Kubernetes, drained"
    elif [ "$listed" = 0 ] && [ "$drained" = 1 ] && [ "$reason" = "$CORDON" ]; then
        scontrol update NodeName="$node" State=RESUME && echo "$node: uncordoned in Kubernetes, resumed"
    elif [ "$listed" = 0 ] && [ "$drained" = 1 ] && [ "$reason" = "$LEFT" ]; then
        scontrol update NodeName="$node" State=RESUME && echo "$node: back in its pool in Kubernetes, resumed"
    fi
done
