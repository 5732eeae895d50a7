#!/bin/sh
# Make slurmctld's inference-window reservations match the file rendered from the stack config
# (components/templates/window-reservations.j2), one line per time-shared pool:
#   ReservationName=<name> DailyStartUTC=<HH:MM> DurationMinutes=<n> Nodes=<hostlist> Users=<user>
# Each line becomes a DAILY reservation of the whole nodes for the window, created when missing and
# updated when its times, nodes, users or flags differ. Reservations named dualsched-window-* that the
# file no longer lists are deleted. A run that finds everything in place does nothing and prints
# nothing; otherwise one line per action. Exit 1 on a real failure (no file, a line that is not the
# template's, slurmctld not answering or refusing an action), for the caller to run it again.
# Usage: window_reservations.sh <file>     (needs `date +%s`, as GNU and busybox date have)
set -u

PREFIX=dualsched-window-
DAY=86400
# Times are seconds since the epoch both ways, so no time zone or date parsing is involved: scontrol
# prints them so given a strftime format, and reads uts<seconds> (src/common/parse_time.c, 22.05 to 26.05).
export SLURM_TIME_FORMAT=%s
# DAILY: slurmctld moves the reservation to the next day when it ends. IGNORE_JOBS: without it
# slurmctld refuses a reservation that a running job's time limit reaches into ("Requested nodes are
# busy"), on a busy pool nearly always; such a job still runs into the first window, and no job
# that would reach into a window starts once the reservation is there.
FLAGS=DAILY,IGNORE_JOBS

fail() { echo "window reservations: $*" >&2; return 1; }

one_line() { printf '%s' "$1" | tr '\n' ' '; }

# The value of Key in a line of Key=Value words (the file's, or `scontrol show --oneliner`'s).
field() { printf ' %s\n' "$2" | sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }

# Run an scontrol action; print what it did, or on one line why it failed.
act() {
    message=$1
    shift
    if output=$(scontrol "$@" 2>&1); then echo "$message"; else fail "scontrol $* failed: $(one_line "$output")"; fi
}

# "<start> <end>" in epoch seconds: the day's window that is open now or opens next; yesterday's
# when it runs past midnight and is still open, tomorrow's when today's is over.
occurrence() {
    hour=${1%:*} minute=${1#*:}
    start=$((now - now % DAY + ${hour#0} * 3600 + ${minute#0} * 60))
    length=$(($2 * 60))
    if [ $((start - DAY + length)) -gt "$now" ]; then
        start=$((start - DAY))
    elif [ $((start + length)) -le "$now" ]; then
        start=$((start + DAY))
    fi
    echo "$start $((start + length))"
}

same_nodes() { [ "$(scontrol show hostnames "$1" | sort)" = "$(scontrol show hostnames "$2" | sort)" ]; }

has_flags() {
    for flag in $(echo "$FLAGS" | tr , ' '); do
        case ",$1," in *",$flag,"*) ;; *) return 1 ;; esac
    done
}

# Nodes, users and flags of the reservation record $1 are those wanted.
holds_wanted() {
    same_nodes "$(field Nodes "$1")" "$nodes" && [ "$(field Users "$1")" = "$users" ] && has_flags "$(field Flags "$1")"
}

create() {
    act "created $name: $description" create reservation ReservationName="$name" \
        StartTime="uts$begin" EndTime="uts$end" Nodes="$nodes" Users="$users" Flags="$FLAGS"
}

# Bring the existing reservation (its record in $record) to the window [start, end).
reconcile() {
    held_start=$(field StartTime "$record") held_end=$(field EndTime "$record")
    if [ "$held_end" -le "$now" ]; then
        return 0 # this day's is over: slurmctld moves a DAILY reservation on within a minute
    elif [ "$held_start" -gt "$now" ]; then
        [ "$held_start" = "$start" ] && [ "$held_end" = "$end" ] && holds_wanted "$record" && return 0
        act "updated $name: $description" update ReservationName="$name" \
            StartTime="uts$begin" EndTime="uts$end" Nodes="$nodes" Users="$users" Flags="$FLAGS"
    elif [ "$start" -le "$now" ]; then
        # Active in an open window: slurmctld refuses a new start for a started reservation,
        # the rest may change.
        [ "$held_end" = "$end" ] && holds_wanted "$record" && return 0
        act "updated $name: $description" update ReservationName="$name" \
            EndTime="uts$end" Nodes="$nodes" Users="$users" Flags="$FLAGS"
    else
        # Active while the window is closed (it moved): only a new reservation starts later.
        act "deleted $name: active outside its window" delete ReservationName="$name" && create
    fi
}

# The line's fields are the template's (the file is rendered from a validated config): refuse
# anything else rather than guess.
well_formed() {
    case $name in "$PREFIX"?*) ;; *) return 1 ;; esac
    case $daily in [0-2][0-9]:[0-5][0-9]) ;; *) return 1 ;; esac
    case $minutes in '' | 0* | *[!0-9]*) return 1 ;; esac
    [ -n "$nodes" ] && [ -n "$users" ]
}

# Apply one line of the file; $held lists every reservation slurmctld has.
apply() {
    name=$(field ReservationName "$1") daily=$(field DailyStartUTC "$1") minutes=$(field DurationMinutes "$1")
    nodes=$(field Nodes "$1") users=$(field Users "$1")
    well_formed || { fail "not a window reservation line: $1"; return; }
    description="daily from $daily UTC for $minutes minutes on $nodes, for $users only"
    set -- $(occurrence "$daily" "$minutes")
    # slurmctld refuses a start more than 10 minutes in the past (MAX_RESV_DELAY): inside the
    # window the reservation begins now; at its end slurmctld moves it to the same hours
    # tomorrow, and a later run to the window's start.
    start=$1 end=$2 begin=$(($1 > now ? $1 : now))
    record=$(printf '%s\n' "$held" | grep "^ReservationName=$name ")
    if [ -z "$record" ]; then create; else reconcile; fi
}

file=${1:?usage: window_reservations.sh <file>}
[ -r "$file" ] || { fail "cannot read $file"; exit 1; }
now=$(date +%s)
held=$(scontrol show reservation --oneliner 2>&1) || { fail "slurmctld did not answer: $(one_line "$held")"; exit 1; }

status=0
listed=" "
# fd 3: scontrol must not read the file's lines from stdin
while IFS= read -r line <&3; do
    case $line in '' | '#'*) continue ;; esac
    apply "$line" || status=1
    listed="$listed$name "
done 3<"$file"

for name in $(printf '%s\n' "$held" | sed -n "s/^ReservationName=\($PREFIX[^ ]*\) .*/\1/p"); do
    case $listed in *" $name "*) continue ;; esac
    act "deleted $name: its pool is no longer time-shared" delete ReservationName="$name" || status=1
done
exit $status
