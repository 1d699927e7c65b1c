#!/usr/bin/env bash
# leader-watch.sh: sourced by the per-rank entrypoint of every headless rank (launch/<instance>-rank<k>.sh).
# Shipped as is by `ascend-deploy render` and the launch ConfigMaps of instances deployed per rank; not a
# template. A LeaderWorkerSet instance's workers (launch/<instance>-worker.sh) do not use it: the
# controller recreates the whole group.
#
# Whole-instance restart (docs/rendering.md): after starting its engine, a headless rank
# calls watch_leader. It waits up to STARTUP_TIMEOUT_S for the leader's API port, then polls
# it every POLL_S seconds; after POLL_FAILURES failed polls in a row it stops the engine and
# exits 75, so the orchestrator restarts the rank and the instance re-forms around the
# restarted leader. If the engine itself exits, the rank exits with the engine's status.
#
# Expects from the entrypoint: RANK_NAME, engine_pid, LEADER_HOST, LEADER_PORT,
# STARTUP_TIMEOUT_S, POLL_S, POLL_FAILURES.
# shellcheck disable=SC2154  # the variables above are set by the sourcing entrypoint

stop_engine() {
  kill -TERM "$engine_pid" 2>/dev/null || true
  for _ in $(seq 1 30); do
    kill -0 "$engine_pid" 2>/dev/null || return 0
    sleep 1
  done
  kill -KILL "$engine_pid" 2>/dev/null || true
}

leader_up() {
  # the host and port are arguments of the inner shell, never part of its code
  # shellcheck disable=SC2016  # $1 and $2 expand in the inner shell
  timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2"' leader-up "$LEADER_HOST" "$LEADER_PORT" 2>/dev/null
}

engine_alive() {
  kill -0 "$engine_pid" 2>/dev/null
}

finish_with_engine() {
  local status=0
  wait "$engine_pid" || status=$?
  echo "ascend-deploy: $RANK_NAME: engine exited with status $status" >&2
  exit "$status"
}

watch_leader() {
  trap 'stop_engine; exit 143' TERM INT
  local started=$SECONDS failures=0
  until leader_up; do
    engine_alive || finish_with_engine
    if [ $((SECONDS - started)) -ge "$STARTUP_TIMEOUT_S" ]; then
      echo "ascend-deploy: $RANK_NAME: leader $LEADER_HOST:$LEADER_PORT not up after ${STARTUP_TIMEOUT_S}s" >&2
      stop_engine
      exit 75
    fi
    sleep "$POLL_S"
  done
  while engine_alive; do
    if leader_up; then
      failures=0
    else
      failures=$((failures + 1))
      if [ "$failures" -ge "$POLL_FAILURES" ]; then
        echo "ascend-deploy: $RANK_NAME: leader $LEADER_HOST:$LEADER_PORT lost; restarting with the instance" >&2
        stop_engine
        exit 75
      fi
    fi
    sleep "$POLL_S"
  done
  finish_with_engine
}
