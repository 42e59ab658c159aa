"""The compiled packing of a worker's Redis write (``runwire.core._native.pack_append_many``)
and its Python twin (``runwire.bus.redis.entries.pack_append_many_python``) write the same bytes:
generated writes — streams of one entry or several (past ``ENTRY_EVENTS``), contiguous seqs or
not, encoded as ``Lines`` or as a list, with and without a checkpoint, holding the run's own end,
a child's end or none — packed by both are equal, byte for byte."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from runwire.bus.redis import entries
from runwire.bus.redis.entries import ENTRY_EVENTS, _frame
from runwire.core.envelope import Event, encode
from runwire.core.lines import encode_lines
from tests.events import event
from tests.workers.test_core import compiled


@st.composite
def stream(draw: Any, index: int) -> tuple[Any, list[Event], Any, bytes | None]:
    run_id = f"run-{index}"
    count = draw(st.sampled_from((1, 2, 5, 40)) | st.just(ENTRY_EVENTS + 3))
    first = draw(st.integers(1, 1 << 40))
    skip = draw(st.integers(0, 3)) == 0 and count > 1
    seqs = [first + i + (1 if skip and i >= count // 2 else 0) for i in range(count)]
    events = [event(run_id, seq, "text.delta", text=draw(st.sampled_from(("a", "é\n\"", "")))) for seq in seqs]
    end = draw(st.sampled_from(("none", "own", "child", "running")))
    if end != "none":
        fields = {"child_id": "kid"} if end == "child" else {}
        state = "running" if end == "running" else "done"
        events[-1] = event(run_id, seqs[-1], "run.lifecycle", {"state": state}, **fields)
    encoded: Any = encode_lines(events) if draw(st.booleans()) else [encode(e) for e in events]
    state = draw(st.none() | st.binary(max_size=40))
    return (run_id, "raw"), events, encoded, state


@settings(max_examples=200, deadline=None)
@given(data=st.data(), count=st.integers(0, 6), head=st.binary(max_size=30), sha=st.text("0123456789abcdef", max_size=40))
def test_the_compiled_packing_writes_what_its_python_twin_writes(data: Any, count: int, head: bytes, sha: str) -> None:
    appends = [data.draw(stream(index)) for index in range(count)]

    def keys_of(key: Any) -> bytes:
        return b"".join(_frame(f"{key[0]}:{part}".encode()) for part in ("a", "b", "c"))

    compiled()  # (fails with the install hint where it was not built)
    assert entries._CORE is not None
    packed = entries._CORE.pack_append_many(_frame(sha.encode()), head, appends, keys_of)
    assert packed == entries.pack_append_many_python(sha, head, appends, keys_of)
