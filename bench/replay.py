"""Replay log export/import throughput, SQLite and PostgreSQL, beside the plain loop.

    .venv/bin/python bench/replay.py                     # 1 M events, 3 export repeats
    .venv/bin/python bench/replay.py --quick --json      # 200 k events, 3 repeats of all
    .venv/bin/python bench/replay.py --postgres postgresql://u@h/db   # else one of our own

The data: ``--runs`` runs (default 100) sharing ``--events`` events, the mix
of a real run (mostly text/reasoning deltas, tool calls, usage, lifecycle).

* **runwire export** — ``runwire.jobs.replay.export_run`` of every run (koder JSONL,
  seq order) into ``/dev/null``: streams the stored canonical bytes.
* **baseline export** — the loop a user writes over a plain events table
  (``id, run_id, tenant, child_id, seq, type, ts, payload`` — Koder agent stream §6):
  select each run's rows and ``json.dumps`` an envelope per row.
* **runwire import** — ``runwire.store.jsonl.import_jsonl`` of the exported file
  (validates every line, maintains run metadata, idempotent).
* **baseline import** — ``json.loads`` each line and ``executemany`` an
  ``INSERT … ON CONFLICT DO NOTHING`` into the plain table, 10 000 a batch.
* **stored as a worker writes it** (SQLite, ``sqlite_worker_written_*``) — the
  same data appended with ``append_streams``, ``--per-write`` events of every run
  a write; then an export of every run, a decode of every event
  (``iter_events``), 2 000 reads of 64 events from random seqs, and the file's
  bytes per event (``bytes_per_event``, beside the events' JSON).

Figures are medians of ``--repeats`` (import: ``--import-repeats``) runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cputime import import_code  # noqa: E402 - bench/ is the script's directory

import_code()

from runwire.core import envelope  # noqa: E402 - the tree import_code() names
from runwire.core.ulid import MonotonicULID  # noqa: E402
from runwire.jobs.replay import export_run  # noqa: E402
from runwire.store import open_store  # noqa: E402
from runwire.store.jsonl import import_jsonl  # noqa: E402

BASE_COLUMNS = "id, run_id, tenant, child_id, seq, type, ts, payload"


# ---- data ----------------------------------------------------------------------------
def _payload(seq: int) -> tuple[str, dict[str, Any]]:
    kind = seq % 50
    if kind == 10:
        return "tool.start", {"call_id": f"c{seq}", "tool": "search",
                              "input": {"query": f"item {seq}", "limit": 10}}
    if kind == 11:
        return "tool.end", {"call_id": f"c{seq - 1}", "ok": True,
                            "output": {"hits": [f"doc {seq}", "doc 2"]}, "duration_ms": 41}
    if kind == 20:
        return "x.usage", {"input_tokens": 120, "output_tokens": 48, "total_tokens": 168}
    if kind < 8:
        return "reasoning.delta", {"text": f"thinking about step {seq} of the plan "}
    return "text.delta", {"text": f"word{seq} and some more text "}


def make_jsonl(path: Path, events: int, runs: int) -> list[str]:
    """Write the bench data as JSONL; return the run ids."""
    ids = MonotonicULID("evt_")
    per_run = max(1, events // runs)
    run_ids = [f"run_{n:05d}" for n in range(runs)]
    with path.open("wb") as out:
        written = 0
        for run_id in run_ids:
            count = min(per_run, events - written) if run_id != run_ids[-1] else events - written
            lines = []
            for seq in range(1, count + 1):
                kind, payload = _payload(seq)
                if seq == count:
                    kind, payload = "run.lifecycle", {"state": "done"}
                ts = f"2026-01-01T00:{(seq // 60000) % 60:02d}:{(seq // 1000) % 60:02d}.{seq % 1000:03d}Z"
                event = envelope.make(kind, payload, id=ids.new(), ts=ts, run_id=run_id,
                                      seq=seq, tenant="acme")
                lines.append(envelope.encode(event))
            out.write(b"\n".join(lines) + b"\n")
            written += count
    return run_ids


def _lines(path: Path) -> Iterator[bytes]:
    with path.open("rb") as source:
        yield from source


def _median_rate(count: int, timings: list[float]) -> float:
    return count / statistics.median(timings)


# ---- runwire ---------------------------------------------------------------------------
async def runwire_import(url: str, path: Path) -> tuple[float, int]:
    async with open_store(url) as log:
        start = time.perf_counter()
        report = await import_jsonl(log, _lines(path))
        return time.perf_counter() - start, report.added


async def runwire_export(url: str, run_ids: list[str], sink: IO[bytes]) -> tuple[float, int]:
    async with open_store(url) as log:
        start = time.perf_counter()
        count = sum([await export_run(log, run_id, sink.write) for run_id in run_ids])
        return time.perf_counter() - start, count


async def written_like_a_worker(db: Path, data: Path, per_write: int, sink: IO[bytes]) -> dict[str, float]:
    """Store the data as a worker writes it (``per_write`` events of every run per write), then
    time an export of every run, a decode of every event, and short reads from random seqs."""
    runs: dict[str, tuple[list[Any], list[bytes]]] = {}
    for line in _lines(data):
        body = line.rstrip(b"\n")
        event = envelope.decode(body)
        events, bodies = runs.setdefault(event.run_id, ([], []))
        events.append(event)
        bodies.append(body)
    total = sum(len(events) for events, _ in runs.values())
    longest = max(len(events) for events, _ in runs.values())
    picks = random.Random(7)
    starts = [(run_id, picks.randrange(len(events))) for run_id, (events, _) in runs.items() for _ in range(20)]
    async with open_store(f"sqlite:///{db}") as log:
        for offset in range(0, longest, per_write):
            await log.append_streams([(run_id, events[offset:offset + per_write], bodies[offset:offset + per_write])
                                      for run_id, (events, bodies) in runs.items() if offset < len(events)])
        started = time.perf_counter()
        exported = sum([await export_run(log, run_id, sink.write) for run_id in runs])
        export_s = time.perf_counter() - started
        started = time.perf_counter()
        decoded = 0
        for run_id in runs:
            async for _ in log.iter_events(run_id):
                decoded += 1
        decode_s = time.perf_counter() - started
        started = time.perf_counter()
        for run_id, after in starts:
            await log.read(run_id, after=after, limit=64)
        reads_s = time.perf_counter() - started
    assert exported == decoded == total, (exported, decoded, total)
    return {"export_per_s": total / export_s, "iter_events_per_s": total / decode_s,
            "reads_64_per_s": len(starts) / reads_s, "events": total,
            "json_bytes_per_event": sum(len(b) for _, bodies in runs.values() for b in bodies) / total}


# ---- the plain loop ----------------------------------------------------------------------
def _row(line: bytes) -> tuple[Any, ...]:
    obj = json.loads(line)
    return (obj["id"], obj["run_id"], obj.get("tenant"), obj.get("child_id"), obj["seq"],
            obj["type"], obj["ts"], json.dumps(obj["payload"]))


def _envelope(row: tuple[Any, ...], payload: Any, ts: str) -> bytes:
    event = {"id": row[0], "ts": ts, "type": row[5], "run_id": row[1], "seq": row[4],
             "payload": payload}
    if row[3] is not None:
        event["child_id"] = row[3]
    if row[2] is not None:
        event["tenant"] = row[2]
    return json.dumps(event).encode() + b"\n"


def sqlite_baseline_import(path: Path, lines: Path) -> float:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute(f"CREATE TABLE events ({BASE_COLUMNS.replace('seq', 'seq INTEGER')},"
                 " PRIMARY KEY (run_id, seq))")
    start = time.perf_counter()
    batch: list[tuple[Any, ...]] = []
    sql = f"INSERT OR IGNORE INTO events ({BASE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
    for line in _lines(lines):
        batch.append(_row(line))
        if len(batch) >= 10_000:
            conn.executemany(sql, batch)
            conn.commit()
            batch = []
    conn.executemany(sql, batch)
    conn.commit()
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed


def sqlite_baseline_export(path: Path, run_ids: list[str]) -> tuple[float, int]:
    conn = sqlite3.connect(path)
    count = 0
    with open(os.devnull, "wb") as sink:
        start = time.perf_counter()
        for run_id in run_ids:
            for row in conn.execute(
                f"SELECT {BASE_COLUMNS} FROM events WHERE run_id = ? ORDER BY seq", (run_id,)
            ):
                sink.write(_envelope(row, json.loads(row[7]), row[6]))
                count += 1
        elapsed = time.perf_counter() - start
    conn.close()
    return elapsed, count


def pg_baseline_import(url: str, lines: Path) -> float:
    import psycopg

    with psycopg.connect(url) as conn:
        conn.execute(
            "CREATE TABLE base_events (id text, run_id text, tenant text, child_id text,"
            " seq bigint, type text, ts timestamptz, payload jsonb, PRIMARY KEY (run_id, seq))"
        )
        conn.commit()
        sql = (f"INSERT INTO base_events ({BASE_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
               " ON CONFLICT DO NOTHING")
        start = time.perf_counter()
        batch: list[tuple[Any, ...]] = []
        with conn.cursor() as cursor:
            for line in _lines(lines):
                batch.append(_row(line))
                if len(batch) >= 10_000:
                    cursor.executemany(sql, batch)
                    conn.commit()
                    batch = []
            cursor.executemany(sql, batch)
            conn.commit()
        return time.perf_counter() - start


def pg_baseline_export(url: str, run_ids: list[str]) -> tuple[float, int]:
    import psycopg

    count = 0
    with psycopg.connect(url) as conn, open(os.devnull, "wb") as sink:
        start = time.perf_counter()
        for run_id in run_ids:
            cursor = conn.execute(
                f"SELECT {BASE_COLUMNS} FROM base_events WHERE run_id = %s ORDER BY seq",
                (run_id,),
            )
            for row in cursor:
                ts = row[6].isoformat(timespec="milliseconds").replace("+00:00", "Z")
                sink.write(_envelope(row, row[7], ts))
                count += 1
        return time.perf_counter() - start, count


# ---- orchestration --------------------------------------------------------------------------
def measure(
    name: str, events: int, run_ids: list[str], data: Path, repeats: int, import_repeats: int,
    new_url: Callable[[], str], baseline_import: Callable[[], float],
    baseline_export: Callable[[], tuple[float, int]],
) -> dict[str, float]:
    imports, base_imports, exports, base_exports = [], [], [], []
    url = ""
    for _ in range(import_repeats):
        url = new_url()
        elapsed, added = asyncio.run(runwire_import(url, data))
        assert added == events, (added, events)
        imports.append(elapsed)
        base_imports.append(baseline_import())
    for _ in range(repeats):
        with open(os.devnull, "wb") as sink:
            elapsed, count = asyncio.run(runwire_export(url, run_ids, sink))
        assert count == events
        exports.append(elapsed)
        elapsed, count = baseline_export()
        assert count == events
        base_exports.append(elapsed)
    figures = {
        f"{name}_export_per_s": _median_rate(events, exports),
        f"{name}_baseline_export_per_s": _median_rate(events, base_exports),
        f"{name}_import_per_s": _median_rate(events, imports),
        f"{name}_baseline_import_per_s": _median_rate(events, base_imports),
    }
    figures[f"{name}_export_vs_baseline"] = (
        figures[f"{name}_export_per_s"] / figures[f"{name}_baseline_export_per_s"])
    return figures


def bench_sqlite(args: argparse.Namespace, work: Path, data: Path, run_ids: list[str]) -> dict[str, float]:
    counter = iter(range(1000))
    baselines: list[Path] = []

    def new_url() -> str:
        return f"sqlite:///{work}/runwire-{next(counter)}.db"

    def base_import() -> float:
        path = work / f"baseline-{len(baselines)}.db"
        baselines.append(path)
        return sqlite_baseline_import(path, data)

    return measure("sqlite", args.events, run_ids, data, args.repeats, args.import_repeats,
                   new_url, base_import, lambda: sqlite_baseline_export(baselines[-1], run_ids))


def bench_worker_written(args: argparse.Namespace, work: Path, data: Path) -> dict[str, float]:
    rounds = []
    for index in range(args.repeats):
        with open(os.devnull, "wb") as sink:
            db = work / f"worker-{index}.db"
            figures = asyncio.run(written_like_a_worker(db, data, args.per_write, sink))
        figures["bytes_per_event"] = db.stat().st_size / figures.pop("events")  # closed: WAL checkpointed
        rounds.append(figures)
    return {f"sqlite_worker_written_{key}": statistics.median(r[key] for r in rounds) for key in rounds[0]}


def bench_postgres(args: argparse.Namespace, base_url: str, data: Path, run_ids: list[str]) -> dict[str, float]:
    import psycopg

    schemas: list[str] = []

    def schema_url() -> str:
        schema = f"bench_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(base_url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        schemas.append(schema)
        sep = "&" if "?" in base_url else "?"
        return f"{base_url}{sep}options=-csearch_path%3D{schema}"

    baseline_urls: list[str] = []

    def base_import() -> float:
        baseline_urls.append(schema_url())
        return pg_baseline_import(baseline_urls[-1], data)

    try:
        return measure("postgres", args.events, run_ids, data, args.repeats,
                       args.import_repeats, schema_url, base_import,
                       lambda: pg_baseline_export(baseline_urls[-1], run_ids))
    finally:
        with psycopg.connect(base_url, autocommit=True) as conn:
            for schema in schemas:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def _postgres(args: argparse.Namespace) -> tuple[str, Callable[[], None]]:
    if args.postgres:
        return args.postgres, lambda: None
    from tests.services import PostgresServer

    server = PostgresServer()
    server.start()
    return server.url, server.close


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="200 000 events instead")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3, help="export repeats (median)")
    parser.add_argument("--import-repeats", type=int, default=None,
                        help="import repeats (median; default 1, 3 with --quick)")
    parser.add_argument("--postgres", help="PostgreSQL URL (default: start one of our own)")
    parser.add_argument("--skip-postgres", action="store_true")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--per-write", type=int, default=23,
                        help="events of each run per write when stored as a worker does (bench/workers.py: ~23)")
    args = parser.parse_args()
    if args.quick:
        args.events = min(args.events, 200_000)
    if args.import_repeats is None:
        args.import_repeats = 3 if args.quick else 1

    figures: dict[str, float] = {"events": args.events, "runs": args.runs}
    with tempfile.TemporaryDirectory(prefix="runwire-bench-") as tmp:
        work = Path(tmp)
        data = work / "events.jsonl"
        run_ids = make_jsonl(data, args.events, args.runs)
        figures.update(bench_sqlite(args, work, data, run_ids))
        figures.update(bench_worker_written(args, work, data))
        if not args.skip_postgres:
            url, stop = _postgres(args)
            try:
                figures.update(bench_postgres(args, url, data, run_ids))
            finally:
                stop()
    if args.json:
        print(json.dumps({k: round(v, 2) for k, v in figures.items()}))
        return
    print(f"{args.events:,} events in {args.runs} runs (medians)")
    for key, value in figures.items():
        if key.endswith("_per_s"):
            print(f"  {key:38s} {value:>14,.0f}")
        elif key.endswith("_vs_baseline"):
            print(f"  {key:38s} {value:>14.2f}x")
        elif key.endswith("_per_event"):
            print(f"  {key:38s} {value:>14.0f} B")


if __name__ == "__main__":
    main()
