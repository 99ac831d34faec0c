#!/usr/bin/env bash
# The README's quick start, run as written (tests/ops/readme.py says how):
# each command of its ```sh blocks but `scripts/test`, the gateway on free
# 127.0.0.1 ports in place of 8080 and 9000, `--upstream` in front of a real
# server (the built-in `demo-upstream`), and each curl's answer compared with
# the README's. Uses the debug binary scripts/test built for the
# `cargo run --release --` commands. Every process it starts is stopped on
# exit, on failure too. Fails, never skips, when it cannot run.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="${SESSIONLESS_BIN:-$PWD/target/debug/sessionless}"
fail() { echo "readme.sh: FAIL: $*" >&2; exit 1; }
[[ -x "$BIN" ]] || fail "no gateway binary at $BIN (cargo build, or set SESSIONLESS_BIN)"
command -v curl >/dev/null || fail "curl is needed (the README's commands use it)"
command -v python3 >/dev/null || fail "python3 is needed"
exec python3 tests/ops/readme.py "$BIN"
