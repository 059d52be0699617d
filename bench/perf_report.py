#!/usr/bin/env python3
"""bench/perf_report.py — the report of one scripts/bench run.

Reads the run's raw results (WORK/manifest.jsonl and the files it names: idem-bench JSON, Google
Benchmark JSON, pgbench output and per-transaction logs, memory samples) and writes, to OUT:
performance.md (method, machine, targets met or not, every run), performance-throughput.svg and
performance-latency.svg (gnuplot), and performance.json (every figure the report uses). Nothing is
typed in: a figure that a run did not produce is reported as missing, never guessed.

  bench/perf_report.py --work WORK --out docs --root REPO --idemd BUILD/server/idemd
"""
import argparse
import datetime
import glob
import json
import math
import os
import platform
import re
import sqlite3
import statistics
import subprocess
import sys

MIB = 1024.0  # KiB per MiB


# ---- Reading the raw results ----------------------------------------------------------------------

def read_manifest(work):
    entries = []
    with open(os.path.join(work, "manifest.jsonl")) as f:
        for line in f:
            line = line.strip()
            if line:
                entries.append(json.loads(line))
    return entries


def quantile(sorted_values, q):
    """The value of rank max(1, ceil(q * n)), as idem-bench's histogram defines its quantiles."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def idem_bench_run(work, entry):
    with open(os.path.join(work, entry["json"])) as f:
        j = json.load(f)
    m = j["measured"]
    statuses = {int(k): v for k, v in m["statuses"].items()}
    successes = statuses.get(200, 0) + statuses.get(201, 0)
    seconds = max(m["seconds"], m.get("sending_seconds", 0))
    lat = m["latency_us"]
    check = j.get("check")
    return {
        "loop": j["config"]["loop"],
        "rate": j["config"]["rate"],
        "connections": j["config"]["connections"],
        "duration_s": j["config"]["duration_s"],
        "seconds": seconds,
        "requests": m["requests"],
        "rps": m["rps"],
        "successes": successes,
        "replayed": m["replayed"],
        "ok_rps": successes / seconds if seconds > 0 else 0.0,
        "first_rps": (successes - m["replayed"]) / seconds if seconds > 0 else 0.0,
        "errors": m["errors"],
        "statuses": m["statuses"],
        "transport_errors": m["transport_errors"],
        "missed_slots": m.get("missed_slots", 0),
        "latency_ms": {k: lat[k] / 1000.0 for k in ("p50", "p90", "p99", "p99_9", "max", "mean")},
        "check": None if check is None else ("PASS" if check["pass"] else "FAIL"),
        "exit_status": entry.get("status", 0),
        "waits": waits_of(work, entry),
        "cpu": cpu_of(work, entry),
    }


def waits_of(work, entry):
    """What the database's sessions did during a run (scripts/bench's bench_run): the share of
    each wait event (or CPU, idle, idle-in-transaction) over every session of every sample."""
    path = entry.get("waits")
    if not path or not os.path.exists(os.path.join(work, path)):
        return None
    counts, samples = {}, 0
    with open(os.path.join(work, path)) as f:
        for line in f:
            words = line.split()
            if not words:
                continue
            samples += 1
            for w in words:
                counts[w] = counts.get(w, 0) + 1
    total = sum(counts.values())
    if not total:
        return None
    return {"samples": samples, "sessions": total / samples,
            "shares": sorted(((w, n / total) for w, n in counts.items()), key=lambda x: -x[1])}


# Command names (as /proc/PID/stat gives them) by the part each plays in a run; any other command
# counts as "other" (the samplers, psql, the kernel's threads).
CPU_GROUPS = (("idemd", ("idemd",)), ("nginx", ("nginx",)), ("idem-bench", ("idem-bench",)),
              ("wrk", ("wrk",)), ("pgbench", ("pgbench",)),
              ("provider-sim", ("provider-sim",)), ("upstream-sim", ("upstream-sim",)),
              ("PostgreSQL", ("postgres",)), ("Redis", ("redis-server",)))


def cpu_of(work, entry):
    """Where the machine's CPU went during a run's measured window (bench/cpu_share.py): the
    share of all CPUs busy, and each part's share of all CPUs, the rest as "other"."""
    path = entry.get("cpu")
    if not path or not os.path.exists(os.path.join(work, path)):
        return None
    with open(os.path.join(work, path)) as f:
        j = json.load(f)
    parts = {name: 0.0 for name, _ in CPU_GROUPS}
    parts["other"] = 0.0
    for comm, share in j["commands"].items():
        name = next((n for n, comms in CPU_GROUPS if comm in comms), "other")
        parts[name] += share
    return {"seconds": j["seconds"], "cpus": j["cpus"], "busy": j["busy"], "steal": j["steal"],
            "parts": parts}


def cpu_per_answer_us(r, part):
    """CPU time of one part (idemd, nginx) per answer of the run, in microseconds."""
    c = r.get("cpu") if r else None
    if not c or not r.get("rps"):
        return None
    return c["parts"][part] * c["cpus"] * 1e6 / r["rps"]


def cpu_text(c, top=4):
    """"2 CPUs 97 % busy: idemd 55 %, idem-bench 30 %, ...": the busiest parts first."""
    parts = sorted(((n, v) for n, v in c["parts"].items() if v >= 0.005), key=lambda x: -x[1])
    return (f"{c['cpus']} CPUs {c['busy'] * 100:.0f} % busy: "
            + ", ".join(f"{n} {v * 100:.0f} %" for n, v in parts[:top]))


def wrk_run(work, entry):
    """A run of bench/wrk/gateway.lua: its done() summary, with the upstream's executions."""
    with open(os.path.join(work, entry["json"])) as f:
        j = json.load(f)
    seconds = j["duration_us"] / 1e6
    statuses = {int(k): v for k, v in j["statuses"].items()}
    ok = sum(v for k, v in statuses.items() if 200 <= k < 300)
    lat = j["latency_us"]
    return {
        "system": entry["system"], "mode": entry["mode"], "threads": entry["threads"],
        "connections": entry["connections"], "seconds": seconds,
        "rps": j["requests"] / seconds if seconds else None,
        "ok_rps": ok / seconds if seconds else None, "ok": ok,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "transport_errors": {k: v for k, v in j["errors"].items() if v},
        "upstream_executions": entry["upstream_executions"],
        "latency_ms": {k: lat[k] / 1000.0 for k in ("p50", "p90", "p99", "p99_9", "max", "mean")},
        "cpu": cpu_of(work, entry),
    }


def profile_of(work, entry):
    """A perf profile of idemd (scripts/bench's step 10): [(share, shared object)] and
    [(share, shared object, function)], as perf report listed them, largest first."""
    def rows(path, fields):
        out = []
        full = os.path.join(work, path)
        if not os.path.exists(full):
            return out
        with open(full) as f:
            for line in f:
                m = re.match(r"\s*([0-9.]+)%\s+(.*\S)", line)
                if not m:
                    continue
                rest = m.group(2)
                if fields == 1:
                    out.append((float(m.group(1)) / 100, rest))
                else:
                    parts = re.split(r"\s+\[[.k]\]\s+", rest, maxsplit=1)
                    if len(parts) == 2:
                        out.append((float(m.group(1)) / 100, parts[0].strip(), parts[1].strip()))
        return out
    return {"store": entry["store"], "scenario": entry["scenario"],
            "objects": rows(entry["dso"], 1), "functions": rows(entry["sym"], 2),
            "threads": rows(entry["comm"], 1) if entry.get("comm") else []}


def gbench_runs(work, entry):
    with open(os.path.join(work, entry["json"])) as f:
        j = json.load(f)
    out = {}
    scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
    for b in j.get("benchmarks", []):
        name = b["name"]
        if not name.startswith("BM_SqliteClaimAndFinish/") or b.get("error_occurred"):
            continue
        arg = name.split("/")[1]
        out["full" if arg == "1" else "normal"] = {
            "name": name,
            "label": b.get("label", ""),
            "iterations": b["iterations"],
            "per_s": b["items_per_second"],
            "mean_ms": b["real_time"] * scale[b.get("time_unit", "ns")],
        }
    out["context"] = j.get("context", {})
    return out


def pgbench_run(work, entry):
    with open(os.path.join(work, entry["out"])) as f:
        text = f.read()
    tps = re.search(r"^tps = ([0-9.]+) \(without initial connection time\)", text, re.M)
    processed = re.search(r"^number of transactions actually processed: (\d+)", text, re.M)
    failed = re.search(r"^number of failed transactions: (\d+)", text, re.M)
    latencies = []
    for path in glob.glob(os.path.join(work, entry["log_prefix"]) + ".*"):
        with open(path) as f:
            for line in f:
                fields = line.split()
                # client_id transaction_no time script_no time_epoch time_us; time in µs
                if len(fields) >= 6 and fields[2].isdigit():
                    latencies.append(int(fields[2]) / 1000.0)
    latencies.sort()
    run = {
        "clients": entry["clients"],
        "threads": entry["threads"],
        "duration_s": entry["duration_s"],
        "tps": float(tps.group(1)) if tps else None,
        "processed": int(processed.group(1)) if processed else None,
        "failed": int(failed.group(1)) if failed else None,
        "latency_ms": None,
        "cpu": cpu_of(work, entry),
    }
    if latencies:
        run["latency_ms"] = {
            "p50": quantile(latencies, 0.5),
            "p90": quantile(latencies, 0.9),
            "p99": quantile(latencies, 0.99),
            "p99_9": quantile(latencies, 0.999),
            "max": latencies[-1],
            "mean": sum(latencies) / len(latencies),
        }
    return run


def samples(work, path):
    rows = []
    with open(os.path.join(work, path)) as f:
        for line in f:
            fields = line.split()
            if len(fields) == 4:
                rows.append([float(fields[0])] + [int(x) for x in fields[1:]])
    if not rows:
        return None
    return {
        "count": len(rows),
        "peak_rss_kb": max(r[1] for r in rows),
        "peak_hwm_kb": max(r[2] for r in rows),
        "peak_provider_connections": max(r[3] for r in rows),
    }


# ---- The machine ----------------------------------------------------------------------------------

def command_output(args, cwd=None):
    try:
        r = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (r.stdout + r.stderr).strip()
    return text.splitlines()[0] if text else None


def machine(root, idemd):
    info = {"nproc": os.cpu_count()}
    with open("/proc/cpuinfo") as f:
        models = [l.split(":", 1)[1].strip() for l in f if l.startswith("model name")]
    info["cpu"] = models[0] if models else "unknown"
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                info["memory_gib"] = int(line.split()[1]) / 1024.0 / 1024.0
    info["kernel"] = platform.release()
    try:
        with open("/etc/debian_version") as f:
            info["debian"] = f.read().strip()
    except OSError:
        info["debian"] = None
    info["commit"] = command_output(["git", "rev-parse", "HEAD"], cwd=root)
    info["commit_subject"] = command_output(["git", "log", "-1", "--format=%s"], cwd=root)
    # The report's own files do not count: an earlier run may have rewritten them.
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                            ":(exclude)docs/performance*"], cwd=root,
                           capture_output=True, text=True).stdout.strip()
    info["dirty"] = bool(dirty)
    info["branch"] = command_output(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=root)
    info["nginx"] = command_output(["nginx", "-v"])
    info["postgres"] = command_output(["/usr/lib/postgresql/15/bin/postgres", "--version"])
    info["pgbench"] = command_output(["pgbench", "--version"])
    info["redis"] = command_output(["redis-server", "--version"])
    info["sqlite"] = sqlite3.sqlite_version
    info["gnuplot"] = command_output(["gnuplot", "--version"])
    cache = os.path.join(os.path.dirname(os.path.dirname(idemd)), "CMakeCache.txt")
    info["build_type"] = None
    info["compiler"] = None
    if os.path.exists(cache):
        with open(cache) as f:
            for line in f:
                if line.startswith("CMAKE_BUILD_TYPE:"):
                    info["build_type"] = line.split("=", 1)[1].strip()
                if line.startswith("CMAKE_CXX_COMPILER:"):
                    info["compiler"] = command_output([line.split("=", 1)[1].strip(), "--version"])
    return info


# ---- Formatting -----------------------------------------------------------------------------------

def num(x, digits=0):
    if x is None:
        return "—"
    return f"{x:,.{digits}f}"


def ms(x):
    if x is None:
        return "—"
    if x < 1:
        return f"{x:.3f}"
    if x < 10:
        return f"{x:.2f}"
    if x < 100:
        return f"{x:.1f}"
    return f"{x:,.0f}"


def mib(kb):
    return None if kb is None else kb / MIB


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


STORE_NAMES = {"sqlite": "SQLite", "postgres": "PostgreSQL", "postgres-redis": "PostgreSQL + Redis",
               "postgres-quiet": "PostgreSQL, notifications off"}


# ---- The report -----------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--idemd", required=True)
    args = ap.parse_args()
    work, out = args.work, args.out
    os.makedirs(out, exist_ok=True)

    entries = read_manifest(work)
    meta = next(e for e in entries if e["id"] == "meta")
    runs = {}      # id -> summary of an HTTP load run (idem-bench)
    memory = {}    # store -> idle memory
    gbench = None
    pgbench = None
    sampled = {}   # id -> memory samples
    inflight_entry = None
    gateway = {}   # the gateway step's wrk runs, by the part of their id after "gateway/"
    wrk_payments = {}  # wrk on POST /v1/payments: "nginx-replay", "<store>-replay"
    profiles = []  # perf profiles of idemd (step 10)
    ab = []        # the A/B's runs: (build, round, harness and scenario, summary)
    ab_meta = next((e for e in entries if e.get("kind") == "ab-meta"), None)
    for e in entries:
        kind = e.get("kind")
        if "ab_build" in e:
            summary = (idem_bench_run(work, e) if kind == "idem-bench" else wrk_run(work, e))
            what = ("wrk " + e["mode"]) if kind == "wrk" else e["scenario"]
            ab.append((e["ab_build"], e["ab_round"], what, summary))
        elif kind == "idem-bench":
            runs[e["id"]] = dict(idem_bench_run(work, e), system=e["system"], store=e["store"],
                                 scenario=e["scenario"])
            if "samples" in e:
                sampled[e["id"]] = samples(work, e["samples"])
            if e["id"] == "inflight":
                inflight_entry = e
        elif kind == "profile":
            profiles.append(profile_of(work, e))
        elif kind == "gbench":
            gbench = gbench_runs(work, e)
        elif kind == "pgbench":
            pgbench = pgbench_run(work, e)
        elif kind == "memory":
            memory[e["store"]] = e
        elif kind == "wrk":
            part, name = e["id"].split("/", 1)
            (gateway if part == "gateway" else wrk_payments)[name] = wrk_run(work, e)
    info = machine(args.root, args.idemd)
    if meta.get("commit"):  # the commit the run measured, not the one the report is drawn on
        info["commit"], info["dirty"] = meta["commit"], meta["dirty"]
        info["commit_subject"] = command_output(["git", "log", "-1", "--format=%s",
                                                 meta["commit"]], cwd=args.root)
    stores = [s for s in ("sqlite", "postgres", "postgres-redis") if f"{s}/replay" in runs]

    # ---- Targets ----
    targets = []

    def target(name, figure, against, value, bound, met, note="", run=None, versus=None):
        # value: a ratio (bound "≥ 0.5"), or the figure itself (MiB, per second). A target not
        # met says what its run was bound by: where the CPU went (against the ceiling's run,
        # versus, the CPU time per answer of each server) and what PostgreSQL's sessions waited on.
        if not met and run:
            bounds = [note] if note else []
            if run.get("cpu"):
                bounds.append(cpu_text(run["cpu"]))
            mine = cpu_per_answer_us(run, "idemd")
            theirs = cpu_per_answer_us(versus, "nginx")
            if mine is not None and theirs is not None:
                bounds.append(f"idemd's CPU per answer {mine:.0f} µs, nginx's {theirs:.0f} µs")
            elif mine is not None:
                bounds.append(f"idemd's CPU per answer {mine:,.0f} µs")
            w = run.get("waits")
            if w:
                waiting = [(n, v) for n, v in w["shares"] if n not in ("idle", "CPU")][:2]
                if waiting:
                    bounds.append("PostgreSQL's sessions: " + ", ".join(
                        f"{n} {v * 100:.0f} %" for n, v in waiting))
            note = "; ".join(bounds)
        if value is None:
            shown = "—"
        elif "MiB" in bound:
            shown = f"{value:,.1f} MiB"
        elif "/s" in bound:
            shown = f"{value:,.0f}/s"
        else:
            shown = f"{value:.2f}"
            # Where two digits would round onto the other side of the bound (0.496 shown as
            # "0.50" beside "≥ 0.5" and not met), the figure gets a third.
            edge = re.match(r"([≥≤])\s*([0-9.]+)$", bound)
            if edge:
                rounded, limit = float(shown), float(edge.group(2))
                if (rounded >= limit if edge.group(1) == "≥" else rounded <= limit) != bool(met):
                    shown = f"{value:.3f}"
        targets.append({"target": name, "figure": figure, "against": against, "value": value,
                        "shown": shown, "bound": bound, "met": bool(met), "note": note})

    # Replays against nginx in both harnesses: idem-bench (its keys) and wrk (one key retried,
    # the same keep-alive connections).
    nginx = runs.get("nginx")
    harnesses = (("", nginx, lambda s: runs.get(f"{s}/replay")),
                 (", wrk", wrk_payments.get("nginx-replay"),
                  lambda s: wrk_payments.get(f"{s}-replay")))
    for suffix, ceiling, replays_of in harnesses:
        measured = [(s, replays_of(s)) for s in stores if ceiling and replays_of(s)]
        for s, r in measured:
            v = ratio(r["ok_rps"], ceiling["ok_rps"])
            target(f"Replays ≥ 0.5 × nginx's requests/s{suffix} ({STORE_NAMES[s]})",
                   f"{num(r['ok_rps'])}/s", f"nginx {num(ceiling['ok_rps'])}/s",
                   v, "≥ 0.5", v is not None and v >= 0.5, run=r, versus=ceiling)
        for s, r in measured:
            v = ratio(r["latency_ms"]["p99"], ceiling["latency_ms"]["p99"])
            target(f"Replays' p99 ≤ 2 × nginx's p99{suffix} ({STORE_NAMES[s]})",
                   f"{ms(r['latency_ms']['p99'])} ms",
                   f"nginx {ms(ceiling['latency_ms']['p99'])} ms", v, "≤ 2",
                   v is not None and v <= 2, run=r, versus=ceiling)
    full = gbench.get("full") if gbench else None
    r = runs.get("sqlite/unique")
    if r and full:
        v = ratio(r["first_rps"], full["per_s"])
        target("First executions on SQLite (durable commits) ≥ 5 × one commit per request",
               f"{num(r['first_rps'])}/s",
               f"{num(full['per_s'])}/s (claim + completion, each committed alone, synchronous=FULL)",
               v, "≥ 5", v is not None and v >= 5, run=r)
    for s in ("postgres", "postgres-redis"):
        r = runs.get(f"{s}/unique")
        if r and pgbench and pgbench["tps"]:
            v = ratio(r["first_rps"], pgbench["tps"])
            target(f"First executions on {STORE_NAMES[s]} ≥ 0.7 × pgbench, same statements",
                   f"{num(r['first_rps'])}/s", f"pgbench {num(pgbench['tps'])}/s", v, "≥ 0.7",
                   v is not None and v >= 0.7, run=r)
    for run, whose in (("slow", ""), ("slow-principals",
                                      f"from {num(meta.get('principals', 0))} principals ")):
        for s in stores:
            r = runs.get(f"{s}/{run}")
            if r:
                target(f"Provider answering in {meta['slow_delay_ms']} ms: ≥ 1,000 first "
                       f"executions/s {whose}({STORE_NAMES[s]})",
                       f"{num(r['first_rps'])}/s", f"{num(meta['slow_rate'])}/s scheduled",
                       r["first_rps"], "≥ 1,000/s", r["first_rps"] >= 1000, run=r)
    for s in stores:
        alone, beside = runs.get(f"{s}/replay-alone"), runs.get(f"{s}/replay-beside-slow")
        if alone and beside:
            v = ratio(beside["latency_ms"]["p99"], alone["latency_ms"]["p99"])
            target(f"Replays' p99 beside the slow run ≤ 1.5 × unloaded ({STORE_NAMES[s]})",
                   f"{ms(beside['latency_ms']['p99'])} ms",
                   f"alone {ms(alone['latency_ms']['p99'])} ms", v, "≤ 1.5",
                   v is not None and v <= 1.5, run=runs.get(f"{s}/slow"))
    for s in stores:
        m = memory.get(s)
        if m:
            v = mib(m["rss_kb"])
            target(f"RSS < 100 MiB at {num(m['connections'])} open connections ({STORE_NAMES[s]})",
                   f"{v:.1f} MiB", f"fresh {mib(m['fresh_rss_kb']):.1f} MiB", v, "< 100 MiB",
                   v < 100)
    inflight = runs.get("inflight")
    if inflight and inflight_entry:
        smp = sampled.get("inflight")
        peak_conns = smp["peak_provider_connections"] if smp else 0
        peak_kb = max(inflight_entry["final_hwm_kb"], smp["peak_rss_kb"] if smp else 0)
        v = mib(peak_kb)
        reached = peak_conns >= 10000
        if reached:
            note = ""
        elif peak_conns < 0.95 * meta["inflight"]:
            note = (f"idemd had only {num(peak_conns)} provider calls in flight at once, with "
                    f"{num(meta['inflight'])} requests waiting")
        else:
            note = f"not measurable here: {meta['inflight_note']}" if meta.get("inflight_note") else ""
        target("RSS < 300 MiB with 10,000 provider calls in flight",
               f"{v:.1f} MiB peak", f"{num(peak_conns)} provider connections at the peak", v,
               "< 300 MiB and 10,000 in flight", reached and v < 300, note)

    # The A/B: this build against the baseline's, medians of their rounds. A regression beyond
    # the machine's noise shows here, in the report of the change that made it.
    ab_rows = ab_table(ab)
    for what, cur, base in ab_rows:
        v = ratio(cur["rps"], base["rps"])
        target(f"{AB_NAMES[what]} ≥ 0.9 × the baseline build's (A/B, SQLite)",
               f"{num(cur['rps'])}/s", f"baseline {num(base['rps'])}/s", v, "≥ 0.9",
               v is not None and v >= 0.9)

    # ---- Plots ----
    plot_rows = []  # (label, requests/s, colour 1 ceiling / 2 idemd)
    if nginx:
        plot_rows.append(("nginx fixed 201", nginx["ok_rps"], 1))
    if full:
        plot_rows.append(("SQLite claim+finish FULL", full["per_s"], 1))
    if pgbench and pgbench["tps"]:
        plot_rows.append(("pgbench same statements", pgbench["tps"], 1))
    short = {"sqlite": "SQLite", "postgres": "PG", "postgres-redis": "PG+Redis"}
    for s in stores:
        for sc, label in (("replay", "replay"), ("unique", "unique"),
                          ("unique-principals", "unique 1000p"), ("mix", "mix"),
                          ("slow", "slow 500 ms"), ("slow-principals", "slow 1000p")):
            r = runs.get(f"{s}/{sc}")
            if r:
                plot_rows.append((f"{short[s]} {label}", r["ok_rps"], 2))
    lat_rows = []  # (label, p50, p90, p99, p99.9)
    if nginx:
        lat_rows.append(("nginx", nginx["latency_ms"]))
    if pgbench and pgbench["latency_ms"]:
        lat_rows.append(("pgbench", pgbench["latency_ms"]))
    for s in stores:
        for sc, label in (("replay", "replay"), ("unique", "unique"),
                          ("unique-principals", "unique 1000p"), ("mix", "mix"),
                          ("replay-alone", "replay alone"), ("slow", "slow"),
                          ("slow-principals", "slow 1000p"),
                          ("replay-beside-slow", "replay+slow")):
            r = runs.get(f"{s}/{sc}")
            if r:
                lat_rows.append((f"{short[s]} {label}", r["latency_ms"]))
    plots_ok, plot_error = draw(work, out, plot_rows, lat_rows, meta["mode"])

    # ---- performance.json ----
    summary = {"meta": meta, "machine": info, "targets": targets, "runs": runs,
               "sqlite_ceiling": gbench, "pgbench": pgbench, "memory": memory,
               "memory_samples": sampled, "gateway": gateway, "wrk_payments": wrk_payments,
               "ab": {"meta": ab_meta, "rows": [{"what": w, "current": c, "baseline": b}
                                                for w, c, b in ab_rows]}}
    with open(os.path.join(out, "performance.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True, default=str)
        f.write("\n")

    # ---- performance.md ----
    md = []
    quick = meta["mode"] == "quick"
    when = meta["started"]
    commit = (info["commit"] or "unknown")[:12] + (" (with uncommitted changes)" if info["dirty"] else "")
    md.append("# idemd performance\n")
    md.append(f"Written by `scripts/bench{' --quick' if quick else ''}`, started {when} on commit "
              f"`{commit}` ({info['branch']}). Every figure on this page comes from the raw results of "
              "that one run (the script prints where it kept them); nothing is typed in. Run "
              "`scripts/bench` again to replace the page.\n")
    if quick:
        md.append(f"> **A quick run** (`--quick`): each measurement lasted {meta['duration_s']} s "
                  f"after a {meta['warmup_s']} s warmup. It shows that the script works end to end; "
                  "its figures are noisy and are not the project's measurement. The full run "
                  "(`scripts/bench`, about 20 minutes, on a quiet machine) replaces them.\n")
    md.append("Read the ratios, not the absolutes: every ceiling and every idemd run was measured on "
              "the same machine in the same sitting, but the machine is a small shared VM (below), "
              "and the load generator, the database and idemd share its cores.\n")

    md.append("## Targets\n")
    md.append("| target | idemd | against | ratio / figure | bound | met |")
    md.append("|---|---|---|---|---|---|")
    for t in targets:
        met = "**met**" if t["met"] else "**not met**"
        if t["note"]:
            met += f" — {t['note']}"
        md.append(f"| {t['target']} | {t['figure']} | {t['against']} | {t['shown']} | {t['bound']} "
                  f"| {met} |")
    met_count = sum(1 for t in targets if t["met"])
    md.append(f"\n{met_count} of {len(targets)} met.\n")

    md.append("## Machine\n")
    md.append(f"- CPU: {info['cpu']}, {info['nproc']} logical CPUs (`nproc`)")
    md.append(f"- Memory: {info['memory_gib']:.1f} GiB; kernel {info['kernel']}; Debian {info['debian']}")
    md.append(f"- Build: {info['build_type']} (CMake preset `release`), {info['compiler']}")
    md.append(f"- nginx: {info['nginx']}; PostgreSQL: {info['postgres']}; pgbench: {info['pgbench']}")
    md.append(f"- Redis: {info['redis']}; SQLite {info['sqlite']}; plots: {info['gnuplot']}")
    md.append(f"- Open-files limit of the run: {meta['nofile']}")
    end = next((e for e in entries if e["id"] == "end"), None)
    md.append(f"- Load average (1, 5, 15 min) when the measurements began: {meta.get('loadavg', '?')}"
              + (f"; when they ended: {end.get('loadavg', '?')}" if end else "")
              + " (the first shows what else ran on the machine; the second includes this run)")
    md.append(f"- Commit: `{info['commit']}` {info['commit_subject'] or ''}"
              + (" — with uncommitted changes" if info["dirty"] else ""))
    md.append(f"- Date: {when} (UTC)" + (f"; the measurements took {end['elapsed_s'] / 60:.1f} "
                                           "minutes" if end else "") + "\n")

    md.append("## Method\n")
    md.append(method_text(meta, nginx_workers=next((e.get("workers") for e in entries
                                                      if e["id"] == "nginx"), None)))

    md.append("## Every run\n")
    md.append("Requests/s counts every answer in the measured window; ok/s the 200s and 201s "
              "(first executions and replays); first/s the 200s and 201s not marked "
              "`Idempotent-Replayed`. Latency in milliseconds: closed loop from the send, open loop "
              "from the scheduled time (idem-bench, coordinated omission counted); pgbench per "
              "script (one first execution: two transactions); Google Benchmark the mean per "
              "iteration.\n")
    md.append("| run | load | requests/s | ok/s | first/s | p50 | p90 | p99 | p99.9 | max | "
              "errors | exactly-once |")
    md.append("|---|---|---|---|---|---|---|---|---|---|---|---|")

    def load_of(r):
        if r["loop"] == "open":
            return f"open {num(r['rate'])}/s, {num(r['connections'])} conn"
        return f"closed, {num(r['connections'])} conn"

    def run_row(label, r):
        l = r["latency_ms"]
        err = num(r["errors"])
        if r["errors"]:
            kinds = ", ".join(f"{k}: {v}" for k, v in sorted(r["statuses"].items())
                              if k not in ("200", "201"))
            kinds += (", " if kinds and r["transport_errors"] else "") + ", ".join(
                f"{k}: {v}" for k, v in sorted(r["transport_errors"].items()))
            err += f" ({kinds})"
        check = r["check"] or "not checked"
        if r["exit_status"] and r["check"] != "FAIL":
            check += f" (exit {r['exit_status']})"
        md.append(f"| {label} | {load_of(r)} | {num(r['rps'])} | {num(r['ok_rps'])} | "
                  f"{num(r['first_rps'])} | {ms(l['p50'])} | {ms(l['p90'])} | {ms(l['p99'])} | "
                  f"{ms(l['p99_9'])} | {ms(l['max'])} | {err} | {check} |")

    if nginx:
        run_row("nginx, fixed 201 (HTTP ceiling)", nginx)
    if gbench:
        for k, label in (("full", "synchronous=FULL (idemd's; the SQLite ceiling)"),
                         ("normal", "synchronous=NORMAL (for comparison)")):
            g = gbench.get(k)
            if g:
                md.append(f"| SQLite claim + completion, {label} | 1 thread, "
                          f"{num(g['iterations'])} iterations | {num(g['per_s'])} | — | "
                          f"{num(g['per_s'])} | mean {ms(g['mean_ms'])} | | | | | | |")
    if pgbench:
        l = pgbench["latency_ms"] or {}
        md.append(f"| pgbench, same statements (PostgreSQL ceiling) | {pgbench['clients']} clients, "
                  f"{pgbench['threads']} threads, -M prepared | {num(pgbench['tps'])} | — | "
                  f"{num(pgbench['tps'])} | {ms(l.get('p50'))} | {ms(l.get('p90'))} | "
                  f"{ms(l.get('p99'))} | {ms(l.get('p99_9'))} | {ms(l.get('max'))} | "
                  f"{num(pgbench['failed'])} failed | — |")
    many = num(meta.get("principals", 0))
    names = {"replay": "replays", "unique": "first executions",
             "unique-principals": f"first executions from {many} principals",
             "slow-principals": f"first executions, provider {meta['slow_delay_ms']} ms, "
                                f"from {many} principals",
             "replay-alone": "replays alone (baseline)",
             "mix": f"mix ({meta['mix_duplicates']} % repeats)",
             "slow": f"first executions, provider {meta['slow_delay_ms']} ms",
             "replay-beside-slow": "replays beside the slow run"}
    for s in stores:
        for sc in ("replay", "unique", "unique-principals", "mix", "replay-alone", "slow",
                   "slow-principals", "replay-beside-slow"):
            r = runs.get(f"{s}/{sc}")
            if r:
                run_row(f"idemd {STORE_NAMES[s]}: {names[sc]}", r)
    for sc in ("unique", "unique-principals"):
        r = runs.get(f"postgres-quiet/{sc}")
        if r:
            run_row(f"idemd {STORE_NAMES['postgres-quiet']}: {names[sc]}", r)
    if inflight:
        run_row(f"idemd SQLite: {num(meta['inflight'])} requests waiting "
                f"{num(meta['inflight_delay_ms'])} ms for the provider", inflight)
    md.append("")
    if wrk_payments:
        md.append("The replays in the second harness: wrk (`bench/wrk/gateway.lua` with "
                  "`WRK_ROUTE=payments WRK_MODE=replay`), 2 threads and "
                  f"{meta['connections']} keep-alive connections for {meta['duration_s']} s, one "
                  "key retried (idem-bench's replays spread over "
                  f"{num(meta['keys'])} keys); wrk's latency from the send (closed loop).\n")
        md.append("| run | requests/s | 2xx/s | p50 | p90 | p99 | p99.9 | max | errors |")
        md.append("|---|---|---|---|---|---|---|---|---|")
        for key, label in [("nginx-replay", "nginx, fixed 201")] + [
                (f"{s}-replay", f"idemd {STORE_NAMES[s]}: replays") for s in stores]:
            r = wrk_payments.get(key)
            if not r:
                continue
            l = r["latency_ms"]
            md.append(f"| {label} | {num(r['rps'])} | {num(r['ok_rps'])} | {ms(l['p50'])} | "
                      f"{ms(l['p90'])} | {ms(l['p99'])} | {ms(l['p99_9'])} | {ms(l['max'])} | "
                      f"{wrk_errors(r)} |")
    md.append("")

    cpu_rows = [("nginx, fixed 201", nginx, "nginx"),
                ("nginx, fixed 201 (wrk)", wrk_payments.get("nginx-replay"), "nginx"),
                ("pgbench, same statements", pgbench, "PostgreSQL")]
    for s in stores + ["postgres-quiet"]:
        for sc in ("replay", "unique", "unique-principals", "mix", "replay-alone", "slow",
                   "slow-principals"):
            cpu_rows.append((f"idemd {STORE_NAMES[s]}: {names[sc]}", runs.get(f"{s}/{sc}"),
                             "idemd"))
        cpu_rows.append((f"idemd {STORE_NAMES[s]}: replays (wrk)", wrk_payments.get(f"{s}-replay"),
                         "idemd"))
    cpu_rows = [(label, r, server) for label, r, server in cpu_rows if r and r.get("cpu")]
    if cpu_rows:
        parts = [n for n, _ in CPU_GROUPS] + ["other"]
        parts = [n for n in parts if any(r["cpu"]["parts"][n] >= 0.005 for _, r, _ in cpu_rows)]
        md.append("## Where the CPU went\n")
        md.append("During each run's measured window (`bench/cpu_share.py`): the share of the "
                  "machine's CPUs that was busy (`/proc/stat`), and each process's share of them "
                  "(user and system time from `/proc/PID/stat`, by command; `other` is everything "
                  "else: the samplers, psql, the kernel's threads). 100 % is every CPU for the "
                  "whole window, so a busy share near 100 % means the run was bound by this "
                  "machine's CPUs, shared by the server, its load generator and its "
                  "dependencies. The last column is the server's CPU time per answer (idemd's, or "
                  "nginx's): what one answer costs, whatever else ran.\n")
        md.append("| run | busy | " + " | ".join(parts) + " | server's CPU per answer |")
        md.append("|---|---|" + "---|" * len(parts) + "---|")
        for label, r, server in cpu_rows:
            c = r["cpu"]
            per = cpu_per_answer_us(r, server)
            md.append(f"| {label} | {c['busy'] * 100:.0f} % | "
                      + " | ".join(f"{c['parts'][n] * 100:.0f} %" for n in parts)
                      + f" | {'—' if per is None else f'{per:,.0f} µs'} |")
        md.append("")

    waited = [(s, sc) for s in stores + ["postgres-quiet"]
              for sc in ("unique", "unique-principals", "slow", "slow-principals", "replay")
              if runs.get(f"{s}/{sc}") and runs[f"{s}/{sc}"]["waits"]]
    if waited:
        md.append("## What PostgreSQL's sessions did\n")
        md.append("During each run's measured window, `pg_stat_activity` of the run's database "
                  "every 0.2 s (one psql session, `\\watch`): the share of idemd's sessions in "
                  "each state over all samples. `Lock:transactionid` and `Lock:tuple`: waiting for "
                  "another transaction's row lock — a principal's counter row, which its claims "
                  "take at the quota count and hold to their commit; `Lock:object`: the queue of "
                  "LISTEN/NOTIFY, whose lock each completion's commit takes (its `pg_notify`) "
                  "until it is flushed; `IO:WALSync`: a commit's "
                  "flush; `CPU`: executing; `idle`: waiting for idemd to send the next "
                  "statement or transaction; `idle-in-transaction`: inside a transaction, waiting "
                  "for idemd.\n")
        md.append("| run | samples | sessions | states (share of session-samples) |")
        md.append("|---|---|---|---|")
        for s, sc in waited:
            w = runs[f"{s}/{sc}"]["waits"]
            shown = ", ".join(f"{name} {share * 100:.0f} %" for name, share in w["shares"][:6]
                              if share >= 0.01)
            md.append(f"| idemd {STORE_NAMES[s]}: {names[sc]} | {w['samples']} | "
                      f"{w['sessions']:.1f} | {shown} |")
        md.append("")
        quiet = [(sc, runs.get(f"postgres/{sc}"), runs.get(f"postgres-quiet/{sc}"))
                 for sc in ("unique", "unique-principals")]
        quiet = [(sc, on, off) for sc, on, off in quiet if on and off and on["first_rps"]]
        if quiet:
            md.append("With `[store] notifications = false` (no `NOTIFY` in a completion, no "
                      "listener; a fresh database, the same load just after the PostgreSQL runs): "
                      + "; ".join(f"{names[sc]} {num(off['first_rps'])}/s against "
                                  f"{num(on['first_rps'])}/s with them "
                                  f"({ratio(off['first_rps'], on['first_rps']):.2f}×)"
                                  for sc, on, off in quiet) + ".\n")

    if profiles:
        md.append(profile_text(profiles, meta, names))
    if gateway:
        md.append(gateway_text(gateway, meta))
    if ab_rows:
        md.append(ab_text(ab, ab_rows, ab_meta, meta, args.root))

    md.append("## Memory\n")
    md.append("idemd's resident set (`VmRSS`) and its peak (`VmHWM`) from `/proc/PID/status`; "
              "provider connections are the TCP connections open to provider-sim at once, sampled "
              f"every {meta['sample_s']} s from `/proc/net/tcp` (each is a provider call in flight, "
              "or an idle kept-alive connection of a client pool).\n")
    md.append("| when | VmRSS MiB | VmHWM MiB | provider connections (peak) |")
    md.append("|---|---|---|---|")
    for s in stores:
        m = memory.get(s)
        if m:
            md.append(f"| {STORE_NAMES[s]}: fresh process | {mib(m['fresh_rss_kb']):.1f} | "
                      f"{mib(m['fresh_hwm_kb']):.1f} | — |")
            md.append(f"| {STORE_NAMES[s]}: {num(m['connections'])} idle connections open | "
                      f"{mib(m['rss_kb']):.1f} | {mib(m['hwm_kb']):.1f} | — |")
        smp = sampled.get(f"{s}/slow")
        if smp:
            md.append(f"| {STORE_NAMES[s]}: slow run (peak of {smp['count']} samples) | "
                      f"{mib(smp['peak_rss_kb']):.1f} | {mib(smp['peak_hwm_kb']):.1f} | "
                      f"{num(smp['peak_provider_connections'])} |")
    if inflight_entry:
        smp = sampled.get("inflight")
        md.append(f"| SQLite, fresh process before the in-flight run | "
                  f"{mib(inflight_entry['fresh_rss_kb']):.1f} | — | — |")
        if smp:
            md.append(f"| SQLite: {num(meta['inflight'])} requests held at the provider (peak of "
                      f"{smp['count']} samples) | {mib(smp['peak_rss_kb']):.1f} | "
                      f"{mib(smp['peak_hwm_kb']):.1f} | {num(smp['peak_provider_connections'])} |")
        md.append(f"| SQLite: after that run | {mib(inflight_entry['final_rss_kb']):.1f} | "
                  f"{mib(inflight_entry['final_hwm_kb']):.1f} | — |")
    md.append("")

    md.append("## Plots\n")
    if plots_ok:
        md.append("Throughput (successful answers per second; ceilings in the first colour, log scale):\n")
        md.append("![Throughput of every run](performance-throughput.svg)\n")
        md.append("Latency percentiles of every load run (milliseconds, log scale):\n")
        md.append("![Latency percentiles of every run](performance-latency.svg)\n")
    else:
        md.append(f"The plots could not be drawn: {plot_error}\n")

    md.append("## Caveats\n")
    md.append(caveats_text(meta, info))

    md.append("## idemd's configuration in these runs\n")
    md.append("`config/idemd.dev.toml` with the store, the secrets file, and the keys `scripts/bench` "
              "sets (its `make_config`: connection, in-flight and per-principal bounds, the "
              "PostgreSQL pool, provider timeout and lease for the in-flight run, no periodic "
              "reconciliation). The tables that matter, as given to idemd on SQLite (the "
              "PostgreSQL runs differ only in the store's url, and with Redis its `[redis]` url); "
              "keys this build does not know are ignored by it:\n")
    cfg = os.path.join(work, "idemd-sqlite.toml")
    if os.path.exists(cfg):
        md.append("```toml")
        md.append(config_tables(cfg, ("server", "store", "provider", "idempotency")))
        md.append("```\n")

    with open(os.path.join(out, "performance.md"), "w") as f:
        f.write("\n".join(md).rstrip() + "\n")
    return 0


AB_NAMES = {"replay": "Replays (idem-bench)", "wrk replay": "Replays (wrk)",
            "unique": "First executions (idem-bench)"}


def profile_text(profiles, meta, names):
    out = ["## Where idemd's CPU time went\n",
           "Runs of their own after the A/B (so the sampling costs none of the figures above): a "
           "fresh idemd, closed loop on "
           f"{meta['connections']} connections, sampled by `perf record -F 499` for "
           f"{max(1, meta['duration_s'] - 2)} s of the measured window (no call graphs). Shares "
           "of idemd's samples: by shared object (`[kernel.kallsyms]` is the kernel working for "
           "idemd: its sockets, its writes, its scheduling), by thread (`http-io`: the event "
           "loops; `store`: the store's blocking calls, SQLite's writer among them; "
           "`store-read`: snapshot reads; `log-writer`: the access log), then the functions above "
           "0.5 %.\n"]
    for p in profiles:
        label = f"idemd {STORE_NAMES.get(p['store'], p['store'])}: {names.get(p['scenario'], p['scenario'])}"
        objects = ", ".join(f"`{o}` {v * 100:.0f} %" for v, o in p["objects"][:6] if v >= 0.005)
        threads = ", ".join(f"`{t}` {v * 100:.0f} %" for v, t in p["threads"][:6] if v >= 0.005)
        out.append(f"**{label}.** By shared object: {objects or 'nothing recorded'}."
                   + (f" By thread: {threads}." if threads else "") + "\n")
        if p["functions"]:
            out.append("| function | shared object | share |")
            out.append("|---|---|---|")
            for v, o, fn in p["functions"][:12]:
                shown = fn.replace("|", "\\|")
                out.append(f"| `{shown}` | `{o}` | {v * 100:.1f} % |")
            out.append("")
    return "\n".join(out) + "\n"


def ab_table(ab):
    """[(what, current, baseline)]: per harness and scenario, each build's figures as the
    median of its rounds (requests/s and p99), in AB_NAMES' order."""
    rows = []
    for what in AB_NAMES:
        per = {}
        for build in ("current", "baseline"):
            # A round that answered nothing counts (as 0/s): it is the regression to show.
            got = [r for b, _, w, r in ab if b == build and w == what and r["ok_rps"] is not None]
            if got:
                per[build] = {"rps": statistics.median(r["ok_rps"] for r in got),
                              "p99": statistics.median(r["latency_ms"]["p99"] for r in got),
                              "rounds": [r["ok_rps"] for r in got],
                              "checks": sorted({r.get("check") or "not checked" for r in got})}
        if len(per) == 2:
            rows.append((what, per["current"], per["baseline"]))
    return rows


def ab_text(ab, rows, ab_meta, meta, root):
    """This build against the baseline's, alternating rounds in one sitting."""
    ab_meta = ab_meta or {}
    commit, chosen = ab_meta.get("baseline_commit", ""), ab_meta.get("baseline_from", "")
    if commit == "same":
        whose = ("This build against itself (no baseline given, as in a quick run): the "
                 "difference is the machine's noise")
    elif commit:
        subject = command_output(["git", "log", "-1", "--format=%s", commit], cwd=root)
        why = ("the commit the previous report names" if chosen == "report"
               else "given by `IDEM_BASELINE`")
        whose = (f"This build against the baseline, commit `{commit[:12]}` ({subject or '?'}; "
                 f"{why}), built from a worktree with the same release preset")
    else:
        whose = f"This build against the idemd in `{ab_meta.get('baseline_bin', '?')}`"
    order = ", ".join(f"{b}" for b, _ in sorted({(b, r) for b, r, _, _ in ab},
                                                key=lambda x: x[1]))
    md = ["## A/B against the baseline build\n",
          f"{whose}. Each round is a fresh idemd of one build on a fresh SQLite file, with the same "
          f"load generators and config: replays (idem-bench, {num(meta['keys'])} keys; then wrk, "
          "one key), then first executions, closed loop on "
          f"{meta['connections']} connections for {meta['duration_s']} s each. Rounds in order: "
          f"{order}. Figures are the medians of each build's rounds (requests/s; p99 ms); "
          "ratio = this build ÷ the baseline (successful answers/s).\n",
          "| run | this build /s | baseline /s | ratio | this build p99 | baseline p99 | "
          "p99 ratio | rounds (this; baseline) | exactly-once |",
          "|---|---|---|---|---|---|---|---|---|"]
    for what, cur, base in rows:
        r = ratio(cur["rps"], base["rps"])
        pr = ratio(cur["p99"], base["p99"])
        shown = lambda xs: " / ".join(num(x) for x in xs)
        md.append(f"| {AB_NAMES[what]} | {num(cur['rps'])} | {num(base['rps'])} | "
                  f"{'—' if r is None else f'{r:.2f}'} | {ms(cur['p99'])} | {ms(base['p99'])} | "
                  f"{'—' if pr is None else f'{pr:.2f}'} | {shown(cur['rounds'])}; "
                  f"{shown(base['rounds'])} | {', '.join(sorted(set(cur['checks'] + base['checks'])))} |")
    md.append("")
    return "\n".join(md)


def gateway_text(gateway, meta):
    """The gateway beside nginx: latency added to a first request, and requests/s under load."""
    md = ["## Gateway beside nginx\n",
          "idemd's gateway route (`POST /v1/orders`, SQLite store, `docs/gateway.md`) and nginx as "
          "a plain reverse proxy (`bench/nginx-gateway.conf`, kept-alive upstream connections, no "
          "access log) in front of the same upstream-sim, which executes and counts every request "
          "it gets. Load by wrk (`bench/wrk/gateway.lua`) for "
          f"{meta['duration_s']} s per run. Unloaded: one connection, a new key per request, so "
          "every request through idemd is a first execution (a durable claim and completion, the "
          "forward, the sealed answer). Loaded: 2 threads and "
          f"{meta['connections']} connections; nginx forwards every request (it knows no keys), "
          "while idemd answers one key's replays from its records (its 409s are copies that "
          "arrived while the first request was still at the upstream). Upstream executions are "
          "read from upstream-sim before and after each run.\n"]
    md.append("| run | load | requests/s | 2xx/s | p50 | p90 | p99 | p99.9 | max | upstream "
              "executions | errors |")
    md.append("|---|---|---|---|---|---|---|---|---|---|---|")
    labels = {"direct-first": "upstream-sim directly, new keys",
              "nginx-first": "nginx proxy, new keys",
              "idemd-first": "idemd gateway, new keys (first executions)",
              "direct-load": "upstream-sim directly",
              "nginx-load": "nginx proxy (forwards every request)",
              "idemd-replay": "idemd gateway, one key (replays)"}
    for key, label in labels.items():
        r = gateway.get(key)
        if not r:
            continue
        l = r["latency_ms"]
        md.append(f"| {label} | {r['threads']} thr, {r['connections']} conn | {num(r['rps'])} | "
                  f"{num(r['ok_rps'])} | {ms(l['p50'])} | {ms(l['p90'])} | {ms(l['p99'])} | "
                  f"{ms(l['p99_9'])} | {ms(l['max'])} | {num(r['upstream_executions'])} | "
                  f"{wrk_errors(r)} |")
    md.append("")
    direct, nginx, idemd = (gateway.get(k) for k in ("direct-first", "nginx-first", "idemd-first"))
    if direct and nginx and idemd:
        d = direct["latency_ms"]
        md.append("Latency a hop adds to a first request (unloaded p50 and p99 minus the "
                  f"upstream's own): nginx {ms(nginx['latency_ms']['p50'] - d['p50'])} / "
                  f"{ms(nginx['latency_ms']['p99'] - d['p99'])} ms; idemd "
                  f"{ms(idemd['latency_ms']['p50'] - d['p50'])} / "
                  f"{ms(idemd['latency_ms']['p99'] - d['p99'])} ms, which includes its two durable "
                  "SQLite commits.")
    nl, rep = gateway.get("nginx-load"), gateway.get("idemd-replay")
    if nl and rep:
        v = ratio(rep["ok_rps"], nl["ok_rps"])
        shown = f"{v:.2f}×" if v is not None else "—"
        md.append(f"\nidemd's replays: {num(rep['ok_rps'])}/s against nginx's forwarding "
                  f"{num(nl['ok_rps'])}/s ({shown}), with {num(rep['upstream_executions'])} "
                  "upstream execution(s) for the replayed key's run (the first request; nginx's run: "
                  f"{num(nl['upstream_executions'])}).")
    if idemd:
        # wrk stops with up to one request per connection unanswered, which may still execute.
        extra = idemd["upstream_executions"] - idemd["ok"]
        md.append(f"\nThrough idemd's first executions: {num(idemd['ok'])} 2xx answers and "
                  f"{num(idemd['upstream_executions'])} upstream executions"
                  + (" — one each." if extra == 0 else
                     f" — {extra:+d}: requests wrk cut off when it stopped (at most "
                     f"{idemd['connections']}) were still executed." if 0 < extra <= idemd["connections"]
                     else f" — {extra:+d}: NOT one execution per answer."))
    md.append("")
    return "\n".join(md) + "\n"


def wrk_errors(r):
    """A wrk run's answers that were not 2xx, and its transport errors: "0" when none."""
    errors = ", ".join(f"{k}: {v}" for k, v in r["statuses"].items() if not k.startswith("2"))
    errors += (", " if errors and r["transport_errors"] else "") + ", ".join(
        f"{k}: {v}" for k, v in r["transport_errors"].items())
    return errors or "0"


def config_tables(path, wanted):
    keep, out = False, []
    with open(path) as f:
        for line in f:
            stripped = line.strip()
            if stripped.startswith("["):
                header = stripped.split("#", 1)[0].strip()
                keep = header.strip("[]") in wanted and not header.startswith("[[")
            if keep:
                if stripped.startswith("#") or not stripped:
                    continue
                if stripped.startswith("[") and out:
                    out.append("")
                out.append(line.rstrip())
    return "\n".join(out)


def method_text(meta, nginx_workers):
    d, w = meta["duration_s"], meta["warmup_s"]
    lines = [
        f"One `scripts/bench{' --quick' if meta['mode'] == 'quick' else ''}` run on loopback with "
        "free ports, in the order nginx, the SQLite ceiling, idemd on SQLite, the PostgreSQL "
        "ceiling, idemd on PostgreSQL, on PostgreSQL + Redis, the in-flight run, the gateway "
        "beside nginx, the A/B against the baseline build, the profiles: each ceiling just "
        "before the idemd runs compared with it. PostgreSQL 15 and Redis are the throwaway instances of "
        "`scripts/with-services` (PostgreSQL with its default durability: `fsync` and "
        "`synchronous_commit` on). Each HTTP measurement is `idem-bench` "
        f"(`bench/loadgen/`, one event-loop thread) measuring {d} s after a {w} s warmup.\n",
        f"1. **HTTP ceiling**: nginx ({nginx_workers if nginx_workers is not None else '?'} worker "
        "processes, `bench/nginx.conf`) answers `POST /v1/payments` with a fixed 201 and a "
        "payment body of the size idemd sends, keep-alive, no access log; `idem-bench --no-check "
        f"--scenario unique`, closed loop on {meta['connections']} connections: the same requests "
        "as idemd's first executions. And wrk (2 threads, the same connections) sending one "
        "payment again and again (`bench/wrk/gateway.lua`, `WRK_ROUTE=payments WRK_MODE=replay`): "
        "the second harness of the replays.",
        "2. **SQLite ceiling**: `BM_SqliteClaimAndFinish` (`bench/store_bench.cc`, Google "
        "Benchmark, at least " f"{meta['gbench_min_s']} s each): per iteration one claim transaction and one "
        "completion transaction through the real SQLite store (WAL), each its own commit, one "
        "request after the other: one request's writes per commit, no grouping. `synchronous=FULL` "
        "is idemd's setting (the store's default; idemd has no switch for it) and the ceiling; "
        "NORMAL is shown for comparison. Its file lies on the same file system as idemd's.",
        "3. **PostgreSQL ceiling**: `pgbench -M prepared` (idemd prepares its statements) with "
        f"{meta['pg_clients']} clients — idemd's `[store] pool_size` in the PostgreSQL runs — for "
        f"{d} s after a {w} s warmup, on a database whose schema idemd created. The script is "
        "printed by `idem-pgbench-script` (`bench/pgbench_script.cc`) from the statement texts of "
        "`src/store/sql.cc` (`RecordSql` for PostgreSQL), so it cannot drift from the store: the "
        "two transactions of one first execution in idemd's order and in the store's pipelines "
        "(`\\startpipeline` ... `\\endpipeline`, one round trip each) — the claim (BEGIN with "
        "the insert, the advance to `claimed`, the covered advance to `charge_sent` before the "
        "provider call, then both quota counts, the first locking the principal's counter row, "
        "COMMIT), the completion "
        "(BEGIN with the finish with the sealed 201, which notifies listeners; COMMIT). Latency "
        "percentiles come from pgbench's per-transaction log.",
        "4. **idemd** on SQLite (a file in the run's directory), on PostgreSQL and on PostgreSQL + "
        "Redis (a fresh database each), each with a provider-sim of its own, each store in this "
        "order:",
        f"   - memory of the fresh process, and with {meta['idle_connections']} connections open "
        "and idle, each having made one `GET /healthz` (`bench/hold_connections.py`);",
        f"   - replays: `--scenario replay`, {meta['keys']} payments created first, then only "
        f"retried, closed loop on {meta['connections']} connections; then wrk's one payment "
        "retried, as against nginx;",
        f"   - first executions: `--scenario unique`, closed loop on {meta['connections']} "
        f"connections, from one principal (acme/alice) and from {meta.get('principals', 0):,} "
        "(`--principals`, intent i from principal i mod N: claims of one principal serialise "
        "on its quota count, those of different principals do not); and `--scenario mix` "
        f"({meta['mix_duplicates']} % of requests repeat an earlier payment);",
        f"   - replays alone, open loop at {meta['replay_rate']}/s on "
        f"{meta['replay_connections']} connections ({meta['replay_keys']} payments): the unloaded "
        "baseline;",
        f"   - first executions with provider-sim answering every charge {meta['slow_delay_ms']} ms "
        f"late (`--scenario slow`), open loop at {meta['slow_rate']}/s "
        f"({(meta['slow_rate'] / 1000 - 1) * 100:+.0f} % against the 1,000/s target) on "
        f"{meta['slow_connections']} connections, and beside it the same replays as "
        "the baseline (a second idem-bench, `--no-check`, its window inside the slow run's); "
        f"idemd's memory and its connections to the provider sampled every {meta['sample_s']} s. "
        f"Each answer may take up to {meta['slow_timeout_ms'] / 1000:g} s here (a backlog shows in "
        "the latency instead of as timeouts). Then the same slow run again, its payments spread "
        f"over the {meta.get('principals', 0):,} principals, with no replays beside it.",
        "   - on PostgreSQL, after its runs: the two closed-loop first-execution runs again on a "
        "fresh database with `[store] notifications = false`, to show what the completions' "
        "`NOTIFY` costs.",
        f"5. **Memory with provider calls in flight**: a fresh idemd on the SQLite store, "
        f"`--scenario slow` closed loop on {meta['inflight']} connections with the provider "
        f"answering {meta['inflight_delay_ms']} ms late, for {meta['inflight_s']} s, and "
        f"`[provider] max_connections = {meta['inflight']}` so that every call has a connection "
        f"of its own; memory and provider connections sampled every {meta['sample_s']} s."
        + " Memory only, no check."
        + (f" Here {meta['inflight_note']}." if meta.get("inflight_note") else ""),
        "6. **The gateway beside nginx**: see its section below.",
        "7. **The A/B against the baseline build**: see its section below.",
        "8. **Profiles**: see the section on where idemd's CPU time went.",
        "9. This report (`bench/perf_report.py`) and its plots (gnuplot).\n",
        "Beside each load run, `bench/cpu_share.py` reads where the machine's CPU went in the "
        "measured window (see its section). A target that is not met names what its run was "
        "bound by: the CPUs' busy share and the largest users of it, idemd's CPU time per "
        "answer (against nginx's where nginx is the measure), and what PostgreSQL's sessions "
        "waited on.\n",
        "Every idemd run but the replays beside the slow run and the in-flight run ends with "
        "idem-bench's exactly-once check against provider-sim's books (docs/testing.md): each "
        "payment that succeeded was charged once, and no other charge was made. Before it, "
        f"payments left without a final answer are retried with their key for up to "
        f"{meta['resolve_s']} s ({meta['slow_resolve_s']} s after the slow runs).\n",
    ]
    return "\n".join(lines) + "\n"


def caveats_text(meta, info):
    lines = [
        f"- The machine is a shared VM with {info['nproc']} logical CPUs, and other work may have "
        "run during the measurement. idem-bench, pgbench, provider-sim, PostgreSQL and Redis run on "
        "the same cores as idemd (and nginx), so every figure is lower than on a machine of its "
        "own; the ratios between runs of the same sitting are what this page is for.",
        "- The PostgreSQL ceiling runs libidem's record statements only. idemd also writes its "
        "payment row (an insert in the claim, an update in the completion, each inside a savepoint) "
        "and calls provider-sim between the transactions, so the ceiling is higher than the "
        "database work idemd really does per request: the ratio understates idemd.",
        "- The SQLite ceiling commits two transactions per request (claim, completion), one after "
        "the other, each alone. idemd commits the same two per first execution, plus its payment "
        "row, and shares each commit with the transactions waiting for the writer (group commit).",
        "- pgbench cannot bind a NULL, so the script binds the store's time (`{now}`, which idemd "
        "binds to NULL so that PostgreSQL's clock decides) to the time it was generated, and uses "
        "the decimal text of a random 63-bit integer as each record's scope hash (idemd's are 32 "
        "bytes).",
        "- Provider calls in flight are counted as TCP connections open to provider-sim. A client "
        "that keeps idle connections to the provider would show more connections than calls.",
        "- Open-loop runs count latency from each request's scheduled time: when idemd falls "
        "behind, the wait for a free connection is part of the latency, as a real client's would "
        "be. Closed-loop runs count from the send.",
    ]
    if meta["mode"] == "quick":
        lines.append(f"- Quick run: {meta['duration_s']} s per measurement, {meta['keys']} replay "
                     "keys, the in-flight run's provider delay "
                     f"{meta['inflight_delay_ms']} ms for {meta['inflight_s']} s. Short windows make "
                     "p99 and above rest on few samples.")
    return "\n".join(lines) + "\n"


# ---- Plots ------------------------------------------------------------------------------------------

def draw(work, out, plot_rows, lat_rows, mode):
    if not plot_rows or not lat_rows:
        return False, "no runs to plot"
    data_t = os.path.join(work, "plot-throughput.dat")
    with open(data_t, "w") as f:
        f.write("# index value colour label\n")
        for i, (label, value, colour) in enumerate(plot_rows):
            f.write(f'{i} {max(value, 1):.3f} {colour} "{label}" {value:.0f}\n')
    data_l = os.path.join(work, "plot-latency.dat")
    with open(data_l, "w") as f:
        f.write('"run" "p50" "p90" "p99" "p99.9"\n')
        for label, l in lat_rows:
            vals = [max(l[k], 0.001) for k in ("p50", "p90", "p99", "p99_9")]
            f.write(f'"{label}" ' + " ".join(f"{v:.4f}" for v in vals) + "\n")
    title_suffix = " (quick run)" if mode == "quick" else ""
    script = f"""
set terminal svg size 1000,560 dynamic enhanced font "sans,12" background rgb "white"
set output "{os.path.join(out, 'performance-throughput.svg')}"
set title "Throughput: successful answers per second{title_suffix}" noenhanced
set logscale y
set yrange [1:*]
set ylabel "per second (log scale)"
set grid ytics
set style fill solid 0.8 border -1
set boxwidth 0.7
set xtics rotate by -40 left nomirror noenhanced font ",10"
set xrange [-0.7:{len(plot_rows) - 0.3}]
set bmargin 10
set rmargin 14
set key top right
set linetype 1 lc rgb "#999999"
set linetype 2 lc rgb "#3366aa"
plot "{data_t}" using 1:2:3:xtic(4) with boxes lc variable notitle, \\
     "" using 1:2:(sprintf("%.0f", $5)) with labels offset 0,0.7 font ",9" notitle, \\
     keyentry with boxes lc 1 title "ceiling", keyentry with boxes lc 2 title "idemd"

set output "{os.path.join(out, 'performance-latency.svg')}"
set terminal svg size 1100,600 dynamic enhanced font "sans,12" background rgb "white"
set title "Latency percentiles (ms){title_suffix}" noenhanced
set logscale y
set yrange [0.01:*]
set ylabel "milliseconds (log scale)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set xrange [*:*]
set rmargin 14
set key top left noenhanced
set linetype 1 lc rgb "#9ecae1"
set linetype 2 lc rgb "#4292c6"
set linetype 3 lc rgb "#08519c"
set linetype 4 lc rgb "#08306b"
plot for [i=2:5] "{data_l}" using i:xtic(1) title columnheader(i)
"""
    script_path = os.path.join(work, "plots.gp")
    with open(script_path, "w") as f:
        f.write(script)
    r = subprocess.run(["gnuplot", script_path], capture_output=True, text=True)
    if r.returncode != 0:
        return False, "gnuplot: " + r.stderr.strip()
    return True, ""


if __name__ == "__main__":
    sys.exit(main())
