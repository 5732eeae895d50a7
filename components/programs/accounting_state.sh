#!/bin/sh
# Make slurmdbd's QOS, accounts and users' associations match the file rendered from the stack config
# (components/templates/accounting-state.j2), one line each, parents before children:
#   Cluster=<name> Marker=dualsched:<name>
#   QOS=<name> Priority= PreemptMode= UsageFactor= [Preempt=] [PreemptExemptTime=] [MaxWall=] [MaxTRESPU=] [GrpTRES=] [MaxJobsPU=]
#   Account=<name> Parent= Fairshare= QOS= DefaultQOS=
#   User=<name> Account=<account> DefaultAccount=<account>
# Values are written as `sacctmgr --noheader --parsable2 show` prints them; an option left out is unset.
#
# What is missing is added (QOS and accounts with Description=<Marker>), what differs is changed to the
# file's values. QOS and accounts with Description=<Marker> (dualsched made them for this cluster) that the
# file no longer lists are removed, and so are the users' associations with such accounts that it no
# longer lists; anything else in slurmdbd (its own QOS normal, root, accounts made by hand) is changed
# only while the file lists it, and never removed. Nothing that pending or running jobs still use is
# removed: the program says so and removes it on a later run, once they are gone. Accounts and
# associations are this cluster's; QOS are slurmdbd's, shared by every cluster it serves.
#
# A run that finds everything in place does nothing and prints nothing; otherwise one line per
# action. Exit 1 on a real failure (no file, a line that is not the template's, slurmdbd not answering
# or refusing an action), for the caller to run it again. No Cluster line (accounting disabled): nothing.
# Usage: accounting_state.sh <file>
set -u
set -f # values are single words; none is a glob

# The options of each kind of line, as sacctmgr shows them; LISTS are compared as sets.
QOS_KEYS="Priority Preempt PreemptMode PreemptExemptTime UsageFactor MaxWall MaxTRESPU GrpTRES MaxJobsPU"
ACCOUNT_KEYS="Parent Fairshare QOS DefaultQOS"
LISTS=" Preempt MaxTRESPU GrpTRES QOS "
TRES="MaxTRESPU GrpTRES"
ACTIVE=PENDING,RUNNING,SUSPENDED,COMPLETING,CONFIGURING,REQUEUED,RESIZING

fail() { echo "accounting state: $*" >&2; return 1; }

one_line() { printf '%s' "$1" | tr '\n' ' '; }

# The value of Key in a line of Key=Value words.
field() { printf ' %s\n' "$2" | sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }

sorted() { printf '%s\n' "$1" | tr , '\n' | sed '/^$/d' | sort | tr '\n' , | sed 's/,$//'; }

show() { sacctmgr --noheader --parsable2 "$@"; }

# Run a sacctmgr action; print what it did, or on one line why it failed.
act() {
    message=$1
    shift
    if output=$(sacctmgr --immediate "$@" 2>&1); then echo "$message"; else fail "sacctmgr $* failed: $(one_line "$output")"; fi
}

# How many jobs slurmctld has pending or running with the squeue filter "$@"; fails when it cannot tell.
active_jobs() {
    ids=$(squeue --noheader --states="$ACTIVE" --format=%i "$@" 2>&1) || { one_line "$ids"; return 1; }
    printf '%s\n' "$ids" | grep -c . || :
}

# The value sacctmgr takes to set option $1 to the file's $2, the shown value being $3.
set_value() {
    option=$1 want=$2 have=$3
    case " $TRES " in
    *" $option "*)
        # a TRES left out of a limit is cleared with -1, one by one
        value=$want
        for item in $(printf '%s' "$have" | tr , ' '); do
            case ",$want," in *",${item%%=*}="*) ;; *) value="${value:+$value,}${item%%=*}=-1" ;; esac
        done
        echo "$value" ;;
    *)
        if [ -n "$want" ]; then echo "$want"; else
            case $option in Preempt | QOS) echo "" ;; *) echo "-1" ;; esac
        fi ;;
    esac
}

set_name() {
    case $1 in MaxTRESPU) echo MaxTRESPerUser ;; MaxJobsPU) echo MaxJobsPerUser ;; *) echo "$1" ;; esac
}

# The sacctmgr settings that bring record $2 to line $3, for options $1; empty when it matches.
changes() {
    settings=""
    for option in $1; do
        want=$(field "$option" "$3") have=$(field "$option" "$2")
        case $LISTS in *" $option "*) want=$(sorted "$want") have=$(sorted "$have") ;; esac
        [ "$want" = "$have" ] && continue
        settings="$settings $(set_name "$option")=$(set_value "$option" "$want" "$have")"
    done
    echo "${settings# }"
}

# The line $3 is the template's: Option=Value words of the options $1 only, values not empty, every
# option of $2 there. (An option of $1 left out is unset.)
well_formed() {
    for word in $3; do
        case $word in *=?*) ;; *) return 1 ;; esac
        case " $1 " in *" ${word%%=*} "*) ;; *) return 1 ;; esac
    done
    for option in $2; do case " $3 " in *" $option="*) ;; *) return 1 ;; esac; done
}

# ------------------------------------------------------------------------------ the file

file=${1:?usage: accounting_state.sh <file>}
[ -r "$file" ] || { fail "cannot read $file"; exit 1; }
header=$(grep '^Cluster=' "$file")
[ -n "$header" ] || exit 0
cluster=$(field Cluster "$header") marker=$(field Marker "$header")
[ -n "$cluster" ] && [ -n "$marker" ] || { fail "not a Cluster line: $header"; exit 1; }
qos_lines=$(grep '^QOS=' "$file")
account_lines=$(grep '^Account=' "$file")
user_lines=$(grep '^User=' "$file")
status=0
# Every line is the template's, or nothing is done: better no change than a guessed one.
# (fd 3: sacctmgr and squeue must not read the lines from stdin)
while IFS= read -r line <&3; do
    case $line in
    '' | '#'* | Cluster=*) ;;
    QOS=*) well_formed "QOS $QOS_KEYS" "QOS Priority PreemptMode UsageFactor" "$line" || { fail "not a QOS line: $line"; exit 1; } ;;
    Account=*) well_formed "Account $ACCOUNT_KEYS" "Account $ACCOUNT_KEYS" "$line" || { fail "not an Account line: $line"; exit 1; } ;;
    User=*) well_formed "User Account DefaultAccount" "User Account DefaultAccount" "$line" || { fail "not a User line: $line"; exit 1; } ;;
    *) fail "not a line of the accounting state: $line"; exit 1 ;;
    esac
done 3<"$file"

# --------------------------------------------------------------------------- what is held

# QOS as lines of the file's form, and the names of those this cluster's dualsched made.
read_qos() {
    held_qos=$(show show qos format=Name,Priority,Preempt,PreemptMode,PreemptExemptTime,UsageFactor,MaxWall,MaxTRESPU,GrpTRES,MaxJobsPU,Description 2>&1) ||
        { fail "slurmdbd did not answer: $(one_line "$held_qos")"; exit 1; }
    owned_qos=$(printf '%s\n' "$held_qos" | awk -F'|' -v m="$marker" '$11 == m { print $1 }')
    held_qos=$(printf '%s\n' "$held_qos" | awk -F'|' 'NF >= 11 { printf "QOS=%s Priority=%s Preempt=%s PreemptMode=%s PreemptExemptTime=%s UsageFactor=%s MaxWall=%s MaxTRESPU=%s GrpTRES=%s MaxJobsPU=%s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10 }')
}

# This cluster's account and user associations, in the tree's order, and the accounts dualsched made.
read_associations() {
    held_assoc=$(show show association where cluster="$cluster" format=Account,User,ParentName,Fairshare,QOS,DefaultQOS 2>&1) ||
        { fail "slurmdbd did not answer: $(one_line "$held_assoc")"; exit 1; }
    held_accounts=$(printf '%s\n' "$held_assoc" | awk -F'|' 'NF >= 6 && $2 == "" { printf "Account=%s Parent=%s Fairshare=%s QOS=%s DefaultQOS=%s\n", $1, $3, $4, $5, $6 }')
    held_users=$(printf '%s\n' "$held_assoc" | awk -F'|' 'NF >= 6 && $2 != "" { printf "User=%s Account=%s\n", $2, $1 }')
    owned_accounts=$(show show account format=Account,Description 2>&1) ||
        { fail "slurmdbd did not answer: $(one_line "$owned_accounts")"; exit 1; }
    owned_accounts=$(printf '%s\n' "$owned_accounts" | awk -F'|' -v m="$marker" '$2 == m { print $1 }')
    default_accounts=$(show show user format=User,DefaultAccount 2>&1) ||
        { fail "slurmdbd did not answer: $(one_line "$default_accounts")"; exit 1; }
}

listed() { printf '%s\n' "$2" | grep -qx -- "$1"; }

record_of() { printf '%s\n' "$2" | grep -- "^$1 " | head -n 1; }

# ----------------------------------------------------------------------------------- QOS

read_qos
# Every QOS first, bare, so that a Preempt list may name any of them.
for name in $(printf '%s\n' "$qos_lines" | sed -n 's/^QOS=\([^ ]*\) .*/\1/p'); do
    [ -n "$(record_of "QOS=$name" "$held_qos")" ] && continue
    act "added qos $name" add qos "$name" Description="$marker" || status=1
done
read_qos
while IFS= read -r line <&3; do
    [ -n "$line" ] || continue
    name=$(field QOS "$line")
    record=$(record_of "QOS=$name" "$held_qos")
    [ -n "$record" ] || continue # its add failed, said above
    settings=$(changes "$QOS_KEYS" "$record" "$line")
    [ -n "$settings" ] || continue
    # shellcheck disable=SC2086 # one word per setting
    act "set qos $name: $settings" modify qos where name="$name" set $settings || status=1
done 3<<EOF
$qos_lines
EOF

# ------------------------------------------------------------------------------ accounts

read_associations
while IFS= read -r line <&3; do
    [ -n "$line" ] || continue
    name=$(field Account "$line")
    record=$(record_of "Account=$name" "$held_accounts")
    if [ -z "$record" ]; then
        act "added account $name: $(echo "$line" | cut -d' ' -f2-)" add account "$name" cluster="$cluster" \
            Description="$marker" Parent="$(field Parent "$line")" Fairshare="$(field Fairshare "$line")" \
            QOS="$(field QOS "$line")" DefaultQOS="$(field DefaultQOS "$line")" || status=1
        continue
    fi
    settings=$(changes "$ACCOUNT_KEYS" "$record" "$line")
    [ -n "$settings" ] || continue
    # shellcheck disable=SC2086
    act "set account $name: $settings" modify account where name="$name" cluster="$cluster" set $settings || status=1
done 3<<EOF
$account_lines
EOF

# ------------------------------------------------------------------------------- users

read_associations
while IFS= read -r line <&3; do
    [ -n "$line" ] || continue
    name=$(field User "$line") account=$(field Account "$line")
    listed "User=$name Account=$account" "$held_users" && continue
    act "added user $name to account $account" add user "$name" account="$account" cluster="$cluster" || status=1
done 3<<EOF
$user_lines
EOF

read_associations
while IFS= read -r line <&3; do
    [ -n "$line" ] || continue
    name=$(field User "$line") want=$(field DefaultAccount "$line")
    have=$(printf '%s\n' "$default_accounts" | awk -F'|' -v u="$name" '$1 == u { print $2 }')
    [ "$want" = "$have" ] && continue
    act "set user $name: DefaultAccount=$want" modify user where name="$name" cluster="$cluster" set DefaultAccount="$want" || status=1
done 3<<EOF
$(printf '%s\n' "$user_lines" | awk '!seen[$1]++')
EOF

# ---------------------------------------------------------------------------- removals

# Users' associations with accounts dualsched made that the file no longer lists.
wanted_users=$(printf '%s\n' "$user_lines" | awk '{ print $1, $2 }')
while IFS= read -r held <&3; do
    [ -n "$held" ] || continue
    name=$(field User "$held") account=$(field Account "$held")
    listed "$account" "$owned_accounts" || continue
    listed "$held" "$wanted_users" && continue
    # a user the pods no longer know has no uid for squeue --user: match the name squeue prints
    owners=$(squeue --noheader --states="$ACTIVE" --account="$account" --format=%u 2>&1) ||
        { fail "kept user $name in account $account: slurmctld did not answer: $(one_line "$owners")"; status=1; continue; }
    jobs=$(printf '%s\n' "$owners" | grep -cx -- "$name")
    if [ "$jobs" -gt 0 ]; then
        echo "kept user $name in account $account: $jobs job(s) of the user's there still pending or running; removed once they end"
        continue
    fi
    act "removed user $name from account $account" remove user where name="$name" account="$account" cluster="$cluster" || status=1
done 3<<EOF
$held_users
EOF

# Accounts dualsched made that the file no longer lists: children first (removing an account removes its subtree).
read_associations
wanted_accounts=$(printf '%s\n' "$account_lines" | sed -n 's/^Account=\([^ ]*\) .*/\1/p')
for name in $(printf '%s\n' "$held_accounts" | sed -n 's/^Account=\([^ ]*\) .*/\1/p' | sed '1!G;h;$!d'); do
    listed "$name" "$owned_accounts" || continue
    listed "$name" "$wanted_accounts" && continue
    jobs=$(active_jobs --account="$name") || { fail "kept account $name: slurmctld did not answer: $jobs"; status=1; continue; }
    if [ "$jobs" -gt 0 ]; then
        echo "kept account $name: $jobs job(s) charged to it still pending or running; removed once they end"
        continue
    fi
    act "removed account $name" remove account where name="$name" cluster="$cluster" || status=1
done

# QOS dualsched made that the file no longer lists.
wanted_qos=$(printf '%s\n' "$qos_lines" | sed -n 's/^QOS=\([^ ]*\) .*/\1/p')
for name in $owned_qos; do
    listed "$name" "$wanted_qos" && continue
    jobs=$(active_jobs --qos="$name") || { fail "kept qos $name: slurmctld did not answer: $jobs"; status=1; continue; }
    if [ "$jobs" -gt 0 ]; then
        echo "kept qos $name: $jobs job(s) of it still pending or running; removed once they end"
        continue
    fi
    act "removed qos $name" remove qos where name="$name" || status=1
done
exit $status
