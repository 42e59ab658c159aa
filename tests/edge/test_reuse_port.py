"""Several ``runwire edge --reuse-port`` processes on one port (docs/edge.md § Performance,
"Several processes on one port"): the kernel spreads the connections among them, every client
gets its whole run whichever process it reached, and each process's own metrics are read at its
``--own-addr``."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from runwire.bus import open_bus
from tests.e2e_harness import bus_url as own_bus_url
from tests.e2e_harness import unique
from tests.edge.harness import append, run_events
from tests.services import free_port
from tests.waiting import until

pytestmark = pytest.mark.slow

RUNWIRE = [sys.executable, "-c", "from runwire.workers.cli import main; main()"]
EDGES = 2
CLIENTS = 40


def spawn_edge(bus: str, store: str, port: int, own: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("w") as out:  # (the child has its own copy of the descriptor)
        return subprocess.Popen([*RUNWIRE, "edge", "--bus", bus, "--store", store, "--port", str(port),
                                 "--reuse-port", "--own-addr", str(own)], stdout=subprocess.DEVNULL, stderr=out)


async def connections(http: httpx.AsyncClient, port: int) -> int:
    """Open stream connections the edge at its own ``port`` counts in its ``/metrics``."""
    text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    match = re.search(r"^runwire_edge_connections (\S+)$", text, re.M)
    assert match, "runwire_edge_connections in /metrics"
    return int(float(match.group(1)))


async def test_edges_sharing_a_port_each_take_connections_and_serve_every_client(
    redis_url: str, tmp_path: Path
) -> None:
    url = own_bus_url(redis_url, unique("reuse-port"))
    port = free_port()
    run = unique("run")
    logs = [tmp_path / f"edge{n}.log" for n in range(EDGES)]
    own = [free_port() for _ in logs]
    edges = [spawn_edge(url, f"sqlite:///{tmp_path / 'replay.db'}", port, mine, log)
             for mine, log in zip(own, logs, strict=True)]
    try:
        await until(lambda: all("shared with SO_REUSEPORT" in log.read_text() for log in logs), within=30,
                    what="every edge listening on the shared port")
        async with open_bus(url) as bus:
            await append(bus, run, run_events(run, 3, end=None))
            async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=CLIENTS + EDGES)) as http:
                async def client() -> list[int]:
                    async with http.stream("GET", f"http://127.0.0.1:{port}/v1/runs/{run}/stream?detail=full") as response:
                        body = b"".join([chunk async for chunk in response.aiter_bytes()])
                    return [int(line[4:]) for line in body.split(b"\n") if line.startswith(b"id: ")]

                readers = [asyncio.create_task(client()) for _ in range(CLIENTS)]
                async def held() -> list[int]:
                    return [await connections(http, mine) for mine in own]

                async def all_connected() -> bool:
                    return sum(await held()) == CLIENTS

                await until(all_connected, what="every client connected")
                gained = await held()
                await append(bus, run, run_events(run, 10, start=4))
                received = await asyncio.wait_for(asyncio.gather(*readers), 30)
        assert all(count > 0 for count in gained), f"connections per edge: {gained}"
        assert all(ids == list(range(1, 14)) for ids in received)
    finally:
        for edge in edges:
            edge.terminate()
        for edge in edges:
            try:
                edge.wait(20)
            except subprocess.TimeoutExpired:
                edge.kill()
                edge.wait()


def test_a_port_another_process_holds_without_reuse_port_is_one_clear_error(tmp_path: Path) -> None:
    """An edge asked to share a port a socket without ``SO_REUSEPORT`` holds exits with one line."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([*RUNWIRE, "edge", "--bus", "memory://", "--store", f"sqlite:///{tmp_path / 'r.db'}",
                               "--port", str(port), "--reuse-port"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert f"can't bind 127.0.0.1:{port} with SO_REUSEPORT" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_own_address_off_loopback_needs_a_secret_as_the_shared_one_does(tmp_path: Path) -> None:
    """Without ``RUNWIRE_SECRET`` the edge serves without auth, so ``--own-addr`` may not leave
    loopback either; a malformed address is named."""
    base = [*RUNWIRE, "edge", "--bus", "memory://", "--store", f"sqlite:///{tmp_path / 'r.db'}",
            "--port", str(free_port())]
    env = {k: v for k, v in os.environ.items() if k != "RUNWIRE_SECRET"}
    off = subprocess.run([*base, "--own-addr", f"0.0.0.0:{free_port()}"], capture_output=True, text=True,
                         timeout=60, env=env)
    assert off.returncode == 2 and "refusing to bind 0.0.0.0 without RUNWIRE_SECRET" in off.stderr
    bad = subprocess.run([*base, "--own-addr", "here"], capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 2 and "'here' is not [HOST:]PORT" in bad.stderr
