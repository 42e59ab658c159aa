"""The Kafka-protocol broker restarted mid-run: the faust worker and the publisher SDK ride it out.

The first test's broker is Tansu on ``s3://`` storage (a moto S3 server of its own), so its
topics, records and committed offsets outlive the restart. The others' is Tansu on
``memory://``, restarted empty: what a publisher's ``emit`` returned, before the restart or
after it, is stored.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from runwire import Publisher
from runwire.bus import open_bus
from runwire.edge.fanout.resume import history
from runwire.store import open_store
from tests.services import DurableTansu, TansuBroker, free_port
from tests.waiting import until
from tests.workers.test_crash import kill_all, start_worker, wait_sharing

RUNS = 12
DELTAS = 250


@pytest.fixture
def durable_kafka() -> Iterator[DurableTansu]:
    broker = DurableTansu()
    try:
        broker.start()
    except (AssertionError, OSError, RuntimeError) as exc:
        broker.close()
        pytest.fail(f"cannot start Tansu on s3 storage: {exc}", pytrace=False)
    yield broker
    broker.close()


async def _resumed(bus: Any, run_id: str) -> list[Any]:
    """What a client resuming ``run_id`` from its start reads, reading on (as a stream stays open)
    until the run's end: the log is written before the delivery streams, so a run the log holds as
    ended may still be reaching them."""
    events: list[Any] = []

    async def whole() -> bool:
        while batch := await bus.read((run_id, "raw"), events[-1].seq if events else 0):
            events.extend(batch)
        last = events[-1] if events else None
        return last is not None and last.type == "run.lifecycle" and last.payload.state != "running"

    with contextlib.suppress(AssertionError):  # (what is missing then is what _check shows)
        await until(whole, within=30, what=f"{run_id}'s end on its delivery stream")
    return events


def _check(events: list[Any], run_id: str) -> None:
    """One run's stream: every delta once, in emit order, seqs 1..n without a gap."""
    texts = [e.payload.text for e in events if e.type == "text.delta"]
    assert texts == [f"d{k} " for k in range(DELTAS)], (run_id, len(texts))
    assert [e.seq for e in events] == list(range(1, DELTAS + 3)), run_id
    assert events[-1].type == "run.lifecycle" and events[-1].payload.state == "done", run_id


@pytest.mark.slow
async def test_a_broker_restarted_mid_run_loses_doubles_and_reorders_nothing(
    durable_kafka: DurableTansu, tmp_path: Path
) -> None:
    """SIGKILL the broker while a publisher emits and a `runwire worker` (faust) processes, start
    it again on the same port: every delta the publisher's `emit` returned is in the replay log and
    in what a resuming client reads, once and in order, and the worker process is still up."""
    prefix = f"r{uuid.uuid4().hex[:8]}"
    url = f"{durable_kafka.url}?prefix={prefix}&session_timeout_ms=2000"
    store_url = f"sqlite:///{tmp_path}/replay.db"
    log = tmp_path / "w0.log"
    metrics = free_port()
    worker = start_worker(url, store_url, "w0", tmp_path, f"{prefix}-g",
                          "--metrics-addr", f"127.0.0.1:{metrics}")
    try:
        async with Publisher.connect(url, delivery_timeout=120) as pub, open_store(store_url) as store:
            runs = [pub.run(f"{prefix}-{i}") for i in range(RUNS)]

            async def emit(first: int, end: int) -> None:
                for k in range(first, end):
                    for run in runs:
                        await run.emit("text.delta", {"text": f"d{k} "})

            for run in runs:
                await run.emit("run.lifecycle", {"state": "running"})
            await emit(0, 100)
            await until(lambda: _written(store, runs[0].run_id), within=60)  # the worker joined
            durable_kafka.kill()
            await emit(100, 175)  # while the broker is down: queued, retried
            await until(lambda: "Connect call failed" in log.read_text(), within=30)
            durable_kafka.start()
            await emit(175, DELTAS)
            for run in runs:
                await run.finish()
            await pub.flush()
            for run in runs:
                await until(lambda run=run: _ended(store, run.run_id), within=120)
                _check(await store.read(run.run_id, 0, None), run.run_id)
        assert worker.poll() is None, log.read_text()[-3000:]
        async with open_bus(url) as bus:  # a client resuming each run from its start
            for run in runs:
                _check(await _resumed(bus, run.run_id), run.run_id)
        assert worker.poll() is None, log.read_text()[-3000:]
        async with httpx.AsyncClient() as http:  # its pauses served as the other runtime's are
            served = (await http.get(f"http://127.0.0.1:{metrics}/metrics")).text
        assert "# TYPE runwire_worker_paused gauge" in served
    finally:
        kill_all([worker])
        try:
            worker.wait(5)
        except subprocess.TimeoutExpired:
            pass


async def _written(store: Any, run_id: str) -> bool:
    return bool(await store.read(run_id, 0, 5))


async def _ended(store: Any, run_id: str) -> bool:
    info = await store.run(run_id)
    return info is not None and info.terminal


@pytest.mark.slow
async def test_every_event_a_publisher_emitted_is_readable_after_a_broker_restarted_empty(
    tmp_path: Path,
) -> None:
    """SIGKILL a broker on memory storage and start it again empty on its port under a connected
    publisher that emits nothing more: every event whose `emit` returned before the restart is
    readable from the ingest topic again (the publisher keeps what no group committed past, and
    sends it again once it finds the broker's life marker gone), as is everything emitted after
    it — the ingest topic is there again with its partition count. (The broker acknowledged
    records for topics it no longer had, which no one could ever read; a client's metadata
    request made it create the ingest topic with 4 partitions of its own; and what it had
    acknowledged before the restart was gone with it.)"""
    broker = TansuBroker()
    broker.start()
    prefix = f"e{uuid.uuid4().hex[:8]}"
    url = f"{broker.url}?prefix={prefix}"
    try:
        async with Publisher.connect(url, delivery_timeout=120) as pub:
            before = await _begin(pub, f"{prefix}-a")
            await _emit_all(before)
            await pub.flush()
            broker.close()
            broker.start()  # empty: no topic, record or committed offset
            await until(lambda: _resent(pub), within=30)  # idle: found by the publisher's own check
            after = await _begin(pub, f"{prefix}-b")
            await _emit_all(after)
            await pub.flush()
        wanted = {(run.run_id, seq) for run in before + after for seq in range(1, DELTAS + 3)}
        found: set[tuple[str, int]] = set()
        async with open_bus(url) as bus:  # a group of its own: it reads each partition from 0
            consumer = bus.consumer("check", "c0")

            async def all_read() -> bool:
                deliveries = await consumer.fetch(4096, 200)
                for delivery in deliveries:
                    event = msgspec.json.decode(delivery.data)
                    found.add((event["run_id"], event["seq"]))
                if deliveries:
                    await consumer.ack(deliveries)
                return wanted <= found

            await until(all_read, within=60)
    finally:
        broker.close()


@pytest.mark.slow
async def test_what_no_worker_had_read_when_the_broker_restarted_empty_reaches_the_log(
    tmp_path: Path,
) -> None:
    """Runs emitted whole while no worker reads (acknowledged by the broker, read by none), then
    the broker SIGKILLed and started again empty, then a `runwire worker` (faust) started: each
    run reaches the replay log once, in order, seqs 1..n — the publisher sent again what the
    broker lost. Before, all of it was lost with the broker."""
    broker = TansuBroker()
    broker.start()
    prefix = f"u{uuid.uuid4().hex[:8]}"
    url = f"{broker.url}?prefix={prefix}&session_timeout_ms=2000"
    store_url = f"sqlite:///{tmp_path}/replay.db"
    workers: list[subprocess.Popen[bytes]] = []
    try:
        async with Publisher.connect(url, delivery_timeout=120) as pub, open_store(store_url) as store:
            runs = await _begin(pub, f"{prefix}-a")
            await _emit_all(runs)
            await pub.flush()
            broker.close()
            broker.start()  # empty
            await until(lambda: _resent(pub), within=30)
            workers.append(start_worker(url, store_url, "w0", tmp_path, f"{prefix}-g"))
            for run in runs:
                await until(lambda run=run: _ended(store, run.run_id), within=120)
                _check(await store.read(run.run_id, 0, None), run.run_id)
        assert workers[0].poll() is None, (tmp_path / "w0.log").read_text()[-3000:]
    finally:
        _stop(workers)
        broker.close()


async def _emit_all(runs: list[Any]) -> None:
    """``DELTAS`` deltas to each of ``runs`` (interleaved), then each run's end."""
    for k in range(DELTAS):
        for run in runs:
            await run.emit("text.delta", {"text": f"d{k} "})
    for run in runs:
        await run.finish()


async def _resent(pub: Publisher) -> bool:
    """Whether the publisher's bus sent again what the broker lost."""
    return bool(pub.bus.kept.resent)  # type: ignore[attr-defined]


@pytest.mark.slow
async def test_a_faust_worker_rides_out_a_broker_restarted_empty(tmp_path: Path) -> None:
    """SIGKILL a broker on memory storage under two `runwire worker`s (faust) that have written
    every run so far, start it again empty on its port: the workers stay up, and every event the
    publisher's `emit` returned after the restart reaches the replay log once, in order, each run
    going on from its checkpoint (seqs 1..n, no gap, none doubled) — runs begun before the restart
    and runs begun after it — and a client resuming each run from its start reads the same. (The workers kept their consumer positions and faust's read offsets
    from the broker's former life: the first records of each partition made again were dropped;
    and faust's table recovery, finding the changelog behind what it had read, crashed the app.)"""
    broker = TansuBroker()
    broker.start()
    prefix = f"w{uuid.uuid4().hex[:8]}"
    url = f"{broker.url}?prefix={prefix}&session_timeout_ms=2000"
    store_url = f"sqlite:///{tmp_path}/replay.db"
    workers = [start_worker(url, store_url, name, tmp_path, f"{prefix}-g") for name in ("w0", "w1")]
    try:
        await wait_sharing(tmp_path, ["w0", "w1"], 60, shards=16)
        async with Publisher.connect(url, delivery_timeout=120) as pub, open_store(store_url) as store:
            before = await _begin(pub, f"{prefix}-a")
            for k in range(100):
                for run in before:
                    await run.emit("text.delta", {"text": f"d{k} "})
            await pub.flush()
            for run in before:  # nothing acknowledged before the restart is left unread
                await until(lambda run=run: _count(store, run.run_id, 101), within=60)
            broker.close()
            broker.start()  # empty: no topic, record, committed offset or changelog
            after = await _begin(pub, f"{prefix}-b")
            for k in range(DELTAS):
                for run in after:
                    await run.emit("text.delta", {"text": f"d{k} "})
                if k >= 100:
                    for run in before:
                        await run.emit("text.delta", {"text": f"d{k} "})
            for run in before + after:
                await run.finish()
            await pub.flush()
            for run in before + after:
                await until(lambda run=run: _ended(store, run.run_id), within=120)
                _check(await store.read(run.run_id, 0, None), run.run_id)
            async with open_bus(url) as bus:  # a client resuming each run from its start, as an
                for run in before + after:  # edge reads it: what the hot tier lost, from the log
                    info = await store.run(run.run_id)
                    assert info is not None
                    events: list[Any] = []
                    async for _, chunk in history(bus, store, (run.run_id, "raw"), 0, info.last_seq):
                        events += chunk
                    _check(events, run.run_id)
        for name, worker in zip(("w0", "w1"), workers, strict=True):
            log = (tmp_path / f"{name}.log").read_text()
            assert worker.poll() is None, log[-3000:]
            assert "the broker lost its state; reading ingest partitions" in log, name
    finally:
        _stop(workers)
        broker.close()


async def _count(store: Any, run_id: str, count: int) -> bool:
    return len(await store.read(run_id, 0, None)) >= count


@pytest.mark.slow
async def test_a_faust_worker_stops_on_sigterm_while_the_broker_is_gone(tmp_path: Path) -> None:
    """A `runwire worker` (faust) whose broker is down pauses — one `paused: bus unavailable`
    line, `runwire_worker_paused{part="bus",reason="unavailable"}` 1 — and, SIGTERMed, stops and
    exits 0. (It said nothing of its own; and aiokafka's fetcher, closed during a fetch's retry
    backoff, raised a CancelledError out of the consumer thread's stop: the thread died without
    saying it had stopped and the worker waited for it for ever.)"""
    broker = TansuBroker()
    broker.start()
    prefix = f"t{uuid.uuid4().hex[:8]}"
    log = tmp_path / "w0.log"
    metrics = free_port()
    worker = start_worker(f"{broker.url}?prefix={prefix}&session_timeout_ms=2000",
                          f"sqlite:///{tmp_path}/replay.db", "w0", tmp_path, f"{prefix}-g",
                          "--metrics-addr", f"127.0.0.1:{metrics}")
    try:
        await until(lambda: "owns shards" in log.read_text(), within=60)
        broker.close()
        paused = 'runwire_worker_paused{part="bus",reason="unavailable"} 1.0'

        async def says_paused() -> bool:
            async with httpx.AsyncClient() as http:
                return paused in (await http.get(f"http://127.0.0.1:{metrics}/metrics")).text

        await until(says_paused, within=30)
        assert log.read_text().count("paused: bus unavailable") == 1
        worker.send_signal(signal.SIGTERM)
        await until(lambda: worker.poll() is not None, within=60)
        assert worker.returncode == 0, log.read_text()[-3000:]
    finally:
        kill_all([worker])
        broker.close()


def _stop(workers: list[subprocess.Popen[bytes]]) -> None:
    kill_all(workers)
    for worker in workers:
        try:
            worker.wait(5)
        except subprocess.TimeoutExpired:
            pass


async def _begin(pub: Publisher, prefix: str) -> list[Any]:
    """``RUNS`` runs ``<prefix>0``… begun (``running``)."""
    runs = [pub.run(f"{prefix}{i}") for i in range(RUNS)]
    for run in runs:
        await run.emit("run.lifecycle", {"state": "running"})
    return runs
