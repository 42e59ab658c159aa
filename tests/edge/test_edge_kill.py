"""An edge SIGKILLed under live clients: each client resumes on a second edge, exactly.

Real processes: Redis, one ``runwire worker`` (SQLite replay log), two ``runwire edge``s, an SDK
publisher, and 200 streaming clients (``tests/edge/resuming_clients.py``: EventSource with
``Last-Event-ID``, Durable Streams ``live=sse`` with its offset, the AI SDK UI-message stream) on
edge A. Edge A is SIGKILLed mid-run; every client moves to edge B with its cursor and must end up
with every event of its run once, in order, as the replay log has them.
``bench/faults.py --only edge-kill`` is the same with 2,000 clients, measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from runwire.core.envelope import Event, TextDelta
from runwire.sdk.publisher import Publisher
from runwire.store import open_store
from tests.e2e_harness import bus_url as own_bus_url
from tests.e2e_harness import unique, wait_for_terminal
from tests.edge.resuming_clients import KINDS, ResumingClient, check, crowd
from tests.services import free_port, wait_port
from tests.waiting import until

pytestmark = pytest.mark.slow

RUNWIRE = [sys.executable, "-c", "from runwire.workers.cli import main; main()"]
RUNS = 10
CLIENTS = 200


def spawn(*args: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("w") as out:  # (the child has its own copy of the descriptor)
        return subprocess.Popen([*RUNWIRE, *args], stdout=subprocess.DEVNULL, stderr=out)


@contextlib.asynccontextmanager
async def processes(url: str, store_url: str, ports: list[int], work: Path) -> AsyncIterator[
        tuple[subprocess.Popen[bytes], list[subprocess.Popen[bytes]]]]:
    """A ``runwire worker`` and an edge on each of ``ports``, listening; all stopped on exit."""
    worker = spawn("worker", "--bus", url, "--store", store_url, "--name", "w1", "--data-dir", str(work),
                   log=work / "worker.log")
    edges = [spawn("edge", "--bus", url, "--store", store_url, "--port", str(port), log=work / f"edge{n}.log")
             for n, port in enumerate(ports)]
    try:
        for port, edge in zip(ports, edges, strict=True):
            await asyncio.to_thread(wait_port, port, 30.0, edge)
        yield worker, edges
    finally:
        for proc in [*edges, worker]:
            if proc.poll() is None:
                proc.terminate()
        for proc in [*edges, worker]:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def assert_exact(client: ResumingClient, events: list[Event]) -> None:
    """The client got every event of its run once, in order, as the replay log has them."""
    assert client.edge == 1 and client.errors == [], (client.kind, client.edge, client.errors)
    assert check(client.record(), [e.seq for e in events]) == {
        "missing": 0, "repeated": 0, "out_of_order": 0, "unexpected": 0}, client.kind
    if client.kind == "aisdk":
        text = "".join(e.payload.text for e in events if isinstance(e, TextDelta))
        assert "".join(client.texts) == text, "the AI SDK stream's text"


async def waiting(condition: Callable[[], Awaitable[bool]], clients: list[ResumingClient], what: str) -> None:
    """``until(condition)``, failing with the state of the clients it waited for."""
    try:
        await until(condition, within=90, what=what)
    except AssertionError:
        stuck = [(c.kind, c.edge, c.connects, len(c.seqs), c.cursor, c.errors[-2:]) for c in clients
                 if not (c.resumed_ts if "edge B" in what else c.seqs)]
        raise AssertionError(f"{len(stuck)} clients not {what}, e.g. {stuck[:5]}") from None


async def test_every_client_resumes_exactly_on_a_second_edge_after_the_first_is_sigkilled(
    redis_url: str, tmp_path: Path
) -> None:
    url = own_bus_url(redis_url, unique("edge-kill"))
    store_url = f"sqlite:///{tmp_path / 'replay.db'}"
    ports = [free_port(), free_port()]
    runs = [unique(f"edge-kill-{n}") for n in range(RUNS)]
    clients = crowd(runs, CLIENTS, list(KINDS), ports)
    gate = asyncio.Semaphore(50)
    for client in clients:
        client.gate = gate
    tasks: list[asyncio.Task[None]] = []
    async with processes(url, store_url, ports, tmp_path) as (worker, edges):
        try:
            async with Publisher.connect(url, linger_ms=1.0) as publisher:
                handles = [publisher.run(run_id) for run_id in runs]
                for handle in handles:
                    await handle.emit("run.lifecycle", {"state": "running"})
                tasks = [asyncio.create_task(client.run()) for client in clients]
                sent = 0

                def publishing_until(holds: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
                    """A condition that publishes one delta to every run each time it is checked."""
                    async def condition() -> bool:
                        nonlocal sent
                        for handle in handles:
                            await handle.emit("text.delta", {"text": f"d{sent} "})
                        sent += 1
                        return holds()
                    return condition

                await waiting(publishing_until(lambda: all(c.seqs for c in clients)), clients, "receiving on edge A")
                edges[0].kill()
                edges[0].wait()
                await waiting(publishing_until(lambda: all(c.resumed_ts for c in clients)), clients,
                              "with their next event from edge B")
                for handle in handles:
                    await handle.finish()
            async with open_store(store_url) as store:
                for run_id in runs:
                    await wait_for_terminal(store, run_id)
                logged = {run_id: await store.read(run_id, 0, None) for run_id in runs}
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        assert all(len(events) == sent + 2 for events in logged.values())
        for client in clients:
            assert_exact(client, logged[client.run_id])
        assert edges[1].poll() is None and worker.poll() is None, "edge B and the worker still up"
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"http://127.0.0.1:{ports[1]}/healthz")).status_code == 200


def test_a_client_record_is_checked_against_the_replay_log() -> None:
    """The check counts what it should: a gap, a repeat and a step back."""
    client = ResumingClient("r", "sse", [1])
    client.seqs = [1, 2, 2, 5, 4]
    assert check(client.record(), [1, 2, 3, 4, 5]) == {
        "missing": 1, "repeated": 1, "out_of_order": 2, "unexpected": 0}
