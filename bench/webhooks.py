"""Webhook deliveries per minute from one process to a local receiver, and their CPU per delivery.

A receiver process (uvicorn + httptools, answering 204 to every POST, as a
receiver that verifies and queues would before its own work) listens on
loopback; this process then delivers ``--deliveries`` bodies to it, three ways
per round, each beside the others in the same run:

* ``baseline`` — the bodies POSTed straight from memory through the same
  connection pool (httpcore, ``--concurrency`` at once), signed, with no
  outbox: what sending alone costs;
* ``outbox`` — the same deliveries queued in the replay log's outbox
  (SQLite file, or ``--store``) and delivered by a ``Deliverer``: claims,
  leases and settles included (the queueing is timed apart, ``enqueue``);
* ``runs`` — the whole path: ``--deliveries`` runs' terminal ``run.lifecycle``
  events appended to the log (the notices are written with them), fanned
  out to one webhook and delivered (the append is timed apart, ``append``).

Each prints deliveries per minute (wall clock, first claim to last settle)
and CPU µs per delivery per part of this process (``loop``: the event loop,
``log``: the SQLite thread, ``other``: the PostgreSQL outbox's thread and the
rest) and of the receiver; the summary is the median of ``--rounds``.

    .venv/bin/python bench/webhooks.py --deliveries 5000 --rounds 3

Not a test: it reports figures (docs/benchmarks.md § Webhook deliveries).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cputime import CpuMeter, import_code, per_event_us

import_code()

from runwire.core.envelope import make  # noqa: E402
from runwire.store import open_store  # noqa: E402
from runwire.store.base import ReplayLog  # noqa: E402
from runwire.store.outbox import Delivery, Subscription  # noqa: E402
from runwire.webhooks.deliverer import Deliverer  # noqa: E402
from runwire.webhooks.notify import build  # noqa: E402
from runwire.webhooks.sender import Sender  # noqa: E402
from runwire.webhooks.signing import new_secret, signed_headers  # noqa: E402

RECEIVER = """
import sys, uvicorn
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", http="httptools",
            lifespan="off", backlog=4096)
"""
BODY = json.dumps({"type": "run.finished", "timestamp": "2026-11-27T09:00:00.000Z", "data": {
    "run_id": "run-0123456789abcdef", "root_id": "run-0123456789abcdef", "tenant": "acme", "state": "done",
    "last_seq": 1234}}).encode()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError("the receiver did not start")


def figures(name: str, count: int, wall_s: float, cpu: dict[str, float]) -> dict[str, float]:
    return {f"{name}_per_min": round(count / wall_s * 60), **{
        key: round(value, 1) for key, value in per_event_us(cpu, count, name).items()}}


async def baseline(url: str, count: int, concurrency: int, receiver_pid: int) -> dict[str, float]:
    sender = Sender(allow_private=True, max_connections=concurrency)
    secret = new_secret()
    pending = [Delivery(id=f"msg_b{n}", channel="bench", url=url, body=BODY, secrets=secret) for n in range(count)]
    meter = CpuMeter(pids={"receiver": receiver_pid})

    async def lane() -> None:
        while pending:
            error, _ = await sender.send(pending.pop())
            assert error is None, error

    meter.start()
    started = time.monotonic()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    wall = time.monotonic() - started
    cpu = meter.stop()
    await sender.aclose()
    signed_headers(secret, "msg", 0, BODY)  # (what the sender does per attempt, named for the reader)
    return figures("baseline", count, wall, cpu)


async def drain(log: ReplayLog, url: str, count: int, concurrency: int, receiver_pid: int, name: str,
                fan_out: bool) -> dict[str, float]:
    """Deliver until ``count`` deliveries went out (the outbox is empty)."""
    outbox = log.outbox()
    sender = Sender(allow_private=True, max_connections=concurrency)
    deliverer = Deliverer(outbox, sender, build=build if fan_out else None, concurrency=concurrency, poll_s=0.01)
    meter = CpuMeter(pids={"receiver": receiver_pid})
    stop = asyncio.Event()
    meter.start()
    started = time.monotonic()
    task = asyncio.create_task(deliverer.run(stop))
    while deliverer.stats.delivered < count:
        await asyncio.sleep(0.01)
        if task.done():
            task.result()
    wall = time.monotonic() - started
    cpu = meter.stop()
    stop.set()
    await task
    await sender.aclose()
    assert deliverer.stats.retried == 0 and deliverer.stats.exhausted == 0
    return figures(name, count, wall, cpu)


async def one_round(store_url: str, url: str, count: int, concurrency: int, receiver_pid: int) -> dict[str, float]:
    tag = uuid.uuid4().hex[:8]  # rounds may share one database
    out = await baseline(url, count, concurrency, receiver_pid)
    async with open_store(store_url) as log:
        outbox = log.outbox()
        secret = new_secret()
        started = time.monotonic()
        for first in range(0, count, 500):
            await outbox.enqueue([Delivery(id=f"msg_{tag}{n}", channel="bench", url=url, body=BODY, secrets=secret)
                                  for n in range(first, min(count, first + 500))])
        out["enqueue_us_per_delivery"] = round((time.monotonic() - started) * 1e6 / count, 1)
        out |= await drain(log, url, count, concurrency, receiver_pid, "outbox", fan_out=False)

        await outbox.add_webhook(Subscription(id=f"bench-{tag}", tenant=tag, url=url, events=["run.finished"],
                                              secret=secret, created_at=time.time()))
        started = time.monotonic()
        for first in range(0, count, 500):
            await log.append([make("run.lifecycle", {"state": "done"}, id=f"evt_{n}", ts="2026-11-27T09:00:00Z",
                                   run_id=f"run-{tag}-{n}", seq=1, tenant=tag)
                              for n in range(first, min(count, first + 500))])
        out["append_us_per_run"] = round((time.monotonic() - started) * 1e6 / count, 1)
        out |= await drain(log, url, count, concurrency, receiver_pid, "runs", fan_out=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--store", default=None, help="replay log URL (default: a fresh SQLite file per round)")
    args = parser.parse_args()
    port = free_port()
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER, str(port)])
    rounds: list[dict[str, float]] = []
    try:
        wait_port(port)
        with tempfile.TemporaryDirectory() as work:
            for n in range(args.rounds):
                store = args.store or f"sqlite:///{work}/replay-{n}.db"
                figures_ = asyncio.run(one_round(store, f"http://127.0.0.1:{port}/hook", args.deliveries,
                                                 args.concurrency, receiver.pid))
                rounds.append(figures_)
                print(json.dumps({"round": n + 1, **figures_}), flush=True)
    finally:
        receiver.terminate()
        receiver.wait()
    summary: dict[str, Any] = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    print(json.dumps({"median": summary, "deliveries": args.deliveries, "concurrency": args.concurrency,
                      "store": "postgresql" if args.store else "sqlite"}, indent=1))


if __name__ == "__main__":
    main()
