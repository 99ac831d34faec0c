#!/usr/bin/env bash
# One-command benchmark of sessionless on loopback. The headline (part
# `fast`): every path of the gateway in front of examples/fast_upstream.rs, a
# minimal MCP server costing a few µs per request, each beside nginx relaying
# the same requests (the load generator single- and multi-threaded); part
# `syscalls`: system calls per request of the gateway and nginx (strace -c
# -f). Then: throughput and latency of
# tools/call `echo` direct to the built-in legacy server, through nginx (plain
# reverse proxy) and through sessionless at concurrency 1, 8, 32; the same for
# a legacy (2025 session) client relayed by the gateway's legacy cell; the
# same for a 2026 client on a 2026 upstream (the built-in server with
# --generation modern: direct, nginx, the gateway's pass-through); one MRTR
# round trip beside `echo`; gateway memory per parked flow and per pooled
# session; gateway memory per held stream (part `streams`: relay GET streams
# and `subscriptions/listen` on either upstream); the criterion
# microbenchmarks. Prints a table and writes it, with
# the raw JSON lines and the logs, to bench/out/<timestamp>/ (and
# bench/out/latest.md). Every process it starts is stopped on exit.
#
#   BENCH_ONLY=fast,syscalls bench/run.sh   # the headline (~13 min at 5 reps; needs strace)
#   bench/run.sh                       # everything, about 25 minutes after the build
#   BENCH_REPS=5 BENCH_DURATION=10 bench/run.sh
#   BENCH_ONLY=legacy bench/run.sh     # only the legacy relay cells (~3 min at 5 reps)
#   BENCH_ONLY=modern,echo bench/run.sh   # the pass-through beside the translating path
#   BENCH_ONLY=auth bench/run.sh       # an open route beside an API-key and a JWT route (~2 min at 5 reps)
#   BENCH_ONLY=streams bench/run.sh    # memory per held stream, 5,000 of each kind (~2 min)
#   BENCH_ONLY=federation bench/run.sh # a federated route of three members beside a single upstream (~2 min at 5 reps)
#   BENCH_ONLY=stdio bench/run.sh      # a stdio upstream beside the same server over HTTP, and cold spawns (~3 min at 5 reps)
#
# Knobs (environment): BENCH_REPS (5) repetitions of every load cell,
# BENCH_DURATION (3) measured seconds per cell, BENCH_WARMUP (1),
# BENCH_PARKED (10000) flows to park, BENCH_PRINCIPALS (1000) pooled sessions
# to open, BENCH_STREAMS (5000) streams of each kind to hold,
# BENCH_STREAMS_HOLD (8) seconds they are held once all are open (the RSS is
# read 3 s in), BENCH_LOADGEN_THREADS (1), BENCH_SKIP_BUILD=1, BENCH_SKIP_CRITERION=1,
# BENCH_COMMIT (the label of a build other than this checkout's),
# BENCH_ONLY (all): a comma-separated list of the parts to run, out of fast
# (the fast upstream: translating, legacy relay, pass-through, API key and
# JWT routes, and the echo cells again with a multi-threaded load generator),
# syscalls (strace of the proxies at c=32), echo
# (stateless echo cells), legacy (legacy relay cells), modern (2026 upstream:
# pass-through cells, interleaved with the echo cells when both run), auth
# (open, api_key and jwt routes of one gateway), mrtr, memory, streams
# (memory per held stream, in front of the fast upstream), federation
# (tools/list and a call on a route of three members, beside the same on a
# route of one upstream, in front of the fast upstream), stdio (the fast
# upstream as a stdio upstream, `--stdio`, beside the same server over HTTP,
# through one gateway; and calls on a new session, each a new principal, so
# on stdio a process spawned and initialized, beside warm calls, without and
# with a spare process), criterion; BENCH_STDIO_COLD (20) cold calls per
# repetition and route of part stdio, BENCH_STDIO_PAUSE_MS (100) ms of quiet
# before each; CARGO_TARGET_DIR (default: target/). Needs: cargo, curl,
# nginx (installed with apt-get when missing and running as root), openssl
# (the JWT), strace (part syscalls).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
REPS=${BENCH_REPS:-5}
DURATION=${BENCH_DURATION:-3}
WARMUP=${BENCH_WARMUP:-1}
PARKED=${BENCH_PARKED:-10000}
PRINCIPALS=${BENCH_PRINCIPALS:-1000}
STREAMS=${BENCH_STREAMS:-5000}
STREAMS_HOLD=${BENCH_STREAMS_HOLD:-8}
THREADS=${BENCH_LOADGEN_THREADS:-1}
STDIO_COLD=${BENCH_STDIO_COLD:-20}
STDIO_PAUSE_MS=${BENCH_STDIO_PAUSE_MS:-100}
CONCURRENCY=(1 8 32)
ONLY=${BENCH_ONLY:-}
PARTS=(fast syscalls echo legacy modern auth mrtr memory streams federation stdio criterion)
want() { [[ -z $ONLY || ",$ONLY," == *",$1,"* ]]; }
for part in ${ONLY//,/ }; do
    [[ " ${PARTS[*]} " == *" $part "* ]] || { echo "BENCH_ONLY: unknown part '$part' (${PARTS[*]})" >&2; exit 2; }
done
if ! want criterion; then BENCH_SKIP_CRITERION=1; fi

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=$ROOT/bench/out/$STAMP
mkdir -p "$OUT"
RESULTS=$OUT/results.jsonl
: >"$RESULTS"

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# --- every process we start is stopped on exit, whatever happens ----------
PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    PIDS=()
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

stop() { # stop one process we started, by pid
    local pid=$1 rest=()
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    for p in "${PIDS[@]}"; do [[ $p == "$pid" ]] || rest+=("$p"); done
    PIDS=("${rest[@]}")
}

# --- prerequisites ---------------------------------------------------------
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if [[ $(ulimit -n) != unlimited && $(ulimit -n) -lt $((PARKED + 1000)) ]]; then
    log "warning: ulimit -n is $(ulimit -n); parking $PARKED flows needs about $((PARKED + 1000))"
fi
if ! command -v nginx >/dev/null && [[ -x /usr/sbin/nginx ]]; then PATH=$PATH:/usr/sbin; fi
needs_nginx() { local p; for p in fast syscalls echo legacy modern mrtr auth; do want $p && return 0; done; return 1; }
if needs_nginx && ! command -v nginx >/dev/null; then
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
command -v curl >/dev/null || { echo "curl is missing" >&2; exit 1; }

if [[ ${BENCH_SKIP_BUILD:-0} != 1 ]]; then
    log "building (release) into $TARGET_DIR"
    (cd "$ROOT" && CARGO_TARGET_DIR=$TARGET_DIR cargo build --release --bins --example loadgen --example fast_upstream)
    if [[ ${BENCH_SKIP_CRITERION:-0} != 1 ]]; then
        (cd "$ROOT" && CARGO_TARGET_DIR=$TARGET_DIR cargo bench --bench hot_paths --no-run)
    fi
fi
BIN=$TARGET_DIR/release/sessionless
LOADGEN=$TARGET_DIR/release/examples/loadgen
[[ -x $BIN && -x $LOADGEN ]] || { echo "missing $BIN or $LOADGEN (build first)" >&2; exit 1; }

{
    echo "nproc: $(nproc)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
    echo "kernel: $(uname -r)"
    echo "rustc: $(rustc --version)"
    echo "nginx: $(if command -v nginx >/dev/null; then nginx -v 2>&1 | sed 's/.*: //'; else echo none; fi)"
    if [[ -n ${BENCH_COMMIT:-} ]]; then
        echo "commit: $BENCH_COMMIT"
    else
        echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD -- src Cargo.toml 2>/dev/null || echo ' (src modified)')"
    fi
    echo "knobs: reps=$REPS duration=${DURATION}s warmup=${WARMUP}s parked=$PARKED principals=$PRINCIPALS streams=$STREAMS loadgen_threads=$THREADS only=${ONLY:-all}"
} >"$OUT/machine.txt"

# --- servers ---------------------------------------------------------------
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

start_upstream() {
    "$BIN" demo-upstream --listen 127.0.0.1:0 2>"$OUT/upstream.log" &
    PIDS+=($!)
    UPSTREAM_PID=$!
    UPSTREAM_PORT=$(port_from_log "$OUT/upstream.log" 'on http://127\.0\.0\.1:[0-9]+')
}

# The built-in server speaking 2026-07-28 only (stateless), for the pass-through cells.
start_modern_upstream() {
    "$BIN" demo-upstream --generation modern --listen 127.0.0.1:0 2>"$OUT/upstream-modern.log" &
    PIDS+=($!)
    MODERN_UPSTREAM_PID=$!
    MODERN_UPSTREAM_PORT=$(port_from_log "$OUT/upstream-modern.log" 'on http://127\.0\.0\.1:[0-9]+')
}

GATEWAY_CONF=$OUT/gateway.toml
write_gateway_conf() {
    cat >"$GATEWAY_CONF" <<EOF
[server]
listen = "127.0.0.1:0"

[[upstreams]]
name = "demo"
url = "http://127.0.0.1:$UPSTREAM_PORT/mcp"

[[routes]]
path = "/mcp"
upstream = "demo"

[pool]
max_sessions = $((PRINCIPALS + 4000))

[limits]
max_parked_flows = $((PARKED + 10000))
# Every parked flow of the memory run has one (anonymous) caller.
max_parked_flows_per_principal = $((PARKED + 10000))
EOF
}

# The gateway in front of the 2026 upstream: generation auto (the default),
# so it is probed; the run checks that /readyz says modern before measuring.
write_modern_gateway_conf() {
    cat >"$OUT/gateway-modern.toml" <<EOF
[server]
listen = "127.0.0.1:0"

[[upstreams]]
name = "demo-modern"
url = "http://127.0.0.1:$MODERN_UPSTREAM_PORT/mcp"

[[routes]]
path = "/mcp"
upstream = "demo-modern"
EOF
}

start_gateway() { # $1: log name, [$2: config file]
    "$BIN" --config "${2:-$GATEWAY_CONF}" 2>"$OUT/$1.log" &
    PIDS+=($!)
    GATEWAY_PID=$!
    GATEWAY_PORT=$(port_from_log "$OUT/$1.log" 'listening on http://127\.0\.0\.1:[0-9]+')
}

start_nginx() { # [$1: directory name, $2: upstream port]
    local dir=$OUT/${1:-nginx}
    mkdir -p "$dir"
    NGINX_PORT=$("$LOADGEN" free-port)
    sed -e "s|@PREFIX@|$dir|g" -e "s|@LISTEN@|127.0.0.1:$NGINX_PORT|g" \
        -e "s|@UPSTREAM@|127.0.0.1:${2:-$UPSTREAM_PORT}|g" "$ROOT/bench/nginx.conf" >"$dir/nginx.conf"
    nginx -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" 2>>"$dir/error.log" &
    PIDS+=($!)
    NGINX_PID=$!
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$NGINX_PORT") 2>/dev/null && return 0
        kill -0 "$NGINX_PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "nginx did not start:" >&2
    cat "$dir/error.log" >&2
    return 1
}

rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
nginx_pids() { # [$1: master pid]
    local pid=${1:-$NGINX_PID}
    echo "$pid $(cat "/proc/$pid/task/$pid/children" 2>/dev/null)"
}
metric() { # $1 port, $2 metric name prefix → first value
    # awk reads to the end: exiting early would make curl fail with a broken
    # pipe (exit 23) when the page is larger than the pipe, and pipefail + set -e
    # would then end the whole run.
    curl -s "http://127.0.0.1:$1/metrics" | awk -v m="$2" 'index($0, m) == 1 && !found {print $NF; found = 1}'
}

# Runs the load generator with a time bound; appends its JSON line to the
# results, with the CPU time the proxy under test (PROXY_PIDS) and the upstream
# (LOAD_UPSTREAM_PID, default UPSTREAM_PID; a space-separated list for the
# processes of a stdio upstream) spent per request (warm-up included on both
# sides of the division).
PROXY_PIDS=""
LOAD_UPSTREAM_PID=""
load() { # mode addr label rep concurrency [extra args…]
    local mode=$1 addr=$2 label=$3 rep=$4 c=$5
    shift 5
    local line pu0 ps0 uu0 us0 pu1 ps1 uu1 us1 all up=${LOAD_UPSTREAM_PID:-$UPSTREAM_PID}
    read -r pu0 ps0 < <(cpu_ticks $PROXY_PIDS)
    # shellcheck disable=SC2086 # one pid or several
    read -r uu0 us0 < <(cpu_ticks $up)
    line=$(timeout $((DURATION + WARMUP + 120)) "$LOADGEN" "$mode" --addr "$addr" -c "$c" \
        -d "$DURATION" --warmup "$WARMUP" --threads "${LOAD_THREADS:-$THREADS}" --label "$label" --rep "$rep" "$@") || {
        log "loadgen $mode $label c=$c failed"
        line="{\"kind\":\"load\",\"label\":\"$label\",\"rep\":$rep,\"mode\":\"$mode\",\"concurrency\":$c,\"requests\":0,\"errors\":1,\"rps\":0,\"first_error\":\"loadgen failed\"}"
    }
    read -r pu1 ps1 < <(cpu_ticks $PROXY_PIDS)
    # shellcheck disable=SC2086
    read -r uu1 us1 < <(cpu_ticks $up)
    all=$(field "$line" all_requests)
    if [[ ${all:-0} -gt 0 ]]; then
        line="${line%\}},\"proxy_cpu_us\":$(per_req $((pu1 - pu0 + ps1 - ps0)) "$all"),\"proxy_user_us\":$(per_req $((pu1 - pu0)) "$all"),\"proxy_sys_us\":$(per_req $((ps1 - ps0)) "$all"),\"upstream_cpu_us\":$(per_req $((uu1 - uu0 + us1 - us0)) "$all")}"
    fi
    echo "$line" >>"$RESULTS"
    echo "$line"
}
field() { grep -oE "\"$2\":[0-9.]+" <<<"$1" | head -1 | cut -d: -f2; }

# An API key (one of 1000 digests in DIR/keys) and an HS256 JWT for the
# authenticated routes: sets API_KEY and JWT, exports the HS256 secret.
auth_material() { # DIR
    mkdir -p "$1"
    local key_lines jwt_head jwt_claims jwt_sig
    key_lines=$("$BIN" hash-key bench)
    API_KEY=$(sed -n 1p <<<"$key_lines")
    { for i in $(seq 999); do "$BIN" hash-key "k$i" | sed -n 2p; done; sed -n 2p <<<"$key_lines"; } >"$1/keys"
    SESSIONLESS_BENCH_HS256=$(head -c 48 /dev/urandom | base64 | tr -d '\n=+/')
    export SESSIONLESS_BENCH_HS256
    b64url() { base64 | tr -d '\n=' | tr '+/' '-_'; }
    jwt_head=$(printf '{"alg":"HS256","typ":"JWT"}' | b64url)
    jwt_claims=$(printf '{"iss":"https://issuer.bench","aud":"https://gateway.bench","sub":"bench","exp":%d}' \
        $(($(date +%s) + 86400)) | b64url)
    jwt_sig=$(printf '%s.%s' "$jwt_head" "$jwt_claims" |
        openssl dgst -sha256 -mac HMAC -macopt "key:$SESSIONLESS_BENCH_HS256" -binary | b64url)
    JWT=$jwt_head.$jwt_claims.$jwt_sig
}
auth_policies() { # DIR: the `keys` and `jwt` policies (TOML)
    cat <<EOF
[auth.keys]
type = "api_key"
keys_file = "$1/keys"

[auth.jwt]
type = "jwt"
issuer = "https://issuer.bench"
audience = "https://gateway.bench"
algorithms = ["HS256"]
hs256_secret_env = "SESSIONLESS_BENCH_HS256"
EOF
}

# --- 0. the fast upstream: the headline ------------------------------------
# examples/fast_upstream.rs costs a few µs per request (the demo server about
# 15), so that the proxies' own cost shows. One gateway serves four routes to
# it: /mcp (a 2026 client translated onto a pooled legacy session, and a
# legacy client relayed), /mcp-modern (the pass-through to the fast server
# speaking 2026-07-28), /mcp-key and /mcp-jwt (the translating path behind an
# API key and a JWT). Two nginx, one in front of each fast server. Every cell
# at concurrency 1, 8, 32, the load generator single-threaded; the stateless
# echo group also with it multi-threaded (`fastmt-`). Labels: fast-*.
FAST=$TARGET_DIR/release/examples/fast_upstream
start_fast() { # generation → FAST_PID FAST_PORT
    "$FAST" --generation "$1" --listen 127.0.0.1:0 2>"$OUT/fast-$1.log" &
    PIDS+=($!)
    FAST_PID=$!
    FAST_PORT=$(port_from_log "$OUT/fast-$1.log" 'on http://127\.0\.0\.1:[0-9]+')
}

# strace -c -f on the proxy's processes during one run of $DURATION s at
# c=32: one JSON line of system calls per request (warm-up 0: the trace
# covers every request sent).
syscall_cell() { # label mode addr pids… (then -- loadgen args)
    local label=$1 mode=$2 addr=$3 pids=() args=() line all tracer
    shift 3
    while [[ $# -gt 0 && $1 != -- ]]; do pids+=(-p "$1"); shift; done
    [[ ${1:-} == -- ]] && shift
    args=("$@")
    strace -c -f -q "${pids[@]}" -o "$OUT/strace-$label.txt" 2>/dev/null &
    tracer=$!
    sleep 0.5
    line=$(timeout $((DURATION + 60)) "$LOADGEN" "$mode" --addr "$addr" -c 32 -d "$DURATION" --warmup 0 \
        --label "$label" "${args[@]}") || line='{}'
    kill -INT "$tracer" 2>/dev/null || true
    wait "$tracer" 2>/dev/null || true
    all=$(field "$line" all_requests)
    awk -v label="$label" -v n="${all:-0}" '
        $NF ~ /^[a-z_0-9]+$/ && $(NF-1) ~ /^[0-9]+$/ && $NF != "total" {
            errs = (NF == 6) ? $5 : 0; calls = (NF == 6) ? $4 : $4
            out = out sprintf("%s\"%s\":[%d,%d]", sep, $NF, calls, errs); sep = ","
            total += calls; terr += errs
        }
        END { printf "{\"kind\":\"syscalls\",\"label\":\"%s\",\"requests\":%d,\"total\":%d,\"errors\":%d,\"calls\":{%s}}\n", label, n, total, terr, out }
    ' "$OUT/strace-$label.txt" >>"$RESULTS"
    log "syscalls $label: $(tail -1 "$RESULTS")"
}

if want fast || want syscalls; then
    [[ -x $FAST ]] || { echo "missing $FAST (cargo build --release --example fast_upstream)" >&2; exit 1; }
    start_fast legacy
    FAST_LEGACY_PID=$FAST_PID FAST_LEGACY_PORT=$FAST_PORT
    start_fast modern
    FAST_MODERN_PID=$FAST_PID FAST_MODERN_PORT=$FAST_PORT
    FAST_DIR=$OUT/fast
    auth_material "$FAST_DIR"
    cat >"$FAST_DIR/gateway.toml" <<EOF
[server]
listen = "127.0.0.1:0"

[[upstreams]]
name = "fast"
url = "http://127.0.0.1:$FAST_LEGACY_PORT/mcp"
generation = "legacy"

[[upstreams]]
name = "fast-modern"
url = "http://127.0.0.1:$FAST_MODERN_PORT/mcp"
generation = "modern"

$(auth_policies "$FAST_DIR")

[[routes]]
path = "/mcp"
upstream = "fast"

[[routes]]
path = "/mcp-modern"
upstream = "fast-modern"

[[routes]]
path = "/mcp-key"
upstream = "fast"
auth = "keys"

[[routes]]
path = "/mcp-jwt"
upstream = "fast"
auth = "jwt"
EOF
    start_gateway gateway-fast "$FAST_DIR/gateway.toml"
    FAST_GATEWAY_PID=$GATEWAY_PID FAST_GATEWAY_PORT=$GATEWAY_PORT
    start_nginx nginx-fast "$FAST_LEGACY_PORT"
    FAST_NGINX_PID=$NGINX_PID FAST_NGINX_PORT=$NGINX_PORT
    start_nginx nginx-fast-modern "$FAST_MODERN_PORT"
    FAST_MODERN_NGINX_PID=$NGINX_PID FAST_MODERN_NGINX_PORT=$NGINX_PORT
    log "fast upstreams :$FAST_LEGACY_PORT (legacy) :$FAST_MODERN_PORT (modern), sessionless :$FAST_GATEWAY_PORT, nginx :$FAST_NGINX_PORT / :$FAST_MODERN_NGINX_PORT"
    GW=127.0.0.1:$FAST_GATEWAY_PORT
fi

# One cell of the fast part: label target → load (the upstream's CPU is the
# fast server's that serves it).
fast_cell() { # label target rep c [threads]
    local label=$1 t=$2 rep=$3 c=$4 line
    LOAD_THREADS=${5:-1} LOAD_UPSTREAM_PID=$FAST_LEGACY_PID
    case $label:$t in
    *modern-*:direct) PROXY_PIDS="" LOAD_UPSTREAM_PID=$FAST_MODERN_PID line=$(load modern "127.0.0.1:$FAST_MODERN_PORT" "$label" "$rep" "$c") ;;
    *modern-*:nginx) PROXY_PIDS=$(nginx_pids "$FAST_MODERN_NGINX_PID") LOAD_UPSTREAM_PID=$FAST_MODERN_PID line=$(load modern "127.0.0.1:$FAST_MODERN_NGINX_PORT" "$label" "$rep" "$c") ;;
    *modern-*:sessionless) PROXY_PIDS=$FAST_GATEWAY_PID LOAD_UPSTREAM_PID=$FAST_MODERN_PID line=$(load modern "$GW" "$label" "$rep" "$c" --path /mcp-modern) ;;
    *:direct) PROXY_PIDS="" line=$(load legacy "127.0.0.1:$FAST_LEGACY_PORT" "$label" "$rep" "$c") ;;
    *:nginx) PROXY_PIDS=$(nginx_pids "$FAST_NGINX_PID") line=$(load legacy "127.0.0.1:$FAST_NGINX_PORT" "$label" "$rep" "$c") ;;
    *legacy-*:sessionless) PROXY_PIDS=$FAST_GATEWAY_PID line=$(load legacy "$GW" "$label" "$rep" "$c") ;;
    *apikey-*:sessionless) PROXY_PIDS=$FAST_GATEWAY_PID line=$(load modern "$GW" "$label" "$rep" "$c" --path /mcp-key --bearer "$API_KEY") ;;
    *jwt-*:sessionless) PROXY_PIDS=$FAST_GATEWAY_PID line=$(load modern "$GW" "$label" "$rep" "$c" --path /mcp-jwt --bearer "$JWT") ;;
    *:sessionless) PROXY_PIDS=$FAST_GATEWAY_PID line=$(load modern "$GW" "$label" "$rep" "$c") ;;
    esac
    LOAD_THREADS="" LOAD_UPSTREAM_PID=""
    log "rep $rep c=$c $label: $(field "$line" rps) req/s, p50 $(field "$line" p50_us) µs, errors $(field "$line" errors), proxy CPU $(field "$line" proxy_user_us) + $(field "$line" proxy_sys_us) µs/req (user + sys)"
}

if want fast; then
    for rep in $(seq "$REPS"); do
        for c in "${CONCURRENCY[@]}"; do
            # Groups in rotating order, and the targets within each.
            groups=(echo mt legacy modern auth)
            shift_by=$(((rep - 1) % ${#groups[@]}))
            groups=("${groups[@]:$shift_by}" "${groups[@]:0:$shift_by}")
            order=(direct nginx sessionless)
            shift_by=$(((rep - 1) % 3))
            order=("${order[@]:$shift_by}" "${order[@]:0:$shift_by}")
            for g in "${groups[@]}"; do
                case $g in
                echo) for t in "${order[@]}"; do fast_cell "fast-$t" "$t" "$rep" "$c"; done ;;
                mt) for t in "${order[@]}"; do fast_cell "fastmt-$t" "$t" "$rep" "$c" "$(nproc)"; done ;;
                legacy) for t in "${order[@]}"; do fast_cell "fast-legacy-$t" "$t" "$rep" "$c"; done ;;
                modern) for t in "${order[@]}"; do fast_cell "fast-modern-$t" "$t" "$rep" "$c"; done ;;
                # Beside the same repetition's direct and nginx echo cells.
                auth) fast_cell fast-apikey-sessionless sessionless "$rep" "$c"
                      fast_cell fast-jwt-sessionless sessionless "$rep" "$c" ;;
                esac
            done
        done
    done
fi

if want syscalls; then
    if ! command -v strace >/dev/null && [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        log "installing strace (Debian package)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq strace >/dev/null
    fi
    command -v strace >/dev/null || { echo "strace is missing: apt-get install strace" >&2; exit 1; }
    syscall_cell sessionless modern "$GW" "$FAST_GATEWAY_PID"
    syscall_cell sessionless-modern modern "$GW" "$FAST_GATEWAY_PID" -- --path /mcp-modern
    # shellcheck disable=SC2046 # the master and its workers, one pid each
    syscall_cell nginx legacy "127.0.0.1:$FAST_NGINX_PORT" $(nginx_pids "$FAST_NGINX_PID")
    syscall_cell fast-upstream legacy "127.0.0.1:$FAST_LEGACY_PORT" "$FAST_LEGACY_PID"
fi
if want fast || want syscalls; then
    for pid in "$FAST_MODERN_NGINX_PID" "$FAST_NGINX_PID" "$FAST_GATEWAY_PID" "$FAST_MODERN_PID" "$FAST_LEGACY_PID"; do
        stop "$pid"
    done
fi

# --- 1. throughput and latency --------------------------------------------
if want echo || want legacy || want mrtr || want auth; then
start_upstream
write_gateway_conf
start_gateway gateway
start_nginx
log "upstream :$UPSTREAM_PORT, sessionless :$GATEWAY_PORT, nginx :$NGINX_PORT (workers: auto = $(nproc))"
fi
if want modern; then
    # The 2026 upstream, its own gateway (probed: it must be found modern, so
    # that the cells measure the pass-through) and its own nginx (same template).
    start_modern_upstream
    write_modern_gateway_conf
    saved=("${GATEWAY_PID:-}" "${GATEWAY_PORT:-}" "${NGINX_PID:-}" "${NGINX_PORT:-}")
    start_gateway gateway-modern "$OUT/gateway-modern.toml"
    MODERN_GATEWAY_PID=$GATEWAY_PID MODERN_GATEWAY_PORT=$GATEWAY_PORT
    start_nginx nginx-modern "$MODERN_UPSTREAM_PORT"
    MODERN_NGINX_PID=$NGINX_PID MODERN_NGINX_PORT=$NGINX_PORT
    GATEWAY_PID=${saved[0]} GATEWAY_PORT=${saved[1]} NGINX_PID=${saved[2]} NGINX_PORT=${saved[3]}
    # One short run first (it waits for the probe if need be), then /readyz.
    timeout 30 "$LOADGEN" modern --addr "127.0.0.1:$MODERN_GATEWAY_PORT" -c 1 -d 0.2 --warmup 0 >/dev/null
    readyz=$(curl -s "http://127.0.0.1:$MODERN_GATEWAY_PORT/readyz")
    if ! grep -q 'demo-modern: modern' <<<"$readyz"; then
        echo "the gateway did not find the 2026 upstream modern: $readyz" >&2
        exit 1
    fi
    log "modern upstream :$MODERN_UPSTREAM_PORT, sessionless (pass-through) :$MODERN_GATEWAY_PORT, nginx :$MODERN_NGINX_PORT"
fi

# The stateless echo cells (a 2026 client; the legacy upstream: the gateway
# translates onto a pooled session; direct and nginx send the legacy request
# on a session).
echo_cells() { # rep c
    local rep=$1 c=$2 t shift_by order=(direct nginx sessionless)
    # Rotate the order so that no target always runs first or last.
    shift_by=$(((rep - 1) % 3))
    order=("${order[@]:$shift_by}" "${order[@]:0:$shift_by}")
    for t in "${order[@]}"; do
        case $t in
        direct) PROXY_PIDS="" line=$(load legacy "127.0.0.1:$UPSTREAM_PORT" direct "$rep" "$c") ;;
        nginx) PROXY_PIDS=$(nginx_pids) line=$(load legacy "127.0.0.1:$NGINX_PORT" nginx "$rep" "$c") ;;
        sessionless) PROXY_PIDS=$GATEWAY_PID line=$(load modern "127.0.0.1:$GATEWAY_PORT" sessionless "$rep" "$c") ;;
        esac
        log "rep $rep c=$c $t: $(field "$line" rps) req/s, p50 $(field "$line" p50_us) µs, p99 $(field "$line" p99_us) µs, errors $(field "$line" errors), proxy CPU $(field "$line" proxy_cpu_us) µs/req"
    done
}

# The pass-through cells: the same 2026 request (tools/call echo, `_meta`,
# MCP headers) direct to the 2026 upstream, through nginx, and through the
# gateway; every answer checked (200, a result with resultType complete).
modern_cells() { # rep c
    local rep=$1 c=$2 t addr shift_by order=(direct nginx sessionless)
    shift_by=$(((rep - 1) % 3))
    order=("${order[@]:$shift_by}" "${order[@]:0:$shift_by}")
    LOAD_UPSTREAM_PID=$MODERN_UPSTREAM_PID
    for t in "${order[@]}"; do
        case $t in
        direct) PROXY_PIDS="" addr=127.0.0.1:$MODERN_UPSTREAM_PORT ;;
        nginx) PROXY_PIDS=$(nginx_pids "$MODERN_NGINX_PID") addr=127.0.0.1:$MODERN_NGINX_PORT ;;
        sessionless) PROXY_PIDS=$MODERN_GATEWAY_PID addr=127.0.0.1:$MODERN_GATEWAY_PORT ;;
        esac
        line=$(load modern "$addr" "modern-$t" "$rep" "$c")
        log "rep $rep c=$c modern $t: $(field "$line" rps) req/s, p50 $(field "$line" p50_us) µs, p99 $(field "$line" p99_us) µs, errors $(field "$line" errors), proxy CPU $(field "$line" proxy_cpu_us) µs/req"
    done
    LOAD_UPSTREAM_PID=""
}

# When both run, they share each repetition and concurrency (the same
# minute); which group goes first alternates with the repetition.
if want echo || want modern; then
    for rep in $(seq "$REPS"); do
        for c in "${CONCURRENCY[@]}"; do
            if ((rep % 2 == 1)); then
                if want echo; then echo_cells "$rep" "$c"; fi
                if want modern; then modern_cells "$rep" "$c"; fi
            else
                if want modern; then modern_cells "$rep" "$c"; fi
                if want echo; then echo_cells "$rep" "$c"; fi
            fi
        done
    done
fi
if want modern; then
    stop "$MODERN_NGINX_PID"
    stop "$MODERN_GATEWAY_PID"
    stop "$MODERN_UPSTREAM_PID"
fi

# --- 1b. the legacy relay ----------------------------------------------------
# A legacy (2025 session) client's tools/call echo: the load generator opens
# one session (initialize + notifications/initialized) per run and every
# connection reuses its id: the upstream's own for direct and nginx (which
# passes Mcp-Session-Id through), the gateway's sealed token for sessionless
# (legacy cell: the token is opened, the upstream's id swapped in, the body
# relayed as it is). Every answer is checked (200, a result, no isError).
want legacy && for rep in $(seq "$REPS"); do
    for c in "${CONCURRENCY[@]}"; do
        order=(direct nginx sessionless)
        shift_by=$(((rep - 1) % 3))
        order=("${order[@]:$shift_by}" "${order[@]:0:$shift_by}")
        for t in "${order[@]}"; do
            case $t in
            direct) PROXY_PIDS="" addr=127.0.0.1:$UPSTREAM_PORT ;;
            nginx) PROXY_PIDS=$(nginx_pids) addr=127.0.0.1:$NGINX_PORT ;;
            sessionless) PROXY_PIDS=$GATEWAY_PID addr=127.0.0.1:$GATEWAY_PORT ;;
            esac
            line=$(load legacy "$addr" "legacy-$t" "$rep" "$c")
            log "rep $rep c=$c legacy $t: $(field "$line" rps) req/s, p50 $(field "$line" p50_us) µs, p99 $(field "$line" p99_us) µs, errors $(field "$line" errors), proxy CPU $(field "$line" proxy_cpu_us) µs/req"
        done
    done
done

# --- 1c. authentication ------------------------------------------------------
# One gateway, one upstream, three routes: open (`type = "none"`), an API key
# (a key file of 1000 digests, the caller's among them) and a JWT (HS256; the
# verified token is cached, which is the steady state of a client that
# reuses its token). The same stateless echo on each, interleaved per
# repetition; every answer checked.
if want auth; then
    AUTH_DIR=$OUT/auth
    auth_material "$AUTH_DIR"
    cat >"$AUTH_DIR/gateway.toml" <<EOF
[server]
listen = "127.0.0.1:0"

[[upstreams]]
name = "demo"
url = "http://127.0.0.1:$UPSTREAM_PORT/mcp"

[auth.open]
type = "none"

$(auth_policies "$AUTH_DIR")

[[routes]]
path = "/mcp"
upstream = "demo"
auth = "open"

[[routes]]
path = "/mcp-key"
upstream = "demo"
auth = "keys"

[[routes]]
path = "/mcp-jwt"
upstream = "demo"
auth = "jwt"
EOF
    saved=("${GATEWAY_PID:-}" "${GATEWAY_PORT:-}")
    start_gateway gateway-auth "$AUTH_DIR/gateway.toml"
    AUTH_GATEWAY_PID=$GATEWAY_PID AUTH_GATEWAY_PORT=$GATEWAY_PORT
    GATEWAY_PID=${saved[0]} GATEWAY_PORT=${saved[1]}
    for rep in $(seq "$REPS"); do
        for c in "${CONCURRENCY[@]}"; do
            order=(open api_key jwt)
            shift_by=$(((rep - 1) % 3))
            order=("${order[@]:$shift_by}" "${order[@]:0:$shift_by}")
            for t in "${order[@]}"; do
                case $t in
                open) args=(--path /mcp) ;;
                api_key) args=(--path /mcp-key --bearer "$API_KEY") ;;
                jwt) args=(--path /mcp-jwt --bearer "$JWT") ;;
                esac
                PROXY_PIDS=$AUTH_GATEWAY_PID
                line=$(load modern "127.0.0.1:$AUTH_GATEWAY_PORT" "auth-$t" "$rep" "$c" "${args[@]}")
                log "rep $rep c=$c auth $t: $(field "$line" rps) req/s, p50 $(field "$line" p50_us) µs, errors $(field "$line" errors), proxy CPU $(field "$line" proxy_cpu_us) µs/req"
            done
        done
    done
    stop "$AUTH_GATEWAY_PID"
fi

# --- 2. MRTR round trip beside echo ----------------------------------------
want mrtr && for rep in $(seq "$REPS"); do
    PROXY_PIDS=$GATEWAY_PID
    line=$(load modern "127.0.0.1:$GATEWAY_PORT" mrtr-echo "$rep" 1)
    log "rep $rep echo c=1: p50 $(field "$line" p50_us) µs"
    line=$(load mrtr "127.0.0.1:$GATEWAY_PORT" mrtr "$rep" 1)
    log "rep $rep MRTR round trip c=1: p50 $(field "$line" p50_us) µs (question $(field "$line" question_p50_us), retry $(field "$line" retry_p50_us)), errors $(field "$line" errors)"
done
if [[ -n ${GATEWAY_PID:-} ]]; then
    stop "$NGINX_PID"
    stop "$GATEWAY_PID"
fi

# --- 3. memory per parked flow (fresh gateway) ------------------------------
if want memory; then
if [[ -z ${UPSTREAM_PID:-} ]]; then
    start_upstream
    write_gateway_conf
fi
start_gateway gateway-parked
GW=127.0.0.1:$GATEWAY_PORT
# Warm up the paths a parked flow uses, then take the baseline.
timeout 60 "$LOADGEN" mrtr --addr "$GW" -c 4 -d 1 --warmup 0 >/dev/null
timeout 60 "$LOADGEN" modern --addr "$GW" -c 4 -d 1 --warmup 0 >/dev/null
sleep 1
before=$(rss_kb "$GATEWAY_PID")
line=$(timeout 300 "$LOADGEN" park --addr "$GW" -c 64 --count "$PARKED" --label park) || line='{}'
echo "$line" >>"$OUT/park.json"
sleep 2
after=$(rss_kb "$GATEWAY_PID")
parked=$(metric "$GATEWAY_PORT" sessionless_parked_flows_open)
parked=${parked:-$(field "$line" requests)}
log "parked flows: ${parked:-0} (errors $(field "$line" errors)), VmRSS $before → $after KiB"
echo "{\"kind\":\"mem\",\"what\":\"parked flows\",\"count\":${parked:-0},\"before_kb\":$before,\"after_kb\":$after}" >>"$RESULTS"
stop "$GATEWAY_PID"
# The upstream still holds the declined/abandoned questions' jobs: start afresh.
stop "$UPSTREAM_PID"
start_upstream
write_gateway_conf

# --- 4. memory per pooled upstream session (fresh gateway) ------------------
start_gateway gateway-sessions
GW=127.0.0.1:$GATEWAY_PORT
timeout 60 "$LOADGEN" modern --addr "$GW" -c 4 -d 1 --warmup 0 >/dev/null
timeout 60 "$LOADGEN" principals --addr "$GW" -c 4 --count 50 --offset 1000000 >/dev/null
sleep 1
before=$(rss_kb "$GATEWAY_PID")
open_before=$(metric "$GATEWAY_PORT" 'sessionless_upstream_sessions_open{')
line=$(timeout 300 "$LOADGEN" principals --addr "$GW" -c 16 --count "$PRINCIPALS" --label principals) || line='{}'
echo "$line" >>"$OUT/principals.json"
sleep 2
after=$(rss_kb "$GATEWAY_PID")
open_after=$(metric "$GATEWAY_PORT" 'sessionless_upstream_sessions_open{')
sessions=$(( ${open_after:-0} - ${open_before:-0} ))
log "pooled sessions: +$sessions (errors $(field "$line" errors)), VmRSS $before → $after KiB"
echo "{\"kind\":\"mem\",\"what\":\"pooled sessions (one principal each)\",\"count\":$sessions,\"before_kb\":$before,\"after_kb\":$after}" >>"$RESULTS"
cleanup
fi

# --- 5. memory per held stream (fresh gateway for each kind) ----------------
# A legacy client's standalone GET stream relayed (legacy_legacy + relay), a
# 2026 client's subscriptions/listen on a legacy upstream (modern_legacy: an
# exclusive upstream session and its GET stream) and on a 2026 upstream
# (modern_modern: the upstream's own listen stream relayed). In front of the
# fast upstream, whose held streams send nothing: all are idle but for the
# gateway's keep-alive comments. Each kind: a fresh gateway, 20 streams
# opened and let go (warm-up), the gateway's VmRSS, STREAMS opened (64 at a
# time, one connection each) and held, VmRSS again 3 s after the last one
# opened. Only the gateway's memory is counted (not the upstream's, not the
# load generator's).
if want streams; then
    [[ -x $FAST ]] || { echo "missing $FAST (cargo build --release --example fast_upstream)" >&2; exit 1; }
    # A held stream is two sockets in the gateway (client and upstream).
    if [[ $(ulimit -n) != unlimited && $(ulimit -n) -lt $((2 * STREAMS + 1000)) ]]; then
        log "warning: ulimit -n is $(ulimit -n); holding $STREAMS streams needs about $((2 * STREAMS + 1000))"
    fi
    start_fast legacy
    STREAMS_LEGACY_PID=$FAST_PID STREAMS_LEGACY_PORT=$FAST_PORT
    start_fast modern
    STREAMS_MODERN_PID=$FAST_PID STREAMS_MODERN_PORT=$FAST_PORT
    STREAMS_DIR=$OUT/streams
    mkdir -p "$STREAMS_DIR"
    room=$((STREAMS + 1000))
    cat >"$STREAMS_DIR/gateway.toml" <<EOF
[server]
listen = "127.0.0.1:0"

[[upstreams]]
name = "fast"
url = "http://127.0.0.1:$STREAMS_LEGACY_PORT/mcp"
generation = "legacy"

[[upstreams]]
name = "fast-modern"
url = "http://127.0.0.1:$STREAMS_MODERN_PORT/mcp"
generation = "modern"

[[routes]]
path = "/mcp"
upstream = "fast"

[[routes]]
path = "/mcp-modern"
upstream = "fast-modern"

# Every stream of the run has one (anonymous) caller.
[pool]
max_sessions = $room

[limits]
max_connections = $room
max_concurrent_requests = $room
max_listen_streams = $room
max_listen_streams_per_principal = $room
max_sessions_per_principal = $room

[legacy]
max_new_sessions_per_minute = $((10 * room))
max_new_sessions_per_principal_per_minute = $((10 * room))
EOF
    # Waits (bounded) for the load generator to let its streams go and exit.
    stop_after_exit() {
        for _ in $(seq $(((STREAMS_HOLD + 60) * 10))); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
        stop "$1"
    }
    streams_cell() { # label kind path what
        local label=$1 kind=$2 path=$3 what=$4 out line before after end holder
        start_gateway "gateway-streams-$label" "$STREAMS_DIR/gateway.toml"
        timeout 60 "$LOADGEN" streams --kind "$kind" --addr "127.0.0.1:$GATEWAY_PORT" --path "$path" \
            -c 20 --count 20 -d 0 >/dev/null || log "streams $label: warm-up failed"
        sleep 1
        before=$(rss_kb "$GATEWAY_PID")
        out=$STREAMS_DIR/$label.jsonl
        timeout $((STREAMS_HOLD + 400)) "$LOADGEN" streams --kind "$kind" --addr "127.0.0.1:$GATEWAY_PORT" \
            --path "$path" -c 64 --count "$STREAMS" -d "$STREAMS_HOLD" --label "streams-$label" >"$out" &
        PIDS+=($!)
        holder=$!
        # The first line comes once every stream is open (or failed).
        for _ in $(seq 4000); do
            [[ -s $out ]] && break
            kill -0 "$holder" 2>/dev/null || break
            sleep 0.1
        done
        line=$(head -1 "$out")
        sleep 3
        after=$(rss_kb "$GATEWAY_PID")
        stop_after_exit "$holder"
        end=$(sed -n 2p "$out")
        [[ -n $line ]] || line='{"kind":"streams","opened":0,"errors":1,"first_error":"loadgen failed"}'
        echo "$line" >>"$RESULTS"
        [[ -z $end ]] || echo "$end" >>"$RESULTS"
        log "streams $label: opened $(field "$line" opened) of $STREAMS in $(field "$line" open_seconds) s (errors $(field "$line" errors)), still open when let go $(field "$end" still_open), VmRSS $before → $after KiB"
        echo "{\"kind\":\"mem\",\"what\":\"$what\",\"held_stream\":true,\"count\":$(field "$line" opened),\"before_kb\":$before,\"after_kb\":$after}" >>"$RESULTS"
        stop "$GATEWAY_PID"
    }
    streams_cell relay-get get /mcp "relay GET streams (legacy client, legacy upstream)"
    streams_cell listen-legacy listen /mcp "subscriptions/listen (legacy upstream)"
    streams_cell listen-modern listen /mcp-modern "subscriptions/listen (2026 upstream)"
    stop "$STREAMS_MODERN_PID"
    stop "$STREAMS_LEGACY_PID"
fi

# --- 5b. a federated route beside a single upstream ---------------------------
if want federation; then
    [[ -x $FAST ]] || { echo "missing $FAST (cargo build --release --example fast_upstream)" >&2; exit 1; }
    start_fast legacy
    FED_UPSTREAM_PID=$FAST_PID
    FED_DIR=$OUT/federation
    mkdir -p "$FED_DIR"
    {
        printf '[server]\nlisten = "127.0.0.1:0"\n\n'
        # Three members (the same fast server under three names), and the server alone.
        for m in single a b c; do
            printf '[[upstreams]]\nname = "%s"\nurl = "http://127.0.0.1:%s/mcp"\ngeneration = "legacy"\n\n' "$m" "$FAST_PORT"
        done
        printf '[[routes]]\npath = "/mcp"\nupstream = "single"\n\n'
        printf '[[routes]]\npath = "/fed"\nmembers = ["a", "b", "c"]\n'
    } >"$FED_DIR/gateway.toml"
    start_gateway gateway-federation "$FED_DIR/gateway.toml"
    FED_GATEWAY_PID=$GATEWAY_PID FED_GW=127.0.0.1:$GATEWAY_PORT
    log "federation: fast upstream pid $FED_UPSTREAM_PID, sessionless $FED_GW (routes /mcp and /fed)"
    LOAD_UPSTREAM_PID=$FED_UPSTREAM_PID PROXY_PIDS=$FED_GATEWAY_PID
    for rep in $(seq "$REPS"); do
        for c in "${CONCURRENCY[@]}"; do
            cells=(call-single call-federated list-single list-federated)
            shift_by=$(((rep - 1) % 4))
            for cell in "${cells[@]:$shift_by}" "${cells[@]:0:$shift_by}"; do
                case $cell in
                call-single) line=$(load modern "$FED_GW" "fed-$cell" "$rep" "$c" --path /mcp) ;;
                call-federated) line=$(load modern "$FED_GW" "fed-$cell" "$rep" "$c" --path /fed --tool b__echo) ;;
                list-single) line=$(load list "$FED_GW" "fed-$cell" "$rep" "$c" --path /mcp) ;;
                list-federated) line=$(load list "$FED_GW" "fed-$cell" "$rep" "$c" --path /fed) ;;
                esac
                log "rep $rep c=$c federation $cell: $(field "$line" rps) req/s, p50 $(field "$line" p50_us) µs, errors $(field "$line" errors), proxy CPU $(field "$line" proxy_cpu_us) µs/req"
            done
        done
    done
    LOAD_UPSTREAM_PID="" PROXY_PIDS=""
    stop "$FED_GATEWAY_PID"
    stop "$FED_UPSTREAM_PID"
fi

# --- 5c. a stdio upstream beside the same server over HTTP; cold spawns -------
# One gateway, three routes onto examples/fast_upstream.rs: /mcp-http (the
# server over HTTP, legacy), /mcp-stdio (the same program with `--stdio`, a
# stdio upstream: spawned by the gateway, legacy by default) and
# /mcp-stdio-spare (the same with `spare_processes = 1`). Load cells: a 2026
# client's tools/call echo at c=1, 8, 32, HTTP and stdio (which goes first
# alternates with the repetition)
# (one anonymous caller: one pooled session, on stdio one process shared by
# every call). Then, each repetition, `loadgen cold` on each route (rotating
# order): STDIO_COLD calls, each with a bearer token of its own (a new
# principal: a new upstream session, on stdio a process spawned and
# initialized), each beside a warm call. `max_processes` leaves room for
# every cold process of the run (idle ones are stopped only after the
# default 300 s), so no call waits for one to be stopped.
if want stdio; then
    [[ -x $FAST ]] || { echo "missing $FAST (cargo build --release --example fast_upstream)" >&2; exit 1; }
    start_fast legacy
    STDIO_HTTP_PID=$FAST_PID
    STDIO_DIR=$OUT/stdio
    mkdir -p "$STDIO_DIR"
    room=$((STDIO_COLD * REPS + 16))
    cat >"$STDIO_DIR/gateway.toml" <<EOF
[server]
listen = "127.0.0.1:0"

[[upstreams]]
name = "fast-http"
url = "http://127.0.0.1:$FAST_PORT/mcp"
generation = "legacy"

[[upstreams]]
name = "fast-stdio"
command = ["$FAST", "--stdio"]
max_processes = $room

[[upstreams]]
name = "fast-stdio-spare"
command = ["$FAST", "--stdio"]
max_processes = $room
spare_processes = 1

[[routes]]
path = "/mcp-http"
upstream = "fast-http"

[[routes]]
path = "/mcp-stdio"
upstream = "fast-stdio"

[[routes]]
path = "/mcp-stdio-spare"
upstream = "fast-stdio-spare"

# A session per cold principal.
[pool]
max_sessions = $((3 * room + 64))
EOF
    start_gateway gateway-stdio "$STDIO_DIR/gateway.toml"
    STDIO_GATEWAY_PID=$GATEWAY_PID STDIO_GW=127.0.0.1:$GATEWAY_PORT
    # The warm processes (and the pooled HTTP session) opened before any cell,
    # so that each cell's upstream CPU covers the process that serves it.
    for path in /mcp-http /mcp-stdio; do
        timeout 30 "$LOADGEN" modern --addr "$STDIO_GW" --path "$path" -c 1 -d 0.2 --warmup 0 >/dev/null ||
            { echo "part stdio: no echo through $path (see $OUT/gateway-stdio.log)" >&2; exit 1; }
    done
    # The gateway's children: its stdio processes (the serving one, and idle
    # ones that cost nothing while the cells run).
    gateway_children() { cat "/proc/$STDIO_GATEWAY_PID"/task/*/children 2>/dev/null | tr -s ' \n' ' '; }
    log "stdio: fast upstream pid $STDIO_HTTP_PID over HTTP, sessionless $STDIO_GW (routes /mcp-http, /mcp-stdio, /mcp-stdio-spare), stdio processes: $(gateway_children)"
    PROXY_PIDS=$STDIO_GATEWAY_PID
    for rep in $(seq "$REPS"); do
        for c in "${CONCURRENCY[@]}"; do
            cells=(http stdio)
            shift_by=$(((rep - 1) % 2))
            for cell in "${cells[@]:$shift_by}" "${cells[@]:0:$shift_by}"; do
                case $cell in
                http) LOAD_UPSTREAM_PID=$STDIO_HTTP_PID line=$(load modern "$STDIO_GW" "stdio-$cell" "$rep" "$c" --path /mcp-http) ;;
                stdio) LOAD_UPSTREAM_PID=$(gateway_children) line=$(load modern "$STDIO_GW" "stdio-$cell" "$rep" "$c" --path /mcp-stdio) ;;
                esac
                log "rep $rep c=$c stdio $cell: $(field "$line" rps) req/s, p50 $(field "$line" p50_us) µs, errors $(field "$line" errors), gateway CPU $(field "$line" proxy_cpu_us) µs/req, upstream CPU $(field "$line" upstream_cpu_us) µs/req"
            done
        done
        cells=(cold-http cold cold-spare)
        shift_by=$(((rep - 1) % 3))
        for cell in "${cells[@]:$shift_by}" "${cells[@]:0:$shift_by}"; do
            case $cell in
            cold-http) path=/mcp-http ;;
            cold) path=/mcp-stdio ;;
            cold-spare) path=/mcp-stdio-spare ;;
            esac
            line=$(timeout $((STDIO_COLD * (2 * STDIO_PAUSE_MS + 5000) / 1000 + 60)) "$LOADGEN" cold --addr "$STDIO_GW" \
                --path "$path" --count "$STDIO_COLD" --pause-ms "$STDIO_PAUSE_MS" --label "stdio-$cell" --rep "$rep") || {
                log "loadgen cold $path failed"
                line="{\"kind\":\"cold\",\"label\":\"stdio-$cell\",\"rep\":$rep,\"cold_calls\":0,\"errors\":1,\"first_error\":\"loadgen failed\"}"
            }
            echo "$line" >>"$RESULTS"
            log "rep $rep stdio $cell ($path): cold p50 $(field "$line" cold_p50_us) µs, warm p50 $(field "$line" warm_p50_us) µs, cold ÷ warm $(field "$line" cold_over_warm), errors $(field "$line" errors)"
        done
    done
    PROXY_PIDS="" LOAD_UPSTREAM_PID=""
    # What the gateway counted: every cold call on stdio a start of its own.
    curl -s "http://$STDIO_GW/metrics" | grep '^sessionless_stdio' >"$STDIO_DIR/metrics.txt" || true
    log "stdio: $(tr '\n' ';' <"$STDIO_DIR/metrics.txt")"
    stop "$STDIO_GATEWAY_PID"
    stop "$STDIO_HTTP_PID"
fi

# --- 6. criterion microbenchmarks (quiet machine) ---------------------------
CRIT_ARGS=()
if [[ ${BENCH_SKIP_CRITERION:-0} != 1 ]]; then
    log "criterion: cargo bench --bench hot_paths"
    rm -rf "$TARGET_DIR/criterion"
    (cd "$ROOT" && CARGO_TARGET_DIR=$TARGET_DIR timeout 300 cargo bench --bench hot_paths -- \
        --warm-up-time 1 --measurement-time 3) >"$OUT/criterion.log" 2>&1 ||
        log "criterion failed (see $OUT/criterion.log)"
    CRIT_ARGS=(--criterion "$TARGET_DIR/criterion")
fi

# --- report ------------------------------------------------------------------
{
    echo "## sessionless benchmark $STAMP"
    echo
    sed 's/^/    /' "$OUT/machine.txt"
    echo
    "$LOADGEN" report --results "$RESULTS" "${CRIT_ARGS[@]}"
} >"$OUT/report.md"
cp "$OUT/report.md" "$ROOT/bench/out/latest.md"
cat "$OUT/report.md"
log "written: $OUT/report.md (raw: $RESULTS)"
