#!/usr/bin/env bash
# Cluster tests with real processes: two `sessionless --config` replicas (same
# sealing key and internal-listener secret, their own instance ids and internal
# ports) in front of real legacy MCP servers, driven by a round-robin client
# (tests/cluster/rr_client.py, raw 2026-07-28 HTTP) the way a load balancer would.
#
#   tests/cluster/run.sh
#
# Upstreams: py-legacy (tests/interop/legacy_server.py on mcp==1.30.0, tool
# elicit_name; its SSE carries no event ids), server-everything (tool
# trigger-elicitation-request; its SSE events have ids and are kept, so a
# stream can be resumed with Last-Event-ID) and `sessionless demo-upstream`
# (tool ask_user; event ids, but no events kept). Routes on both replicas:
#   /mcp -> py-legacy (park)   /replay -> py-legacy (continuity = "replay")
#   /everything -> server-everything (park)   /demo -> demo-upstream (park)
# Scenarios (one PASS/FAIL line each):
#   a  20 flows, round 1 on one replica, the retry on the other: all complete
#   b  the same on the replay route
#   c1 owner killed (kill -9) while a server-everything flow is parked: the retry
#      on the other replica resumes the upstream stream and completes
#   c2 owner killed while a py-legacy flow is parked: 400 -32602 flow_lost
#   c3 the same with the demo upstream (ids, no kept events): 400 -32602 flow_lost
#   d  rolling restart: 20 flows parked over both replicas, SIGTERM to replica A
#      (drain_timeout_ms 10000): /readyz 503, a new call 503 + Retry-After (the
#      client fails over), every retry round-robin completes within the drain
#      deadline, A exits (status 0) once its flows are done
#   d2 A restarted on the same ports: flows alternating over A and B complete
#
# Environment:
#   SESSIONLESS_BIN        gateway binary (default target/debug/sessionless)
#   SESSIONLESS_PEERS      where scripts/setup-peers installs the peers (default .peers)
#   CLUSTER_LOGDIR         keep logs there (default: a temporary directory)
#   CLUSTER_STEP_TIMEOUT   seconds per client step (default 120)
set -euo pipefail
cd "$(dirname "$0")/../.."
# Logs, the cleanup traps (tests/lib/proc.sh) and the helpers: setup_peers, start,
# free_port, wait_http, wait_exit, verdict, run_step, scenario, cluster_keys,
# replica_config, start_replica, summary
SCENARIO=cluster
source tests/cluster/lib.sh

# step LABEL ARGS... : one bounded rr_client.py run; STEP_OUT is its verdict line.
step() { run_step tests/cluster/rr_client.py "$@"; }

setup_peers

# ---------------------------------------------------------------- upstreams

UP_PY=$(free_port); UP_EV=$(free_port); UP_DEMO=$(free_port)
start up-py-legacy "$PY_LEGACY" tests/interop/legacy_server.py --port "$UP_PY"; PID_UP_PY=$LAST_PID
start up-everything env PORT="$UP_EV" "$NODE" --import ./tests/interop/loopback.mjs "$EVERYTHING" streamableHttp; PID_UP_EV=$LAST_PID
wait_http up-py-legacy "$PID_UP_PY" "http://127.0.0.1:$UP_PY/mcp" 30 || die "py-legacy upstream: $WAIT_REASON"
start up-demo "$BIN" demo-upstream --listen "127.0.0.1:$UP_DEMO"; PID_UP_DEMO=$LAST_PID
wait_http up-everything "$PID_UP_EV" "http://127.0.0.1:$UP_EV/mcp" 30 || die "server-everything: $WAIT_REASON"
wait_http up-demo "$PID_UP_DEMO" "http://127.0.0.1:$UP_DEMO/mcp" 30 || die "demo upstream: $WAIT_REASON"

# ---------------------------------------------------------------- replicas

cluster_keys
for r in a b; do
  replica_config "$r" "$(cat <<EOF
[[upstreams]]
name = "py"
url = "http://127.0.0.1:$UP_PY/mcp"

[[upstreams]]
name = "everything"
url = "http://127.0.0.1:$UP_EV/mcp"

[[upstreams]]
name = "demo"
url = "http://127.0.0.1:$UP_DEMO/mcp"

[[routes]]
path = "/mcp"
upstream = "py"

[[routes]]
path = "/replay"
upstream = "py"
continuity = "replay"

[[routes]]
path = "/everything"
upstream = "everything"

[[routes]]
path = "/demo"
upstream = "demo"
EOF
)" "drain_timeout_ms = 10000"
done
start_replica a || die "replica gw-a: $WAIT_REASON"
start_replica b || die "replica gw-b: $WAIT_REASON"
A="127.0.0.1:${PUBLIC[a]}"; B="127.0.0.1:${PUBLIC[b]}"
echo "upstreams: py-legacy 127.0.0.1:$UP_PY, everything 127.0.0.1:$UP_EV, demo 127.0.0.1:$UP_DEMO; replicas gw-a $A (internal ${INTERNAL[a]}), gw-b $B (internal ${INTERNAL[b]}); logs in $LOGDIR"

PY_FLOW=(--tool elicit_name --args '{}')
PY_ANSWER='{"user_name": "Ada"}'
EV_FLOW=(--tool trigger-elicitation-request --args '{}')
EV_ANSWER='{"name": "Ada"}'
DEMO_FLOW=(--tool ask_user --args '{"question": "colour?"}')
DEMO_ANSWER='{"answer": "blue"}'

# ---------------------------------------------------------------- a: 20 alternating flows

scenario "a alternating-park" tests/cluster/rr_client.py a flows --replicas "$A,$B" --path /mcp "${PY_FLOW[@]}" \
  --answer "$PY_ANSWER" --expect 'hello, Ada' --count 20

# ---------------------------------------------------------------- b: the same in replay mode

scenario "b alternating-replay" tests/cluster/rr_client.py b flows --replicas "$A,$B" --path /replay "${PY_FLOW[@]}" \
  --answer "$PY_ANSWER" --expect 'hello, Ada' --count 20

# ---------------------------------------------------------------- c: owner killed while parked

c_ok=1
step c-park-everything round --replica "$A" --path /everything "${EV_FLOW[@]}" --save "$LOGDIR/c-everything.json" || c_ok=0
C_PARK_EV="$STEP_OUT"
step c-park-py round --replica "$A" --path /mcp "${PY_FLOW[@]}" --save "$LOGDIR/c-py.json" || c_ok=0
C_PARK_PY="$STEP_OUT"
step c-park-demo round --replica "$A" --path /demo "${DEMO_FLOW[@]}" --save "$LOGDIR/c-demo.json" || c_ok=0
C_PARK_DEMO="$STEP_OUT"
{ kill -KILL "${PID_GW[a]}"; wait_exit "${PID_GW[a]}" 10; } 2>/dev/null || die "gw-a survived kill -9"
echo "  gw-a killed (-9) with 3 flows parked"
if (( c_ok == 0 )); then
  verdict FAIL "c1 owner-killed-resumable (server-everything)" "could not park: $C_PARK_EV"
  verdict FAIL "c2 owner-killed-not-resumable (py-legacy)" "could not park: $C_PARK_PY"
  verdict FAIL "c3 owner-killed-not-resumable (demo-upstream)" "could not park: $C_PARK_DEMO"
else
  if step c1 retry --replica "$B" --load "$LOGDIR/c-everything.json" --answer "$EV_ANSWER" --expect '- Name: Ada'; then
    verdict PASS "c1 owner-killed-resumable (server-everything)" "retry on gw-b ${STEP_OUT#PASS c1: }"
  else
    verdict FAIL "c1 owner-killed-resumable (server-everything)" "${STEP_OUT#FAIL c1: }"
  fi
  if step c2 retry --replica "$B" --load "$LOGDIR/c-py.json" --answer "$PY_ANSWER" --expect-error 400:-32602:flow_lost; then
    verdict PASS "c2 owner-killed-not-resumable (py-legacy)" "retry on gw-b: ${STEP_OUT#PASS c2: }"
  else
    verdict FAIL "c2 owner-killed-not-resumable (py-legacy)" "${STEP_OUT#FAIL c2: }"
  fi
  if step c3 retry --replica "$B" --load "$LOGDIR/c-demo.json" --answer "$DEMO_ANSWER" --expect-error 400:-32602:flow_lost; then
    verdict PASS "c3 owner-killed-not-resumable (demo-upstream)" "retry on gw-b: ${STEP_OUT#PASS c3: }"
  else
    verdict FAIL "c3 owner-killed-not-resumable (demo-upstream)" "${STEP_OUT#FAIL c3: }"
  fi
fi
start_replica a || die "replica gw-a did not come back after kill -9: $WAIT_REASON"

# ---------------------------------------------------------------- d: rolling restart of gw-a

d_fail=""
d_notes=()
if step d-begin begin --replicas "$A,$B" --path /mcp "${PY_FLOW[@]}" --count 20 --save "$LOGDIR/d-flows.json"; then
  d_notes+=("${STEP_OUT#PASS d-begin: }")
  kill -TERM "${PID_GW[a]}"
  T_TERM=$SECONDS
  if step d-finish finish --replicas "$A,$B" --path /mcp --load "$LOGDIR/d-flows.json" \
       --answer "$PY_ANSWER" --expect 'hello, Ada' --draining "$A"; then
    took=$((SECONDS - T_TERM))
    d_notes+=("${STEP_OUT#PASS d-finish: } ${took}s after SIGTERM")
    (( took < 10 )) || d_fail="the retries took ${took}s, past the 10 s drain deadline"
  else
    d_fail="${STEP_OUT#FAIL d-finish: }"
  fi
  if wait_exit "${PID_GW[a]}" 20; then
    exited=$((SECONDS - T_TERM))
    d_notes+=("gw-a exited $EXIT_STATUS ${exited}s after SIGTERM")
    [[ -n "$d_fail" ]] || (( EXIT_STATUS == 0 )) || d_fail="gw-a exited with status $EXIT_STATUS"
    [[ -n "$d_fail" ]] || (( exited < 10 )) || d_fail="gw-a exited only ${exited}s after SIGTERM (its flows were done; drain deadline 10 s)"
  else
    [[ -n "$d_fail" ]] || d_fail="gw-a still running 20 s after SIGTERM"
    kill -KILL "${PID_GW[a]}" 2>/dev/null || true
  fi
else
  d_fail="${STEP_OUT#FAIL d-begin: }"
  kill -TERM "${PID_GW[a]}" 2>/dev/null || true
  wait_exit "${PID_GW[a]}" 20 || kill -KILL "${PID_GW[a]}" 2>/dev/null || true
fi
if [[ -z "$d_fail" ]]; then
  verdict PASS "d rolling-restart" "$(printf '%s; ' "${d_notes[@]}" | sed 's/; $//')"
else
  verdict FAIL "d rolling-restart" "$d_fail"
fi

if start_replica a; then
  scenario "d2 restarted-replica-serves" tests/cluster/rr_client.py d2 flows --replicas "$A,$B" --path /mcp "${PY_FLOW[@]}" \
    --answer "$PY_ANSWER" --expect 'hello, Ada' --count 6
else
  verdict FAIL "d2 restarted-replica-serves" "gw-a did not restart: $WAIT_REASON"
fi

# ---------------------------------------------------------------- verdict

summary cluster
