"""A network between a worker and Redis that a test (or ``bench/faults.py``) can break.

* :class:`NetNs` — a network namespace joined to the host by a veth pair: a process started
  with :meth:`NetNs.command` reaches the host (where ``redis-server`` listens on
  :attr:`NetNs.host_ip`) only through it. :meth:`NetNs.cut` takes the namespace's end down
  (nothing passes either way: a partition; established TCP connections stay open and
  retransmit) and :meth:`NetNs.heal` brings it back. Needs root (``ip netns add``).
* :class:`DelayProxy` — a TCP proxy (its own thread and event loop) that holds every chunk
  ``delay_s`` in each direction, in order, and, with ``stall_p``, holds a chunk that much longer
  again (``stall_s``): what a lost segment costs the application on a TCP stream (its
  retransmission). It stands in for ``tc netem``, which this machine's kernel does not have
  (no ``sch_netem``, no tc classifiers or actions): no packet is really lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import subprocess
import threading
import time

HINT = ("a network namespace needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN): run the tests as root, "
        "as .ci/run does")


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()} ({HINT})")


class NetNs:
    """See the module docstring. Use as a context manager: it is removed on exit, also after
    a failure."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 10000}{random.randrange(100):02d}"
        self.name = f"rwnet{tag}"
        self.host_if = f"rwh{tag}"
        self.ns_if = f"rwn{tag}"
        net = random.randrange(1, 250)
        sub = random.randrange(0, 64) * 4
        self.host_ip = f"10.{net}.{sub // 256 + 200}.{sub % 256 + 1}"
        self.ns_ip = f"10.{net}.{sub // 256 + 200}.{sub % 256 + 2}"

    def __enter__(self) -> NetNs:
        _ip("netns", "add", self.name)
        try:
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            _ip("link", "set", self.ns_if, "netns", self.name)
            _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            for args in (("addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if),
                         ("link", "set", self.ns_if, "up"), ("link", "set", "lo", "up")):
                _ip("netns", "exec", self.name, "ip", *args)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]

    def cut(self) -> None:
        """Nothing passes between the namespace and the host until :meth:`heal`."""
        _ip("netns", "exec", self.name, "ip", "link", "set", self.ns_if, "down")

    def heal(self) -> None:
        _ip("netns", "exec", self.name, "ip", "link", "set", self.ns_if, "up")

    def close(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)


class DelayProxy:
    """See the module docstring. ``address`` is where to connect instead of ``target``."""

    def __init__(self, target_port: int, *, delay_s: float, stall_p: float = 0.0,
                 stall_s: float = 0.2, seed: int = 1) -> None:
        self.target_port = target_port
        self.delay_s = delay_s
        self.stall_p = stall_p
        self.stall_s = stall_s
        self.rng = random.Random(seed)
        self.chunks = 0
        self.stalls = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._writers: list[asyncio.StreamWriter] = []

    def __enter__(self) -> DelayProxy:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the delay proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()
        # Every task finished and every socket closed here, in this loop: left for the garbage
        # collector, they warn (unclosed transport, a pending task destroyed) inside whichever
        # test happens to run then.
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        for writer in self._writers:
            writer.transport.abort()
        self._loop.run_until_complete(server.wait_closed())
        self._loop.run_until_complete(asyncio.sleep(0))
        self._loop.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers.append(up_writer)
        with contextlib.suppress(asyncio.CancelledError):  # at shutdown: ends as any connection
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer),
                                 return_exceptions=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Chunks from ``reader`` to ``writer``, each due ``delay_s`` after it arrived (a
        stalled one later, and everything behind it with it: a stream keeps its order)."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
            writer.close()

        sender = asyncio.ensure_future(send())
        last_due = 0.0
        try:
            while data := await reader.read(65536):
                self.chunks += 1
                due = time.monotonic() + self.delay_s
                if self.stall_p and self.rng.random() < self.stall_p:
                    self.stalls += 1
                    due += self.stall_s
                last_due = max(last_due, due)
                queue.put_nowait((last_due, data))
        except OSError:
            pass
        finally:
            queue.put_nowait((0.0, b""))
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await sender
