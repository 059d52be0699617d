#!/usr/bin/env python3
"""The history of scripts/bench --history: fills a store's records table in minutes, and reads it.

  history.py fill STORE --to N     adds copies of one finished record of the store until it holds
                                   N records; prints a JSON line (records, added, seconds)
  history.py size STORE            a JSON line: records, expired records, table and index bytes
  history.py report WORK OUT MODE MACHINE
                                   writes OUT/performance-history.md from WORK's manifest

STORE is idemd's store url: sqlite://PATH or postgresql://... (read with psql). The store must be
idle: idemd stopped. A fill copies the newest SUCCEEDED record (idemd's own, sealed answer and
all) under new random scope hashes, for the same principal and route, already expired a minute
ago (created a day before that): retained until a sweep deletes them, and never in the way of a
new claim. It drops the records table's indexes and triggers, inserts, builds them again and
recounts idem_retained in one transaction, as a bulk load would; each index is then as compact as
a fresh build makes it (a table that grew by claims is less so).
"""
import json
import os
import sqlite3
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perf_report import idem_bench_run, num  # noqa: E402  (one reading of idem-bench's JSON)

DAY_MS = 86_400_000


def now_ms():
    return int(time.time() * 1000)


# ---- PostgreSQL (psql) ------------------------------------------------------------------------

def psql(url, sql):
    out = subprocess.run(["psql", "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1", url],
                         input=sql, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"history: psql failed: {out.stderr.strip()}")
    return out.stdout.strip()


def pg_fill(url, target):
    records = int(psql(url, "SELECT count(*) FROM idem_records;"))
    if records >= target:
        return records, 0
    columns = psql(url, "SELECT column_name FROM information_schema.columns WHERE table_schema = "
                        "current_schema() AND table_name = 'idem_records' ORDER BY ordinal_position;"
                   ).split("\n")
    indexes = [line.split("|", 1) for line in psql(
        url, "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() AND "
             "tablename = 'idem_records' AND indexname <> 'idem_records_pkey';").split("\n") if line]
    expired = now_ms() - 60_000
    values = {"scope_hash": f"sha256(convert_to('history-' || g, 'UTF8'))",
              "expires_at": str(expired), "created_at": str(expired - DAY_MS),
              "updated_at": str(expired - DAY_MS)}
    select = ", ".join(values.get(c, f"t.{c}") for c in columns)
    script = ["BEGIN;", "SET LOCAL maintenance_work_mem = '1GB';",
              "ALTER TABLE idem_records DISABLE TRIGGER USER;"]
    script += [f"DROP INDEX {name};" for name, _ in indexes]
    script += ["ALTER TABLE idem_records DROP CONSTRAINT idem_records_pkey;",
               f"INSERT INTO idem_records ({', '.join(columns)}) SELECT {select} FROM "
               "(SELECT * FROM idem_records WHERE state = 'SUCCEEDED' ORDER BY created_at DESC "
               f"LIMIT 1) t, generate_series({records + 1}, {target}) g;",
               "ALTER TABLE idem_records ADD CONSTRAINT idem_records_pkey PRIMARY KEY (scope_hash);"]
    script += [f"{definition};" for _, definition in indexes]
    script += ["ALTER TABLE idem_records ENABLE TRIGGER USER;",
               "DELETE FROM idem_retained;",
               "INSERT INTO idem_retained (tenant, user_id, records) "
               "SELECT tenant, user_id, count(*) FROM idem_records GROUP BY tenant, user_id;",
               "COMMIT;", "VACUUM ANALYZE idem_records;", "VACUUM ANALYZE idem_retained;",
               "CHECKPOINT;"]
    psql(url, "\n".join(script) + "\n")
    after = int(psql(url, "SELECT count(*) FROM idem_records;"))
    if after != target:
        sys.exit(f"history: the fill left {after} records, not {target}")
    return after, target - records


def pg_size(url):
    row = psql(url, "SELECT (SELECT COALESCE(sum(records), 0) FROM idem_retained), "
                    "(SELECT count(*) FROM idem_records WHERE expires_at <= "
                    f"{now_ms()}), pg_table_size('idem_records'), "
                    "pg_indexes_size('idem_records');")
    records, expired, table, indexes = (int(x) for x in row.split("|"))
    return {"records": records, "expired": expired, "table_bytes": table, "index_bytes": indexes}


# ---- SQLite -------------------------------------------------------------------------------------

def sqlite_path(url):
    return url[len("sqlite://"):]


def sqlite_fill(url, target):
    con = sqlite3.connect(sqlite_path(url), isolation_level=None)
    records = con.execute("SELECT count(*) FROM idem_records").fetchone()[0]
    if records >= target:
        return records, 0
    columns = [r[1] for r in con.execute("PRAGMA table_info(idem_records)")]
    template = con.execute(f"SELECT {', '.join(columns)} FROM idem_records WHERE state = "
                           "'SUCCEEDED' ORDER BY created_at DESC LIMIT 1").fetchone()
    if template is None:
        sys.exit("history: the store has no SUCCEEDED record to copy")
    schema = con.execute("SELECT type, name, sql FROM sqlite_master WHERE tbl_name = "
                         "'idem_records' AND type IN ('index', 'trigger') AND sql IS NOT NULL"
                         ).fetchall()
    expired = now_ms() - 60_000
    fixed = {"expires_at": expired, "created_at": expired - DAY_MS, "updated_at": expired - DAY_MS}
    select, params = [], []
    for c, v in zip(columns, template):
        if c == "scope_hash":
            select.append("randomblob(32)")
        else:
            select.append("?")
            params.append(fixed.get(c, v))
    # A bulk load: no rollback journal (the file is the benchmark's), a large page cache.
    con.execute("PRAGMA journal_mode = DELETE")
    con.execute("PRAGMA journal_mode = OFF")
    con.execute("PRAGMA synchronous = OFF")
    con.execute("PRAGMA cache_size = -4000000")
    con.execute("BEGIN IMMEDIATE")
    for kind, name, _ in schema:
        con.execute(f"DROP {kind.upper()} {name}")
    con.execute(f"INSERT INTO idem_records ({', '.join(columns)}) WITH RECURSIVE c(i) AS "
                f"(SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < {target - records}) "
                f"SELECT {', '.join(select)} FROM c", params)
    for _, _, sql in schema:
        con.execute(sql)
    con.execute("DELETE FROM idem_retained")
    con.execute("INSERT INTO idem_retained (tenant, user_id, records) SELECT tenant, user_id, "
                "count(*) FROM idem_records GROUP BY tenant, user_id")
    con.execute("COMMIT")
    con.execute("PRAGMA journal_mode = WAL")
    after = con.execute("SELECT count(*) FROM idem_records").fetchone()[0]
    con.close()
    if after != target:
        sys.exit(f"history: the fill left {after} records, not {target}")
    return after, target - records


def sqlite_size(url):
    path = sqlite_path(url)
    con = sqlite3.connect(path)
    records = con.execute("SELECT COALESCE(sum(records), 0) FROM idem_retained").fetchone()[0]
    expired = con.execute("SELECT count(*) FROM idem_records WHERE expires_at <= ?",
                          (now_ms(),)).fetchone()[0]
    con.close()
    size = sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))
    # The file holds the table and its indexes together; dbstat is not in Debian's build.
    return {"records": records, "expired": expired, "table_bytes": size, "index_bytes": None}


# ---- The report ---------------------------------------------------------------------------------

def gib(b):
    return "—" if b is None else f"{b / 2**30:.2f}"


def bench_json(work, entry):
    r = idem_bench_run(work, entry)
    return dict(r, p50=r["latency_ms"]["p50"], p99=r["latency_ms"]["p99"])


def report(work, out, mode, machine):
    entries = [json.loads(line) for line in open(os.path.join(work, "manifest.jsonl")) if line.strip()]
    meta = next(e for e in entries if e["id"] == "meta")
    names = {"sqlite": "SQLite", "postgres": "PostgreSQL"}
    md = ["# idemd with a long history\n",
          f"Written by `scripts/bench --history{' --quick' if mode == 'quick' else ''}` "
          f"(started {meta['started']}"
          + (f" on commit `{meta['commit'][:12]}`" + (" with uncommitted changes" if meta["dirty"] else "")
             if meta.get("commit") else "")
          + f"; {machine}). Every figure comes from that run. For each "
          "store, the records table is filled (`bench/history.py fill`: copies of one of idemd's "
          "own finished payments, expired, for the principal the load runs as) to each size in "
          "turn, and idemd (stopped during the fill, started again after it, the sweep off) runs "
          f"first executions: `idem-bench --scenario unique`, closed loop on {meta['connections']} "
          f"connections, {meta['duration_s']} s after a {meta['warmup_s']} s warmup, the "
          "exactly-once check after it. Then idemd is started with `sweep_interval_ms = 1` (a "
          "round starts 1 ms after idemd does and goes on until it has caught up, batches of 500, each "
          "followed by the sweeper's rest of twice its time: `limits::kSweepRestPerWork`) on the "
          "largest history and the same run "
          "measures claims while the sweep deletes. Records deleted are counted from before that "
          "idemd started to after it stopped.\n",
          "| store | records before the run | table + indexes GiB | fill s | first/s | vs smallest | p50 ms | "
          "p99 ms | p99 vs smallest | errors | exactly-once |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    targets = []
    for store in ("sqlite", "postgres"):
        rows = [e for e in entries if e.get("kind") == "history" and e["store"] == store]
        if not rows:
            continue
        base = None
        for e in rows:
            r = bench_json(work, e)
            size = e["size"]
            total = size["table_bytes"] + (size["index_bytes"] or 0)
            if base is None:
                base = r
            md.append(f"| {names[store]} | {num(size['records'])} | {gib(total)} | "
                      f"{e['fill']['seconds']:.0f} | {num(r['first_rps'])} | "
                      f"{r['first_rps'] / base['first_rps']:.2f} | {r['p50']:.2f} | "
                      f"{r['p99']:.2f} | {r['p99'] / base['p99']:.2f} | {num(r['errors'])} | "
                      f"{r['check'] or 'not checked'} |")
            e["result"] = r
        lo = min(e["result"]["first_rps"] for e in rows)
        hi = max(e["result"]["first_rps"] for e in rows)
        spread = (hi - lo) / hi if hi else 0
        targets.append((f"First executions/s within 20 % of each other from "
                        f"{num(rows[0]['size']['records'])} to {num(rows[-1]['size']['records'])} "
                        f"records ({names[store]})", f"{spread * 100:.0f} % apart", spread <= 0.2))
        p99s = [e["result"]["p99"] for e in rows]
        pspread = (max(p99s) - min(p99s)) / max(p99s) if max(p99s) else 0
        targets.append((f"p99 within 20 % of each other ({names[store]})",
                        f"{min(p99s):.2f}–{max(p99s):.2f} ms, {pspread * 100:.0f} % apart",
                        pspread <= 0.2))
    md.append("")
    sweeps = [e for e in entries if e.get("kind") == "sweep"]
    if sweeps:
        md.append("## Claims during a sweep\n")
        md.append("| store | expired at the start | deleted during the run | deleted/s | time for "
                  "the whole history at that rate | first/s | p99 ms | quiet p99 ms (same "
                  "history) | p99 ratio | exactly-once |")
        md.append("|---|---|---|---|---|---|---|---|---|---|")
        for e in sweeps:
            r = bench_json(work, e)
            quiet = [h for h in entries if h.get("kind") == "history" and h["store"] == e["store"]][-1]
            q = bench_json(work, quiet)
            deleted = e["expired_before"] - e["expired_after"]
            rate = deleted / e["seconds"] if e["seconds"] else 0
            if e["expired_after"] == 0:
                whole = f"all swept within {e['seconds']:.0f} s (the rate a lower bound)"
            elif rate:
                whole = f"{e['expired_before'] / rate / 60:,.1f} min"
            else:
                whole = "—"
            ratio = r["p99"] / q["p99"] if q["p99"] else None
            md.append(f"| {names[e['store']]} | {num(e['expired_before'])} | {num(deleted)} | "
                      f"{num(rate)} | {whole} | {num(r['first_rps'])} | {r['p99']:.2f} | "
                      f"{q['p99']:.2f} | {ratio:.2f} | {r['check'] or 'not checked'} |")
            targets.append((f"Claims' p99 during a sweep ≤ 2 × quiet ({names[e['store']]})",
                            f"{ratio:.2f} ×", ratio is not None and ratio <= 2))
        md.append("")
    md.insert(2, "## Targets\n\n| target | figure | met |\n|---|---|---|\n" + "\n".join(
        f"| {t} | {f} | {'**met**' if ok else '**not met**'} |" for t, f, ok in targets) + "\n")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "performance-history.md"), "w") as f:
        f.write("\n".join(md).rstrip() + "\n")


def main():
    if len(sys.argv) >= 3 and sys.argv[1] in ("fill", "size"):
        url = sys.argv[2]
        postgres = url.startswith(("postgres://", "postgresql://"))
        if sys.argv[1] == "size":
            print(json.dumps(pg_size(url) if postgres else sqlite_size(url)))
            return
        if len(sys.argv) != 5 or sys.argv[3] != "--to":
            sys.exit("usage: history.py fill STORE --to N")
        started = time.monotonic()
        records, added = (pg_fill if postgres else sqlite_fill)(url, int(sys.argv[4]))
        print(json.dumps({"records": records, "added": added,
                          "seconds": round(time.monotonic() - started, 1)}))
    elif len(sys.argv) == 6 and sys.argv[1] == "report":
        report(*sys.argv[2:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
