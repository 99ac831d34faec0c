#!/usr/bin/env bash
# Several instances of one upstream, with real processes: two instances of a legacy
# MCP server (tests/interop/legacy_server.py on mcp==1.30.0, tool elicit_name) behind
# two `sessionless --config` replicas in cluster mode (shared sealing key and
# internal-listener secret), each with one route /mcp to the upstream
# `urls = [instance 1, instance 2]`, generation "legacy". Driven over raw HTTP by
# tests/cluster/rr_client.py (MRTR flows, 2026-07-28) and
# tests/cluster/instances_client.py (2025-11-25 legacy sessions, /metrics).
#
#   tests/cluster/instances.sh
#
# Scenarios (one PASS/FAIL line each):
#   1a 20 MRTR flows, round 1 on one replica, the retry on the other: all complete
#   1b 20 legacy sessions, initialize on one replica, tools/list + tools/call on the
#      other: all complete
#   1c /metrics (sessionless_upstream_requests_total{instance}): every replica sent
#      requests to both instances, each instance took at least a fifth of them
#   2a 10 flows parked (round 1 only) and 10 legacy sessions opened, then instance 1
#      killed (kill -9)
#   2b each parked flow retried and each session used on the other replica: each
#      completes (held by instance 2) or ends with the clear error (flow: 400 -32602
#      flow_lost|instance_unreachable; session: 404 -32001 with the request's id), at
#      least one of each for both kinds, nothing else, no hang
#   2c 20 new flows and 2d 5 new legacy sessions: all complete
#   2e since 2b, instance 1 answered nothing (counted for failed attempts at most),
#      instance 2 took the work; sessionless_upstream_instance_up is 0 for instance 1
#      and 1 for instance 2 on both replicas
#   3a instance 1 restarted on its port: instance_up back to 1 on both replicas (the
#      background probe) within 10 s
#   3b 10 flows and 3c 10 legacy sessions complete, 3d spread over both instances again
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
SCENARIO=instances
source tests/cluster/lib.sh

setup_peers

# ---------------------------------------------------------------- two instances

declare -A UP_PORT UP_URL PID_UP
# start_instance N: instance N of the legacy upstream on UP_PORT[N], up and answering
start_instance() {
  local n="$1"
  echo "--- start $(date +%T) ---" >> "$LOGDIR/instance-$n.log"
  start "instance-$n" "$PY_LEGACY" tests/interop/legacy_server.py --port "${UP_PORT[$n]}"
  PID_UP[$n]=$LAST_PID
  wait_http "instance-$n" "${PID_UP[$n]}" "${UP_URL[$n]}" 30
}
for n in 1 2; do
  UP_PORT[$n]=$(free_port)
  UP_URL[$n]="http://127.0.0.1:${UP_PORT[$n]}/mcp"
  start_instance "$n" || die "upstream instance $n: $WAIT_REASON"
done
INSTANCES="${UP_URL[1]},${UP_URL[2]}"

# ---------------------------------------------------------------- two replicas

cluster_keys
for r in a b; do
  replica_config "$r" "$(cat <<EOF
[[upstreams]]
name = "py"
urls = ["${UP_URL[1]}", "${UP_URL[2]}"]
generation = "legacy"

[[routes]]
path = "/mcp"
upstream = "py"
EOF
)"
  start_replica "$r" || die "replica gw-$r: $WAIT_REASON"
done
A="127.0.0.1:${PUBLIC[a]}"; B="127.0.0.1:${PUBLIC[b]}"
echo "instances: 1 ${UP_URL[1]}, 2 ${UP_URL[2]}; replicas gw-a $A (internal ${INTERNAL[a]}), gw-b $B (internal ${INTERNAL[b]}); logs in $LOGDIR"

RR=tests/cluster/rr_client.py
IC=tests/cluster/instances_client.py
FLOW=(--path /mcp --tool elicit_name --args '{}')
ANSWER='{"user_name": "Ada"}'
EXPECT='hello, Ada'

# snapshot FILE: the upstream request counters now (for a later spread/moved check)
snapshot() {
  run_step "$IC" "snapshot-$1" snapshot --replicas "$A,$B" --save "$LOGDIR/$1" > /dev/null \
    || verdict FAIL "metrics snapshot $1" "${STEP_OUT#FAIL snapshot-$1: }"
}

# ---------------------------------------------------------------- 1: work spread over both instances

snapshot m1.json
scenario "1a flows" "$RR" 1a flows --replicas "$A,$B" "${FLOW[@]}" --answer "$ANSWER" --expect "$EXPECT" --count 20
scenario "1b legacy-sessions" "$IC" 1b sessions --replicas "$A,$B" --path /mcp --count 20
scenario "1c spread-over-instances" "$IC" 1c spread --replicas "$A,$B" --instances "$INSTANCES" --since "$LOGDIR/m1.json"

# ---------------------------------------------------------------- 2: instance 1 killed with work held

if run_step "$IC" 2a park --replicas "$A,$B" "${FLOW[@]}" --flows 10 --sessions 10 --save "$LOGDIR/held.json"; then
  verdict PASS "2a hold-work" "${STEP_OUT#PASS 2a: }"
  { kill -KILL "${PID_UP[1]}"; wait_exit "${PID_UP[1]}" 10; } 2>/dev/null || die "instance 1 survived kill -9"
  echo "  instance 1 killed (-9)"
  scenario "2b held-work-settles" "$IC" 2b settle --replicas "$A,$B" --load "$LOGDIR/held.json" \
    --answer "$ANSWER" --expect "$EXPECT"
else
  verdict FAIL "2a hold-work" "${STEP_OUT#FAIL 2a: }"
  kill -KILL "${PID_UP[1]}" 2>/dev/null || true
  wait_exit "${PID_UP[1]}" 10 || true
fi
snapshot m2.json
scenario "2c new-flows" "$RR" 2c flows --replicas "$A,$B" "${FLOW[@]}" --answer "$ANSWER" --expect "$EXPECT" --count 20
scenario "2d new-legacy-sessions" "$IC" 2d sessions --replicas "$A,$B" --path /mcp --count 5
# 20 flows (round 1 and the answer: two upstream requests each at least) and 5
# sessions (initialize, tools/list, tools/call: three each at least)
scenario "2e dead-instance-skipped" "$IC" 2e moved --replicas "$A,$B" --instances "${UP_URL[1]},${UP_URL[2]}" \
  --since "$LOGDIR/m2.json" --min-live 55 --wait 5

# ---------------------------------------------------------------- 3: instance 1 back

if start_instance 1; then
  scenario "3a instance-back-up" "$IC" 3a up --replicas "$A,$B" --instances "$INSTANCES" --wait 10
  snapshot m3.json
  scenario "3b flows" "$RR" 3b flows --replicas "$A,$B" "${FLOW[@]}" --answer "$ANSWER" --expect "$EXPECT" --count 10
  scenario "3c legacy-sessions" "$IC" 3c sessions --replicas "$A,$B" --path /mcp --count 10
  scenario "3d spread-again" "$IC" 3d spread --replicas "$A,$B" --instances "$INSTANCES" --since "$LOGDIR/m3.json"
else
  verdict FAIL "3a instance-back-up" "instance 1 did not restart on port ${UP_PORT[1]}: $WAIT_REASON"
fi

# ---------------------------------------------------------------- verdict

summary instances
