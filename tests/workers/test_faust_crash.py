"""The Kafka worker and faust's Fetcher: a seek-back never crashes it, and a crash ends the worker."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka.consumer.fetcher import FetchResult
from click.testing import CliRunner
from faust.types import TP

from runwire.bus import open_bus
from runwire.bus.kafka.bus import KafkaBus
from runwire.processing.faust.seam import FaustCrashed, faust_crash
from runwire.processing.faust.worker import FaustWorker
from runwire.store import open_store
from runwire.workers.cli import main
from tests.waiting import until
from tests.workers.checks import assert_delivered_exactly_once, run_tree
from tests.workers.test_crash import wait_finished
from tests.workers.test_faust import kafka_bus_url


@pytest.mark.slow
async def test_seek_backs_while_fetches_are_in_flight_never_crash_the_fetcher(
    kafka_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's seek-backs (a hole, a lost tail) come while faust's consumer thread is inside a
    fetch. Here the thread pauses 20 ms in each fetch, between taking a partition's fetched
    records and deleting them from aiokafka's fetcher (``FetchResult.getall`` in
    ``fetched_records``), as a thread preempted under load does, and the partition is sought back
    every 5 ms meanwhile: a seek run from the event loop deletes the records in that window and
    the fetch's own delete raises ``KeyError``, crashing faust's Fetcher (seen with Tansu on s3).
    Run on the consumer thread, a seek comes between two fetches: the Fetcher lives on and every
    event is delivered exactly once."""
    getall = FetchResult.getall

    def preempted_getall(self: FetchResult, max_records: int | None = None) -> list[Any]:
        time.sleep(0.02)  # the consumer thread lets the event loop's thread run, mid-fetch
        return getall(self, max_records)

    monkeypatch.setattr(FetchResult, "getall", preempted_getall)
    prefix = f"f{uuid.uuid4().hex[:8]}"
    events, ancestry = run_tree(prefix, deltas=20)
    async with open_bus(kafka_bus_url(kafka_url, prefix, session_timeout_ms=2000, shards=1)) as bus, \
            open_store(f"sqlite:///{tmp_path}/replay.db") as store:
        assert isinstance(bus, KafkaBus)
        for start in range(0, len(events), 2):  # many records, so fetches keep returning some
            await bus.publish(events[start:start + 2])
        worker = FaustWorker(bus, store, group=f"{prefix}-g", name="f1")
        running = asyncio.create_task(worker.run())
        try:
            await until(lambda: worker.partitions.offsets.get(0, -1) >= 0, within=30,
                        what="the worker processing its partition")
            tp = TP(worker.topic_name, 0)
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and not running.done():
                await worker.app.consumer.seek(tp, 0)  # re-read all: duplicates, dropped
                await asyncio.sleep(0.005)
            assert faust_crash(worker.app) is None
            await wait_finished(bus, [f"{prefix}_root"], 40)
            assert faust_crash(worker.app) is None
        finally:
            worker.stop.set()
            stats = await asyncio.wait_for(running, 30)
        assert stats.gaps == 0
        assert stats.duplicates > 0  # sought back while fetching: re-read, then dropped
        await assert_delivered_exactly_once(bus, store, events, ancestry)


class _CrashingWorker(FaustWorker):
    """Its intake refuses the first fetched batch: faust's Fetcher, which hands it over, crashes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refused = 0
        put = self.intake.put

        def refusing_put(messages: list[Any], sizes: list[int]) -> None:
            if not self.refused:
                self.refused += 1
                raise RuntimeError("refused by the test")
            put(messages, sizes)

        self.intake.put = refusing_put  # type: ignore[method-assign]


@pytest.mark.slow
async def test_a_crashed_fetcher_ends_the_worker_with_an_error_never_a_zombie(
    kafka_url: str, tmp_path: Path
) -> None:
    """Once faust's Fetcher crashed, nothing is fetched again while the process, its group
    membership and its heartbeats live on: its partitions would stall with no error a
    supervisor sees. The worker ends instead, with an error naming the crash (``runwire
    worker`` exits with status 1: restarted, or its partitions move to a live worker)."""
    prefix = f"f{uuid.uuid4().hex[:8]}"
    events, _ = run_tree(prefix, deltas=3)
    async with open_bus(kafka_bus_url(kafka_url, prefix, session_timeout_ms=2000, shards=1)) as bus, \
            open_store(f"sqlite:///{tmp_path}/replay.db") as store:
        assert isinstance(bus, KafkaBus)
        await bus.publish(events)
        worker = _CrashingWorker(bus, store, group=f"{prefix}-g", name="f1")
        running = asyncio.create_task(worker.run())
        try:
            with pytest.raises(FaustCrashed, match=r"f1: faust's consumer crashed \(RuntimeError"):
                await asyncio.wait_for(asyncio.shield(running), 40)
        finally:
            worker.stop.set()
            if not running.done():
                await asyncio.wait_for(asyncio.gather(running, return_exceptions=True), 30)
        assert worker.refused == 1
        assert worker.app.should_stop  # stopped, not left running


def test_runwire_worker_exits_with_status_1_and_one_line_when_faust_crashed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """``runwire worker`` on Kafka turns :class:`FaustCrashed` into one error line and exit status 1
    (no traceback, no stats line): what a supervisor restarts on."""
    from runwire.workers import faust_app
    from runwire.workers.commands import worker as worker_command

    def crashed(*_: Any, **__: Any) -> None:
        raise FaustCrashed("w0: faust's consumer crashed (KeyError('p7')); exiting")

    monkeypatch.setattr(faust_app, "run_faust_worker", crashed)
    monkeypatch.setattr(worker_command, "tune_gc", lambda: None)
    result = CliRunner().invoke(main, ["worker", "--bus", "kafka://127.0.0.1:1", "--store",
                                       f"sqlite:///{tmp_path}/unused.db"])
    assert result.exit_code == 1
    assert result.output == "Error: w0: faust's consumer crashed (KeyError('p7')); exiting\n"
