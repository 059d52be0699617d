#!/usr/bin/env python3
"""bench/cpu_share.py — where this machine's CPU went during one measured window.

  bench/cpu_share.py --after W --for D OUT

Sleeps W seconds (the run's warmup), reads /proc/stat and every process's CPU time
(/proc/PID/stat, utime + stime), sleeps D seconds (the measured window), reads them again and
writes OUT, one JSON object: the window's length, the number of CPUs, the share of all CPUs that
was busy (user, nice, system, irq, softirq), the share stolen by the hypervisor, and each command
name's share of all CPUs (a share of 1.0 is every CPU for the whole window). A process alive at
both readings counts what it used between them; one that started in between (a database's new
backend) counts all it used; one that ended in between is missed, so a caller ends the window
before its load does. scripts/bench runs it beside each load run; bench/perf_report.py reads OUT.
"""
import argparse
import json
import os
import time

TICKS = os.sysconf("SC_CLK_TCK")


def machine():
    """The first line of /proc/stat: ticks of all CPUs by kind."""
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    v = [int(x) for x in fields[:8]] + [0] * max(0, 8 - len(fields))
    user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
    return {"busy": user + nice + system + irq + softirq, "idle": idle + iowait, "steal": steal}


def processes():
    """PID -> (command name, user + system ticks) for every process readable now."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                line = f.read()
        except OSError:
            continue  # gone meanwhile
        # The command name is in parentheses and may hold spaces; the fields after it are fixed.
        comm = line[line.index("(") + 1:line.rindex(")")]
        rest = line[line.rindex(")") + 2:].split()
        out[name] = (comm, int(rest[11]) + int(rest[12]))  # fields 14 and 15: utime, stime
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--after", type=float, required=True)
    ap.add_argument("--for", dest="window", type=float, required=True)
    ap.add_argument("out")
    args = ap.parse_args()
    time.sleep(args.after)
    t0, m0, p0 = time.monotonic(), machine(), processes()
    time.sleep(args.window)
    t1, m1, p1 = time.monotonic(), machine(), processes()
    cpus = os.cpu_count() or 1
    seconds = t1 - t0
    capacity = seconds * TICKS * cpus  # ticks all CPUs had in the window
    by_command = {}
    for pid, (comm, ticks) in p1.items():
        before = p0[pid][1] if pid in p0 and p0[pid][0] == comm else 0
        by_command[comm] = by_command.get(comm, 0) + ticks - before
    total = sum(m1[k] - m0[k] for k in ("busy", "idle", "steal")) or 1
    result = {
        "seconds": round(seconds, 3),
        "cpus": cpus,
        "busy": (m1["busy"] - m0["busy"]) / total,
        "steal": (m1["steal"] - m0["steal"]) / total,
        "commands": {c: t / capacity for c, t in sorted(by_command.items(), key=lambda x: -x[1])
                     if t > 0},
    }
    with open(args.out, "w") as f:
        json.dump(result, f, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
