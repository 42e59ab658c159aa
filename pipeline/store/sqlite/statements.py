"""The SQLite replay log's statements and the rows they take: events as segments (consecutive
seqs of one run in one row), multi-row statements cut under SQLite's parameter limit, the
retention of each run's rows."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterable, Sequence
from operator import attrgetter, lt
from typing import Any

import msgspec

from ...core import envelope
from ...core.envelope import Event
from ...core.lines import join_lines
from ..base import LogStream, stream_checkpoint
from ..retention import RetentionPolicy
from ..runmeta import STATE_AFTER_MERGE, upsert_run_sql
from .schema import SEGMENT_EVENTS

ROWS_PER_STATEMENT = 512
"""The most rows a multi-row statement holds (an upsert of runs: 9 728 parameters, under SQLite's 32 766)."""
IDS_PER_QUERY = 1000
"""Run ids per ``IN (…)`` lookup (under SQLite's 32 766 parameters)."""
INSERT_SEGMENTS = "INSERT INTO segments (run_id, first_seq, last_seq, body) "
STORED_PAST = (
    "SELECT 1 FROM json_each(?) AS start WHERE EXISTS (SELECT 1 FROM segments"
    " WHERE run_id = json_extract(start.value, '$[0]') AND last_seq >= json_extract(start.value, '$[1]'))"
    " LIMIT 1"
)
"""A row when a run of ``[[run_id, first_seq], …]`` has a stored event at or past ``first_seq``
(one index probe per run)."""


@functools.lru_cache(maxsize=128)
def rows_sql(head: str, width: int, rows: int, tail: str) -> str:
    row = "(" + ",".join(["?"] * width) + ")"
    return head + "VALUES " + ",".join([row] * rows) + tail


def execute_rows(
    db: sqlite3.Connection, head: str, width: int, params: list[Any], tail: str = ""
) -> None:
    """Run ``head VALUES-rows tail`` for rows given as one flat list of ``width`` values each.

    Multi-row statements rather than ``executemany``: the sqlite3 module
    releases the GIL around every ``sqlite3_step``, once per row with
    ``executemany``, and on this writer thread each of those re-acquisitions
    waits for the event loop's thread to let go of the GIL (up to the
    switch interval when it is busy). Measured with a CPU-bound main thread
    (100 k rows over ~600 runs, WAL, 16 KiB pages): ``executemany`` took
    76–660 µs a row instead of 5–6 µs alone; 500-row statements took ~19 µs
    a row while the main thread kept ~88 % of its speed.

    The rows go in statements of a power of two rows each (337: 256, 64, 16
    and 1), so a few texts in all are prepared once and then taken from the
    connection's statement cache. Prepared afresh for each write's own number
    of rows, parsing took ~7 % of the log thread's instructions in
    ``bench/workers.py`` (Kafka); padding one statement to a round number of
    rows with rows its ``WHERE`` leaves out cost more than that parse.
    """
    most = min(ROWS_PER_STATEMENT, db.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // width)  # 999 before 3.32
    largest = 1 << (most.bit_length() - 1)
    at, rows = 0, len(params) // width
    while rows:
        size = min(largest, 1 << (rows.bit_length() - 1))
        db.execute(rows_sql(head, width, size, tail), params[at : at + width * size])
        at += width * size
        rows -= size


@functools.lru_cache(maxsize=16)
def upsert_runs(keep: tuple[float, float, float]) -> tuple[str, str]:
    """The run upsert around its rows, for :func:`execute_rows` (19 values a row),
    setting ``expires_at`` as :meth:`ReplayLog.expiry` computes it with these keep times
    (seconds: done, aborted/error, unfinished) in the same statement."""
    done, failed, unfinished = (repr(float(seconds)) for seconds in keep)
    expires = (f"max(runs.updated_at, excluded.updated_at) + CASE {STATE_AFTER_MERGE} WHEN 'done' THEN {done}"
               f" WHEN 'aborted' THEN {failed} WHEN 'error' THEN {failed} ELSE {unfinished} END")
    statement = upsert_run_sql("?", "max", expires).rsplit("RETURNING", 1)[0]
    head, tail = statement.split("VALUES (" + ", ".join(["?"] * 19) + ")")
    return head, tail


SET_EXPIRY = """
UPDATE runs SET expires_at = updated_at + CASE
        WHEN state = 'done' THEN ?
        WHEN state IN ('aborted', 'error') THEN ?
        ELSE ? END
WHERE run_id IN (SELECT value FROM json_each(?))"""
"""Expiry as :meth:`ReplayLog.expiry` computes it, for one tenant's runs among those touched."""


def keep_seconds(policy: RetentionPolicy) -> tuple[float, float, float]:
    return (policy.keep_for("done").total_seconds(), policy.keep_for("error").total_seconds(),
            policy.keep_for(None).total_seconds())


seq_of = attrgetter("seq")
ids_json = msgspec.json.Encoder()


EVERY_EVENT = 2**63 - 1
"""A limit of "every event" (SQLite's largest integer)."""
SPANS_AFTER = "SELECT first_seq, last_seq FROM segments WHERE run_id = ? AND last_seq > ? ORDER BY last_seq"
"""The spans of a run's segments holding events after a seq, in seq order (from the index alone)."""
SEGMENTS_OF_CHUNK = (
    "SELECT first_seq, last_seq, body FROM segments WHERE run_id = ?1 AND last_seq > ?2 AND last_seq <= ?3"
    " ORDER BY last_seq"
)
"""The segments of run ``?1`` holding events after seq ``?2``, up to the one ending at ``?3``."""
ORDERED_CONCAT = sqlite3.sqlite_version_info >= (3, 44, 0)
JOINED = (
    "SELECT CAST(group_concat(body, x'0a'{order}) AS BLOB), min(first_seq), max(last_seq),"
    " sum(last_seq - first_seq + 1) FROM ({segments})"
).format(order=" ORDER BY last_seq" if ORDERED_CONCAT else "", segments=SEGMENTS_OF_CHUNK)
""":data:`SEGMENTS_OF_CHUNK` joined into one value: ``(lines, first_seq of the first,
last_seq of the last, their events)``. Before SQLite 3.44 (no ORDER BY inside
aggregates) the concatenation follows the ordered subquery, which SQLite runs
as a co-routine feeding the aggregate row by row in seq order; the export test
checks the order."""
EVENTS_OF_RUNS = (
    "SELECT coalesce(sum(last_seq - first_seq + 1), 0) FROM segments"
    " WHERE run_id IN (SELECT value FROM json_each(?))"
)
"""How many events the runs of a JSON list of ids hold (what a sweep deletes)."""
STORED_FROM = (
    "SELECT first_seq, last_seq FROM segments WHERE run_id = ? AND last_seq >= ? ORDER BY last_seq"
)
"""The spans of a run's segments holding a seq at or past one, in seq order."""


def cut_blob(blob: bytes, head: int, tail: int) -> bytes:
    """``blob``'s lines without the first ``head`` and the last ``tail`` (each under a segment)."""
    if not head and not tail:
        return blob
    start, end = 0, len(blob)
    for _ in range(head):
        start = blob.index(b"\n", start) + 1
    for _ in range(tail):
        end = blob.rindex(b"\n", start, end)
    return blob[start:end]


def decode_lines(lines: bytes) -> list[Event]:
    return [envelope.decode(line, max_depth=None) for line in lines.split(b"\n")]


def missing_seqs(seqs: list[int], stored: Iterable[tuple[int, int]]) -> list[int]:
    """The ``seqs`` (ascending) outside every ``(first, last)`` range of ``stored`` (ascending)."""
    missing: list[int] = []
    ranges = iter(stored)
    first, last = next(ranges, (EVERY_EVENT, EVERY_EVENT))
    for seq in seqs:
        while last < seq:
            first, last = next(ranges, (EVERY_EVENT, EVERY_EVENT))
        if seq < first:
            missing.append(seq)
    return missing


def add_segments(
    params: list[Any], run_id: str, seqs: list[int], encoded: Sequence[bytes]
) -> None:
    """Add the segment rows of one run's new events (``seqs`` ascending) to ``params``.

    A contiguous stretch of seqs becomes one segment (several past
    :data:`SEGMENT_EVENTS`).
    """
    count = len(seqs)
    if seqs[-1] - seqs[0] == count - 1:
        bounds = list(range(0, count, SEGMENT_EVENTS)) + [count]
    else:
        bounds = [0]
        for index in range(1, count):
            if seqs[index] != seqs[index - 1] + 1 or index - bounds[-1] == SEGMENT_EVENTS:
                bounds.append(index)
        bounds.append(count)
    for start, stop in zip(bounds, bounds[1:], strict=False):
        params += (run_id, seqs[start], seqs[stop - 1], join_lines(encoded, start, stop))


def ascending_segments(
    streams: Sequence[LogStream],
) -> tuple[list[Any], list[tuple[str, int]]] | None:
    """The segment rows of a write whose runs each come once with ascending seqs, and each
    run's first seq; None for any other write.

    The usual stream (contiguous seqs, at most :data:`SEGMENT_EVENTS`) is one
    join and one comprehension over its events' seqs.
    """
    params: list[Any] = []
    starts: list[tuple[str, int]] = []
    for stream in streams:
        run_id, events, encoded = stream[0], stream[1], stream[2]
        count = len(events)
        if not count:
            continue
        first = events[0].seq
        seqs = [event.seq for event in events]
        if count <= SEGMENT_EVENTS and seqs == list(range(first, first + count)):
            params += (run_id, first, first + count - 1, join_lines(encoded))
        else:
            if not all(map(lt, seqs, seqs[1:])):
                return None
            add_segments(params, run_id, seqs, encoded)
        starts.append((run_id, first))
    if len(starts) != len({run_id for run_id, _ in starts}):
        return None
    return params, starts


def checkpoints_of(streams: Sequence[LogStream], *, ascending: bool = False) -> dict[str, tuple[bytes, int]]:
    """The checkpoint each run's part of a write carries, with that part's last seq (a run
    given twice: the part ending further); ``ascending``: each part's seqs ascend (a caller's
    check said so), so its last event's is its last seq."""
    found: dict[str, tuple[bytes, int]] = {}
    for stream in streams:
        checkpoint = stream_checkpoint(stream)
        if checkpoint is not None and stream[1]:
            last = stream[1][-1].seq if ascending else max(map(seq_of, stream[1]))
            if stream[0] not in found or found[stream[0]][1] <= last:
                found[stream[0]] = (checkpoint, last)
    return found


NO_CHECKPOINT = (None, 0)
