#!/usr/bin/env bash
# Profiles a proxy under load with valgrind's callgrind (perf may be
# unavailable in containers): the gateway, or nginx relaying the same
# requests, so that the gateway's instructions per request have nginx's
# beside them. Starts the upstream natively and the proxy under callgrind,
# drives it with examples/loadgen for a bounded time, stops it, and writes the
# annotated profiles to bench/out/profile-<ts>/. Callgrind counts user-space
# instructions: they repeat from run to run even on a loaded machine.
#
#   bench/profile.sh                   # stateless tools/call echo, concurrency 8, 20 s
#   PROFILE_MODE=mrtr bench/profile.sh # ask_user question + retry
#   PROFILE_MODE=legacy bench/profile.sh # a legacy client's echo through the legacy relay
#   PROFILE_UPSTREAM=modern bench/profile.sh # stateless echo through the pass-through
#                                            # (the built-in server with --generation modern)
#   PROFILE_UPSTREAM=fast bench/profile.sh   # the translating path in front of
#                                            # examples/fast_upstream.rs (its legacy server)
#   PROFILE_UPSTREAM=fast PROFILE_TARGET=nginx bench/profile.sh
#                                            # nginx (bench/nginx.conf, as bench/run.sh starts it,
#                                            # master and workers) in front of the same server
#   PROFILE_UPSTREAM=fast PROFILE_TARGET=both bench/profile.sh
#                                            # the gateway, then nginx: both figures at the end
#
# Knobs: PROFILE_TARGET (gateway | nginx | both), PROFILE_MODE (modern |
# mrtr | principals | legacy; for nginx the request it relays: legacy on a
# legacy upstream, modern on a 2026 one, which is what bench/run.sh sends
# nginx), PROFILE_UPSTREAM (legacy | modern: the built-in server of that
# generation; fast | fast-modern: examples/fast_upstream.rs of that
# generation), PROFILE_CONCURRENCY (8), PROFILE_SECONDS (20), PROFILE_BIN
# (the gateway binary to profile; default the build's), BENCH_SKIP_BUILD=1,
# CARGO_TARGET_DIR (default target/). Needs valgrind (apt-get install
# valgrind); nginx for PROFILE_TARGET=nginx (installed with apt-get when
# missing and running as root). Release builds carry line tables
# (profile.release debug = 1), so the report names src/ lines.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
TARGET=${PROFILE_TARGET:-gateway}
UPSTREAM=${PROFILE_UPSTREAM:-legacy}
CONC=${PROFILE_CONCURRENCY:-8}
SECONDS_=${PROFILE_SECONDS:-20}
case $UPSTREAM in
legacy | modern) UPSTREAM_GENERATION=$UPSTREAM FAST_UPSTREAM=0 ;;
fast) UPSTREAM_GENERATION=legacy FAST_UPSTREAM=1 ;;
fast-modern) UPSTREAM_GENERATION=modern FAST_UPSTREAM=1 ;;
*) echo "PROFILE_UPSTREAM must be legacy, modern, fast or fast-modern" >&2; exit 2 ;;
esac
case $TARGET in
gateway | nginx | both) ;;
*) echo "PROFILE_TARGET must be gateway, nginx or both" >&2; exit 2 ;;
esac
MODE=${PROFILE_MODE:-modern}
# nginx relays what bench/run.sh sends it: a legacy client's call on a
# legacy upstream (it passes Mcp-Session-Id through), a 2026 call on a 2026 one.
if [[ $UPSTREAM_GENERATION == legacy ]]; then NGINX_MODE=legacy; else NGINX_MODE=modern; fi
if [[ $TARGET != gateway && -n ${PROFILE_MODE:-} && $PROFILE_MODE != "$NGINX_MODE" ]]; then
    echo "nginx relays PROFILE_MODE=$NGINX_MODE on a $UPSTREAM_GENERATION upstream" >&2
    exit 2
fi
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=$ROOT/bench/out/profile-$TARGET-$MODE-$UPSTREAM-$STAMP
mkdir -p "$OUT"

log() { printf '[profile %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
command -v valgrind >/dev/null || { echo "valgrind is missing: apt-get install valgrind" >&2; exit 1; }
if [[ $TARGET != gateway ]]; then
    if ! command -v nginx >/dev/null && [[ -x /usr/sbin/nginx ]]; then PATH=$PATH:/usr/sbin; fi
    if ! command -v nginx >/dev/null; then
        if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
            log "installing nginx (Debian package)"
            apt-get update -qq >/dev/null
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx >/dev/null
            PATH=$PATH:/usr/sbin
        else
            echo "nginx is missing: apt-get install nginx" >&2
            exit 1
        fi
    fi
fi

PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    PIDS=()
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ ${BENCH_SKIP_BUILD:-0} != 1 ]]; then
    (cd "$ROOT" && CARGO_TARGET_DIR=$TARGET_DIR cargo build --release --bins --example loadgen --example fast_upstream)
fi
BIN=${PROFILE_BIN:-$TARGET_DIR/release/sessionless}
LOADGEN=$TARGET_DIR/release/examples/loadgen
FAST=$TARGET_DIR/release/examples/fast_upstream

# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

start_upstream() { # → UP (the upstream's port)
    if [[ $FAST_UPSTREAM == 1 ]]; then
        "$FAST" --generation "$UPSTREAM_GENERATION" --listen 127.0.0.1:0 2>"$OUT/upstream.log" &
    else
        "$BIN" demo-upstream --generation "$UPSTREAM_GENERATION" --listen 127.0.0.1:0 2>"$OUT/upstream.log" &
    fi
    PIDS+=($!)
    UP=$(port_from_log "$OUT/upstream.log" 'on http://127\.0\.0\.1:[0-9]+')
}

# The load: a warm-up before instrumentation starts (callgrind_control -i
# on, for every process of the proxy), so the profile holds steady-state
# requests only; then the measured run. `$1`: the directory, `$2`: the
# address, `$3`: the mode, then the proxy's pids.
drive() {
    local dir=$1 addr=$2 mode=$3 pid
    shift 3
    timeout 120 "$LOADGEN" "$mode" --addr "$addr" -c "$CONC" -d 2 --warmup 0 --count 200 >/dev/null
    for pid in "$@"; do callgrind_control -i on "$pid" >/dev/null 2>&1; done
    case $mode in
    principals)
        timeout $((SECONDS_ * 10)) "$LOADGEN" principals --addr "$addr" -c "$CONC" --count $((SECONDS_ * 20)) --offset 1000 | tee "$dir/load.json" ;;
    *)
        timeout $((SECONDS_ + 120)) "$LOADGEN" "$mode" --addr "$addr" -c "$CONC" -d "$SECONDS_" --warmup 0 | tee "$dir/load.json" ;;
    esac
    for pid in "$@"; do callgrind_control -i off "$pid" >/dev/null 2>&1; done
}

# Instructions (Ir) in the callgrind output files given, summed.
instructions() {
    local f total=0 n
    for f in "$@"; do
        n=$(callgrind_annotate --auto=no "$f" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}')
        [[ $n =~ ^[0-9]+$ ]] || n=0
        total=$((total + n))
    done
    echo "$total"
}

# The gateway under callgrind in front of the upstream.
profile_gateway() {
    local dir=$OUT/gateway requests total generation=""
    mkdir -p "$dir"
    start_upstream
    [[ $FAST_UPSTREAM == 1 ]] && generation="generation = \"$UPSTREAM_GENERATION\""
    cat >"$dir/gateway.toml" <<EOF
[server]
listen = "127.0.0.1:0"
drain_timeout_ms = 1000
[[upstreams]]
name = "demo"
url = "http://127.0.0.1:$UP/mcp"
$generation
[[routes]]
path = "/mcp"
upstream = "demo"
[pool]
max_sessions = 5000
EOF
    valgrind --tool=callgrind --callgrind-out-file="$dir/callgrind.out" \
        --instr-atstart=no --dump-instr=no --separate-threads=no \
        "$BIN" --config "$dir/gateway.toml" 2>"$dir/gateway.log" &
    local gw_pid=$!
    PIDS+=($gw_pid)
    local gw
    gw=$(port_from_log "$dir/gateway.log" 'listening on http://127\.0\.0\.1:[0-9]+')
    log "gateway under callgrind on :$gw (pid $gw_pid), upstream :$UP ($UPSTREAM), $MODE at c=$CONC"
    drive "$dir" "127.0.0.1:$gw" "$MODE" "$gw_pid"
    kill -TERM "$gw_pid"
    for _ in $(seq 600); do kill -0 "$gw_pid" 2>/dev/null || break; sleep 0.1; done
    cleanup

    requests=$(grep -oE '"requests":[0-9]+' "$dir/load.json" | cut -d: -f2)
    callgrind_annotate --inclusive=yes --auto=no "$dir/callgrind.out" >"$dir/inclusive.txt" 2>/dev/null
    callgrind_annotate --auto=no "$dir/callgrind.out" >"$dir/self.txt" 2>/dev/null
    # The gateway's own functions, inclusive, with instructions per request.
    total=$(awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}' "$dir/inclusive.txt")
    GATEWAY_FIGURE="gateway ($MODE, $UPSTREAM upstream, c=$CONC): $requests requests, $(( ${total:-0} / ${requests:-1} )) instructions per request"
    {
        echo "requests profiled: $requests; instructions per request: $(( ${total:-0} / ${requests:-1} ))"
        echo
        grep -E 'sessionless::' "$dir/inclusive.txt" | head -60 || true
    } >"$dir/sessionless-inclusive.txt"
    # Per src/ line: inclusive cost of the calls made on that line, per request.
    # (Debug info names the crate's files src/… relative to the checkout: run from there.)
    (cd "$ROOT" && callgrind_annotate --inclusive=yes --auto=yes --context=0 "$dir/callgrind.out" 2>/dev/null) |
        awk -v N="${requests:-1}" -v root="$ROOT/" '
            /^-- (User|Auto)-annotated source: / {
                file = $4
                if (index(file, root) == 1) file = substr(file, length(root) + 1)
                ours = index(file, "src/") == 1
                next
            }
            /^-- line [0-9]+ / { line = $3; next }
            ours && /=> / {
                c = $1; gsub(",", "", c); key = file ":" line; cost[key] += c
                callee = $0; sub(/.*=> /, "", callee); sub(/ \([0-9,]+x\)$/, "", callee); sub(/.*:/, "", callee)
                if (c > best[key]) { best[key] = c; who[key] = callee }
            }
            END { for (k in cost) printf "%9d Ir/req  %-40s %s\n", cost[k] / N, k, who[k] }' |
        sort -k1,1nr | awk "NR <= 40" >"$dir/src-lines.txt" # awk reads to the end: no broken pipe under pipefail
    {
        echo
        echo "top src/ lines (inclusive cost of the calls on the line, per request):"
        cat "$dir/src-lines.txt"
    } >>"$dir/sessionless-inclusive.txt"
    cat "$dir/sessionless-inclusive.txt"
    log "written: $dir/{inclusive,self,sessionless-inclusive}.txt and callgrind.out (callgrind_annotate --inclusive=yes --tree=caller $dir/callgrind.out)"
}

# nginx under callgrind, with bench/nginx.conf as bench/run.sh fills it in,
# in front of the upstream: its workers' instructions (one output file each)
# over the requests. Started as root, nginx runs its workers as another user,
# whom callgrind_control cannot reach: they are instrumented from the start,
# and there is no warm-up (nginx has nothing to warm; the workers' start-up,
# counted, is a fraction of a per cent of a run).
profile_nginx() {
    local dir=$OUT/nginx requests total port pid pids master workers
    mkdir -p "$dir/cg"
    chmod 1777 "$dir/cg" # the workers write their own output files
    start_upstream
    port=$("$LOADGEN" free-port)
    sed -e "s|@PREFIX@|$dir|g" -e "s|@LISTEN@|127.0.0.1:$port|g" \
        -e "s|@UPSTREAM@|127.0.0.1:$UP|g" "$ROOT/bench/nginx.conf" >"$dir/nginx.conf"
    valgrind --tool=callgrind --callgrind-out-file="$dir/cg/callgrind.out.%p" \
        --dump-instr=no --separate-threads=no \
        nginx -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" 2>"$dir/valgrind.log" &
    master=$!
    PIDS+=($master)
    for _ in $(seq 300); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        kill -0 "$master" 2>/dev/null || { cat "$dir/error.log" "$dir/valgrind.log" >&2; return 1; }
        sleep 0.1
    done
    # The workers are forked once the listener is open: wait for them.
    for _ in $(seq 100); do
        [[ -n $(cat "/proc/$master/task/$master/children" 2>/dev/null) ]] && break
        sleep 0.1
    done
    sleep 1
    workers=$(cat "/proc/$master/task/$master/children" 2>/dev/null)
    log "nginx under callgrind on :$port (master $master, workers $workers), upstream :$UP ($UPSTREAM), $NGINX_MODE at c=$CONC"
    timeout $((SECONDS_ + 120)) "$LOADGEN" "$NGINX_MODE" --addr "127.0.0.1:$port" -c "$CONC" -d "$SECONDS_" --warmup 0 |
        tee "$dir/load.json"
    kill -TERM "$master"
    for _ in $(seq 600); do kill -0 "$master" 2>/dev/null || break; sleep 0.1; done
    cleanup

    requests=$(grep -oE '"all_requests":[0-9]+' "$dir/load.json" | cut -d: -f2)
    pids=()
    for pid in $workers; do pids+=("$dir/cg/callgrind.out.$pid"); done
    total=$(instructions "${pids[@]}")
    NGINX_FIGURE="nginx ($NGINX_MODE, $UPSTREAM upstream, c=$CONC): $requests requests, $(( ${total:-0} / ${requests:-1} )) instructions per request"
    {
        echo "requests profiled: $requests; instructions per request: $(( ${total:-0} / ${requests:-1} )) (workers)"
        echo
        for pid in $workers; do
            echo "== worker $pid: $(instructions "$dir/cg/callgrind.out.$pid") instructions"
            callgrind_annotate --inclusive=yes --auto=no "$dir/cg/callgrind.out.$pid" 2>/dev/null | sed -n '/^ *Ir/,$p' | awk 'NR <= 30' # reads to the end: no broken pipe under pipefail
        done
    } >"$dir/nginx-inclusive.txt"
    cat "$dir/nginx-inclusive.txt"
    log "written: $dir/nginx-inclusive.txt and cg/callgrind.out.<pid>"
}

GATEWAY_FIGURE="" NGINX_FIGURE=""
case $TARGET in
gateway) profile_gateway ;;
nginx) profile_nginx ;;
both)
    profile_gateway
    profile_nginx
    ;;
esac
{
    [[ -z $GATEWAY_FIGURE ]] || echo "$GATEWAY_FIGURE"
    [[ -z $NGINX_FIGURE ]] || echo "$NGINX_FIGURE"
} | tee "$OUT/summary.txt"
