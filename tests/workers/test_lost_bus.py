"""The replay log is the checkpoint of record: a bus that lost its checkpoints (Redis restarted
without persistence) or never got a run's first one (its writer died between the log and the
views) loses no acknowledged event, doubles no re-sent one, and its hot streams hold the whole run
again."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from runwire.bus import open_bus
from runwire.core.errors import BusError
from runwire.processing.checkpoint import decode_checkpoint
from runwire.processing.logged import rebuilt_views
from runwire.processing.processor import Processor
from runwire.processing.shaping import shape
from runwire.store import ReplayLog, open_store
from runwire.workers.runtime import run_worker
from tests.services import RedisServer
from tests.workers.checks import assert_delivered_exactly_once, expected_streams, read_all, run_tree
from tests.workers.events import RunScript


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path) -> AsyncIterator[ReplayLog]:  # type: ignore[no-untyped-def]
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/replay.db"
    else:
        url = request.getfixturevalue("postgres_schema_url")
    async with open_store(url) as log:
        yield log


async def test_a_fresh_worker_after_redis_restarted_empty_continues_each_run_from_the_log(
    own_redis: RedisServer, store: ReplayLog
) -> None:
    """A worker writes the first half of a run tree; Redis restarts with nothing (checkpoints,
    streams, group and leases gone); a fresh worker gets the second half and a publisher's
    re-sent first-half events (same publisher seqs). Every stream continues where it stopped:
    in the log and on the hot tier every event once, seqs contiguous, the re-sent ones dropped
    as duplicates, and the shaped view is the raw view's."""
    prefix = f"r{uuid.uuid4().hex[:8]}"
    events, ancestry = run_tree(prefix)
    half = len(events) // 2
    url = f"{own_redis.url}?shards=2&prefix=lost"
    async with open_bus(url) as bus:
        await bus.publish(events[:half])
        await run_worker(bus, store, group="g", name="w1", burst=True)
        written = {run_id: len(await store.read(run_id)) for run_id in ancestry}
    assert all(written.values())
    own_redis.restart()
    async with open_bus(url) as bus:
        assert (await bus.load_states([(f"{prefix}_root", "raw")]))[0] is None  # all of it is gone
        await bus.publish(events[half:])
        await bus.publish(events[half - 20:half])  # the publisher re-sends what it had no ack for
        stats = await run_worker(bus, store, group="g", name="w2", burst=True)
        await assert_delivered_exactly_once(bus, store, events, ancestry)
        root = await read_all(bus, f"{prefix}_root")
    assert stats.duplicates >= 20 and stats.retired == 0
    assert len(root) == len(expected_streams(events, ancestry)[f"{prefix}_root"])


async def test_a_runs_first_write_lost_between_the_log_and_the_views_is_rebuilt_from_the_log(
    tmp_path,  # type: ignore[no-untyped-def]
) -> None:
    """The log runs one write ahead of the views: a worker that dies after logging a run's first
    write leaves no checkpoint on the bus. Its successor continues from the log's, gives the
    views the logged events first and drops the redelivered entries as duplicates: every event
    once in each view and in the log."""
    async with open_bus("memory://?shards=1") as bus, open_store(f"sqlite:///{tmp_path}/log.db") as store:
        run = RunScript("r-first")
        events = [run.lifecycle("running")]
        events += [run.text(f"w{index} ", ms=index * 7) for index in range(200)]
        events += [run.tool_start("c1", ms=1500), run.lifecycle("done", ms=1501)]
        await bus.publish(events)
        real = bus.append_many

        async def views_fail(appends):  # type: ignore[no-untyped-def]
            raise BusError("connection reset")  # not retriable: the worker ends after its log part

        bus.append_many = views_fail  # type: ignore[method-assign]
        with pytest.raises(BusError):
            await run_worker(bus, store, group="g", name="w1", burst=True)
        bus.append_many = real  # type: ignore[method-assign]
        assert (await bus.load_states([("r-first", "raw")]))[0] is None
        assert len(await store.read("r-first")) == len(events)
        stats = await run_worker(bus, store, group="g", name="w2", burst=True, claim_idle_ms=1)
        raw = await read_all(bus, "r-first")
        shaped = await bus.read(("r-first", "shaped"), 0, limit=10_000)
        logged = await store.read("r-first")
    assert stats.duplicates == len(events)
    assert [e.id for e in raw] == [e.id for e in events]
    assert [e.seq for e in raw] == list(range(1, len(events) + 1))
    assert [(e.seq, e.id) for e in logged] == [(e.seq, e.id) for e in raw]
    assert shaped == shape(raw)


def test_a_rebuilt_shaped_view_leaves_open_windows_to_the_live_path_or_settles_them() -> None:
    """From the run's start, the rebuilt shaped view is what the live path had sent and the
    windows it held open stay open (the checkpoint as logged). Cut at the hot tier's length, the
    shaped part starts at the first non-delta event, goes out whole, and the checkpoint is
    settled against it: its open windows count as sent, so no text goes out twice."""
    run = RunScript("r-views")
    events = [run.lifecycle("running"), *[run.text(f"a{i} ", ms=i * 30) for i in range(10)],
              run.tool_start("c1", ms=400), *[run.text(f"b{i} ", ms=400 + i * 30) for i in range(2)]]
    processor = Processor()
    processor.restore("r-views", None)
    output = Processor.seal(processor.process(events))["r-views"]
    assert decode_checkpoint(output.state).shaper.windows  # b0, b1 wait in a window

    kept, appends = rebuilt_views("r-views", output.state, output.raw)
    assert kept == output.state
    assert [(key, len(raw)) for key, raw, _, _ in appends] == [
        (("r-views", "shaped"), len(output.shaped)), (("r-views", "raw"), len(events))]
    assert appends[0][1] == output.shaped

    settled, appends = rebuilt_views("r-views", output.state, output.raw[5:])
    shaped = appends[0][1]
    assert shaped[0].type == "tool.start" and shaped[-1].payload_dict()["text"] == "b0 b1 "
    checkpoint = decode_checkpoint(settled)
    assert not checkpoint.shaper.windows and checkpoint.shaped_seq == len(events)
    assert appends[1][3] == settled
