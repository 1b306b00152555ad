#!/usr/bin/env bash
# What a hung job is doing, for a test that gives up on it: each process of the tree under PID (the
# launcher and its ranks) with every thread's state, where it waits in the kernel (wchan) and its kernel
# stack (root only), then every process of the machine (another job's ranks may hold what this one
# waits for), with the kernel stack of every thread elsewhere that runs or waits on the disk (state R or
# D), the user-space stacks of gtrain's processes in those states (gdb, where installed: it attaches
# for a moment and detaches), the machine's pressure stall figures and its disks' queues twice a second
# apart (a disk that completes nothing stalls every job that syncs a file). It changes nothing.
#   hang_report.sh PID
pid="$1"
tree() { echo "$1"; for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do tree "$c"; done; }
busy=()
echo "=== hang report $(date -u +%FT%TZ): the process tree under $pid"
for p in $(tree "$pid"); do
    [[ -d /proc/$p ]] || continue
    echo "--- pid $p: $(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null | cut -c1-200)"
    for t in /proc/"$p"/task/*; do
        tid=${t##*/}
        state=$(awk '{print $3}' "$t/stat" 2>/dev/null)
        echo "  thread $tid ($(cat "$t/comm" 2>/dev/null)): state $state, wchan $(cat "$t/wchan" 2>/dev/null)"
        sed 's/^/      /' "$t/stack" 2>/dev/null | head -n 12
        [[ ($state == R || $state == D) && $(cat /proc/"$p"/comm 2>/dev/null) == gtrain ]] && busy+=("$p")
    done
done
echo "=== every process"
ps -eo pid,ppid,pgid,stat,wchan:28,etimes,args --sort=pid | cut -c1-220
echo "=== threads elsewhere that run (R) or wait on the disk (D)"
declare -A mine=()
for p in $(tree "$pid"); do mine[$p]=1; done
for t in /proc/[0-9]*/task/[0-9]*; do
    p=${t#/proc/}; p=${p%%/*}
    [[ -n ${mine[$p]:-} ]] && continue
    state=$(awk '{print $3}' "$t/stat" 2>/dev/null)
    [[ $state == R || $state == D ]] || continue
    echo "  pid $p thread ${t##*/} ($(cat "$t/comm" 2>/dev/null)): state $state, wchan $(cat "$t/wchan" 2>/dev/null)"
    sed 's/^/      /' "$t/stack" 2>/dev/null | head -n 12
    [[ $(cat /proc/"$p"/comm 2>/dev/null) == gtrain ]] && busy+=("$p")
done
if command -v gdb >/dev/null; then
    for p in $(printf '%s\n' "${busy[@]}" | sort -u); do
        echo "--- user-space stacks of pid $p: $(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null | cut -c1-160)"
        timeout 20 gdb -p "$p" -batch -nx -ex 'thread apply all bt 10' 2>/dev/null | grep -E '^(Thread|#)' | head -n 60
    done
fi
echo "=== pressure (/proc/pressure) and memory"
for f in cpu io memory; do [[ -r /proc/pressure/$f ]] && sed "s/^/  $f /" /proc/pressure/$f; done
grep -E '^(MemFree|MemAvailable|Dirty|Writeback|Shmem):' /proc/meminfo | sed 's/^/  /'
echo "=== disks: reads and writes completed, in flight, ms doing I/O (twice, a second apart)"
for k in 1 2; do
    awk '$4+$8>0 && $3 !~ /^(loop|ram)/ {printf "  %s reads %s writes %s in_flight %s io_ms %s\n", $3, $4, $8, $12, $13}' /proc/diskstats
    [[ $k == 1 ]] && sleep 1
done
echo "=== end of hang report"
