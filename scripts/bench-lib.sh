# Shared by the scripts that run against a `cairn up` (benchmarks, the file-system suites):
# sourced, not run. The CPU functions need UP_PID (the `cairn up` process) and TICK (getconf
# CLK_TCK).

wait_for_mount() { # MNT LOG: waits up to 60 s for `cairn up --mount MNT` to answer; else exits
    local mnt=$1 log=$2
    for _ in $(seq 1 120); do
        grep -q " - fuse" <(grep " $mnt " /proc/self/mountinfo) 2>/dev/null && ls "$mnt" >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    echo "the mount never came up ($log)" >&2
    exit 1
}

cluster_cpu() { # seconds of CPU of the children of $UP_PID
    local t=0
    for p in $(pgrep -P "$UP_PID"); do
        t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)))
    done
    python3 -c "print($t / $TICK)"
}

master_pids() { # the `cairn master` children of $UP_PID, one a line
    local p
    for p in $(pgrep -P "$UP_PID"); do
        if tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q '^[^ ]* master '; then
            echo "$p"
        fi
    done
}

master_cpu() { # seconds of CPU of the `cairn master` children of $UP_PID
    local t=0 p
    for p in $(master_pids); do
        t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)))
    done
    python3 -c "print($t / $TICK)"
}

creates_and_cpu() { # C0 C1 < bench output with /usr/bin/time's "CPU U S" -> "creates_per_sec cpu_us_per_create"
    python3 -c "
import json, sys
lines = sys.stdin.read().splitlines()
r = json.loads([l for l in lines if l.startswith('{')][-1])
u, s = [float(x) for x in [l for l in lines if l.startswith('CPU ')][-1].split()[1:]]
n = r['ops']
cpu = $2 - $1 + u + s
print(round(r['ops_per_s']), round(cpu / max(n, 1) * 1e6))"
}
