#!/usr/bin/env bash
# Profiles the gateway under load with valgrind's callgrind (perf may be
# unavailable in containers). Starts the built-in legacy server natively and
# the gateway under callgrind, drives it with examples/loadgen for a bounded
# time, stops it, and writes the annotated profiles to bench/out/profile-<ts>/.
#
#   bench/profile.sh                   # stateless tools/call echo, concurrency 8, 20 s
#   PROFILE_MODE=mrtr bench/profile.sh # ask_user question + retry
#   PROFILE_MODE=legacy bench/profile.sh # a legacy client's echo through the legacy relay
#   PROFILE_UPSTREAM=modern bench/profile.sh # stateless echo through the pass-through
#                                            # (the built-in server with --generation modern)
#
# Knobs: PROFILE_MODE (modern | mrtr | principals | legacy), PROFILE_UPSTREAM
# (legacy | modern: what the built-in server speaks), PROFILE_CONCURRENCY (8),
# PROFILE_SECONDS (20), PROFILE_BIN (the gateway binary to profile; default the
# build's), BENCH_SKIP_BUILD=1, CARGO_TARGET_DIR (default target/).
# Needs valgrind (apt-get install valgrind). Release builds carry line tables
# (profile.release debug = 1), so the report names src/ lines.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
MODE=${PROFILE_MODE:-modern}
UPSTREAM_GENERATION=${PROFILE_UPSTREAM:-legacy}
CONC=${PROFILE_CONCURRENCY:-8}
SECONDS_=${PROFILE_SECONDS:-20}
OUT=$ROOT/bench/out/profile-$MODE-$UPSTREAM_GENERATION-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"

log() { printf '[profile %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
command -v valgrind >/dev/null || { echo "valgrind is missing: apt-get install valgrind" >&2; exit 1; }

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
    (cd "$ROOT" && CARGO_TARGET_DIR=$TARGET_DIR cargo build --release --bins --example loadgen)
fi
BIN=${PROFILE_BIN:-$TARGET_DIR/release/sessionless}
LOADGEN=$TARGET_DIR/release/examples/loadgen

# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

"$BIN" demo-upstream --generation "$UPSTREAM_GENERATION" --listen 127.0.0.1:0 2>"$OUT/upstream.log" &
PIDS+=($!)
UP=$(port_from_log "$OUT/upstream.log" 'on http://127\.0\.0\.1:[0-9]+')
cat >"$OUT/gateway.toml" <<EOF
[server]
listen = "127.0.0.1:0"
drain_timeout_ms = 1000
[[upstreams]]
name = "demo"
url = "http://127.0.0.1:$UP/mcp"
[[routes]]
path = "/mcp"
upstream = "demo"
[pool]
max_sessions = 5000
EOF

# Instrumentation starts after the warm-up (callgrind_control -i on), so the
# profile holds steady-state requests only.
valgrind --tool=callgrind --callgrind-out-file="$OUT/callgrind.out" \
    --instr-atstart=no --dump-instr=no --separate-threads=no \
    "$BIN" --config "$OUT/gateway.toml" 2>"$OUT/gateway.log" &
GW_PID=$!
PIDS+=($GW_PID)
GW=$(port_from_log "$OUT/gateway.log" 'listening on http://127\.0\.0\.1:[0-9]+')
log "gateway under callgrind on :$GW (pid $GW_PID), upstream :$UP"

timeout 120 "$LOADGEN" "$MODE" --addr "127.0.0.1:$GW" -c "$CONC" -d 2 --warmup 0 --count 200 >/dev/null
callgrind_control -i on "$GW_PID" >/dev/null 2>&1
case $MODE in
principals)
    timeout $((SECONDS_ * 10)) "$LOADGEN" principals --addr "127.0.0.1:$GW" -c "$CONC" --count $((SECONDS_ * 20)) --offset 1000 | tee "$OUT/load.json" ;;
*)
    timeout $((SECONDS_ + 120)) "$LOADGEN" "$MODE" --addr "127.0.0.1:$GW" -c "$CONC" -d "$SECONDS_" --warmup 0 | tee "$OUT/load.json" ;;
esac
callgrind_control -i off "$GW_PID" >/dev/null 2>&1
kill -TERM "$GW_PID"
for _ in $(seq 600); do kill -0 "$GW_PID" 2>/dev/null || break; sleep 0.1; done
cleanup

requests=$(grep -oE '"requests":[0-9]+' "$OUT/load.json" | cut -d: -f2)
callgrind_annotate --inclusive=yes --auto=no "$OUT/callgrind.out" >"$OUT/inclusive.txt" 2>/dev/null
callgrind_annotate --auto=no "$OUT/callgrind.out" >"$OUT/self.txt" 2>/dev/null
# The gateway's own functions, inclusive, with instructions per request.
total=$(awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}' "$OUT/inclusive.txt")
{
    echo "requests profiled: $requests; instructions per request: $(( ${total:-0} / ${requests:-1} ))"
    echo
    grep -E 'sessionless::' "$OUT/inclusive.txt" | head -60 || true
} >"$OUT/sessionless-inclusive.txt"
# Per src/ line: inclusive cost of the calls made on that line, per request.
# (Debug info names the crate's files src/… relative to the checkout: run from there.)
(cd "$ROOT" && callgrind_annotate --inclusive=yes --auto=yes --context=0 "$OUT/callgrind.out" 2>/dev/null) |
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
    sort -k1,1nr | awk "NR <= 40" >"$OUT/src-lines.txt" # awk reads to the end: no broken pipe under pipefail
{
    echo
    echo "top src/ lines (inclusive cost of the calls on the line, per request):"
    cat "$OUT/src-lines.txt"
} >>"$OUT/sessionless-inclusive.txt"
cat "$OUT/sessionless-inclusive.txt"
log "written: $OUT/{inclusive,self,sessionless-inclusive}.txt and callgrind.out (callgrind_annotate --inclusive=yes --tree=caller $OUT/callgrind.out)"
