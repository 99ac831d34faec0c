#!/usr/bin/env bash
# docker/ checked without a Docker engine or a cluster: YAML parsed with PyYAML
# (pinned in scripts/setup-peers), flags, subcommands, ports, env vars and
# paths checked against the binary and the configs (tests/ops/container.py),
# the probe paths answered by a running gateway, and the Dockerfile's build
# stage run on the host on exactly the files it COPYs (tests/ops/docker_build.py).
# Servers bind 127.0.0.1 on free ports and are stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
BIN="${SESSIONLESS_BIN:-$ROOT/target/debug/sessionless}"
PEERS="${SESSIONLESS_PEERS:-$ROOT/.peers}"
fail() { echo "container.sh: FAIL: $*" >&2; exit 1; }
[[ -x "$BIN" ]] || fail "no gateway binary at $BIN (cargo build, or set SESSIONLESS_BIN)"

scripts/setup-peers >/dev/null || fail "scripts/setup-peers (the pinned PyYAML venv) failed"
PY="$PEERS/py-yaml/bin/python"
[[ -x "$PY" ]] || fail "no PyYAML venv at $PEERS/py-yaml"

echo "=== container.sh: files against the binary and the configs"
"$PY" tests/ops/container.py "$BIN"

echo "=== container.sh: the probe paths the files use answer"
WORK="$(mktemp -d)"; LOGDIR="$WORK"; PIDS=()
source "$ROOT/tests/lib/proc.sh"
trap 'rc=$?; trap - EXIT; (cleanup) || true; rm -rf "$WORK"; exit $rc' EXIT
GW=$(free_port)
start gateway "$BIN" --upstream "http://127.0.0.1:$(free_port)/mcp" --listen "127.0.0.1:$GW"
wait_http gateway "$LAST_PID" "http://127.0.0.1:$GW/healthz" 20 200 || fail "gateway: $WAIT_REASON"
for path in /healthz /readyz /metrics; do
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$GW$path")
  [[ "$code" == 200 || ( "$path" == /readyz && "$code" == 503 ) ]] || fail "GET $path answered $code"
done
"$BIN" health "http://127.0.0.1:$GW/healthz" >/dev/null || fail "sessionless health on a live gateway exited non-zero"
if "$BIN" health "http://127.0.0.1:$GW/nothing-here" >/dev/null 2>&1; then fail "sessionless health on a 404 exited 0"; fi
echo "container.sh: probe paths and the health subcommand: ok"

echo "=== container.sh: the Dockerfile's build stage, on the host"
# The crate is built from the copied files every time; its dependencies are
# shared across runs in .cache/docker-target (the Dockerfile's cached layer).
started=$SECONDS
built=$(python3 tests/ops/docker_build.py "$ROOT/.cache/docker-build" "$ROOT/.cache/docker-target" | tail -n 1) \
  || fail "the Dockerfile's build stage failed on the host"
[[ -x "$built" ]] || fail "the build stage left no binary at $built"
"$built" --help | grep -q "check-config" || fail "the build stage's binary is not the gateway (the empty placeholder?)"
if file "$built" 2>/dev/null | grep -q "not stripped"; then fail "$built is not stripped"; fi
echo "container.sh: Dockerfile build stage: ok in $((SECONDS - started)) s ($(du -h "$built" | cut -f1) stripped)"
