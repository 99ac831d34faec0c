#!/usr/bin/env bash
# Legacy (2025-11-25 session) clients in front of a 2026-07-28-ONLY upstream (DESIGN §9, cell
# "legacy client -> modern upstream"; issue 12): the gateway answers `initialize` itself and
# sends every request upstream as a stateless 2026-07-28 call; an upstream `input_required`
# becomes server requests pushed on the client's SSE answer, answered by the client's POSTs,
# which may reach the other replica.
#
#   tests/interop/legacy_modern.sh
#
#   legacy clients ─▶ rr_proxy.py ─A,B,A,B…─▶ gw-a, gw-b ─▶ filter-1 ─▶ SDK v2 everything-server #1
#                     (per request)          (cluster)  └─▶ filter-2 ─▶ SDK v2 everything-server #2
#
# Upstream: two instances (one [[upstreams]] entry, urls = [filter-1, filter-2]) of the
# mcp==2.3.0 everything-server, each behind `rr_proxy.py --modern-only`: a 2026-only server
# (initialize and any non-2026-07-28 request refused 400 -32022/-32020, GET/DELETE 405,
# server/discover listing only 2026-07-28) whose log is the upstream's wire log.
# Replicas: two `sessionless --config` processes in cluster mode (same sealing key and
# internal secret, as tests/cluster/run.sh), `generation` left at auto (the probe finds the
# upstream 2026-only). In front: rr_proxy.py, each HTTP request to the next replica.
# Clients (real, unmodified SDKs; profile "modern-only" in profiles.json):
#   legacy-py  tests/interop/legacy_client.py on mcp==1.30.0 (elicitation, sampling, roots callbacks)
#   legacy-ts  tests/interop/legacy_ts_client.mjs on @modelcontextprotocol/sdk@1.32.2 (the same)
# Checks, one line each (PASS|FAIL|SKIP <phase>:<what>):
#   control    the filter refuses a legacy client outright and serves 2026-07-28 (no gateway),
#              and the gateway's probe (check-config --probe) finds the upstream modern
#   rr         both legacy clients at once through the forwarder: every flow of the profile,
#              among them elicitation, sampling, roots, two rounds, three questions in one
#              round, and setLevel/subscribe refused as JSON-RPC errors (not carried)
#   wire       the filters' logs: no initialize, no session id, nothing refused, both
#              instances used, each retry on the instance that asked, retries carrying
#              inputResponses/requestState
#   rr:…       every legacy session alternated over both replicas; the client's answers were
#              accepted (202), some on the replica not streaming the call (forwarded)
#   replicas   each replica's /metrics: legacy requests translated (none relayed), questions
#              pushed, no answer lost; answers forwarded between them, as many received
# Exit non-zero on any FAIL. A missing peer fails loudly.
#
# Environment:
#   SESSIONLESS_BIN    gateway binary (default target/debug/sessionless)
#   SESSIONLESS_PEERS  where scripts/setup-peers installs the peers (default .peers)
#   INTEROP_LOGDIR     keep process logs there (default: a temporary directory)
#   INTEROP_CLIENT_TIMEOUT  seconds per client run (default 120)
set -euo pipefail
cd "$(dirname "$0")/../.."
CLIENT_TIMEOUT="${INTEROP_CLIENT_TIMEOUT:-120}"
CLUSTER_LOGDIR="${INTEROP_LOGDIR:-${CLUSTER_LOGDIR:-}}"
# Logs, the cleanup traps (tests/lib/proc.sh), spawn/collect/summary (tests/lib/results.sh)
# and the cluster helpers: setup_peers, cluster_keys, replica_config, start_replica
SCENARIO=legacy-modern
source tests/cluster/lib.sh
die() { echo "legacy-modern: $*" >&2; exit 1; }

# check TAG CMD... : a bounded checker run (legacy_modern.py), its lines recorded under TAG.
check() {
  local tag="$1"; shift
  local rc=0
  timeout -k 5 60 "$@" > "$LOGDIR/check-$tag.out" 2>&1 || rc=$?
  sed -E "s/^(PASS|FAIL|SKIP|INFO) legacy-modern:/\\1 $tag:/" "$LOGDIR/check-$tag.out" | grep -E '^(PASS|FAIL|SKIP|INFO) ' | tee -a "$RESULTS" || true
  if (( rc != 0 )) && ! grep -q '^FAIL ' "$LOGDIR/check-$tag.out"; then
    echo "FAIL $tag: checker exited $rc: $(tail -n 3 "$LOGDIR/check-$tag.out" | tr '\n' ' ')" | tee -a "$RESULTS"
  fi
}

# ---------------------------------------------------------------- peers

setup_peers
EVERYTHING_PY="$SESSIONLESS_PEERS/sdist/mcp-2.3.0/examples/servers/everything-server"
TS_LEGACY_SDK="$SESSIONLESS_PEERS/node/node_modules/@modelcontextprotocol/sdk/package.json"
for f in "$EVERYTHING_PY/mcp_everything_server/server.py" "$TS_LEGACY_SDK"; do [[ -e "$f" ]] || die "missing peer $f"; done
grep -q '"version": "1\.32\.2"' "$TS_LEGACY_SDK" || die "@modelcontextprotocol/sdk is not the pinned 1.32.2 ($TS_LEGACY_SDK)"

# ---------------------------------------------------------------- two 2026-only upstream instances

declare -A UP FILTER
for i in 1 2; do
  UP[$i]=$(free_port); FILTER[$i]=$(free_port)
  start "sdk2-$i" bash -c 'cd "$1" && exec "$2" -m mcp_everything_server --port "$3"' _ "$EVERYTHING_PY" "$PY_MODERN" "${UP[$i]}"
  wait_http "sdk2-$i" "$LAST_PID" "http://127.0.0.1:${UP[$i]}/mcp" 30 || die "SDK v2 everything-server #$i: $WAIT_REASON"
  : > "$LOGDIR/wire-$i.log"
  start "filter-$i" python3 tests/interop/rr_proxy.py --modern-only --port "${FILTER[$i]}" \
    --backend "127.0.0.1:${UP[$i]}" --log "$LOGDIR/wire-$i.log"
  wait_http "filter-$i" "$LAST_PID" "http://127.0.0.1:${FILTER[$i]}/mcp" 30 405 || die "2026-only filter #$i: $WAIT_REASON"
done

# ---------------------------------------------------------------- control: the filter alone

check control:filter python3 tests/interop/legacy_modern.py filter --url "http://127.0.0.1:${FILTER[1]}/mcp"

# ---------------------------------------------------------------- two replicas, shared keys

cluster_keys
for r in a b; do
  replica_config "$r" "[[upstreams]]
name = \"modern-only\"
urls = [\"http://127.0.0.1:${FILTER[1]}/mcp\", \"http://127.0.0.1:${FILTER[2]}/mcp\"]

[[routes]]
path = \"/mcp\"
upstream = \"modern-only\""
done

# The gateway's own probe of the upstream (a server/discover to each instance): modern.
probe=$(timeout 30 "$BIN" check-config "$LOGDIR/gw-a.toml" --probe 2>/dev/null | grep '^/mcp ' || true)
if [[ "$probe" == *": modern"* ]]; then
  echo "PASS control:probe: $probe" | tee -a "$RESULTS"
else
  echo "FAIL control:probe: check-config --probe printed '${probe:-nothing}', not modern" | tee -a "$RESULTS"
fi
# From here on the wire logs hold only what the gateway sends.
for i in 1 2; do : > "$LOGDIR/wire-$i.log"; done

for r in a b; do start_replica "$r" || die "replica gw-$r: $WAIT_REASON"; done

RR=$(free_port)
start rr-proxy python3 tests/interop/rr_proxy.py --port "$RR" \
  --backend "127.0.0.1:${PUBLIC[a]}" --backend "127.0.0.1:${PUBLIC[b]}" --log "$LOGDIR/rr.log"
wait_http rr-proxy "$LAST_PID" "http://127.0.0.1:$RR/healthz" 30 200 || die "round-robin forwarder: $WAIT_REASON"
echo "upstream instances: SDK v2 127.0.0.1:${UP[1]} and :${UP[2]} behind 2026-only filters :${FILTER[1]} and :${FILTER[2]};" \
  "replicas gw-a 127.0.0.1:${PUBLIC[a]}, gw-b :${PUBLIC[b]}; round-robin forwarder :$RR (logs in $LOGDIR)"

# ---------------------------------------------------------------- rr: both legacy clients at once

url="http://127.0.0.1:$RR/mcp"
spawn rr-legacy-py "$PY_LEGACY" tests/interop/legacy_client.py --url "$url" --upstream modern-only --label legacy-py/modern-only
spawn rr-legacy-ts "$NODE" tests/interop/legacy_ts_client.mjs --url "$url" --upstream modern-only --label legacy-ts/modern-only
collect rr-legacy-py rr
collect rr-legacy-ts rr

# ---------------------------------------------------------------- what went upstream, and where

check wire python3 tests/interop/legacy_modern.py wire --expect-retries --log "$LOGDIR/wire-1.log" --log "$LOGDIR/wire-2.log"
check rr python3 tests/interop/legacy_modern.py rr --log "$LOGDIR/rr.log" \
  --replica "127.0.0.1:${PUBLIC[a]}" --replica "127.0.0.1:${PUBLIC[b]}"

# What each replica's /metrics counted: legacy requests for a modern upstream, none relayed
# (outcome "forwarded" is the relaying cell's), questions pushed, and the client's answers
# by how they were routed (here, forwarded to the replica holding the stream, received
# from the other one; no_round, owner_gone, no_owner: lost).
metrics() { # metrics PORT: "<translated> <relayed> <pushed> <here> <forwarded> <received> <lost>"
  curl -s -m 5 "http://127.0.0.1:$1/metrics" | python3 -c '
import collections, re, sys
n = collections.Counter()
for line in sys.stdin:
    m = re.match(r"^(\w+)\{([^}]*)\} (\S+)$", line.strip())
    if not m:
        continue
    name, v = m.group(1), float(m.group(3))
    labels = dict(re.findall(r"(\w+)=\"([^\"]*)\"", m.group(2)))
    if name == "sessionless_requests_total" and labels.get("generation") == "legacy" and labels.get("upstream") == "modern":
        n["relayed" if labels.get("outcome") == "forwarded" else "translated"] += v
    elif name == "sessionless_legacy_questions_pushed_total":
        n["pushed"] += v
    elif name == "sessionless_legacy_answers_routed_total":
        reason = labels.get("reason")
        n[reason if reason in ("here", "forwarded", "received") else "lost"] += v
print(*(int(n[k]) for k in ("translated", "relayed", "pushed", "here", "forwarded", "received", "lost")))'
}
declare -A FWD RCV
for r in a b; do
  read -r translated relayed pushed here fwd rcv lost < <(metrics "${PUBLIC[$r]}") \
    || { echo "FAIL replicas:gw-$r: no /metrics" | tee -a "$RESULTS"; continue; }
  FWD[$r]=$fwd; RCV[$r]=$rcv
  detail="$translated legacy requests translated, $relayed relayed; $pushed questions pushed; answers: $here here, $fwd forwarded, $rcv received, $lost lost"
  if (( translated > 0 && relayed == 0 && pushed > 0 && lost == 0 )); then
    echo "PASS replicas:gw-$r: $detail" | tee -a "$RESULTS"
  else
    echo "FAIL replicas:gw-$r: $detail (log $LOGDIR/gw-$r.log)" | tee -a "$RESULTS"
  fi
done
if (( ${FWD[a]:-0} + ${FWD[b]:-0} > 0 && ${RCV[a]:-0} + ${RCV[b]:-0} == ${FWD[a]:-0} + ${FWD[b]:-0} )); then
  echo "PASS replicas:answers-forwarded: $(( FWD[a] + FWD[b] )) answers forwarded between the replicas, as many received" | tee -a "$RESULTS"
else
  echo "FAIL replicas:answers-forwarded: forwarded a ${FWD[a]:-?} b ${FWD[b]:-?}, received a ${RCV[a]:-?} b ${RCV[b]:-?}" | tee -a "$RESULTS"
fi

# ---------------------------------------------------------------- verdict

summary legacy-modern
