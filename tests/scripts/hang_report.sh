#!/usr/bin/env bash
# What a hung job is doing, for a test that gives up on it: each process of the tree under PID (the
# launcher and its ranks) with every thread's state, where it waits in the kernel (wchan) and its kernel
# stack (root only), then every process of the machine (another job's ranks may hold what this one
# waits for). Read-only: it stops nothing.
#   hang_report.sh PID
pid="$1"
tree() { echo "$1"; for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do tree "$c"; done; }
echo "=== hang report $(date -u +%FT%TZ): the process tree under $pid"
for p in $(tree "$pid"); do
    [[ -d /proc/$p ]] || continue
    echo "--- pid $p: $(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null | cut -c1-200)"
    for t in /proc/"$p"/task/*; do
        tid=${t##*/}
        state=$(awk '{print $3}' "$t/stat" 2>/dev/null)
        echo "  thread $tid ($(cat "$t/comm" 2>/dev/null)): state $state, wchan $(cat "$t/wchan" 2>/dev/null)"
        sed 's/^/      /' "$t/stack" 2>/dev/null | head -n 12
    done
done
echo "=== every process"
ps -eo pid,ppid,pgid,stat,wchan:28,etimes,args --sort=pid | cut -c1-220
echo "=== end of hang report"
