# Shared by the test scripts that start real peers on loopback (interop, cluster).
# The sourcing script sets LOGDIR and PIDS=(); sourcing installs the traps that
# stop every process in PIDS (its whole process group) on exit, even on failure.

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for pid in "${PIDS[@]}"; do
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  done
  rm -f "$PORTS_GIVEN"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start NAME CMD... : runs CMD in its own process group, output appended to $LOGDIR/NAME.log
start() {
  local name="$1"; shift
  setsid "$@" >> "$LOGDIR/$name.log" 2>&1 < /dev/null &
  PIDS+=("$!")
  LAST_PID=$!
}

# The ports free_port has handed out to this script: a port is free again for
# bind(0) as soon as its probe socket closes, so two calls may get the same
# one, and two servers started later would then be told the same port (seen:
# the gateway and Prometheus in tests/ops/prometheus.sh). Removed by cleanup.
PORTS_GIVEN="${TMPDIR:-/tmp}/sessionless-ports.$$"
: > "$PORTS_GIVEN"

free_port() {
  python3 - "$PORTS_GIVEN" <<'EOF'
import socket, sys
path = sys.argv[1]
with open(path) as f:
    given = set(f.read().split())
held = []
while True:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = str(s.getsockname()[1])
    if port not in given:
        break
    held.append(s)  # kept bound while looking, so that bind(0) moves on
for h in held + [s]:
    h.close()
with open(path, "a") as f:
    f.write(port + "\n")
print(port)
EOF
}

# wait_http NAME PID URL SECONDS [STATUS]: until URL answers (any HTTP status, or exactly STATUS).
# On failure WAIT_REASON says why and the tail of NAME's log goes to stderr.
wait_http() {
  local name="$1" pid="$2" url="$3" secs="$4" want="${5:-}" code=000 st
  local deadline=$((SECONDS + secs))
  WAIT_REASON=""
  while (( SECONDS < deadline )); do
    if ! kill -0 "$pid" 2>/dev/null; then
      st=0; wait "$pid" 2>/dev/null || st=$?
      WAIT_REASON="process exited with status $st before $url answered${want:+ $want}"
      break
    fi
    code=$(curl -s -o /dev/null -m 2 -w '%{http_code}' "$url" || true)
    if [[ -n "$want" && "$code" == "$want" ]] || [[ -z "$want" && "$code" != "000" ]]; then return 0; fi
    sleep 0.1
  done
  [[ -n "$WAIT_REASON" ]] || WAIT_REASON="$url did not answer${want:+ $want} within ${secs}s (last status $code)"
  { echo "--- $name log (tail) ---"; tail -n 30 "$LOGDIR/$name.log" || true; echo "---"; } >&2
  return 1
}
