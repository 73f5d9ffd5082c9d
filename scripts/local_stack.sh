#!/usr/bin/env bash
# A local Ray head + MLflow tracking server, both on 127.0.0.1, that behave like the cluster: the README's
# `ray job submit --working-dir . -- python jobs/...` commands run verbatim against it and their runs appear in
# the MLflow UI. See docs/local.md.
#
#   scripts/local_stack.sh start      # starts both (idempotent), prints the variables to export
#   scripts/local_stack.sh status     # what is running, and where
#   scripts/local_stack.sh env        # just the export lines:  eval "$(scripts/local_stack.sh env)"
#   scripts/local_stack.sh stop       # stops both; runs and artifacts stay in the state dir
#
# Settings (environment): LOCAL_STACK_DIR (default .local-stack/ in the repository), RAY_PORT (6379),
# RAY_DASHBOARD_PORT (8265, also the job server), MLFLOW_PORT (5000), LOCAL_STACK_CPUS (default: all).
#
# Every process is started in its own session (setsid) and stopped by that session id, never by name: `ray stop`
# would also kill every other Ray on this machine (other users', other test runs).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
state="${LOCAL_STACK_DIR:-$root/.local-stack}"
mkdir -p "$state"
state="$(cd "$state" && pwd)"
ray_port="${RAY_PORT:-6379}"
dash_port="${RAY_DASHBOARD_PORT:-8265}"
mlflow_port="${MLFLOW_PORT:-5000}"
ports_file="$state/ports"  # the ports a running stack was started with: status, env and start say those
# Ray's temp dir holds Unix sockets (paths limited to ~107 bytes): keep it short, and distinct from /tmp/ray so
# that a later `ray.init()` elsewhere never discovers this head through /tmp/ray/ray_current_cluster.
ray_tmp="/tmp/ray-stack-$(printf '%s' "$state" | sha256sum | cut -c1-8)"
venv_bin=""
if [ -x "$root/.venv/bin/python" ] && [ -z "${VIRTUAL_ENV:-}" ]; then
  venv_bin="$root/.venv/bin"
  export PATH="$venv_bin:$PATH"
fi
if ! command -v ray >/dev/null || ! command -v mlflow >/dev/null; then
  echo "error: ray and mlflow are not installed here: run ./scripts/test.sh --co -q (or ./scripts/quickstart.sh) once" \
       "to create .venv/, or activate the virtualenv that has the project" >&2
  exit 1
fi
# Keep every Ray listener on loopback (Ray otherwise advertises the external interface; see docs/local.md).
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0

session_alive() {  # session_alive FILE: is any process of the session recorded in FILE still running?
  [ -f "$1" ] || return 1
  local sid
  sid="$(cat "$1")"
  [ -n "$(ps -eo sid= | awk -v s="$sid" '$1==s' | head -1)" ]
}

if [ -s "$ports_file" ] && { session_alive "$state/ray.sid" || session_alive "$state/mlflow.sid"; }; then
  read -r ray_port dash_port mlflow_port <"$ports_file"
fi
mlflow_uri="http://127.0.0.1:$mlflow_port"
api_address="http://127.0.0.1:$dash_port"
gcs_address="127.0.0.1:$ray_port"
# Ray 2.60 authenticates every client of a cluster started in token mode (the job server included). The stack's
# token lives in its state dir, readable by you only, not in ~/.ray, so that it is this stack's alone.
token_file="$state/ray_auth_token"

stop_session() {  # stop_session FILE NAME: SIGTERM the session's processes, SIGKILL what is left after 15 s
  local file="$1" name="$2" sid pids i
  [ -f "$file" ] || return 0
  sid="$(cat "$file")"
  pids="$(ps -eo pid=,sid= | awk -v s="$sid" '$2==s {print $1}')"
  if [ -n "$pids" ]; then
    echo ">> stopping $name (session $sid)"
    kill -TERM $pids 2>/dev/null || true
    for i in $(seq 30); do
      pids="$(ps -eo pid=,sid= | awk -v s="$sid" '$2==s {print $1}')"
      [ -z "$pids" ] && break
      sleep 0.5
    done
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
  fi
  rm -f "$file"
}

port_free() {  # port_free PORT: can we listen on 127.0.0.1:PORT?
  python - "$1" <<'EOF' 2>/dev/null
import socket, sys
with socket.socket() as s:
    s.bind(("127.0.0.1", int(sys.argv[1])))
EOF
}

check_port() {  # check_port PORT NAME VARIABLE: fail before starting anything when another process holds it
  local free
  if ! port_free "$1"; then
    free="$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    echo "error: port $1 is taken by another process, so the stack's $2 cannot listen there: choose a free port" \
         "with $3 (e.g. $3=$free $0 start), or stop what holds it" >&2
    exit 1
  fi
}

still_ours() {  # still_ours SIDFILE NAME LOG: the server that answered must be the one we started, alive
  if ! session_alive "$1"; then
    echo "error: the stack's $2 exited (what answered is another process, or nothing); its log: $3" >&2
    tail -20 "$3" >&2 || true
    exit 1
  fi
}

wait_http() {  # wait_http URL SECONDS NAME LOG
  local i
  for i in $(seq "$2"); do
    # Any HTTP answer means the server is up (the job server answers 401 without the token).
    if python - "$1" <<'EOF' 2>/dev/null; then return 0; fi
import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=2).read()
except urllib.error.HTTPError:
    pass
EOF
    sleep 1
  done
  echo "error: $3 did not answer on $1 within $2 s; its log: $4" >&2
  tail -20 "$4" >&2 || true
  return 1
}

# RAY_API_SERVER_ADDRESS is where `ray job submit` goes; RAY_ADDRESS (the GCS) is what `python jobs/X.py`
# joins when run directly in the same shell (an http:// RAY_ADDRESS would make ray.init() fail).
print_env() {
  # The venv's bin first, so that `ray job submit` and `mlflow ui` work in a fresh shell after `source`.
  if [ -n "$venv_bin" ]; then echo "export PATH=$venv_bin:\$PATH"; fi
  cat <<EOF
export RAY_API_SERVER_ADDRESS=$api_address
export RAY_ADDRESS=$gcs_address
export RAY_AUTH_MODE=token
export RAY_AUTH_TOKEN_PATH=$token_file
export MLFLOW_TRACKING_URI=$mlflow_uri
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
EOF
}

start() {
  # A port held by someone else would make our server exit while theirs answers the health check: refuse first.
  if ! session_alive "$state/mlflow.sid"; then check_port "$mlflow_port" "MLflow server" MLFLOW_PORT; fi
  if ! session_alive "$state/ray.sid"; then
    check_port "$ray_port" "Ray GCS" RAY_PORT
    check_port "$dash_port" "Ray dashboard" RAY_DASHBOARD_PORT
  fi
  if ! session_alive "$state/mlflow.sid"; then
    mkdir -p "$state/mlflow/artifacts"
    echo ">> starting MLflow on $mlflow_uri (store: $state/mlflow/mlflow.db)"
    # One worker and no job runner: ~7 s and ~0.5 GB instead of ~29 s and ~1.5 GB. Artifacts are proxied by the
    # server (--serve-artifacts), as on the team server, so clients never write to the store directly.
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false setsid bash -c 'echo $$ > "$0"; exec "$@"' "$state/mlflow.sid" \
      mlflow server --backend-store-uri "sqlite:///$state/mlflow/mlflow.db" \
      --artifacts-destination "$state/mlflow/artifacts" --serve-artifacts \
      --host 127.0.0.1 --port "$mlflow_port" --workers 1 >"$state/mlflow.log" 2>&1 </dev/null &
    sleep 0.5
  fi
  if ! session_alive "$state/ray.sid"; then
    if [ ! -s "$token_file" ]; then
      (umask 077 && python -c 'import secrets; print(secrets.token_hex(32), end="")' >"$token_file")
    fi
    # Ray's other fixed default ports (the dashboard agent's 52365, which job submission goes through, and the
    # client server's 10001) collide with any other Ray on the machine: take free ones.
    read -r agent_port client_port < <(python -c 'import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])')
    echo "$agent_port" >"$state/agent_port"
    echo ">> starting Ray head on $gcs_address (dashboard + job server $api_address, temp $ray_tmp)"
    # Ray gives its raylet 30 s to register (hard-coded); a loaded machine can miss that, so retry twice.
    local attempt
    for attempt in 1 2 3; do
      # MLFLOW_TRACKING_URI in the head's environment is inherited by every job driver `ray job submit` starts.
      if MLFLOW_TRACKING_URI="$mlflow_uri" RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$token_file" \
          setsid bash -c 'echo $$ > "$0"; exec "$@"' "$state/ray.sid" \
          ray start --head --node-ip-address=127.0.0.1 --port="$ray_port" \
          --dashboard-host=127.0.0.1 --dashboard-port="$dash_port" --temp-dir="$ray_tmp" \
          --dashboard-agent-listen-port="$agent_port" --ray-client-server-port="$client_port" \
          --disable-usage-stats ${LOCAL_STACK_CPUS:+--num-cpus="$LOCAL_STACK_CPUS"} >"$state/ray.log" 2>&1 </dev/null
      then
        break
      fi
      stop_session "$state/ray.sid" "the half-started Ray head"
      if [ "$attempt" = 3 ] || ! grep -q "timed out during startup" "$state/ray.log"; then
        echo "error: ray start failed; its log: $state/ray.log (then: $0 stop)" >&2
        tail -20 "$state/ray.log" >&2
        exit 1
      fi
      echo ">> Ray did not come up in time (a busy machine?); retrying ($attempt/3)"
    done
  fi
  wait_http "$mlflow_uri/health" 120 MLflow "$state/mlflow.log"
  wait_http "$api_address/api/version" 120 "Ray job server" "$state/ray.log"
  # Jobs are handed to the dashboard agent: until it listens, `ray job submit` fails with "No available agent".
  wait_http "http://127.0.0.1:$(cat "$state/agent_port")/" 120 "Ray dashboard agent" "$state/ray.log"
  still_ours "$state/mlflow.sid" "MLflow server" "$state/mlflow.log"
  still_ours "$state/ray.sid" "Ray head" "$state/ray.log"
  echo "$ray_port $dash_port $mlflow_port" >"$ports_file"
  print_env >"$state/env.sh"
  echo
  echo "Local stack is up. In your shell:"
  echo
  print_env | sed 's/^/  /'
  echo
  echo "  (or, in any shell: source $state/env.sh)   MLflow UI: $mlflow_uri   Ray dashboard: $api_address"
  echo "  then e.g.: ray job submit --working-dir . -- python jobs/build_dataset.py --input data/sample/corpus ..."
  echo "  stop with: scripts/local_stack.sh stop"
}

status() {
  local rc=0
  if session_alive "$state/ray.sid"; then
    echo "ray:    running (session $(cat "$state/ray.sid")), GCS $gcs_address, job server $api_address"
  else
    echo "ray:    stopped"; rc=1
  fi
  if session_alive "$state/mlflow.sid"; then
    echo "mlflow: running (session $(cat "$state/mlflow.sid")), $mlflow_uri, store $state/mlflow"
  else
    echo "mlflow: stopped"; rc=1
  fi
  return $rc
}

case "${1:-}" in
  start) start ;;
  stop)
    stop_session "$state/ray.sid" "Ray head"
    stop_session "$state/mlflow.sid" "MLflow server"
    rm -rf "$ray_tmp" "$state/env.sh" "$ports_file"
    echo ">> stopped (runs and artifacts kept in $state/mlflow)"
    ;;
  status) status ;;
  env) print_env ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
