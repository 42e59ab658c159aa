"""One contract for every replay log backend: SQLite (a file) and PostgreSQL (a real server).

Koder agent stream §6: "The full event stream is persisted … Retention: 90 days for
completed runs (overrideable per workspace); 30 days for aborted/error." §5.4:
"JSONL replay — One JSON event per line, id ordered ascending".
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest

from runwire.core import envelope
from runwire.core.envelope import Event
from runwire.core.errors import UnknownRun
from runwire.jobs.replay import export_run
from runwire.store import RetentionPolicy, open_store
from runwire.store.jsonl import import_jsonl
from tests.events import T0, deltas, event
from tests.store.conftest import Clock


async def test_append_is_idempotent_on_run_and_seq(store_url: str) -> None:
    """Invariant 2 (no loss, no duplicates): appends are idempotent on (run_id, seq) — a redelivery adds nothing."""
    async with open_store(store_url) as log:
        assert await log.append(deltas("r1", 1, 5)) == 5
        assert await log.append(deltas("r1", 3, 7)) == 2
        assert await log.append(deltas("r1", 1, 7)) == 0
        assert await log.append([*deltas("r2", 1, 2), *deltas("r2", 1, 2)]) == 2
        stored = await log.read("r1")
        info = await log.run("r1")
    assert [e.seq for e in stored] == [1, 2, 3, 4, 5, 6, 7]
    assert info is not None and info.events == 7 and info.last_seq == 7


async def test_append_keeps_the_event_exactly(store_url: str) -> None:
    """What was appended reads back equal, extension and envelope extras included (T1)."""
    original = [
        event("r1", 1, "x.cogency.user", {"content": "hi", "nested": {"a": [1, 2]}}, tenant="acme"),
        event("r1", 2, "tool.start", {"call_id": "c1", "tool": "read", "input": {"f": "a"}},
              ext={"loom": {"node_id": "n1"}}),
        event("r1", 3, child_id="kid"),
    ]
    async with open_store(store_url) as log:
        await log.append(original)
        assert await log.read("r1") == original


async def test_read_after_a_seq_with_a_limit(store_url: str) -> None:
    """T3: a reconnect with Last-Event-ID N gets events ≥ N+1."""
    async with open_store(store_url) as log:
        await log.append(deltas("r1", 1, 10))
        assert [e.seq for e in await log.read("r1", after=6)] == [7, 8, 9, 10]
        assert [e.seq for e in await log.read("r1", after=2, limit=3)] == [3, 4, 5]
        assert await log.read("r1", after=10) == []
        assert await log.read("unknown") == []


async def test_iter_events_streams_all_in_order_batch_by_batch(store_url: str) -> None:
    async with open_store(store_url) as log:
        await log.append(deltas("r1", 1, 23))
        seqs = [e.seq async for e in log.iter_events("r1", batch=5)]
        later = [e.seq async for e in log.iter_events("r1", after=20, batch=2)]
    assert seqs == list(range(1, 24))
    assert later == [21, 22, 23]


async def test_jsonl_chunks_keep_seq_order_across_batches(store_url: str) -> None:
    """Koder agent stream §5.4: "One JSON event per line, id ordered ascending" — batch after batch."""
    stored = deltas("r1", 1, 23)
    async with open_store(store_url) as log:
        await log.append(list(reversed(stored)))
        chunks = [chunk async for chunk in log.iter_jsonl("r1", batch=5)]
        tail = [chunk async for chunk in log.iter_jsonl("r1", after=20, batch=5)]
    assert [count for _, count in chunks] == [5, 5, 5, 5, 3]
    assert b"".join(lines for lines, _ in chunks).splitlines() == [
        envelope.encode(e) for e in stored]
    assert tail == [(b"".join(envelope.encode(e) + b"\n" for e in stored[20:]), 3)]


async def test_first_seq_is_the_lowest_stored(store_url: str) -> None:
    async with open_store(store_url) as log:
        assert await log.first_seq("r1") is None
        await log.append(deltas("r1", 4, 9))
        assert await log.first_seq("r1") == 4


async def test_run_metadata_is_maintained_on_append(store_url: str, clock: Clock) -> None:
    """Tenant, parent, terminal state, counts, tokens, drops and times — a child's end does not end the parent."""
    async with open_store(store_url, clock=clock) as log:
        await log.append([
            event("p", 1, "run.lifecycle", {"state": "running"}, tenant="acme"),
            event("p", 2, "x.usage", {"input_tokens": 100, "output_tokens": 40}),
            event("p", 3, "x.gap", {"run_id": "p", "first": 4, "last": 6}),
        ])
        clock.advance(seconds=30)
        await log.append([
            event("p", 4, "run.lifecycle", {"state": "done"}, child_id="kid"),
            event("p", 5, "x.usage", {"input_tokens": 7, "output_tokens": 3}, child_id="kid"),
            event("p", 6, "x.usage", {"input_tokens": 1, "output_tokens": 2}),
        ])
        await log.append([event("kid", 1, parent_id="p", root_id="p", tenant="acme")])
        parent, kid = await log.run("p"), await log.run("kid")
        await log.append([event("p", 7, "run.lifecycle", {"state": "error"})])
        ended = await log.run("p")
    assert parent is not None and kid is not None and ended is not None
    assert (parent.tenant, parent.state, parent.terminal) == ("acme", "running", False)
    assert (parent.events, parent.last_seq, parent.dropped) == (6, 6, 3)
    assert (parent.input_tokens, parent.output_tokens) == (101, 42)
    assert parent.first_ts == "2026-01-01T00:00:01.000Z"
    assert parent.last_ts == "2026-01-01T00:00:06.000Z"
    assert parent.created_at == T0 and parent.updated_at == T0 + timedelta(seconds=30)
    assert parent.expires_at == T0 + timedelta(days=30, seconds=30)
    assert (kid.parent_id, kid.root_id) == ("p", "p")
    assert (ended.state, ended.terminal) == ("error", True)


async def test_runs_by_id_gives_what_run_gives_for_each_stored_run(store_url: str) -> None:
    """A worker restoring many runs looks them up at once: the same RunInfo as :meth:`run`,
    runs the log does not hold left out, an id asked twice answered once."""
    stored = [f"many-{n}" for n in range(1_205)]  # (more than one lookup's worth of ids)
    async with open_store(store_url) as log:
        await log.append([event(run_id, 1, "run.lifecycle", {"state": "running"}, tenant="acme")
                          for run_id in stored[:3]])
        await log.append([event(run_id, 1) for run_id in stored[3:]])
        await log.append([event("many-0", 2, "run.lifecycle", {"state": "done"})])
        found = await log.runs_by_id([*stored, "never-logged", "many-0"])
        assert set(found) == set(stored)
        for run_id in ("many-0", "many-1", stored[-1]):
            assert found[run_id] == await log.run(run_id)
        assert await log.runs_by_id([]) == {}
    assert (found["many-0"].state, found["many-0"].terminal, found["many-0"].tenant) == ("done", True, "acme")


async def test_a_late_older_lifecycle_event_does_not_overwrite_the_state(store_url: str) -> None:
    async with open_store(store_url) as log:
        await log.append([event("r", 5, "run.lifecycle", {"state": "done"})])
        await log.append([event("r", 2, "run.lifecycle", {"state": "running"})])
        info = await log.run("r")
    assert info is not None and info.state == "done" and info.terminal


async def test_runs_are_listed_by_tenant_state_and_time(store_url: str, clock: Clock) -> None:
    async with open_store(store_url, clock=clock) as log:
        await log.append([event("a", 1, "run.lifecycle", {"state": "done"}, tenant="acme")])
        clock.advance(hours=1)
        await log.append([event("b", 1, "run.lifecycle", {"state": "running"}, tenant="acme")])
        clock.advance(hours=1)
        await log.append([event("c", 1, "run.lifecycle", {"state": "done"}, tenant="other")])
        newest_first = [r.run_id for r in await log.runs()]
        acme = [r.run_id for r in await log.runs(tenant="acme")]
        done = [r.run_id for r in await log.runs(state="done")]
        recent = [r.run_id for r in await log.runs(since=T0 + timedelta(minutes=30))]
        early = [r.run_id for r in await log.runs(until=T0 + timedelta(minutes=90))]
        one = [r.run_id for r in await log.runs(limit=1)]
    assert newest_first == ["c", "b", "a"]
    assert acme == ["b", "a"]
    assert done == ["c", "a"]
    assert recent == ["c", "b"]
    assert early == ["b", "a"]
    assert one == ["c"]


async def test_runs_are_counted_with_the_listings_filters_up_to_a_cap(store_url: str, clock: Clock) -> None:
    """``count_runs`` counts what ``runs`` lists with the same filters and no limit, in one query
    that stops at ``cap``; states may be several, None standing for a run with no state yet."""
    async with open_store(store_url, clock=clock) as log:
        for n in range(5):
            await log.append([event(f"d{n}", 1, "run.lifecycle", {"state": "done"}, tenant="acme",
                                    thread_id="chat-1" if n < 2 else None)])
            clock.advance(minutes=1)
        await log.append([event("r", 1, "run.lifecycle", {"state": "running"}, tenant="acme")])
        await log.append([event("p", 1, "run.lifecycle", {"state": "paused"}, tenant="acme")])
        await log.append([event("n", 1, tenant="acme")])
        await log.append([event("x", 1, "run.lifecycle", {"state": "done"}, tenant="other")])
        every = await log.count_runs(cap=100)
        acme = await log.count_runs(cap=100, tenant="acme")
        capped = await log.count_runs(cap=3, tenant="acme")
        done = await log.count_runs(cap=100, tenant="acme", states=["done"])
        working = await log.count_runs(cap=100, tenant="acme", states=["running", "paused", "planning"])
        unset = await log.count_runs(cap=100, tenant="acme", states=[None])
        thread = await log.count_runs(cap=100, thread_id="chat-1")
        recent = await log.count_runs(cap=100, tenant="acme", since=T0 + timedelta(minutes=3, seconds=30))
        among = await log.count_runs(cap=100, tenant="acme", run_ids=["d0", "r", "x"])
        none = await log.count_runs(cap=100, run_ids=[])
        listed = len(await log.runs(tenant="acme", since=T0 + timedelta(minutes=3, seconds=30), limit=100))
    assert (every, acme, capped) == (9, 8, 3)
    assert (done, working, unset, thread) == (5, 2, 1, 2)
    assert recent == listed == 4
    assert (among, none) == (2, 0)


async def test_a_runs_thread_comes_from_its_own_events_and_filters_the_listing(
    store_url: str, clock: Clock
) -> None:
    """A run's thread is its own events' ``thread_id``; a child's thread fanned into it is not."""
    async with open_store(store_url, clock=clock) as log:
        await log.append([event("t1", 1, "run.lifecycle", {"state": "running"}, tenant="acme")])
        await log.append([event("t1", 2, thread_id="chat-7", child_id="kid"),
                          event("t1", 3, thread_id="chat-1")])
        clock.advance(minutes=1)
        await log.append([event("t2", 1, thread_id="chat-1"), event("other", 1)])
        first, plain = await log.run("t1"), await log.run("other")
        thread = [r.run_id for r in await log.runs(thread_id="chat-1")]
        nothing = await log.runs(thread_id="chat-7")
        acme = [r.run_id for r in await log.runs(thread_id="chat-1", tenant="acme")]
    assert first is not None and first.thread_id == "chat-1"
    assert plain is not None and plain.thread_id is None
    assert thread == ["t2", "t1"]
    assert nothing == []
    assert acme == ["t1"]


async def _three_runs(log_url: str, clock: Clock, **options: object) -> None:
    async with open_store(log_url, clock=clock, **options) as log:
        await log.append([event("done", 1, "run.lifecycle", {"state": "done"}, tenant="acme")])
        await log.append([event("failed", 1, "run.lifecycle", {"state": "error"}, tenant="acme")])
        await log.append([event("aborted", 1, "run.lifecycle", {"state": "aborted"})])
        await log.append([event("open", 1, "run.lifecycle", {"state": "running"})])


async def test_retention_by_terminal_state(store_url: str, clock: Clock) -> None:
    """Koder agent stream §6: 90 days for completed runs; 30 days for aborted/error."""
    await _three_runs(store_url, clock)
    async with open_store(store_url, clock=clock) as log:
        assert (await log.sweep(now=T0 + timedelta(days=29))).runs == []
        month = await log.sweep(now=T0 + timedelta(days=31))
        assert sorted(month.runs) == ["aborted", "failed", "open"] and month.events == 3
        assert await log.run("failed") is None and await log.read("failed") == []
        assert (await log.sweep(now=T0 + timedelta(days=89))).runs == []
        clock.advance(days=91)
        assert (await log.sweep()).runs == ["done"]
        assert await log.runs() == []


async def test_sweep_dry_run_deletes_nothing(store_url: str, clock: Clock) -> None:
    await _three_runs(store_url, clock)
    async with open_store(store_url, clock=clock) as log:
        preview = await log.sweep(now=T0 + timedelta(days=31), dry_run=True)
        assert sorted(preview.runs) == ["aborted", "failed", "open"] and preview.events == 3
        assert len(await log.runs()) == 4
        assert len(await log.read("failed")) == 1


async def test_retention_is_overridable_per_tenant(
    new_store_url: Callable[[], str], clock: Clock
) -> None:
    """Koder agent stream §6: "overrideable per workspace" — by URL parameter or constructor argument."""
    by_url = new_store_url()
    sep = "&" if "?" in by_url else "?"
    by_url += f"{sep}tenant.acme.retention_done_days=7&retention_failed_days=60"
    by_arg = new_store_url()
    for url, options in (
        (by_url, {}),
        (by_arg, {"retention": RetentionPolicy(failed=timedelta(days=60)),
                  "tenant_retention": {"acme": RetentionPolicy(done=timedelta(days=7),
                                                               failed=timedelta(days=60))}}),
    ):
        await _three_runs(url, clock, **options)
        async with open_store(url, clock=clock, **options) as log:
            info = await log.run("done")
            assert info is not None and info.expires_at == T0 + timedelta(days=7)
            assert (await log.sweep(now=T0 + timedelta(days=8))).runs == ["done"]
            assert sorted((await log.sweep(now=T0 + timedelta(days=31))).runs) == ["open"]
            assert sorted((await log.sweep(now=T0 + timedelta(days=61))).runs) == [
                "aborted", "failed"]


async def test_unfinished_runs_expire_by_last_activity(store_url: str, clock: Clock) -> None:
    async with open_store(store_url, clock=clock) as log:
        await log.append(deltas("slow", 1, 2))
        clock.advance(days=20)
        await log.append(deltas("slow", 3, 4))
        assert (await log.sweep(now=T0 + timedelta(days=31))).runs == []
        assert (await log.sweep(now=T0 + timedelta(days=51))).runs == ["slow"]


async def test_require_run_names_unknown_and_expired_runs(store_url: str, clock: Clock) -> None:
    async with open_store(store_url, clock=clock) as log:
        await log.append([event("r", 1, "run.lifecycle", {"state": "error"})])
        assert (await log.require_run("r")).run_id == "r"
        with pytest.raises(UnknownRun, match="unknown run 'nope'"):
            await log.require_run("nope")
        clock.advance(days=31)
        with pytest.raises(UnknownRun, match="expired"):
            await log.require_run("r")


async def test_jsonl_export_import_round_trip(new_store_url: Callable[[], str]) -> None:
    """Koder agent stream §5.4: one JSON event per line, ascending; import is idempotent; bad lines are reported."""
    source_url, copy_url = new_store_url(), new_store_url()
    originals = [*deltas("r1", 1, 30), event("r1", 31, "run.lifecycle", {"state": "done"}),
                 *deltas("r2", 1, 3, tenant="acme")]
    async with open_store(source_url) as log:
        await log.append(originals)
        out = io.BytesIO()
        assert [await export_run(log, run, out.write) for run in ("r1", "r2")] == [31, 3]
    exported = out.getvalue()
    lines = exported.splitlines()
    assert lines == [envelope.encode(e) for e in originals]
    ids = [envelope.decode(line).id for line in lines[:31]]
    assert ids == sorted(ids)

    damaged = [*lines[:5], b'{"type": "nope.kind", "id": "x"}', b"not json", b"", *lines[5:]]
    async with open_store(copy_url) as copy:
        report = await import_jsonl(copy, damaged, batch=7)
        again = await import_jsonl(copy, lines)
        out = io.BytesIO()
        for run in ("r1", "r2"):
            await export_run(copy, run, out.write)
        info = await copy.run("r1")
    assert (report.lines, report.added, report.runs) == (36, 34, ["r1", "r2"])
    assert [(e.line, e.code) for e in report.errors] == [
        (6, "KAI-STREAM-PROTO-0002"), (7, "KAI-STREAM-PROTO-0001")]
    assert again.added == 0 and again.errors == []
    assert out.getvalue() == exported
    assert info is not None and info.state == "done" and info.events == 31


async def test_bulk_appends_are_idempotent_too(store_url: str) -> None:
    """Large batches take the bulk path (COPY on PostgreSQL) with the same (run_id, seq) dedupe."""
    async with open_store(store_url) as log:
        assert await log.append(deltas("big", 1, 400)) == 400
        assert await log.append([*deltas("big", 200, 700), *deltas("other", 1, 300)]) == 600
        assert await log.append(deltas("big", 1, 700)) == 0
        info = await log.run("big")
        seqs = [e.seq async for e in log.iter_events("big", batch=256)]
    assert info is not None and info.events == 700 and info.last_seq == 700
    assert seqs == list(range(1, 701))


async def test_postgres_reconnects_after_losing_its_connections(postgres_url: str) -> None:
    """A read on a dropped connection reconnects and is answered (reads repeat safely: the first
    read after a server restart does not fail); a write on one is a retriable StoreUnavailable
    (its caller retries it) and the next call reconnects."""
    import psycopg

    from runwire.core.errors import StoreUnavailable

    name = f"rw_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {name}")
    url = f"{postgres_url}?application_name={name}&options=-csearch_path%3D{name}"
    async with open_store(url) as log:
        await log.append(deltas("pg-reconnect", 1, 2))
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = %s", (name,)
            )
        assert [e.seq for e in await log.read("pg-reconnect")] == [1, 2]
        with pytest.raises(StoreUnavailable) as failure:
            await log.append(deltas("pg-reconnect", 3, 3))
        assert failure.value.retriable
        assert await log.append(deltas("pg-reconnect", 3, 4)) == 2
        await log.sweep(dry_run=True)
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(f"DROP SCHEMA {name} CASCADE")


async def test_append_streams_is_append_of_the_same_rows(store_url: str, clock: Clock) -> None:
    """A worker's write, grouped per run with the events' canonical JSON: the same rows,
    the same run metadata, and the same dedupe when a batch is written again after a crash."""
    parent = [
        event("sp", 1, "run.lifecycle", {"state": "running"}, tenant="acme"),
        event("sp", 2, "x.usage", {"input_tokens": 5, "output_tokens": 2}),
        event("sp", 3, child_id="sk"),
    ]
    kid = [event("sk", s, parent_id="sp", root_id="sp", tenant="acme") for s in (1, 2)]
    streams = [(run, events, [envelope.encode(e) for e in events])
               for run, events in (("sp", parent), ("sk", kid))]
    async with open_store(store_url, clock=clock) as log:
        assert await log.append_streams(streams) == 5
        done = [event("sp", 4, "run.lifecycle", {"state": "done"})]
        again = [("sp", [*parent, *done], [envelope.encode(e) for e in (*parent, *done)]),
                 ("sk", kid, [envelope.encode(e) for e in kid])]
        assert await log.append_streams(again) == 1  # only seq 4 is new
        assert await log.append_streams([("sp", [], [])]) == 0
        stored = await log.read("sp")
        info, child = await log.run("sp"), await log.run("sk")
    assert stored == [*parent, *done]
    assert info is not None and child is not None
    assert (info.tenant, info.state, info.terminal, info.events) == ("acme", "done", True, 4)
    assert (info.input_tokens, info.output_tokens, info.last_seq) == (5, 2, 4)
    assert (child.parent_id, child.root_id, child.tenant, child.events) == ("sp", "sp", "acme", 2)


async def test_a_write_of_many_runs_gives_each_run_its_own_metadata(store_url: str) -> None:
    """One write touching 1,337 runs (more rows than one SQLite statement holds): each run's
    events stored once, and its metadata from its own events — the tenant, parent and thread
    from whichever of them carries one, not only the first; a fanned-in copy gives neither."""
    runs = [f"m{index}" for index in range(1337)]
    streams = _streams(*[(run, [
        event(run, 1, second=9, child_id=f"{run}.k", parent_id="elsewhere", thread_id="not-mine"),
        event(run, 2, second=3),
        event(run, 3, second=7, tenant="acme", parent_id="p", root_id="r", thread_id=f"t-{run}"),
    ]) for run in runs])
    async with open_store(store_url) as log:
        assert await log.append_streams(streams) == 3 * len(runs)
        infos = await log.runs_by_id(runs)
        stored = await log.read("m1336")
    assert [e.seq for e in stored] == [1, 2, 3]
    assert sorted(infos) == sorted(runs)
    for run, info in infos.items():
        assert (info.events, info.last_seq, info.tenant) == (3, 3, "acme"), run
        assert (info.parent_id, info.root_id, info.thread_id) == ("p", "r", f"t-{run}"), run
        assert (info.first_ts, info.last_ts) == (stored[1].ts, stored[0].ts), run


def _streams(*groups: tuple[str, list[Event]]) -> list[tuple[str, list[Event], list[bytes]]]:
    return [(run, events, [envelope.encode(e) for e in events]) for run, events in groups]


async def test_a_write_redone_in_other_groupings_stores_each_event_once(store_url: str) -> None:
    """Invariant 2 (no loss, no duplicates): after a crash the same events come again, batched
    otherwise, overlapping what is stored, a run split over two streams, next to new runs."""
    async with open_store(store_url) as log:
        assert await log.append_streams(_streams(("ra", deltas("ra", 1, 30)), ("rb", deltas("rb", 1, 10)))) == 40
        assert await log.append_streams(_streams(("ra", deltas("ra", 1, 45)), ("rc", deltas("rc", 1, 3)))) == 18
        assert await log.append_streams(_streams(
            ("rb", deltas("rb", 5, 12)), ("ra", deltas("ra", 40, 44)), ("ra", deltas("ra", 42, 50)))) == 7
        assert await log.append_streams(_streams(("ra", deltas("ra", 50, 50)), ("rb", deltas("rb", 1, 12)))) == 0
        stored = {run: await log.read(run) for run in ("ra", "rb", "rc")}
        infos = {run: await log.run(run) for run in ("ra", "rb", "rc")}
        exported = b"".join([lines async for lines, _ in log.iter_jsonl("ra", batch=7)])
    assert stored == {"ra": deltas("ra", 1, 50), "rb": deltas("rb", 1, 12), "rc": deltas("rc", 1, 3)}
    assert [(i.events, i.last_seq) for i in infos.values() if i] == [(50, 50), (12, 12), (3, 3)]
    assert exported.splitlines() == [envelope.encode(e) for e in deltas("ra", 1, 50)]


async def test_reads_start_and_stop_inside_a_write(store_url: str) -> None:
    """T3 from any seq: a read or an export after a seq in the middle of one write, with a limit
    that ends in the middle of another, returns exactly the events in between."""
    async with open_store(store_url) as log:
        await log.append_streams(_streams(("r1", deltas("r1", 1, 40))))
        await log.append_streams(_streams(("r1", deltas("r1", 41, 100))))
        await log.append_streams(_streams(("r1", deltas("r1", 101, 1300))))  # longer than any one row
        middle = await log.read("r1", after=37, limit=5)
        across = await log.read("r1", after=38, limit=10)
        late = await log.read("r1", after=1250)
        none = await log.read("r1", after=30, limit=0)
        chunks = [chunk async for chunk in log.iter_jsonl("r1", after=33, batch=500)]
        events = [e.seq async for e in log.iter_events("r1", after=99, batch=3)]
    assert [e.seq for e in middle] == [38, 39, 40, 41, 42]
    assert [e.seq for e in across] == list(range(39, 49))
    assert [e.seq for e in late] == list(range(1251, 1301)) and none == []
    assert [count for _, count in chunks] == [500, 500, 267]
    assert b"".join(lines for lines, _ in chunks).splitlines() == [
        envelope.encode(e) for e in deltas("r1", 34, 1300)]
    assert events == list(range(100, 1301))


async def test_a_run_with_gaps_reads_whole_and_its_gaps_fill_later(store_url: str) -> None:
    """Seqs need not be contiguous: a limit counts stored events across a gap, and a late write
    into the gap adds only the missing seqs."""
    async with open_store(store_url) as log:
        await log.append([*deltas("g", 20, 30), *deltas("g", 1, 10)])
        assert await log.first_seq("g") == 1
        across = await log.read("g", after=5, limit=10)
        batches = [e.seq async for e in log.iter_events("g", batch=4)]
        assert await log.append(deltas("g", 5, 25)) == 9
        stored = await log.read("g")
        info = await log.run("g")
    assert [e.seq for e in across] == [6, 7, 8, 9, 10, 20, 21, 22, 23, 24]
    assert batches == [*range(1, 11), *range(20, 31)]
    assert stored == deltas("g", 1, 30)
    assert info is not None and info.events == 30


async def test_a_stream_created_and_never_written_is_swept_with_its_producers(store_url: str) -> None:
    """A Durable Streams ``PUT`` with no append leaves no run behind: after the unfinished-run retention
    its stream row and its producers' rows go too (nothing grows with streams nobody writes)."""
    from datetime import UTC, datetime

    async with open_store(store_url) as log:
        assert await log.stream_create("empty")
        await log.stream_reserve("empty", ("p", 0, 0), 0, close=False, hold_s=0, digest="d")
        assert await log.stream_state("empty") is not None
        assert (await log.sweep(now=datetime.now(UTC) + timedelta(days=29))).runs == []
        assert await log.stream_state("empty") is not None
        await log.sweep(now=datetime.now(UTC) + timedelta(days=31))
        assert await log.stream_state("empty") is None
        assert await log.stream_create("empty")  # created afresh: its old producer state is gone
        fresh = await log.stream_reserve("empty", ("p", 0, 0), 0, close=False, hold_s=0, digest="other")
    assert fresh.outcome == "append"
