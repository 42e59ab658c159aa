"""Webhooks end to end, as an operator runs them: ``runwire worker`` and ``runwire edge`` processes
on Redis and the replay log (SQLite, PostgreSQL), a webhook added with ``runwire webhooks add``, a
receiver verifying with the ``standardwebhooks`` library that fails the first three attempts of
every delivery, and both processes restarted while the deliveries wait for their retries.

The receiver must end up with each run's ``run.finished`` — a root, its child and grandchild,
and another root — under one webhook-id each, accepted once, every attempt signed and verified.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runwire.sdk.publisher import Publisher
from tests.e2e_harness import bus_url as own_bus_url
from tests.e2e_harness import unique
from tests.services import free_port, wait_port
from tests.waiting import until

from .receiver import Receiver, serve_receiver

pytestmark = pytest.mark.slow

RUNWIRE = [sys.executable, "-c", "from runwire.workers.cli import main; main()"]


class Processes:
    """A ``runwire worker`` and a ``runwire edge`` (webhooks to loopback allowed), restartable."""

    def __init__(self, bus: str, store: str, work: Path) -> None:
        self.bus, self.store, self.work = bus, store, work
        self.port = free_port()
        self.edge_url = f"http://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.starts = 0

    def _spawn(self, *args: str, log: str) -> subprocess.Popen[bytes]:
        with (self.work / f"{log}-{self.starts}.log").open("w") as out:
            return subprocess.Popen([*RUNWIRE, *args, "--bus", self.bus, "--store", self.store,
                                     "--webhooks-allow-private"], stdout=subprocess.DEVNULL, stderr=out)

    async def start(self) -> None:
        self.starts += 1
        worker = self._spawn("worker", "--name", f"w{self.starts}", "--data-dir", str(self.work), log="worker")
        edge = self._spawn("edge", "--port", str(self.port), log="edge")
        self.procs = [worker, edge]
        await asyncio.to_thread(wait_port, self.port, 30.0, edge)

    async def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            await asyncio.to_thread(proc.wait, 30)
        # the worker exits 0, and so does the edge once it has shut down and closed the bus and log
        assert [proc.returncode for proc in self.procs] == [0, 0], self.logs()

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.work.glob("*.log")))

    async def cli(self, *args: str) -> str:
        done = await asyncio.to_thread(subprocess.run, [*RUNWIRE, "webhooks", "--url", self.edge_url, *args],
                                       capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/replay.db"
    else:
        yield request.getfixturevalue("postgres_schema_url")


async def publish_tree(bus: str, tag: str) -> dict[str, str]:
    """A root with a child and a grandchild, and a second root; each ends. Run id → its end."""
    ends = {f"{tag}-root": "done", f"{tag}-child": "error", f"{tag}-grandchild": "done", f"{tag}-other": "aborted"}
    async with Publisher.connect(bus) as publisher:
        root = publisher.run(f"{tag}-root")
        child = publisher.run(f"{tag}-child", parent=root)
        grandchild = publisher.run(f"{tag}-grandchild", parent=child)
        other = publisher.run(f"{tag}-other")
        for run in (root, child, grandchild, other):
            await run.emit("run.lifecycle", {"state": "running"})
            await run.emit("text.delta", {"text": f"hello from {run.run_id}"})
        for run in (grandchild, child, root, other):
            await run.finish(ends[run.run_id])
        await publisher.flush()
    return ends


@pytest.mark.timeout(300)
async def test_each_run_finished_reaches_a_verifying_receiver_once_across_failures_and_restarts(
    redis_url: str, store_url: str, tmp_path: Path,
) -> None:
    bus = own_bus_url(redis_url, unique("wh"))
    processes = Processes(bus, store_url, tmp_path)
    async with serve_receiver(Receiver(fail_first=3)) as receiver:
        await processes.start()
        try:
            hook = json.loads(await processes.cli("add", receiver.url + "/hook", "--event", "run.finished"))
            assert hook["secret"].startswith("whsec_") and hook["status"] == "active"
            receiver.secret = hook["secret"]
            ends = await publish_tree(bus, unique("run"))
            await until(lambda: len(receiver.attempts) == len(ends), within=60,
                        what="a first (refused) attempt of every run's delivery")
            first_attempts = time.monotonic()
            await processes.stop()  # every process, while every delivery waits for its retries
            await processes.start()
            await until(lambda: len(receiver.accepted) == len(ends), within=150,
                        what=f"every run.finished accepted; attempts {dict(receiver.attempts)}")
            took = time.monotonic() - first_attempts

            assert receiver.refused == [], "every attempt verifies with the library"
            assert receiver.run_ids() == sorted(ends), "each run's run.finished, root or child, once"
            for msg_id, bodies in receiver.accepted.items():
                body = bodies[0]
                assert len(bodies) == 1 and receiver.attempts[msg_id] == 4, (msg_id, receiver.attempts)
                assert set(body) == {"type", "timestamp", "data"} and body["type"] == "run.finished"
                assert body["data"]["state"] == ends[body["data"]["run_id"]]
                assert set(body["data"]) == {"run_id", "root_id", "tenant", "state", "last_seq"}
            roots = {b[0]["data"]["run_id"]: b[0]["data"]["root_id"] for b in receiver.accepted.values()}
            assert len(set(roots.values())) == 2, roots  # the tree's three runs share their root
            assert took < 90, f"three retries within a minute (+ a restart): {took:.0f} s"

            listed = await processes.cli("list")
            assert hook["id"] in listed and "active" in listed
            receiver.fail_first = 0
            test = json.loads(await processes.cli("test", hook["id"]))
            await until(lambda: test["delivery_id"] in receiver.accepted, within=30, what="the test delivery")
            assert receiver.accepted[test["delivery_id"]][0]["type"] == "webhook.test"
            await processes.cli("remove", hook["id"])
            assert hook["id"] not in await processes.cli("list")
            await processes.stop()
        except BaseException:
            print(processes.logs())
            raise
        finally:
            processes.kill()
