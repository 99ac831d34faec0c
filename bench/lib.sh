# Shell helpers shared by the bench scripts (sourced, not run).

# Waits (up to 60 s) for "…PREFIX…:PORT" matching the regex $2 in the log $1;
# prints PORT.
port_from_log() {
    local file=$1 pattern=$2
    for _ in $(seq 600); do
        if grep -qE "$pattern" "$file" 2>/dev/null; then
            grep -oE "$pattern" "$file" | head -1 | grep -oE '[0-9]+$'
            return 0
        fi
        sleep 0.1
    done
    echo "no port in $file:" >&2
    cat "$file" >&2
    return 1
}
