#!/usr/bin/env bash
# The Grafana dashboard against a real Prometheus: Debian's prometheus package
# (pinned; downloaded and unpacked under .cache/, no root needed once the apt
# lists are there) scrapes a gateway (every 1 s) that runs in front of the
# built-in demo upstreams under a short load (tests/ops/load.py) touching
# every metric family; then every PromQL `expr` of dashboards/sessionless.json
# is run through Prometheus's HTTP API and must return data. Also checks that
# the dashboard uses every family the gateway exports, and nothing else.
# Everything binds 127.0.0.1 on free ports and is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
# Prometheus 2.42.0 as Debian 12 ships it; Debian's own revision suffix
# differs between mirrors and updates (+deb12u1, +b6), so the first of these
# the mirrors serve is taken, and the binary must say 2.42.0.
PROMETHEUS_DEB_VERSIONS=("2.42.0+ds-5+deb12u1" "2.42.0+ds-5+b6")
BIN="${SESSIONLESS_BIN:-$ROOT/target/debug/sessionless}"
DASHBOARD="${SESSIONLESS_DASHBOARD:-$ROOT/dashboards/sessionless.json}"

fail() { echo "prometheus.sh: FAIL: $*" >&2; exit 1; }
[[ -x "$BIN" ]] || fail "no gateway binary at $BIN (cargo build, or set SESSIONLESS_BIN)"
command -v python3 >/dev/null || fail "python3 is required"
command -v curl >/dev/null || fail "curl is required"

# --- Prometheus, pinned -------------------------------------------------------
PROM_DIR="$ROOT/.cache/prometheus-2.42.0"
PROM="$PROM_DIR/usr/bin/prometheus"
fetch() { # downloads the first pinned revision the mirrors serve
  local v
  for v in "${PROMETHEUS_DEB_VERSIONS[@]}"; do
    (cd "$PROM_DIR.tmp" && apt-get download -q "prometheus=$v" 2>/dev/null) && return 0
  done
  return 1
}
if ! [[ -x "$PROM" ]]; then
  command -v apt-get >/dev/null && command -v dpkg >/dev/null || fail "apt-get and dpkg are needed to install prometheus"
  rm -rf "$PROM_DIR.tmp"; mkdir -p "$PROM_DIR.tmp"
  if ! fetch; then
    [[ "$(id -u)" == 0 ]] || fail "none of prometheus=${PROMETHEUS_DEB_VERSIONS[*]} can be downloaded and we are not root to run apt-get update"
    apt-get update -qq || fail "apt-get update failed"
    fetch || fail "apt-get download of prometheus=${PROMETHEUS_DEB_VERSIONS[*]} failed"
  fi
  dpkg -x "$PROM_DIR.tmp"/prometheus_*.deb "$PROM_DIR.tmp" || fail "cannot unpack the prometheus package"
  rm -f "$PROM_DIR.tmp"/prometheus_*.deb
  rm -rf "$PROM_DIR"; mv "$PROM_DIR.tmp" "$PROM_DIR"
fi
"$PROM" --version 2>&1 | grep -q "version 2.42.0" || fail "$PROM is not prometheus 2.42.0"

# --- processes ------------------------------------------------------------------
WORK="$(mktemp -d)"
LOGDIR="$WORK/logs"; mkdir -p "$LOGDIR"
PIDS=()
source "$ROOT/tests/lib/proc.sh"
# proc.sh's trap stops every process; remove the temp dir after it.
trap 'rc=$?; cleanup_all $rc' EXIT
cleanup_all() {
  local rc=$1
  if (( rc != 0 )); then
    for log in "$LOGDIR"/*.log; do echo "--- $(basename "$log") (tail)"; tail -n 15 "$log"; done >&2 || true
  fi
  trap - EXIT
  (cleanup) || true
  rm -rf "$WORK"
  exit "$rc"
}

UP=$(free_port); UPM=$(free_port); GW=$(free_port); INTERNAL=$(free_port); PROM_PORT=$(free_port)

# An API key file for the protected route (digests only; the key is never used).
"$BIN" hash-key load | sed -n 2p > "$WORK/keys.txt"

cat > "$WORK/gateway.toml" <<EOF
[server]
listen = "127.0.0.1:$GW"
drain_timeout_ms = 1000
header_read_timeout_ms = 400     # the slow head of load.py is cut

[[upstreams]]
name = "legacy"
url = "http://127.0.0.1:$UP/mcp"
generation = "legacy"

[[upstreams]]
name = "one-at-a-time"           # the same server, one request at a time: 503 upstream_busy
url = "http://127.0.0.1:$UP/mcp"
generation = "legacy"
max_concurrent_requests = 1

[[upstreams]]
name = "modern"
url = "http://127.0.0.1:$UPM/mcp"

[[upstreams]]
name = "stdio"                   # a program spawned and spoken to over stdio (the test fake)
command = ["$(python3 -c 'import sys; print(sys.executable)')", "$ROOT/tests/support/stdio_fake.py"]

[auth.machines]
type = "api_key"
keys_file = "$WORK/keys.txt"

[[routes]]
path = "/mcp"
upstream = "legacy"
tool_rate_limits = { "add" = { per_minute = 1, burst = 1 } }

[[routes]]
path = "/busy"
upstream = "one-at-a-time"

[[routes]]
path = "/modern"
upstream = "modern"

[[routes]]
path = "/private"
upstream = "legacy"
auth = "machines"

[[routes]]
path = "/stdio"
upstream = "stdio"

[[routes]]
path = "/all"                    # federated: both demo servers behind one endpoint
members = ["legacy", "modern"]

[limits]
parked_flow_ttl_ms = 1500          # the paused calls load.py abandons expire
max_parked_flows_per_principal = 2

[telemetry]
latency_tools = ["echo", "slow"]   # sessionless_tool_call_duration_seconds for these

[[keys]]
id = "k1"
env = "SESSIONLESS_KEY_K1"

[cluster]
instance_id = "prometheus-test"
internal_listen = "127.0.0.1:$INTERNAL"
secret_env = "SESSIONLESS_CLUSTER_SECRET"
EOF

start upstream "$BIN" demo-upstream --listen "127.0.0.1:$UP"
UP_PID=$LAST_PID
start upstream-modern "$BIN" demo-upstream --generation modern --listen "127.0.0.1:$UPM"
wait_http upstream "$UP_PID" "http://127.0.0.1:$UP/mcp" 20 || fail "demo upstream: $WAIT_REASON"
wait_http upstream-modern "$LAST_PID" "http://127.0.0.1:$UPM/mcp" 20 || fail "modern demo upstream: $WAIT_REASON"

SESSIONLESS_KEY_K1="$("$BIN" gen-key)" SESSIONLESS_CLUSTER_SECRET="$("$BIN" gen-key)" \
  start gateway "$BIN" --config "$WORK/gateway.toml"
GW_PID=$LAST_PID
wait_http gateway "$GW_PID" "http://127.0.0.1:$GW/readyz" 20 200 || fail "gateway: $WAIT_REASON"

cat > "$WORK/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: sessionless
    static_configs:
      - targets: ["127.0.0.1:$GW"]
EOF
"$PROM_DIR/usr/bin/promtool" check config "$WORK/prometheus.yml" >/dev/null || fail "promtool rejects the scrape config"
start prometheus "$PROM" --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
  --web.listen-address="127.0.0.1:$PROM_PORT" --web.console.templates="$WORK" --web.console.libraries="$WORK"
wait_http prometheus "$LAST_PID" "http://127.0.0.1:$PROM_PORT/-/ready" 30 200 || fail "prometheus: $WAIT_REASON"

# --- load -----------------------------------------------------------------------------
started=$SECONDS
python3 tests/ops/load.py main "127.0.0.1:$GW" "127.0.0.1:$INTERNAL" || fail "the load did not run as expected"
# The upstream restarts: the gateway's pooled session gets a 404 and a fresh one.
kill -TERM -- "-$UP_PID"; wait "$UP_PID" 2>/dev/null || true
start upstream "$BIN" demo-upstream --listen "127.0.0.1:$UP"
wait_http upstream "$LAST_PID" "http://127.0.0.1:$UP/mcp" 20 || fail "demo upstream (restarted): $WAIT_REASON"
python3 tests/ops/load.py after_restart "127.0.0.1:$GW" "127.0.0.1:$INTERNAL" || fail "the load after the restart did not run as expected"
echo "prometheus.sh: load ran in $((SECONDS - started)) s"

# --- the dashboard's queries ---------------------------------------------------------
curl -sf "http://127.0.0.1:$GW/metrics" -H 'Host: 127.0.0.1' > "$WORK/exposition.txt" || fail "cannot read the gateway's /metrics"
python3 - "$DASHBOARD" "http://127.0.0.1:$PROM_PORT" "$WORK/exposition.txt" <<'EOF'
import json, sys, time, urllib.parse, urllib.request

dashboard, prom, exposition = sys.argv[1:4]
exprs = []
def walk(node):
    if isinstance(node, dict):
        if isinstance(node.get("expr"), str):
            exprs.append(node["expr"])
        for v in node.values():
            walk(v)
    elif isinstance(node, list):
        for v in node:
            walk(v)
walk(json.load(open(dashboard)))
if not exprs:
    sys.exit("prometheus.sh: FAIL: no expr in the dashboard")

# Names: the dashboard uses every family the gateway exports, and only those.
families = {l.split()[2] for l in open(exposition) if l.startswith("# TYPE ")}
import re
used = set(re.findall(r"sessionless_[a-z0-9_]+", " ".join(exprs)))
def family(name):
    for suffix in ("_total", "_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in families:
            return name[: -len(suffix)]
    return name
unknown = sorted(n for n in used if family(n) not in families)
unused = sorted(f for f in families if not any(family(n) == f for n in used))
if unknown or unused:
    sys.exit(f"prometheus.sh: FAIL: dashboard uses unknown metrics {unknown}; misses families {unused}")

def query(expr):
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise SystemExit(f"prometheus.sh: FAIL: query {expr!r} is an error: {body}")
    return body["data"]["result"]

# Until each query has data (counters need two scrapes of a series for rate()).
pending, deadline = list(dict.fromkeys(exprs)), time.time() + 45
while pending and time.time() < deadline:
    pending = [e for e in pending if not query(e)]
    if pending:
        time.sleep(1)
for e in pending:
    print(f"prometheus.sh: FAIL: no data for the dashboard query: {e}", file=sys.stderr)
total = len(set(exprs))
print(f"prometheus.sh: {total - len(pending)} passed, {len(pending)} failed (dashboard queries with data)")
sys.exit(1 if pending else 0)
EOF
