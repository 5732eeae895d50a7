# shellcheck shell=bash
# Background daemons of tools/cluster.sh and tools/node.sh, sourced by both: each runs in its own
# session with a pid file under $DIR/pids and its log under $DIR/logs, and is stopped by that pid
# only. The sourcing script sets DIR, DAEMONS (what wait_for watches) and defines log and die.

pid_alive() { local f="$DIR/pids/$1.pid"; [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null; }

start_daemon() { # start_daemon NAME CMD...   (idempotent: a running NAME is left alone)
  local name=$1; shift
  if pid_alive "$name"; then log "$name already running (pid $(cat "$DIR/pids/$name.pid"))"; return; fi
  log "starting $name"
  setsid nohup "$@" >"$DIR/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$DIR/pids/$name.pid"
}

stop_daemon() { # stop_daemon NAME   (TERM, then KILL after 10 s)
  local name=$1 pid
  [ -f "$DIR/pids/$name.pid" ] || return 0
  pid=$(cat "$DIR/pids/$name.pid")
  if kill -0 "$pid" 2>/dev/null; then
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$DIR/pids/$name.pid"
}

wait_for() { # wait_for SECONDS DESCRIPTION CMD...   (fails fast when one of DAEMONS died)
  local secs=$1 what=$2; shift 2
  local end=$(( $(date +%s) + secs )) d
  until "$@"; do
    for d in "${DAEMONS[@]}"; do
      if [ -f "$DIR/pids/$d.pid" ] && ! pid_alive "$d"; then
        tail -n 20 "$DIR/logs/$d.log" >&2 || true
        die "$d exited while waiting for $what (log: $DIR/logs/$d.log)"
      fi
    done
    [ "$(date +%s)" -lt "$end" ] || die "timed out after ${secs}s waiting for $what (logs: $DIR/logs)"
    sleep 1
  done
}
