"""Koder agent stream §4 R4 backpressure: bounded client queues, drop order, dropped_count, BUF-0001 for a client that stalls."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import httpx
import pytest

from runwire.bus.base import Bus
from runwire.edge import EdgeSettings
from runwire.edge.fanout.clients import ClientQueue
from runwire.edge.fanout.frames import DROP_REASONING, DROP_TEXT, NEVER_DROP, Frame
from runwire.store.base import ReplayLog
from tests.events import event
from tests.waiting import until

from .harness import append, decoded, read_sse, serve_edge

BIG = "x" * 8_000


def frame(seq: int, rank: int, size: int = 100) -> Frame:
    kind = {DROP_REASONING: "reasoning.delta", DROP_TEXT: "text.delta"}.get(rank, "tool.start")
    return Frame([b"y" * size], seq=seq, rank=rank, event_type=kind)


def test_r4_drop_order_reasoning_first_then_text_never_control() -> None:
    """R4: when the queue is full, drop reasoning.delta first, then text.delta, never tool/step/lifecycle."""
    queue = ClientQueue(max_frames=4, max_bytes=1 << 20)
    for seq, rank in enumerate([DROP_TEXT, DROP_REASONING, DROP_TEXT, DROP_REASONING], start=1):
        assert queue.put(frame(seq, rank))
    assert queue.put(frame(5, NEVER_DROP))  # evicts the oldest reasoning delta (seq 2)
    assert [f.seq for f in queue.take()] == [1, 3, 4, 5]
    for seq, rank in enumerate([DROP_TEXT, DROP_TEXT, DROP_REASONING, NEVER_DROP], start=6):
        queue.put(frame(seq, rank))
    assert queue.put(frame(10, DROP_TEXT))  # evicts reasoning (8) before any text
    assert not queue.put(frame(11, DROP_REASONING))  # an incoming reasoning delta is dropped itself
    assert queue.put(frame(12, NEVER_DROP))  # no reasoning left: the oldest text delta (6) goes
    assert [f.seq for f in queue.take()] == [7, 9, 10, 12]
    assert queue.dropped == 4
    assert queue.dropped_by_type == {"reasoning.delta": 3, "text.delta": 1}
    assert not queue.overflowed


def test_a_queue_full_of_control_events_overflows_instead_of_dropping_one() -> None:
    """R4 never drops tool/step/lifecycle: a client that can't take them is cut off (BUF-0001)."""
    queue = ClientQueue(max_frames=100, max_bytes=1000)
    gone: list[bool] = []
    queue.on_overflow = lambda: gone.append(True)
    assert queue.put(frame(1, NEVER_DROP, size=500))
    assert queue.put(frame(2, DROP_TEXT, size=300))
    assert queue.put(frame(3, NEVER_DROP, size=400))  # evicts the text delta
    assert not queue.put(frame(4, NEVER_DROP, size=400))
    assert queue.overflowed and gone == [True]
    assert queue.dropped == 1


async def _stalled_sse(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, _, rest = url.removeprefix("http://").partition("/")
    hostname, _, port = host.partition(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a client that reads nothing stalls fast
    sock.connect((hostname, int(port)))
    sock.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=sock, limit=16_384)
    writer.write(f"GET /{rest} HTTP/1.1\r\nHost: {host}\r\nAccept: text/event-stream\r\n\r\n".encode())
    await writer.drain()
    return reader, writer


def _sse_bodies(raw: bytes) -> list[dict[str, Any]]:
    _, _, body = raw.partition(b"\r\n\r\n")
    out: list[dict[str, Any]] = []
    for line in body.split(b"\n"):
        start = line.find(b"data: ")
        if start >= 0:
            out.append(json.loads(line[start + 6 :]))
    return out


@pytest.mark.slow
async def test_a_slow_client_gets_every_control_event_and_its_dropped_count(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """R4: a client that stops reading loses deltas (reasoning first), never tool/lifecycle events;
    the terminal run.lifecycle it receives carries its dropped_count; other clients lose nothing."""
    settings = EdgeSettings(client_queue_events=64, client_queue_bytes=1 << 20)
    await append(memory_bus, run_id, [event(run_id, 1, "run.lifecycle", {"state": "running"})])
    async with serve_edge(memory_bus, store, settings) as edge, httpx.AsyncClient(timeout=30) as http:
        url = f"{edge.url}/v1/runs/{run_id}/stream?detail=full"
        reader, writer = await _stalled_sse(url)
        async with http.stream("GET", url) as healthy:
            healthy_reader = asyncio.create_task(read_sse(healthy))
            await until(lambda: edge.live_clients(run_id) == 2, what="both clients attached")
            seq = 2
            for index in range(900):
                kind = ("reasoning.delta", "text.delta", "text.delta")[index % 3]
                batch = [event(run_id, seq, kind, {"text": BIG})]
                if index % 50 == 0:
                    batch.append(event(run_id, seq + 1, "tool.start", {"call_id": f"c{seq}", "tool": "t"}))
                await append(memory_bus, run_id, batch)
                seq += len(batch)
                await asyncio.sleep(0.001)  # the agent is another process in real life: pace it
            await append(memory_bus, run_id, [event(run_id, seq, "run.lifecycle", {"state": "done"})])
            healthy_events, _ = await asyncio.wait_for(healthy_reader, 30)
        raw = await asyncio.wait_for(reader.read(-1), 30)
        writer.close()
    last = seq
    healthy_body = decoded(healthy_events)
    assert [e["seq"] for e in healthy_body] == list(range(1, last + 1))
    assert "dropped_count" not in healthy_body[-1]["payload"]
    slow = _sse_bodies(raw)
    slow_seqs = {e["seq"] for e in slow}
    missing = [e for e in healthy_body if e["seq"] not in slow_seqs]
    kinds = {e["type"] for e in missing}
    assert missing, "the stalled client should have lost some deltas"
    assert kinds <= {"reasoning.delta", "text.delta"}
    assert "reasoning.delta" in kinds
    assert slow[-1]["type"] == "run.lifecycle" and slow[-1]["payload"]["state"] == "done"
    assert slow[-1]["payload"]["dropped_count"] == len(missing)
    reasoning_kept = sum(1 for e in slow if e["type"] == "reasoning.delta")
    text_kept = sum(1 for e in slow if e["type"] == "text.delta")
    assert reasoning_kept / 300 < text_kept / 600, "reasoning deltas go before text deltas"


@pytest.mark.slow
async def test_buf_0001_disconnects_a_client_that_cannot_take_control_events(
    memory_bus: Bus, store: ReplayLog, run_id: str
) -> None:
    """A client that can't take even control events is disconnected with KAI-STREAM-BUF-0001 and can resume."""
    settings = EdgeSettings(client_queue_events=32, client_queue_bytes=1 << 20, write_timeout_s=0.3)
    await append(memory_bus, run_id, [event(run_id, 1, "run.lifecycle", {"state": "running"})])
    async with serve_edge(memory_bus, store, settings) as edge, httpx.AsyncClient(timeout=30) as http:
        url = f"{edge.url}/v1/runs/{run_id}/stream?detail=full"
        reader, writer = await _stalled_sse(url)
        await until(lambda: edge.live_clients(run_id) == 1, what="the client attached")
        for seq in range(2, 600):
            start = {"call_id": f"c{seq}", "tool": "search", "input": {"q": BIG}}
            await append(memory_bus, run_id, [event(run_id, seq, "tool.start", start)])
            if seq % 20 == 0:
                await asyncio.sleep(0)
        await append(memory_bus, run_id, [event(run_id, 600, "run.lifecycle", {"state": "done"})])
        raw = await asyncio.wait_for(reader.read(-1), 30)
        writer.close()
        slow = _sse_bodies(raw)
        assert slow[-1]["type"] == "error" and slow[-1]["code"] == "KAI-STREAM-BUF-0001"
        seqs = [e["seq"] for e in slow[:-1]]
        assert seqs == list(range(1, len(seqs) + 1)), "nothing before the cut is missing"
        async with http.stream("GET", url, headers={"Last-Event-ID": str(seqs[-1])}) as response:
            rest, _ = await read_sse(response)
        metrics = (await http.get(f"{edge.url}/metrics")).text
    assert [int(e.id or 0) for e in rest] == list(range(seqs[-1] + 1, 601))
    assert 'runwire_edge_disconnects_total{code="KAI-STREAM-BUF-0001"} 1.0' in metrics
