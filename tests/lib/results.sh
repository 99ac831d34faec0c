# Shared by the test scripts that print one result line per check (interop, cluster).
# The sourcing script sets LOGDIR, RESULTS (a file of PASS|FAIL|SKIP|INFO lines), PIDS=()
# and, for spawn, CLIENT_TIMEOUT; STARTED (its start, in $SECONDS) if summary should say
# how long it took.

# spawn LABEL CMD... : starts a bounded client run in the background (own process group,
# stopped by proc.sh's traps), output in $LOGDIR/LABEL.out and .err; collect LABEL TAG
# waits for it and records its result lines, prefixed with TAG:.
declare -A CLIENT_PID
spawn() {
  local label="$1"; shift
  setsid timeout -k 5 "$CLIENT_TIMEOUT" "$@" > "$LOGDIR/$label.out" 2> "$LOGDIR/$label.err" < /dev/null &
  CLIENT_PID[$label]=$!
  PIDS+=("$!")
}
collect() {
  local label="$1" tag="$2" rc=0
  wait "${CLIENT_PID[$label]}" || rc=$?
  grep -E '^(PASS|FAIL|SKIP|INFO) ' "$LOGDIR/$label.out" | sed -E "s/^(PASS|FAIL|SKIP|INFO) /\1 $tag:/" | tee -a "$RESULTS" || true
  if (( rc == 124 || rc == 137 )); then
    echo "FAIL $tag:$label: client timed out after ${CLIENT_TIMEOUT}s" | tee -a "$RESULTS"
  elif (( rc != 0 )) && ! grep -q '^FAIL ' "$LOGDIR/$label.out"; then
    echo "FAIL $tag:$label: client exited $rc: $(tail -n 3 "$LOGDIR/$label.err" | tr '\n' ' ')" | tee -a "$RESULTS"
  elif ! grep -q '^PASS ' "$LOGDIR/$label.out"; then
    echo "FAIL $tag:$label: no flow passed (exit $rc)" | tee -a "$RESULTS"
  fi
}

# summary NAME: the verdict from $RESULTS ("NAME: P passed, F failed[, S skipped] …"); exits
# 1, the failures repeated on stderr, when any line is a FAIL.
summary() {
  local pass fail skip took=""
  pass=$(grep -c '^PASS ' "$RESULTS" || true)
  fail=$(grep -c '^FAIL ' "$RESULTS" || true)
  skip=$(grep -c '^SKIP ' "$RESULTS" || true)
  [[ -n "${STARTED:-}" ]] && took=" in $((SECONDS - STARTED))s"
  echo "$1: $pass passed, $fail failed$( ((skip > 0)) && echo ", $skip skipped")$took (logs in $LOGDIR)"
  if (( fail > 0 )); then
    echo "failures:" >&2
    grep '^FAIL ' "$RESULTS" >&2
    exit 1
  fi
}
