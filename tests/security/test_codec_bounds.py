"""Bounds on every numeric and structural field, the same at HTTP ingest and in the worker.

Koder agent stream §2 (the envelope) gives ``seq`` as a per-run integer; the
replay log and the workers' checkpoints hold it as a signed 64-bit number, so
anything outside 0..2^63-1 — and any nesting a recursive encoder downstream
cannot walk — is a malformed event (KAI-STREAM-PROTO-0001) wherever it enters,
never a crash.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from runwire.bus import Bus, open_bus
from runwire.core import envelope
from runwire.core.errors import MalformedFrame
from runwire.store import ReplayLog, open_store
from runwire.workers.runtime import run_worker
from tests.edge.harness import serve_edge
from tests.security.hostile import frame, nested, publish_raw
from tests.workers.checks import read_all

INT64_MAX = (1 << 63) - 1
MAX_DEPTH = 64
"""The documented limits (docs/security.md § Input bounds)."""

BAD_NUMBERS: list[tuple[str, dict[str, Any], str]] = [
    ("seq 2^63", {"seq": INT64_MAX + 1}, "$.seq"),
    ("seq 2^64", {"seq": 1 << 64}, "$.seq"),
    ("seq -1", {"seq": -1}, "$.seq"),
    ("span past int64", {"span": [1, 1 << 64]}, "$.span[1]"),
    ("negative step index", {"type": "step.boundary",
                             "payload": {"step_index": -1, "step_kind": "plan"}}, "$.payload.step_index"),
    ("negative duration", {"type": "tool.end",
                           "payload": {"call_id": "c", "ok": True, "duration_ms": -5}}, "$.payload.duration_ms"),
    ("token count past int64", {"type": "x.usage", "payload": {"input_tokens": 1 << 70}},
     "$.payload.input_tokens"),
    ("dropped count negative", {"type": "run.lifecycle",
                                "payload": {"state": "done", "dropped_count": -1}}, "$.payload.dropped_count"),
    ("gap bound past int64", {"type": "x.gap", "payload": {"run_id": "r", "first": 1, "last": 1 << 64}},
     "$.payload.last"),
    ("parent id of 10,000 chars", {"parent_id": "p" * 10_000}, "$.parent_id"),
]


def hostile(changes: dict[str, Any], run_id: str = "r", seq: int = 1) -> bytes:
    fields = dict(changes)
    kind = fields.pop("type", "text.delta")
    payload = fields.pop("payload", None)
    seq = fields.pop("seq", seq)
    return frame(run_id, seq, kind, payload, **fields)


@pytest.mark.parametrize(("case", "changes", "field"), BAD_NUMBERS, ids=[c[0] for c in BAD_NUMBERS])
def test_numbers_out_of_range_are_malformed_frames_naming_the_field(
    case: str, changes: dict[str, Any], field: str
) -> None:
    with pytest.raises(MalformedFrame) as refused:
        envelope.decode(hostile(changes))
    assert refused.value.code == "KAI-STREAM-PROTO-0001"
    assert refused.value.field == field


def test_the_largest_int64_seq_is_still_an_event() -> None:
    assert envelope.decode(hostile({"seq": INT64_MAX})).seq == INT64_MAX


@pytest.mark.parametrize("depth", [MAX_DEPTH - 2 + 1, 700, 5_000, 100_000])
def test_payloads_nested_past_the_limit_are_malformed_not_a_recursion_error(depth: int) -> None:
    """A tool input is at level 3 of the frame, so ``MAX_DEPTH - 2`` levels of it are the most allowed."""
    deep = frame("r", 1, "tool.start", {"call_id": "c", "tool": "t", "input": nested(depth)})
    with pytest.raises(MalformedFrame, match=f"deeper than {MAX_DEPTH}"):
        envelope.decode(deep)
    ext = frame("r", 1, "x.acme.thing", {"v": nested(depth)})
    with pytest.raises(MalformedFrame, match=f"deeper than {MAX_DEPTH}"):
        envelope.decode(ext)


def test_the_deepest_allowed_payload_decodes() -> None:
    ok = frame("r", 1, "tool.start", {"call_id": "c", "tool": "t", "input": nested(MAX_DEPTH - 2)})
    expected = msgspec.json.decode(bytes(nested(MAX_DEPTH - 2)))
    assert envelope.decode(ok).payload_dict()["input"] == expected


def test_a_batch_decode_reports_each_bad_frame_alone() -> None:
    """The worker's batch decoder: one result per frame; bad frames don't spoil the good ones."""
    frames = [
        frame("r", 1),
        hostile({"seq": 1 << 64}, seq=2),
        frame("r", 3, "tool.start", {"call_id": "c", "tool": "t", "input": nested(2_000)}),
        frame("r", 4, "tool.start", {"call_id": "c", "tool": "t", "input": nested(MAX_DEPTH - 2)}),
        frame("r", 5),
    ]
    results = envelope.decode_many(frames)
    assert [type(r).__name__ for r in results] == [
        "TextDelta", "MalformedFrame", "MalformedFrame", "ToolStart", "TextDelta"
    ]
    lines = envelope.decode_lines(b"\n".join(frames))
    assert [type(r).__name__ for r in lines] == [type(r).__name__ for r in results]


def test_check_holds_events_built_in_code_to_the_decoder_limits() -> None:
    """Events made by codecs or the SDK skip the decoder; ``check`` applies the worker's limits."""
    made = envelope.make("text.delta", {"text": "x"}, id="e", ts=envelope.now_ts(), run_id="r", seq=1 << 64)
    with pytest.raises(MalformedFrame):
        envelope.check(made)
    huge = envelope.make("text.delta", {"text": "x" * envelope.MAX_FRAME_BYTES},
                         id="e", ts=envelope.now_ts(), run_id="r", seq=1)
    with pytest.raises(MalformedFrame, match="byte limit"):
        envelope.check(huge)
    month_13 = envelope.make("text.delta", {"text": "x"}, id="e", ts="2026-13-45T10:00:00.000Z",
                             run_id="r", seq=1)
    with pytest.raises(MalformedFrame, match="not a valid instant"):  # a worker would dead-letter it
        envelope.check(month_13)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ReplayLog]:
    async with open_store(f"sqlite:///{tmp_path / 'replay.db'}") as opened:
        yield opened


@pytest.fixture
async def redis_bus(redis_url: str) -> AsyncIterator[Bus]:
    url = f"{redis_url}{'&' if '?' in redis_url else '?'}prefix=s{uuid.uuid4().hex[:10]}"
    async with open_bus(url) as opened:
        yield opened


async def test_http_ingest_refuses_what_a_worker_could_not_carry_and_publishes_the_rest(
    store: ReplayLog,
) -> None:
    """Partial acceptance: out-of-range numbers and depth bombs are per-line KAI-STREAM-PROTO-0001."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    body = b"\n".join([
        frame(run_id, 1),
        hostile({"seq": 1 << 64}, run_id),
        frame(run_id, 2, "tool.start", {"call_id": "c", "tool": "t", "input": nested(700)}),
        b'{"type":"x.a.b","payload":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        frame(run_id, 3),
    ])
    async with open_bus("memory://") as bus:
        consumer = bus.consumer("g", "c1")
        async with serve_edge(bus, store) as edge, httpx.AsyncClient(timeout=30) as http:
            response = await http.post(f"{edge.url}/v1/runs/{run_id}/events", content=body)
        assert response.status_code == 422, response.text
        result = response.json()
        assert result["accepted"] == 2
        assert [(r["line"], r["code"]) for r in result["rejected"]] == [
            (2, "KAI-STREAM-PROTO-0001"), (3, "KAI-STREAM-PROTO-0001"), (4, "KAI-STREAM-PROTO-0001"),
        ]
        delivered = await consumer.fetch(100, block_ms=500)
        assert [envelope.decode(d.data).seq for d in delivered] == [1, 3]
        await consumer.close()


async def test_a_worker_dead_letters_hostile_entries_alone_and_the_rest_of_the_batch_proceeds(
    redis_bus: Bus, store: ReplayLog
) -> None:
    """Entries put on the bus by a producer that skipped every check (a hostile SDK user):
    the worker neither crashes nor loops; each one is dead-lettered with its code."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    await publish_raw(redis_bus, run_id, [
        frame(run_id, 1),
        hostile({"seq": 1 << 64}, run_id),
        frame(run_id, 2, "tool.start", {"call_id": "c", "tool": "t", "input": nested(5_000)}),
        hostile({"type": "step.boundary", "payload": {"step_index": -1, "step_kind": "plan"}}, run_id, 2),
        frame(run_id, 2),
        frame(run_id, 3, "run.lifecycle", {"state": "done"}),
    ])
    stats = await run_worker(redis_bus, store, group="g", name="w1", burst=True)
    assert stats.dead_lettered == 3
    reasons = [d.reason for d in await redis_bus.dead_letters()]
    assert len(reasons) == 3 and all("KAI-STREAM-PROTO-0001" in r for r in reasons)
    raw = await read_all(redis_bus, run_id)
    assert [(e.seq, e.type) for e in raw] == [(1, "text.delta"), (2, "text.delta"), (3, "run.lifecycle")]
    assert [e.id for e in await store.read(run_id)] == [e.id for e in raw]
    again = await run_worker(redis_bus, store, group="g", name="w2", burst=True)
    assert again.dead_lettered == 0  # nothing left pending to crash-loop on


@pytest.fixture(params=["sqlite", "postgresql"])
async def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ReplayLog]:
    url = (f"sqlite:///{tmp_path / 'replay.db'}" if request.param == "sqlite"
           else request.getfixturevalue("postgres_url"))
    async with open_store(url) as opened:
        yield opened


async def test_token_counts_saturate_in_run_metadata_instead_of_stopping_the_writes(
    any_store: ReplayLog,
) -> None:
    """Each count is within int64, their sum is not: the replay log's run totals stop at the
    largest BIGINT rather than failing every write of the worker (found by the fuzz suite)."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    usage = {"type": "x.usage", "payload": {"input_tokens": INT64_MAX, "output_tokens": INT64_MAX}}
    async with open_bus("memory://") as bus:
        await publish_raw(bus, run_id, [hostile(usage, run_id, 1), hostile(usage, run_id, 2)])
        await run_worker(bus, any_store, group="g", name="w", burst=True)
        await publish_raw(bus, run_id, [hostile(usage, run_id, 3), frame(run_id, 4)])
        stats = await run_worker(bus, any_store, group="g", name="w", burst=True)
        assert stats.dead_lettered == 0
        info = await any_store.run(run_id)
        assert info is not None and info.input_tokens == info.output_tokens == INT64_MAX
        assert [e.seq for e in await any_store.read(run_id)] == [1, 2, 3, 4]


async def test_the_sdk_refuses_at_emit_what_a_worker_would_dead_letter() -> None:
    """An agent hears about a payload too deep or too big when it emits it, not never."""
    from runwire.sdk.publisher import Publisher

    deep: Any = []
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    async with open_bus("memory://") as bus, Publisher(bus) as pub:
        run = pub.run(f"run-{uuid.uuid4().hex[:8]}")
        with pytest.raises(MalformedFrame, match=f"deeper than {MAX_DEPTH}"):
            await run.emit("tool.start", {"call_id": "c", "tool": "t", "input": deep})
        with pytest.raises(MalformedFrame, match="byte limit"):
            await run.emit("text.delta", {"text": "x" * (1 << 20)})
        sent = await run.emit("text.delta", {"text": "fine"})
    assert sent.seq == 1  # the refused emits used up no seq: no gap downstream
