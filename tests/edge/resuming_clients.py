"""Streaming clients that follow a run on one edge and resume on another when it dies.

Each :class:`ResumingClient` reads one run over raw asyncio sockets (HTTP/1.1, chunked bodies
decoded here, no client library in the way) and behaves as the real client of its protocol does:

* ``sse`` — a browser ``EventSource`` on ``/v1/runs/{run}/stream?detail=full``: keeps the last
  ``id:`` it saw and sends it as ``Last-Event-ID`` on every reconnect, waiting the stream's
  ``retry:`` first; a ``204`` ends it.
* ``aisdk`` — the same with ``format=ai-sdk`` (the AI SDK UI-message stream; ids on the last frame
  of each event, id-only frames for events the format renders as nothing).
* ``ds`` — a Durable Streams reader (``/v1/ds/runs/{run}?live=sse``): a batch counts once its
  ``control`` event (and so its ``streamNextOffset``) has arrived, that offset is what it resumes
  from; ``streamClosed`` ends it.

A client starts on ``ports[0]``; when a connection there breaks or is refused it moves to the next
port (a load balancer routing around a dead instance) and resumes with its cursor. It records every
delivery seq it was handed, in order, and when it first got an event after moving
(``failover_ts``, ``resumed_ts``: wall clock, for comparing with the time of a kill).

``python -m tests.edge.resuming_clients`` runs a crowd of them in a process of its own
(``bench/faults.py`` ``edge-kill``): it answers ``report`` on stdin with counts and ``dump PATH``
by writing every client's record to ``PATH`` as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

KINDS = ("sse", "ds", "aisdk")


class StreamBroken(Exception):
    """The connection ended before the response did (a killed edge, a reset)."""


class NotYet(Exception):
    """The run has no stream yet: ask again a little later."""


class Body:
    """A chunked HTTP body decoded as it arrives: ``feed`` raw bytes, get body bytes back."""

    def __init__(self) -> None:
        self.raw = b""
        self.ended = False

    def feed(self, data: bytes) -> bytes:
        self.raw += data
        out = []
        while not self.ended:
            line_end = self.raw.find(b"\r\n")
            if line_end < 0:
                break
            size = int(self.raw[:line_end].split(b";")[0], 16)
            if size == 0:
                self.ended = True
                break
            if len(self.raw) < line_end + 2 + size + 2:
                break
            out.append(self.raw[line_end + 2:line_end + 2 + size])
            self.raw = self.raw[line_end + 2 + size + 2:]
        return b"".join(out)


class ResumingClient:
    """One client of one run (see the module docstring)."""

    def __init__(self, run_id: str, kind: str, ports: list[int], host: str = "127.0.0.1") -> None:
        assert kind in KINDS
        self.run_id = run_id
        self.kind = kind
        self.ports = ports
        self.host = host
        self.edge = 0
        """Index in ``ports`` of the edge this client talks to."""
        self.cursor = "0" if kind != "ds" else "-1"
        self.seqs: list[int] = []
        self.texts: list[str] = []
        """AI SDK ``text-delta`` chunks' text (the format's own content)."""
        self.done = False
        self.connects = 0
        self.retry_s = 0.0
        self.failover_ts: float | None = None
        self.resumed_ts: float | None = None
        self.errors: list[str] = []
        self._pending: list[int] = []
        self._line_carry = b""
        self._fields: dict[str, str] = {}
        self.gate: asyncio.Semaphore | None = None
        """Held while the first connection opens (a crowd opening thousands at once overflows an
        edge's accept backlog)."""

    def path(self) -> str:
        if self.kind == "ds":
            return f"/v1/ds/runs/{self.run_id}?offset={self.cursor}&live=sse&detail=full"
        fmt = "&format=ai-sdk" if self.kind == "aisdk" else ""
        return f"/v1/runs/{self.run_id}/stream?detail=full{fmt}"

    def request(self) -> bytes:
        head = f"GET {self.path()} HTTP/1.1\r\nHost: {self.host}\r\nAccept: text/event-stream\r\n"
        if self.kind != "ds" and self.cursor != "0":
            head += f"Last-Event-ID: {self.cursor}\r\n"
        return (head + "\r\n").encode()

    async def run(self) -> None:
        """Follow the run to its end, across edges."""
        while not self.done:
            try:
                await self._once()
            except NotYet:
                await asyncio.sleep(1.0)
                continue
            except (OSError, StreamBroken, asyncio.IncompleteReadError) as exc:
                if self.edge + 1 < len(self.ports):
                    self.edge += 1
                    self.failover_ts = time.time()
                elif isinstance(exc, StreamBroken):
                    self.errors.append(f"broken on the last edge: {exc}")
                    await asyncio.sleep(0.5)  # (an EventSource keeps trying; so does this)
                else:
                    self.errors.append(repr(exc))
                    await asyncio.sleep(0.5)
            if not self.done and self.retry_s:
                await asyncio.sleep(self.retry_s)

    async def _once(self) -> None:
        gate = self.gate if self.gate is not None and not self.connects else contextlib.nullcontext()
        async with gate:
            reader, writer = await asyncio.open_connection(self.host, self.ports[self.edge])
        self.connects += 1
        try:
            writer.write(self.request())
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            if status == 204:
                self.done = True
                return
            if status == 404 and self.kind == "ds" and not self.seqs:
                raise NotYet  # (the Durable Streams endpoint has no stream before the run's first event)
            if status != 200:
                with contextlib.suppress(TimeoutError, OSError):
                    head += await asyncio.wait_for(reader.read(1000), 1.0)
                self.errors.append(f"status {status}: {head.decode(errors='replace')}")
                self.done = True  # (a refused resume is not retried: it is counted as missing events)
                return
            body = Body()
            self._line_carry = b""
            self._fields = {}
            self._pending = []
            while not body.ended:
                data = await reader.read(65536)
                if not data:
                    raise StreamBroken("the connection closed mid-response")
                self._frames(body.feed(data))
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    def _frames(self, data: bytes) -> None:
        data = self._line_carry + data
        lines = data.split(b"\n")
        self._line_carry = lines.pop()
        for raw in lines:
            line = raw.decode().rstrip("\r")
            if line == "":
                if self._fields:
                    self._dispatch(self._fields)
                self._fields = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(":")
                self._fields[name] = value[1:] if value.startswith(" ") else value

    def _got(self, seq: int) -> None:
        self.seqs.append(seq)
        if self.failover_ts is not None and self.resumed_ts is None:
            self.resumed_ts = time.time()

    def _dispatch(self, fields: dict[str, str]) -> None:
        if "retry" in fields:
            self.retry_s = int(fields["retry"]) / 1000
        data = fields.get("data")
        if self.kind == "ds":
            if fields.get("event") == "data" and data is not None:
                self._pending += [int(item["seq"]) for item in json.loads(data)]
            elif fields.get("event") == "control" and data is not None:
                control = json.loads(data)
                for seq in self._pending:
                    self._got(seq)
                self._pending = []
                self.cursor = control["streamNextOffset"]
                if control.get("streamClosed"):
                    self.done = True
            return
        if self.kind == "sse" and data is not None:
            event = json.loads(data)
            if event.get("type") == "error":
                self.errors.append(data)
        if self.kind == "aisdk" and data is not None and data != "[DONE]":
            chunk = json.loads(data)
            if chunk.get("type") == "text-delta":
                self.texts.append(chunk["delta"])
            elif chunk.get("type") == "error":
                self.errors.append(data)
        if "id" in fields and fields["id"]:
            self.cursor = fields["id"]
            self._got(int(fields["id"]))

    def record(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "kind": self.kind, "seqs": self.seqs, "texts": self.texts,
                "done": self.done, "connects": self.connects, "edge": self.edge,
                "failover_ts": self.failover_ts, "resumed_ts": self.resumed_ts, "errors": self.errors}


def crowd(runs: list[str], count: int, kinds: list[str], ports: list[int], first: int = 0) -> list[ResumingClient]:
    """``count`` clients spread round-robin over ``runs``, their kinds in turn."""
    return [ResumingClient(runs[(first + i) % len(runs)], kinds[(first + i) % len(kinds)], ports)
            for i in range(count)]


def check(client: dict[str, Any], expected: list[int]) -> dict[str, int]:
    """A client's record against the run's seqs in the replay log: events missing, repeated, out of order."""
    seqs: list[int] = client["seqs"]
    return {"missing": len(set(expected) - set(seqs)), "repeated": len(seqs) - len(set(seqs)),
            "out_of_order": sum(1 for a, b in zip(seqs, seqs[1:], strict=False) if b <= a),
            "unexpected": len(set(seqs) - set(expected))}


async def _main(args: argparse.Namespace) -> None:
    ports = [int(p) for p in args.ports.split(",")]
    runs = [f"{args.prefix}{i}" for i in range(args.runs)]
    clients = crowd(runs, args.clients, args.kinds.split(","), ports, args.first)
    gate = asyncio.Semaphore(100)
    for client in clients:
        client.gate = gate
    tasks = [asyncio.create_task(c.run()) for c in clients]
    loop = asyncio.get_running_loop()
    while True:
        line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
        if not line or line == "quit":
            break
        if line.startswith("dump "):
            records = json.dumps([c.record() for c in clients])
            await asyncio.to_thread(Path(line.split(" ", 1)[1]).write_text, records)
            print(json.dumps({"dumped": len(clients)}), flush=True)
            continue
        print(json.dumps({
            "clients": len(clients), "connected": sum(c.connects > 0 for c in clients),
            "receiving": sum(bool(c.seqs) for c in clients), "done": sum(c.done for c in clients),
            "failed_over": sum(c.failover_ts is not None for c in clients),
            "resumed": sum(c.resumed_ts is not None for c in clients),
        }), flush=True)
    for task in tasks:
        task.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description="resuming streaming clients (tests/edge/resuming_clients.py)")
    parser.add_argument("--ports", required=True, help="edge ports, in failover order: A,B")
    parser.add_argument("--prefix", default="fault-")
    parser.add_argument("--runs", type=int, required=True)
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--first", type=int, default=0, help="index of the first client (spreads runs and kinds)")
    parser.add_argument("--kinds", default=",".join(KINDS))
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.run(_main(args))
    except ImportError:
        asyncio.run(_main(args))


if __name__ == "__main__":
    main()
