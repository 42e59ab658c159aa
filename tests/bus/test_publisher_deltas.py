"""A text or reasoning delta queued as bytes (``Run.delta_nowait``, every framework token's path).

Deltas of a run queued back to back are one delta of their texts (what the linger would have
sent in one batch: fewer, larger events, the same text, in order). The publisher splices the delta's text, id, ts and seq into the run's canonical bytes instead of
building and encoding an event: the bytes must be exactly those ``emit`` would have queued for
the same event, and every bus must carry them to the workers (Koder agent stream §2: the
envelope's fields; invariant 4 of docs/architecture.md: nothing lost silently).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator

import msgspec
import pytest

from runwire import Publisher
from runwire.core.envelope import TextPayload, decode_lines, encode
from runwire.core.errors import DeliveryTimeout, MalformedFrame
from runwire.sdk.publisher import JOIN_BYTES, Run, _Clock
from tests.bus.reading import consume
from tests.services import RedisServer

DELTAS = ("text.delta", "reasoning.delta")
encode_text = msgspec.json.Encoder().encode


def texts() -> list[str]:
    """Every control character, JSON's escapes, unicode beyond ASCII and the BMP, and random
    mixes of them."""
    pool = [chr(c) for c in range(0x20)] + ['"', "\\", "/", "\x7f", "\u2028", "\u2029", "é",
                                            "日本", "😀", "\ufeff", "a", " ", "\u0080", "\uffff"]
    rng = random.Random(7)
    mixes = ["".join(rng.choices(pool, k=rng.randrange(1, 40))) for _ in range(300)]
    return [*pool, "", "plain text ", "x" * 5000, "</script>", "\\u0041", *mixes]


class _Frozen(_Clock):
    """The same ids and timestamps for two publishers, one after the other."""

    def __init__(self) -> None:
        super().__init__()
        self._stamps = self._made()

    def _made(self) -> Iterator[tuple[str, str]]:
        for n in range(10**6):
            yield f"evt_01M8EEJ19NCJF9NSZXD{n:09d}", f"2026-11-27T12:{n // 60000 % 60:02d}:00.{n % 1000:03d}Z"

    def stamp(self) -> tuple[str, str]:
        return next(self._stamps)


RUNS = {
    "root": {},
    "child in a thread": {"tenant": "acme", "parent": "run-root", "thread": "chat-9"},
    "unicode and escapes in its fields": {"tenant": 'te"n\\a\u2028nt é', "parent": "p/ü\n",
                                          "thread": "😀"},
    "a named agent (its first event says it in ext)": {"agent": "planner"},
    "a tenant like the cut's marks": {"tenant": "\x01id"},
    "a thread like the seq's mark": {"thread": "7036874417766401"},
}


@pytest.mark.parametrize("fields", RUNS.values(), ids=RUNS.keys())
async def test_a_delta_queued_as_bytes_is_what_emit_queues(fields: dict[str, str]) -> None:
    """Byte for byte, over every kind of text, both delta types and runs with every field."""
    queued: list[list[bytes]] = []
    spliced = 0
    for fast in (True, False):
        async with Publisher.connect(f"memory://d{uuid.uuid4().hex[:8]}", linger_ms=600_000,
                                     join_deltas=False) as pub:
            pub._clock = _Frozen()
            run = pub.run("run-ü\"1" if fields else "run-1", **fields)  # type: ignore[arg-type]
            for text in texts():
                for type in DELTAS:
                    if fast:
                        assert run.delta_nowait(type, text)
                    else:
                        assert run.emit_nowait(type, TextPayload(text=text)) is not None
            queued.append(list(pub._encoded))
            spliced += sum(isinstance(item, Run) for item in pub._queue)
    fast_bytes, emitted = queued
    assert fast_bytes == emitted
    cut = not any("\x01" in value or "7036874417766401" in value for value in fields.values())
    assert spliced == (len(emitted) - ("agent" in fields) if cut else 0)
    events = decode_lines(b"\n".join(fast_bytes))  # what a worker reads of them
    assert [encode(event) for event in events] == fast_bytes  # type: ignore[arg-type]
    assert [event.payload.text for event in events[::2]] == texts()  # type: ignore[union-attr]


async def test_a_delta_over_the_frame_limit_is_refused_and_uses_no_seq() -> None:
    async with Publisher.connect(f"memory://d{uuid.uuid4().hex[:8]}") as pub:
        run = pub.run("run-big")
        with pytest.raises(MalformedFrame):
            run.delta_nowait("text.delta", "x" * (1 << 20))
        assert run.delta_nowait("text.delta", "fits") and run.seq == 1


async def test_deltas_as_bytes_reach_consumers_on_every_bus(sdk_url: str) -> None:
    """Deltas queued as bytes among events built as objects, a child run's and a root's: each
    bus routes them to the tree's shard and consumers read them in order, as emitted."""
    async with Publisher.connect(sdk_url) as pub:
        root = pub.run("run-tree", tenant="acme")
        child = pub.run("run-leaf", parent=root)
        for n in range(30):
            assert root.delta_nowait("text.delta", f"root {n} ")
            assert child.delta_nowait("reasoning.delta", f"leaf \"{n}\"\n")
            if n % 10 == 0:
                await child.emit("tool.start", {"call_id": f"c{n}", "tool": "grep"})
    got = await consume(sdk_url, 63)
    assert [(e.seq, e.payload.text) for e in got if e.run_id == "run-tree"] == [  # type: ignore[union-attr]
        (n + 1, f"root {n} ") for n in range(30)]
    leaf = [e for e in got if e.run_id == "run-leaf"]
    assert [e.seq for e in leaf] == list(range(1, 34))
    assert [e.type for e in leaf[:3]] == ["reasoning.delta", "tool.start", "reasoning.delta"]
    assert {(e.root_id, e.parent_id, e.tenant) for e in leaf} == {("run-tree", "run-tree", "acme")}
    ids = [e.id for e in sorted(got, key=lambda e: (e.run_id, e.seq))]
    assert all(a < b for a, b in zip(ids[:32], ids[1:33], strict=True))


@pytest.mark.slow
async def test_a_give_up_names_the_deltas_queued_as_bytes(own_redis: RedisServer) -> None:
    """With the bus down past ``delivery_timeout``, DeliveryTimeout names every delta queued as
    bytes by its run and seq, among events queued as objects."""
    async with Publisher.connect(own_redis.url, max_pending=50, max_batch=10, delivery_timeout=1.5,
                                 linger_ms=1, backoff_cap=0.2, join_deltas=False) as pub:
        run = pub.run("run-down")
        own_redis.stop()
        assert run.emit_nowait("tool.start", {"call_id": "c1", "tool": "grep"}) is not None
        while run.delta_nowait("text.delta", f"{run.seq} "):
            pass
        assert run.seq == 50  # the bound: no room for the 51st, and no seq used up
        with pytest.raises(DeliveryTimeout) as failure:
            await pub.flush()
        assert failure.value.undelivered == [("run-down", s) for s in range(1, 51)]
        own_redis.start()
        assert run.delta_nowait("text.delta", "after")
        await pub.flush()
    got = await consume(own_redis.url, 1)
    assert [(e.seq, e.payload.text) for e in got] == [(51, "after")]  # type: ignore[union-attr]


async def test_deltas_queued_back_to_back_are_one_delta_of_their_texts(sdk_url: str) -> None:
    """A run's deltas while nothing else is queued are one event: its text theirs joined, its
    id, ts and seq the first's, its bytes what ``emit`` makes of that text. A delta of the other
    type, another run's event or the flusher taking the batch starts a new one; seqs stay
    contiguous and each run's text arrives whole and in order on every bus."""
    async with Publisher.connect(sdk_url, linger_ms=600_000) as pub:
        root = pub.run("run-joined", tenant="acme")
        child = pub.run("run-joined-leaf", parent=root)
        pieces = texts()[:60]
        for text in pieces[:20]:
            assert root.delta_nowait("text.delta", text)
        assert root.seq == 1 and len(pub._encoded) == 1
        assert root.delta_nowait("reasoning.delta", "think")  # another type: an event of its own
        assert root.delta_nowait("reasoning.delta", "ing")
        for text in pieces[20:40]:
            assert root.delta_nowait("text.delta", text)
        assert child.delta_nowait("text.delta", "leaf")  # another run's event in between
        for text in pieces[40:]:
            assert root.delta_nowait("text.delta", text)
        assert root.seq == 4 and child.seq == 1 and pub.pending == 5
        await pub.flush()
        for text in ("after ", "the ", "flush"):
            assert root.delta_nowait("text.delta", text)
        await pub.flush()
    got = [e for e in await consume(sdk_url, 6) if e.run_id == "run-joined"]
    assert [(e.seq, e.type) for e in got] == [(1, "text.delta"), (2, "reasoning.delta"),
                                             (3, "text.delta"), (4, "text.delta"), (5, "text.delta")]
    texts_of = [e.payload.text for e in got]  # type: ignore[union-attr]
    assert texts_of == ["".join(pieces[:20]), "thinking", "".join(pieces[20:40]),
                        "".join(pieces[40:]), "after the flush"]


async def test_a_joined_delta_is_the_bytes_emit_makes_of_its_text() -> None:
    """Byte for byte: joined texts of every kind (escapes, beyond the BMP, the empty text) make
    the bytes ``emit`` queues for one delta of their concatenation, with the first's id and ts."""
    pieces = texts()
    async with Publisher.connect(f"memory://d{uuid.uuid4().hex[:8]}", linger_ms=600_000) as pub:
        pub._clock = _Frozen()
        run = pub.run("run-ü\"j", tenant="acme", thread="😀")
        for text in pieces:
            assert run.delta_nowait("text.delta", text)
        joined = [item.seal() if not isinstance(item, bytes) else item for item in pub._encoded]  # type: ignore[union-attr]
        queued = pub.pending_bytes
    async with Publisher.connect(f"memory://d{uuid.uuid4().hex[:8]}", linger_ms=600_000) as pub:
        pub._clock = _Frozen()
        run = pub.run("run-ü\"j", tenant="acme", thread="😀")
        cut, made = [], []
        text = ""
        for piece in pieces:  # where the joined ones were cut: at JOIN_BYTES of encoded text
            if text and len(encode_text(text + piece)) - 2 > JOIN_BYTES:
                cut.append(text)
                text = ""
            text += piece
        cut.append(text)
        for text in cut:
            event = run.emit_nowait("text.delta", TextPayload(text=text))
            assert event is not None
            made.append(encode(event))
    assert joined == made and len(made) > 1
    assert queued == sum(map(len, made))  # the byte bound counted exactly what is sent


async def test_a_full_byte_bound_refuses_a_delta_it_would_have_joined() -> None:
    """Joining does not pass the byte bound: with no room left the delta is refused (False, no
    seq used up) and goes once there is room."""
    async with Publisher.connect(f"memory://d{uuid.uuid4().hex[:8]}", linger_ms=600_000,
                                 max_pending_bytes=2000) as pub:
        run = pub.run("run-bound")
        while run.delta_nowait("text.delta", "x" * 50):
            pass
        assert run.seq == 1 and pub.pending_bytes <= 2000
        refused = pub.pending_bytes
        await pub.flush()
        assert run.delta_nowait("text.delta", "x" * 50) and run.seq == 2
        assert pub.published == 1 and refused > 1500
