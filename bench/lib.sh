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

# CPU time of processes, from /proc/PID/stat (fields 14 and 15, all threads).
CLK_TCK=$(getconf CLK_TCK)
cpu_ticks() { # "user system" ticks of these processes (all their threads)
    local u=0 s=0 p pu ps
    for p in "$@"; do
        if [[ -r /proc/$p/stat ]] && read -r pu ps < <(awk '{print $14, $15}' "/proc/$p/stat"); then
            u=$((u + pu)) s=$((s + ps))
        fi
    done
    echo "$u $s"
}
per_req() { # ticks requests → µs per request with one decimal
    echo "$(($1 * 1000000 / CLK_TCK / $2)).$(($1 * 10000000 / CLK_TCK / $2 % 10))"
}
