#!/usr/bin/env bash
# Real stdio MCP servers behind TWO gateway replicas (DESIGN §12, issue 24): the gateways
# spawn them (argv, no shell), pool them as legacy sessions, and serve modern (2026-07-28)
# clients and translated legacy (2025-11-25) clients from them, every HTTP request
# alternating between the replicas.
#
#   tests/interop/stdio.sh
#
#   clients ──▶ rr_proxy.py ──A,B,A,B…──▶ gw-a ──stdin/stdout──▶ its own children:
#               (per request)             gw-b ──stdin/stdout──▶   legacy_server.py --stdio  (/py)
#                                        (cluster)                 server-everything stdio   (/everything)
#                                                                  server-filesystem DIR     (/files)
#                                                                  fixture/server.py --stdio (/abandon)
#
# Upstreams (stdio, legacy; each replica spawns its own processes):
#   py          tests/interop/legacy_server.py --stdio on mcp==1.30.0 (FastMCP)
#   everything  @modelcontextprotocol/server-everything@2026.8.31 `stdio` (TS SDK v1)
#   files       @modelcontextprotocol/server-filesystem@2026.8.31 serving a temporary
#               directory with one file in it (its cwd), with an `env` that lists a plain
#               value and a value_env secret; process_idle_timeout_ms 3000 (10000 for the
#               others; py keeps one spare process)
# Replicas: two `sessionless --config` in cluster mode (same [[keys]] sealing key, same
# [cluster] secret; tests/cluster/lib.sh), commands given as absolute paths (the child's
# PATH is the gateway's, nothing else is inherited). In front: tests/interop/rr_proxy.py,
# each request to the next replica, with --states-log (which replica handed out each
# requestState) so every MRTR retry can be matched to the round that asked.
# Clients (real, unmodified SDKs; expectations from tests/interop/profiles.json):
#   py, ts          the modern py_client.py (mcp==2.3.0) and ts_client.mjs
#                   (@modelcontextprotocol/client@2.4.0), --mrtr: elicitation and sampling
#                   as input_required rounds; profiles py-legacy and everything (as over HTTP)
#   legacy-py, legacy-ts  legacy_client.py (mcp==1.30.0) and legacy_ts_client.mjs
#                   (@modelcontextprotocol/sdk@1.32.2), translated (a stdio route never pins
#                   a legacy client to a process); profiles py-legacy-translated and
#                   everything-translated
#   files           stdio_checks.py files: plain-HTTP 2026-07-28 calls to server-filesystem
#   cross           tests/cluster/rr_client.py flows: round 1 on one replica, its retry on the
#                   other, straight to the replicas (so the owner of the parked process is
#                   always the other one)
# Phases, one line per check (PASS|FAIL|SKIP|INFO <phase>:<what>):
#   direct    each server driven over stdio by stdio_direct.py, no gateway (the control:
#             a failure only here is the peer's or the machine's)
#   config    check-config shows the commands without env values or the secret;
#             check-config --probe starts each, initializes, lists its tools, stops it
#   rr        each client alone through the forwarder, per route; files
#   cross     10 flows per route with round 1 and the retry on different replicas
#   mixed     per route, all four clients at once through the forwarder; files again
#   abandon   four calls at once to gw-a for an upstream not started before (the
#             conformance fixture, route /abandon) whose clients leave while its processes
#             start (stdio_checks.py abandon): what was spawned for them must go like any
#             idle process (idle)
#   retries   every MRTR retry through the forwarder carried a state a replica handed out,
#             was answered 200, and per route some reached the other replica
#   rr:…      legacy sessions alternated over both replicas; answers to pushed questions
#             accepted (202), some on the replica not streaming the call
#   replicas  each replica's /metrics: modern requests served from a legacy upstream, legacy
#             requests translated (none relayed), questions pushed, no answer lost,
#             processes spawned (sessionless_stdio_spawns_total)
#   children  right after the mixed phase (and the files check again): the replicas' child
#             processes exist, none is a zombie, each leads its own process group, at most
#             max_processes per upstream, and each environment is exactly the listed
#             variables plus PATH, HOME, LANG, TMPDIR (no gateway secret, no value_env
#             source name)
#   idle      once nothing is in flight, every process is stopped and reaped after its
#             process_idle_timeout_ms (3 s files, 10 s py and everything) but the py spare
#   children  then SIGTERM: each replica exits 0 and no process that was below it is left
#             (pid + start time, and their process groups)
# Exit non-zero on any FAIL. A missing peer fails loudly.
#
# Environment:
#   SESSIONLESS_BIN    gateway binary (default target/debug/sessionless)
#   SESSIONLESS_PEERS  where scripts/setup-peers installs the peers (default .peers)
#   INTEROP_LOGDIR     keep process logs there (default: a temporary directory)
#   INTEROP_CLIENT_TIMEOUT  seconds per client run (default 180)
set -euo pipefail
cd "$(dirname "$0")/../.."
CLIENT_TIMEOUT="${INTEROP_CLIENT_TIMEOUT:-180}"
CLUSTER_LOGDIR="${INTEROP_LOGDIR:-${CLUSTER_LOGDIR:-}}"
# Logs, the cleanup traps (tests/lib/proc.sh), spawn/collect/summary (tests/lib/results.sh)
# and the cluster helpers: setup_peers, cluster_keys, replica_config, start_replica, wait_exit
SCENARIO=stdio
source tests/cluster/lib.sh
die() { echo "stdio-interop: $*" >&2; exit 1; }

# check TAG CMD... : a bounded checker run (output in $LOGDIR/check-N.out), its lines recorded
# with their own tag replaced by TAG.
CHECKS=0
check() {
  local tag="$1"; shift
  local rc=0 out="$LOGDIR/check-$((++CHECKS)).out"
  timeout -k 5 120 "$@" > "$out" 2>&1 || rc=$?
  sed -E "s/^(PASS|FAIL|SKIP|INFO) [a-z-]+:/\\1 $tag:/" "$out" | grep -E '^(PASS|FAIL|SKIP|INFO) ' | tee -a "$RESULTS" || true
  if (( rc != 0 )) && ! grep -q '^FAIL ' "$out"; then
    echo "FAIL $tag: checker exited $rc: $(tail -n 3 "$out" | tr '\n' ' ')" | tee -a "$RESULTS"
  fi
}

# ---------------------------------------------------------------- peers

setup_peers
FILESYSTEM="$SESSIONLESS_PEERS/node/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
TS_LEGACY_SDK="$SESSIONLESS_PEERS/node/node_modules/@modelcontextprotocol/sdk/package.json"
for f in "$FILESYSTEM" "$TS_LEGACY_SDK"; do [[ -e "$f" ]] || die "missing peer $f"; done
grep -q '"version": "1\.32\.2"' "$TS_LEGACY_SDK" || die "@modelcontextprotocol/sdk is not the pinned 1.32.2 ($TS_LEGACY_SDK)"
for p in server-everything server-filesystem; do
  grep -q '"version": "2026\.8\.31"' "$SESSIONLESS_PEERS/node/node_modules/@modelcontextprotocol/$p/package.json" \
    || die "@modelcontextprotocol/$p is not the pinned 2026.8.31"
done
# Absolute (the child gets no PATH of ours to search), symlinks kept: a venv python
# resolved to its base interpreter would lose the venv.
PY_LEGACY=$(realpath -s "$PY_LEGACY"); NODE=$(realpath -s "$NODE")
EVERYTHING=$(realpath -s "$EVERYTHING"); FILESYSTEM=$(realpath -s "$FILESYSTEM")
LEGACY_SERVER="$ROOT/tests/interop/legacy_server.py"
FIXTURE="$ROOT/tests/conformance/fixture/server.py"

# The directory server-filesystem serves, with one file in it.
FILES="$LOGDIR/files"
mkdir -p "$FILES"
printf 'hello from a file served over stdio\nsecond line\n' > "$FILES/note.txt"
FILES=$(realpath "$FILES")

# ---------------------------------------------------------------- direct: no gateway (control)

spawn direct-py "$PY_LEGACY" tests/interop/stdio_direct.py --label py --server-name sessionless-interop-legacy \
  --tools echo,add,progress,elicit_name,sample,roots --roots --elicit '{"user_name":"Ada"}' --sample 'hi there' \
  --call 'echo {"message":"hello"} =echo: hello' --call 'elicit_name {} =hello, Ada' \
  --call 'sample {"prompt":"greet"} =sampled: hi there' \
  --call 'roots {} =roots: file:///tmp/sessionless-interop (interop-root)' \
  -- "$PY_LEGACY" "$LEGACY_SERVER" --stdio
spawn direct-everything "$PY_LEGACY" tests/interop/stdio_direct.py --label everything --server-name mcp-servers/everything \
  --tools echo,get-sum,trigger-elicitation-request,trigger-sampling-request --roots \
  --elicit '{"name":"Ada"}' --sample 'hi there' \
  --call 'echo {"message":"hello"} =Echo: hello' \
  --call 'trigger-elicitation-request {} ~User provided the requested information' \
  --call 'trigger-sampling-request {"prompt":"greet","maxTokens":50} ~hi there' \
  -- "$NODE" "$EVERYTHING" stdio
spawn direct-files "$PY_LEGACY" tests/interop/stdio_direct.py --label files --server-name secure-filesystem-server \
  --tools read_text_file,list_directory \
  --call "list_directory {\"path\":\"$FILES\"} ~[FILE] note.txt" \
  --call "read_text_file {\"path\":\"$FILES/note.txt\"} ~hello from a file served over stdio" \
  -- "$NODE" "$FILESYSTEM" "$FILES"
for s in py everything files; do collect "direct-$s" direct; done

# ---------------------------------------------------------------- two replicas, shared keys

cluster_keys
# A secret the files server gets through value_env: its value must reach that child under
# the listed name, and nowhere else (never the source variable's name, nor the log).
SESSIONLESS_STDIO_TOKEN="stdio-token-$("$BIN" gen-key | tr -dc 'A-Za-z0-9' | head -c 24)"
export SESSIONLESS_STDIO_TOKEN
UPSTREAMS="[[upstreams]]
name = \"py\"
command = [\"$PY_LEGACY\", \"$LEGACY_SERVER\", \"--stdio\"]
max_processes = 8
process_idle_timeout_ms = 10000
start_timeout_ms = 30000
spare_processes = 1

[[upstreams]]
name = \"everything\"
command = [\"$NODE\", \"$EVERYTHING\", \"stdio\"]
env = { \"STDIO_INTEROP\" = { value = \"everything\" } }
max_processes = 8
process_idle_timeout_ms = 10000
start_timeout_ms = 30000

[[upstreams]]
name = \"files\"
command = [\"$NODE\", \"$FILESYSTEM\", \"$FILES\"]
cwd = \"$FILES\"
env = { \"STDIO_INTEROP\" = { value = \"files\" }, \"STDIO_INTEROP_TOKEN\" = { value_env = \"SESSIONLESS_STDIO_TOKEN\" } }
max_processes = 4
process_idle_timeout_ms = 3000
spare_processes = 0
start_timeout_ms = 30000

# Used only by the abandon phase: a command not started before (its first starts are
# one at a time), the conformance fixture so that its processes are told from py's.
[[upstreams]]
name = \"abandon\"
command = [\"$PY_LEGACY\", \"$FIXTURE\", \"--stdio\"]
max_processes = 4
process_idle_timeout_ms = 3000
start_timeout_ms = 30000

[[routes]]
path = \"/abandon\"
upstream = \"abandon\"

[[routes]]
path = \"/py\"
upstream = \"py\"

[[routes]]
path = \"/everything\"
upstream = \"everything\"

[[routes]]
path = \"/files\"
upstream = \"files\""
for r in a b; do
  replica_config "$r" "$UPSTREAMS" "drain_timeout_ms = 10000"
done

# ---------------------------------------------------------------- config: check-config shows, --probe starts

rc=0; "$BIN" check-config "$LOGDIR/gw-a.toml" > "$LOGDIR/check-config.out" 2>&1 || rc=$?
if (( rc != 0 )); then
  verdict FAIL config:check-config "exit $rc: $(tail -n 3 "$LOGDIR/check-config.out" | tr '\n' ' ')"
elif grep -qF "$SESSIONLESS_STDIO_TOKEN" "$LOGDIR/check-config.out"; then
  verdict FAIL config:check-config "the output shows the value_env secret's value ($LOGDIR/check-config.out)"
elif ! grep -qF "$FILESYSTEM" "$LOGDIR/check-config.out" || ! grep -qF "$LEGACY_SERVER" "$LOGDIR/check-config.out"; then
  verdict FAIL config:check-config "the output does not show the commands ($LOGDIR/check-config.out)"
elif grep -qE 'STDIO_INTEROP=(files|everything)' "$LOGDIR/check-config.out"; then
  verdict FAIL config:check-config "the output shows an env value ($LOGDIR/check-config.out)"
else
  verdict PASS config:check-config "the three commands shown, env values and the secret not"
fi
# In a session of its own: whatever the probe started and left running is found by its sid.
rc=0; setsid timeout 120 "$BIN" check-config "$LOGDIR/gw-a.toml" --probe > "$LOGDIR/check-config-probe.out" 2>&1 < /dev/null &
probe_sid=$!
wait "$probe_sid" || rc=$?
probe_left=$(ps -s "$probe_sid" -o pid=,args= 2>/dev/null | cut -c1-160 || true)
if [[ -n "$probe_left" ]]; then
  verdict FAIL config:probe "processes the probe started are still running: $(tr '\n' ';' <<<"$probe_left")"
  ps -s "$probe_sid" -o pid= | xargs -r kill -KILL 2>/dev/null || true
elif (( rc != 0 )); then
  verdict FAIL config:probe "exit $rc: $(tail -n 5 "$LOGDIR/check-config-probe.out" | tr '\n' ' ')"
elif ! grep -q 'read_text_file' "$LOGDIR/check-config-probe.out" || ! grep -q 'elicit_name' "$LOGDIR/check-config-probe.out" \
    || ! grep -q 'get-sum' "$LOGDIR/check-config-probe.out"; then
  verdict FAIL config:probe "the tools of the three servers are not listed ($LOGDIR/check-config-probe.out)"
else
  verdict PASS config:probe "each server started, initialized and listed its tools, and nothing it started is left"
fi

for r in a b; do start_replica "$r" || die "replica gw-$r: $WAIT_REASON"; done
# The replica's own pid (setsid may have forked): the process whose children are the servers.
for r in a b; do
  [[ "$(readlink -f "/proc/${PID_GW[$r]}/exe")" == "$(realpath "$BIN")" ]] \
    || die "gw-$r: pid ${PID_GW[$r]} is not the gateway ($(readlink -f "/proc/${PID_GW[$r]}/exe"))"
done

RR=$(free_port)
start rr-proxy python3 tests/interop/rr_proxy.py --port "$RR" \
  --backend "127.0.0.1:${PUBLIC[a]}" --backend "127.0.0.1:${PUBLIC[b]}" \
  --log "$LOGDIR/rr.log" --states-log "$LOGDIR/rr-states.log"
wait_http rr-proxy "$LAST_PID" "http://127.0.0.1:$RR/healthz" 30 200 || die "round-robin forwarder: $WAIT_REASON"
echo "replicas gw-a 127.0.0.1:${PUBLIC[a]} (pid ${PID_GW[a]}), gw-b 127.0.0.1:${PUBLIC[b]} (pid ${PID_GW[b]});" \
  "round-robin forwarder 127.0.0.1:$RR; served directory $FILES (logs in $LOGDIR)"

declare -A ROUTE=([py]=/py [everything]=/everything)
declare -A MODERN_PROFILE=([py]=py-legacy [everything]=everything)
declare -A LEGACY_PROFILE=([py]=py-legacy-translated [everything]=everything-translated)
rr_seq() { wc -l < "$LOGDIR/rr.log" 2>/dev/null || echo 0; }

# client KIND UP LABEL: spawns one client of KIND (py, ts, legacy-py, legacy-ts) on route UP.
client() {
  local kind="$1" up="$2" label="$3" url="http://127.0.0.1:$RR${ROUTE[$2]}"
  case "$kind" in
    py) spawn "$label" "$PY_MODERN" tests/interop/py_client.py --url "$url" --upstream "${MODERN_PROFILE[$up]}" --mrtr ;;
    ts) spawn "$label" "$NODE" tests/interop/ts_client.mjs --url "$url" --upstream "${MODERN_PROFILE[$up]}" --mrtr ;;
    legacy-py) spawn "$label" "$PY_LEGACY" tests/interop/legacy_client.py --url "$url" \
                 --upstream "${LEGACY_PROFILE[$up]}" --label "legacy-py/${LEGACY_PROFILE[$up]}" ;;
    legacy-ts) spawn "$label" "$NODE" tests/interop/legacy_ts_client.mjs --url "$url" \
                 --upstream "${LEGACY_PROFILE[$up]}" --label "legacy-ts/${LEGACY_PROFILE[$up]}" ;;
  esac
}

# ---------------------------------------------------------------- rr: each client alone

RR_FIRST=$(( $(rr_seq) + 1 ))
for up in py everything; do
  for kind in py ts legacy-py legacy-ts; do
    client "$kind" "$up" "rr-$kind-$up"
    collect "rr-$kind-$up" rr
  done
done
check rr python3 tests/interop/stdio_checks.py files --url "http://127.0.0.1:$RR/files" --dir "$FILES" --file note.txt
RR_LAST=$(rr_seq)

# ---------------------------------------------------------------- cross: round 1 and retry on different replicas

REPLICAS="127.0.0.1:${PUBLIC[a]},127.0.0.1:${PUBLIC[b]}"
scenario cross:py/elicitation "$ROOT/tests/cluster/rr_client.py" cross-py flows --replicas "$REPLICAS" --path /py \
  --tool elicit_name --args '{}' --answer '{"user_name": "Ada"}' --expect 'hello, Ada' --count 10
scenario cross:everything/elicitation "$ROOT/tests/cluster/rr_client.py" cross-everything flows --replicas "$REPLICAS" \
  --path /everything --tool trigger-elicitation-request --args '{}' --answer '{"name": "Ada"}' \
  --expect 'User provided the requested information' --count 10

# ---------------------------------------------------------------- mixed: all four clients at once

MIXED_FIRST=$(( $(rr_seq) + 1 ))
for up in py everything; do
  for kind in py ts legacy-py legacy-ts; do client "$kind" "$up" "mixed-$kind-$up"; done
  for kind in py ts legacy-py legacy-ts; do collect "mixed-$kind-$up" mixed; done
done
check mixed python3 tests/interop/stdio_checks.py files --url "http://127.0.0.1:$RR/files" --dir "$FILES" --file note.txt

# ---------------------------------------------------------------- children: while they serve

# Right away, before their idle timeouts: every upstream has processes below the replicas.
check children python3 tests/interop/stdio_checks.py snapshot --out "$LOGDIR/children.json" \
  --gateway "gw-a=${PID_GW[a]}" --gateway "gw-b=${PID_GW[b]}" \
  --match "py=$LEGACY_SERVER" --match "everything=$EVERYTHING" --match "files=$FILESYSTEM" \
  --match "abandon=$FIXTURE" --max py=8 --max everything=8 --max files=4 --max abandon=4 \
  --env "everything:STDIO_INTEROP=everything" --env "files:STDIO_INTEROP=files" \
  --env "files:STDIO_INTEROP_TOKEN=$SESSIONLESS_STDIO_TOKEN" \
  --secret "$SESSIONLESS_CLUSTER_TEST_KEY" --secret "$SESSIONLESS_CLUSTER_TEST_SECRET" \
  --need py --need everything --need files

# ---------------------------------------------------------------- abandon: starts whose clients left

# Four calls at once straight to gw-a (so that they meet on one replica) for an upstream
# never started before, whose clients leave after 0.2 s while its processes still start.
# What the gateway spawned for them must be stopped like any other (idle, below).
check abandon python3 tests/interop/stdio_checks.py abandon --url "http://127.0.0.1:${PUBLIC[a]}/abandon" \
  --tool test_simple_text --caps '{"roots": {}}' --count 4 --after 0.2

# ---------------------------------------------------------------- what the forwarder saw

check retries:rr python3 tests/interop/stdio_checks.py retries --log "$LOGDIR/rr.log" --states "$LOGDIR/rr-states.log" \
  --path /py --path /everything --first "$RR_FIRST" --last "$RR_LAST"
check retries:mixed python3 tests/interop/stdio_checks.py retries --log "$LOGDIR/rr.log" --states "$LOGDIR/rr-states.log" \
  --path /py --path /everything --first "$MIXED_FIRST"
check rr python3 tests/interop/legacy_modern.py rr --log "$LOGDIR/rr.log" \
  --replica "127.0.0.1:${PUBLIC[a]}" --replica "127.0.0.1:${PUBLIC[b]}"

# ---------------------------------------------------------------- replicas: /metrics

# metrics PORT: "<modern from legacy> <legacy translated> <legacy relayed> <pushed> <forwarded>
#   <received> <lost> <spawns ok> <spawns not ok>" and, on the next line, the stdio series.
metrics() {
  curl -s -m 5 "http://127.0.0.1:$1/metrics" | python3 -c '
import collections, re, sys
n = collections.Counter()
stdio = []
for line in sys.stdin:
    m = re.match(r"^(\w+)\{([^}]*)\} (\S+)$", line.strip())
    if not m:
        continue
    name, v = m.group(1), float(m.group(3))
    labels = dict(re.findall(r"(\w+)=\"([^\"]*)\"", m.group(2)))
    if name == "sessionless_requests_total" and labels.get("method") != "invalid":
        if labels.get("generation") == "modern" and labels.get("upstream") == "legacy":
            n["modern"] += v
        elif labels.get("generation") == "legacy":
            n["relayed" if labels.get("outcome") == "forwarded" else "translated"] += v
    elif name == "sessionless_legacy_questions_pushed_total":
        n["pushed"] += v
    elif name == "sessionless_legacy_answers_routed_total":
        reason = labels.get("reason")
        n[reason if reason in ("here", "forwarded", "received") else "lost"] += v
    elif name == "sessionless_stdio_spawns_total":
        n["spawn_ok" if labels.get("outcome") == "started" else "spawn_other"] += v
        stdio.append(f"spawns{{{m.group(2)}}}={int(v)}")
    elif name == "sessionless_stdio_processes":
        stdio.append(f"processes{{{m.group(2)}}}={int(v)}")
print(*(int(n[k]) for k in ("modern", "translated", "relayed", "pushed", "forwarded", "received", "lost", "spawn_ok", "spawn_other")))
print(" ".join(stdio) or "none")'
}
declare -A FWD RCV
for r in a b; do
  out=$(metrics "${PUBLIC[$r]}") || { verdict FAIL "replicas:gw-$r" "no /metrics"; continue; }
  read -r modern translated relayed pushed fwd rcv lost spawn_ok spawn_other <<<"$(head -n 1 <<<"$out")"
  echo "INFO replicas:gw-$r/stdio: $(tail -n 1 <<<"$out")" | tee -a "$RESULTS"
  FWD[$r]=$fwd; RCV[$r]=$rcv
  detail="$modern modern requests served from the stdio upstreams; $translated legacy requests translated, $relayed relayed; $pushed questions pushed; answers: $fwd forwarded, $rcv received, $lost lost; $spawn_ok processes started, $spawn_other spawns failed (exited, start_timeout, spawn_error, refused, backoff)"
  if (( modern > 0 && translated > 0 && relayed == 0 && pushed > 0 && lost == 0 && spawn_ok > 0 && spawn_other == 0 )); then
    verdict PASS "replicas:gw-$r" "$detail"
  else
    verdict FAIL "replicas:gw-$r" "$detail (log $LOGDIR/gw-$r.log)"
  fi
done
if (( ${FWD[a]:-0} + ${FWD[b]:-0} > 0 && ${RCV[a]:-0} + ${RCV[b]:-0} == ${FWD[a]:-0} + ${FWD[b]:-0} )); then
  verdict PASS replicas:answers-forwarded "$(( FWD[a] + FWD[b] )) legacy answers forwarded between the replicas, as many received"
else
  verdict FAIL replicas:answers-forwarded "forwarded a ${FWD[a]:-?} b ${FWD[b]:-?}, received a ${RCV[a]:-?} b ${RCV[b]:-?}"
fi

# ---------------------------------------------------------------- children: before and after the replicas stop

# ---------------------------------------------------------------- idle: every process stopped but the spare

# Nothing is in flight now. Every process is stopped once idle (process_idle_timeout_ms:
# 3 s for files, 10 s for py and everything), the one py spare per replica kept; a process
# left beyond that (one that never started serving, say) holds a place of max_processes.
# A legacy client's GET stream held through the forwarder ends at the gateway's next
# keep-alive write (15 s) after the client left, and its process then: 60 s covers two
# keep-alives and the idle timeout, and is far below the pool's (300 s), so a process
# that is never stopped still fails here.
declare -A IDLE_KEEP=([py]=1 [everything]=0 [files]=0 [abandon]=0)
declare -A IDLE_LEFT
idle_t0=$SECONDS
while :; do
  settled=1
  while read -r up na nb; do
    IDLE_LEFT[$up]="$na $nb"
    (( na <= IDLE_KEEP[$up] && nb <= IDLE_KEEP[$up] )) || settled=0
  done < <(python3 tests/interop/stdio_checks.py count --gateway "a=${PID_GW[a]}" --gateway "b=${PID_GW[b]}" \
             --match "py=$LEGACY_SERVER" --match "everything=$EVERYTHING" --match "files=$FILESYSTEM" \
             --match "abandon=$FIXTURE" | tee -a "$LOGDIR/idle.log")
  (( settled || SECONDS - idle_t0 >= 60 )) && break
  sleep 0.5
done
for up in py everything files abandon; do
  read -r na nb <<<"${IDLE_LEFT[$up]}"
  if (( na <= IDLE_KEEP[$up] && nb <= IDLE_KEEP[$up] )); then
    verdict PASS "idle:$up" "processes left once idle: gw-a $na, gw-b $nb (spares kept: ${IDLE_KEEP[$up]}; settled after $((SECONDS - idle_t0)) s)"
  else
    verdict FAIL "idle:$up" "processes left 60 s after the flows ended: gw-a $na, gw-b $nb (at most ${IDLE_KEEP[$up]} spare each; $LOGDIR/idle.log, /metrics sessionless_stdio_processes, $LOGDIR/gw-*.log)"
  fi
done

# What is below the replicas now (spares, and whatever else is left), for the check after
# SIGTERM together with the first snapshot.
python3 tests/interop/stdio_checks.py snapshot --save-only --out "$LOGDIR/children-at-stop.json" \
  --gateway "gw-a=${PID_GW[a]}" --gateway "gw-b=${PID_GW[b]}" \
  --match "py=$LEGACY_SERVER" --match "everything=$EVERYTHING" --match "files=$FILESYSTEM" --match "abandon=$FIXTURE"
for r in a b; do
  kill -TERM "${PID_GW[$r]}" 2>/dev/null || true
done
for r in a b; do
  if wait_exit "${PID_GW[$r]}" 30; then
    if [[ "$EXIT_STATUS" == 0 ]]; then
      verdict PASS "children:gw-$r/stopped" "SIGTERM: exited 0 after ${EXIT_AFTER}s"
    else
      verdict FAIL "children:gw-$r/stopped" "SIGTERM: exited $EXIT_STATUS (log $LOGDIR/gw-$r.log)"
    fi
  else
    verdict FAIL "children:gw-$r/stopped" "still running 30 s after SIGTERM"
  fi
done
check children python3 tests/interop/stdio_checks.py gone --snapshot "$LOGDIR/children.json" \
  --snapshot "$LOGDIR/children-at-stop.json" --wait 5
if grep -qF "$SESSIONLESS_STDIO_TOKEN" "$LOGDIR"/gw-*.log; then
  verdict FAIL secrets:logs "the value_env secret's value is in a gateway log"
else
  verdict PASS secrets:logs "the value_env secret's value is in no gateway log"
fi

# ---------------------------------------------------------------- verdict

summary stdio-interop
