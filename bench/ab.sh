#!/usr/bin/env bash
# A/B of two sessionless builds in one run, on loopback: tools/call `echo`
# through each gateway in front of one legacy server (the fast upstream,
# examples/fast_upstream.rs; AB_UPSTREAM=demo for the built-in one), at concurrency
# 1, 8 and 32, the two alternating cell by cell (order swapped every rep).
# Prints median throughput, p50 and gateway CPU per request for each build,
# and the median of the pair-by-pair ratios (B ÷ A). Every process it starts is stopped on exit.
#
#   bench/ab.sh A_BIN B_BIN                 # e.g. a build of main before a change, and after
#   BENCH_REPS=7 BENCH_DURATION=3 bench/ab.sh A_BIN B_BIN
#   AB_PATH=relay bench/ab.sh A_BIN B_BIN   # the cell: translated (a 2026 client on a legacy
#                                           # server, the default), relay (a legacy client on a
#                                           # legacy server), pass (a 2026 client on a 2026 server)
#
# The load generator and the upstream come from B's tree (target/release):
# build them with `cargo build --release --bin sessionless --example loadgen --example fast_upstream`.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
A_BIN=${1:?A_BIN}
B_BIN=${2:?B_BIN}
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
LOADGEN=$TARGET_DIR/release/examples/loadgen
REPS=${BENCH_REPS:-5}
DURATION=${BENCH_DURATION:-3}
WARMUP=${BENCH_WARMUP:-1}
OUT=$(mktemp -d /tmp/sessionless-ab.XXXXXX)
RESULTS=$OUT/results.jsonl

PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

# Which cell is measured: the upstream's generation and the client's.
case ${AB_PATH:-translated} in
translated) GENERATION=legacy CLIENT=modern ;;
relay) GENERATION=legacy CLIENT=legacy ;;
pass) GENERATION=modern CLIENT=modern ;;
*) echo "AB_PATH must be translated, relay or pass" >&2; exit 2 ;;
esac

if [[ ${AB_UPSTREAM:-fast} == fast ]]; then
    "$TARGET_DIR/release/examples/fast_upstream" --listen 127.0.0.1:0 --generation "$GENERATION" \
        2>"$OUT/upstream.log" &
else
    "$B_BIN" demo-upstream --generation "$GENERATION" --listen 127.0.0.1:0 2>"$OUT/upstream.log" &
fi
PIDS+=($!)
UP=$(port_from_log "$OUT/upstream.log" 'on http://127\.0\.0\.1:[0-9]+')

start() { # $1 label, $2 binary → PORT (not in a subshell: its exit trap would stop the gateway)
    cat >"$OUT/$1.toml" <<EOF
[server]
listen = "127.0.0.1:0"

[[upstreams]]
name = "demo"
url = "http://127.0.0.1:$UP/mcp"
generation = "$GENERATION"

[[routes]]
path = "/mcp"
upstream = "demo"
EOF
    "$2" --config "$OUT/$1.toml" 2>"$OUT/$1.log" &
    PIDS+=($!)
    PID=$!
    PORT=$(port_from_log "$OUT/$1.log" 'listening on http://127\.0\.0\.1:[0-9]+')
}
start a "$A_BIN"
A_PORT=$PORT A_PID=$PID
start b "$B_BIN"
B_PORT=$PORT B_PID=$PID
echo "path ${AB_PATH:-translated}: upstream :$UP ($GENERATION), A :$A_PORT ($A_BIN), B :$B_PORT ($B_BIN); reps=$REPS duration=${DURATION}s" >&2

for rep in $(seq "$REPS"); do
    for c in 1 8 32; do
        order=(a b)
        ((rep % 2 == 0)) && order=(b a)
        for t in "${order[@]}"; do
            port=$A_PORT pid=$A_PID
            [[ $t == b ]] && port=$B_PORT pid=$B_PID
            read -r u0 s0 < <(cpu_ticks "$pid")
            line=$(timeout $((DURATION + WARMUP + 60)) "$LOADGEN" "$CLIENT" --addr "127.0.0.1:$port" -c "$c" \
                -d "$DURATION" --warmup "$WARMUP" --label "$t" --rep "$rep")
            read -r u1 s1 < <(cpu_ticks "$pid")
            # The gateway's CPU (warm-up included) over every request sent.
            all=$(grep -oE '"all_requests":[0-9]+' <<<"$line" | cut -d: -f2)
            n=$((${all:-0} > 0 ? all : 1))
            echo "${line%\}},\"user_us\":$(per_req $((u1 - u0)) $n),\"sys_us\":$(per_req $((s1 - s0)) $n),\"cpu_us\":$(per_req $((u1 - u0 + s1 - s0)) $n)}" >>"$RESULTS"
        done
    done
    echo "rep $rep done" >&2
done

python3 - "$RESULTS" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| c | A req/s | B req/s | B÷A req/s (pairs) | A p50 µs | B p50 µs | B÷A p50 (pairs) | A CPU µs/req (user + sys) | B CPU µs/req (user + sys) | errors A/B |")
print("|---|---|---|---|---|---|---|---|---|---|")
for c in (1, 8, 32):
    cell = {(r["label"], r["rep"]): r for r in rows if r["concurrency"] == c}
    reps = sorted({rep for (_, rep) in cell})
    pairs = [(cell[("a", r)], cell[("b", r)]) for r in reps if ("a", r) in cell and ("b", r) in cell]
    med = lambda xs: statistics.median(xs)
    a_rps, b_rps = med([a["rps"] for a, _ in pairs]), med([b["rps"] for _, b in pairs])
    a_p50, b_p50 = med([a["p50_us"] for a, _ in pairs]), med([b["p50_us"] for _, b in pairs])
    rps_ratio = med([b["rps"] / a["rps"] for a, b in pairs if a["rps"]])
    p50_ratio = med([b["p50_us"] / a["p50_us"] for a, b in pairs if a["p50_us"]])
    errs = f'{sum(a["errors"] for a, _ in pairs)}/{sum(b["errors"] for _, b in pairs)}'
    cpu = lambda side, k: med([p[side][k] for p in pairs])
    a_cpu = f'{cpu(0, "cpu_us"):.1f} ({cpu(0, "user_us"):.1f} + {cpu(0, "sys_us"):.1f})'
    b_cpu = f'{cpu(1, "cpu_us"):.1f} ({cpu(1, "user_us"):.1f} + {cpu(1, "sys_us"):.1f})'
    print(f"| {c} | {a_rps:.0f} | {b_rps:.0f} | {rps_ratio:.3f} | {a_p50:.0f} | {b_p50:.0f} | {p50_ratio:.3f} | {a_cpu} | {b_cpu} | {errs} |")
EOF
echo "raw: $RESULTS" >&2
