#!/usr/bin/env python3
"""bench/consumer_report.py — the report of one `scripts/bench --consumers` run.

Reads the run's manifest (WORK/manifest.jsonl, one JSON object per step) and the JSON every
idem-mq-bench step wrote (WORK/runs/), and writes OUT/performance-consumers.md. Every figure comes
from those files; the machine's description from this machine (bench/perf_report.py's).

  bench/consumer_report.py --work WORK --out docs --root REPO --idemd BUILD/server/idemd
"""

import argparse
import json
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perf_report import command_output, machine, num  # noqa: E402

BROKERS = {"redis": "Redis stream", "rabbitmq": "RabbitMQ quorum queue"}
STORES = {"sqlite": "SQLite", "postgres": "PostgreSQL"}


def load(work, name):
    if not name:
        return None
    try:
        with open(os.path.join(work, name)) as f:
            text = f.read().strip()
        return json.loads(text.splitlines()[-1]) if text else None
    except (OSError, ValueError):
        return None


def ratio(a, b):
    if not a or not b:
        return None
    return a / b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--idemd", required=True)
    args = ap.parse_args()

    steps = []
    with open(os.path.join(args.work, "manifest.jsonl")) as f:
        for line in f:
            if line.strip():
                steps.append(json.loads(line))
    meta = next(s for s in steps if s["id"] == "meta")
    end = next((s for s in steps if s["id"] == "end"), {})
    runs = [s for s in steps if s.get("broker")]
    info = machine(args.root, args.idemd)
    rabbit = command_output(["dpkg-query", "-W", "-f=${Version}", "rabbitmq-server"])
    erlang = command_output(["dpkg-query", "-W", "-f=${Version}", "erlang-base"])
    quick = meta["mode"] == "quick"

    rows = []
    all_ok = True
    for r in runs:
        ceiling = load(args.work, r.get("ceiling"))
        idemd = load(args.work, r.get("idemd"))
        check = load(args.work, r.get("check"))
        ceiling_publish = load(args.work, r.get("ceiling_publish"))
        idemd_publish = load(args.work, r.get("idemd_publish"))
        ok = (r.get("ceiling_status") == 0 and r.get("idemd_status") == 0
              and r.get("check_status") == 0 and bool(check and check.get("ok")))
        all_ok = all_ok and ok
        rows.append({
            "broker": r["broker"], "store": r["store"],
            "ceiling": ceiling and ceiling.get("per_second"),
            "ceiling_s": ceiling and ceiling.get("seconds"),
            "idemd": idemd and idemd.get("per_second"),
            "idemd_s": idemd and idemd.get("seconds"),
            "outcomes": (idemd or {}).get("outcomes", {}),
            "check": check, "ok": ok,
            "publish": [p.get("per_second") for p in (ceiling_publish, idemd_publish) if p],
        })

    commit = (info["commit"] or "unknown")[:12] + (
        " (with uncommitted changes)" if info["dirty"] else "")
    md = []
    md.append("# idemd's queue consumers: throughput against the broker's ceiling\n")
    md.append(
        f"Written by `scripts/bench --consumers{' --quick' if quick else ''}`, started "
        f"{meta['started']} on commit `{commit}` ({info['branch']}). Every figure on this page "
        "comes from the raw results of that one run (the script prints where it kept them); "
        "nothing is typed in. Run the command again to replace the page.\n")
    if quick:
        md.append("**A quick run** (`--quick`): few messages, to try the script; not a "
                  "measurement.\n")
    md.append(
        "Read the ratios, not the absolutes: the figures are from one sitting on a small shared "
        "machine with 2 cores (below), where the broker, the store, upstream-sim, idemd and the "
        "tool that publishes and watches share the cores, and other work may have run beside "
        f"them (load average {meta['loadavg']} at the start, {end.get('loadavg', '—')} at the "
        "end). Each ceiling ran just before the idemd run it is compared with.\n")

    md.append("## Results\n")
    md.append(f"{num(meta['messages'])} messages per run: {num(meta['keys'])} distinct keys and "
              f"{num(meta['messages'] - meta['keys'])} duplicates ({meta['duplicates_percent']} %, "
              "the same payload as the key's first message, spread through the stream), "
              f"{meta['concurrency']} consumer threads in idemd and in the ceiling.\n")
    md.append("| broker | store | ceiling (msgs/s) | idemd (msgs/s) | idemd / ceiling | "
              "idemd's outcomes | exactly once |")
    md.append("|---|---|---|---|---|---|---|")
    for row in rows:
        c = row["check"] or {}
        once = (f"{num(c.get('exactly_once'))} of {num(c.get('keys'))} keys"
                + ("" if c.get("ok") else
                   f" — **failed**: {num(c.get('never'))} never, "
                   f"{num(c.get('more_than_once'))} more than once, "
                   f"{num(c.get('other_keys'))} unknown"
                   + (f" ({c['example']})" if c.get("example") else ""))) if c else "**not checked**"
        outcomes = ", ".join(f"{k} {num(v)}" for k, v in sorted(row["outcomes"].items())) or "—"
        r = ratio(row["idemd"], row["ceiling"])
        md.append(f"| {BROKERS[row['broker']]} | {STORES[row['store']]} | {num(row['ceiling'])} | "
                  f"{num(row['idemd'])} | {num(r, 3) if r is not None else '—'} | {outcomes} | "
                  f"{once}{'' if row['ok'] else ' (a step failed: see the raw output)'} |")
    md.append("")
    md.append("The ceiling is the broker drained by idemd's own broker code with nothing else to "
              "do: what idemd's consumer route costs is the difference. The producer (not timed "
              "against either) published at " + ", ".join(
                  f"{num(min(row['publish']))}–{num(max(row['publish']))} msgs/s on "
                  f"{BROKERS[row['broker']]}/{STORES[row['store']]}"
                  for row in rows if row["publish"]) + " (pipelined), before each run.\n")
    md.append(f"Every exactly-once check passed: **{'yes' if all_ok else 'no'}**. A key executed "
              "twice or never, a message not acknowledged, or one held, quarantined or retried fails "
              "the run.\n")

    md.append("## Method\n")
    md.append(
        "For each broker and store, in this order: the ceiling, then idemd.\n\n"
        "1. **The ceiling** (`idem-mq-bench drain`, bench/mq_bench.cc): the messages are "
        "published to a stream or queue of their own (`idem-mq-bench publish`: Redis `XADD`s "
        "pipelined in batches of 500; RabbitMQ persistent messages under publisher confirms, "
        "500 per batch, to a quorum queue declared by idemd's adapter), then drained by "
        f"{meta['concurrency']} threads, each with a source of its own opened by idemd's adapters "
        "(`OpenRedisStream`, `OpenRabbitQueue` in server/idemd/consumers: the same "
        "`XREADGROUP`/`XAUTOCLAIM`/`XACK`, or the same prefetch of one and `basic.ack`, as in "
        "idemd), each taking one message and acknowledging it before the next, doing nothing "
        "else. Timed from the first delivery to the last acknowledgement.\n"
        "2. **idemd**: the same number of messages published to a fresh stream or queue, then "
        "idemd started with one `[[consumers]]` entry (key `json:/order`, concurrency "
        f"{meta['concurrency']}, `status_path`) making each message a `POST /v1/orders` to an "
        "upstream-sim of its own, its records in a fresh SQLite file (synchronous=FULL) or "
        f"PostgreSQL database ({meta['pg_clients']} connections). `idem-mq-bench watch` polls "
        "the broker every 5 ms and times from the first message taken (the group's lag, the "
        "queue's ready count below the total) to the moment idemd's "
        "`idem_consumer_messages_total` (counted after each acknowledgement) reaches the total; "
        "it then checks the broker holds nothing unacknowledged (the group's lag and pending are "
        "0; the queue has nothing ready) and that idemd answered every message as `executed` or "
        "`duplicate`, one `executed` per key, none held, quarantined or retried. idemd's start "
        "is not timed.\n"
        "3. **The check** (`idem-mq-bench check`): upstream-sim's `/admin/executions` and, for "
        "each operation it executed, `/status/KEY` for the business key in the body it got: "
        "every key executed exactly once, and nothing else.\n")

    md.append("## Machine\n")
    md.append(f"- CPU: {info['cpu']}, {info['nproc']} logical CPUs (`nproc`); memory "
              f"{info['memory_gib']:.1f} GiB; kernel {info['kernel']} (`uname -r`); Debian "
              f"{info['debian']}")
    md.append(f"- Build: {info['build_type']}, {info['compiler']}")
    md.append(f"- Redis: {info['redis']}; RabbitMQ {rabbit} (Debian, Erlang {erlang}, no "
              f"plugins); PostgreSQL: {info['postgres']}; SQLite {info['sqlite']}")
    md.append(f"- Date: {meta['started']}; the run took {end.get('elapsed_s', '—')} s")
    md.append(f"- Commit: `{info['commit']}` {info['commit_subject'] or ''}"
              + (" — with uncommitted changes" if info["dirty"] else ""))
    md.append("")
    with open(os.path.join(args.out, "performance-consumers.md"), "w") as f:
        f.write("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
