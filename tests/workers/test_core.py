"""The compiled per-event path (``runwire.core._native``) and its Python twin
(``Processor``'s own methods, ``Processor(core=None)``) process the same: generated batches of run
trees — roots, children and grandchildren fanned in, deltas of both kinds with and without
``child_ref``, windows that close by event time, tool calls between them, a child.spawn learned
mid-run, a run that ends and gets more, publisher seqs repeated, skipped or 0, another tenant's
events, an event for a run not loaded, a ts not parsed before — processed by both, in place or
not, merged into one write or not, then ticked, give the same raw and shaped events, the same
checkpoints, the same run summaries for the replay log (summed as admitted by the compiled path,
read from the events on the Python one), the same failures and the same counters."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runwire.core.envelope import Event, decode_many, encode
from runwire.processing.processor import Processor, StreamOutput
from runwire.store.runmeta import stream_summary
from tests.events import event
from tests.jobs.test_otlp_native import HINT
from tests.workers.events import at

RUNS = {  # run → (parent, root)
    "r": (None, None), "r.1": ("r", "r"), "r.2": ("r", "r"), "r.1.1": ("r.1", "r"),
    "q": (None, None), "q.1": ("q", "q"),
}
KINDS = ("text.delta", "reasoning.delta", "tool.start", "child.spawn", "run.lifecycle")
TEXTS = st.sampled_from(("", "x", 'a "quoted" \\ line\n', "\x00\x1f\x7f\u2028é😀")) | st.text(
    st.characters(exclude_categories=["Cs"]), max_size=12)
"""Delta texts and thread ids: escapes, widths, empty."""


def compiled() -> ModuleType:
    try:
        return importlib.import_module("runwire.core._native")
    except ImportError:
        pytest.fail(HINT, pytrace=False)


@st.composite
def scripts(draw: Any) -> list[bytes]:
    """A shard's events as the bus holds them (encoded), in order."""
    seqs: dict[str, int] = {}
    clock = 0.0
    frames: list[bytes] = []
    for _ in range(draw(st.integers(1, 120))):
        run_id = draw(st.sampled_from(sorted(RUNS)))
        kind = draw(st.sampled_from(KINDS) if draw(st.integers(0, 3)) == 0 else st.just("text.delta"))
        parent, root = RUNS[run_id]
        step = draw(st.sampled_from((1, 1, 1, 1, 1, 1, 0, 2, -1)))  # (next, repeat, skip, 0, …)
        seq = max(0, seqs.get(run_id, 0) + step) if step >= 0 else 0
        seqs[run_id] = max(seqs.get(run_id, 0), seq)
        clock += draw(st.sampled_from((0, 1, 7, 40, 99, 100, 150, -30)))
        payload: dict[str, Any] | None = None
        if kind == "child.spawn":
            payload = {"child_id": draw(st.sampled_from(("r.1", "r.2", "r.1.1", "q.1")))}
        elif kind == "run.lifecycle":
            payload = {"state": draw(st.sampled_from(("running", "done", "error")))}
        elif kind == "tool.start":
            payload = {"call_id": "c1", "tool": "browser"}
        else:
            payload = {"text": draw(TEXTS)}
        fields: dict[str, Any] = {}
        if parent is not None and draw(st.integers(0, 9)):  # (else: a child that names no parent)
            fields.update(parent_id=parent, root_id=root)
        if draw(st.integers(0, 24)) == 0:
            fields["tenant"] = "other"
        if draw(st.integers(0, 9)) == 0:
            fields["thread_id"] = draw(TEXTS)
        if kind.endswith(".delta") and draw(st.integers(0, 14)) == 0:
            fields["child_ref"] = draw(st.sampled_from(("r.9", "r.é", "é")))
        ms = max(0.0, clock) + (0.5 if draw(st.integers(0, 30)) == 0 else 0)  # (a ts of its own)
        frames.append(encode(event(run_id, seq, kind, payload, ts=at(ms), **fields)))
    return frames


def run_through(core: Any, frames: list[bytes], cuts: list[int], owned: bool, merged: bool) -> list[Any]:
    """What a processor made of ``frames``, batch by batch: its outputs (encoded), failures,
    counters and held streams; each batch decoded afresh (``owned`` stamps them in place)."""
    processor = Processor(core=core, clock=lambda: 1_000_000.0)
    seen: list[Any] = []
    pending: dict[str, StreamOutput] = {}
    for start, end in zip([0, *cuts], [*cuts, len(frames)], strict=True):
        events = decode_many(frames[start:end])
        missing = sorted(processor.missing(events))
        seen.append(missing)
        for run_id in missing:
            processor.restore(run_id, None)
        outputs, failures = processor.process_each(events, owned=owned, into=pending if merged else None)
        seen.append([(index, type(error).__name__, str(error)) for index, error in failures])
        if not merged:
            seen.append(written(outputs))
    seen.append(written(Processor.seal(pending)))
    seen.append(written(processor.tick(1_000_000.0 + 1)))
    seen.append(msgspec.structs.asdict(processor.stats))
    seen.append(sorted(processor.stream_ids()))
    return seen


def written(outputs: dict[str, StreamOutput]) -> list[Any]:
    def lines(events: list[Event]) -> list[bytes]:
        return [encode(event) for event in events]
    def summary(run_id: str, output: StreamOutput) -> Any:
        # what the replay log's row of the run gets: summed as admitted (compiled), or read now
        return stream_summary((run_id, output.raw, [], None, output.raw_summary())) if output.raw else None
    return [(run_id, lines(output.raw), lines(output.shaped), output.state, summary(run_id, output))
            for run_id, output in outputs.items()]


@settings(max_examples=300, deadline=None)
@given(frames=scripts(), data=st.data(), owned=st.booleans(), merged=st.booleans())
def test_the_compiled_path_and_its_python_twin_process_the_same(
    frames: list[bytes], data: Any, owned: bool, merged: bool
) -> None:
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(frames)), max_size=4))) - {len(frames)})
    core = compiled()
    assert run_through(core, frames, cuts, owned, merged) == run_through(None, frames, cuts, owned, merged)


def test_a_busy_tree_takes_the_compiled_path_and_matches_its_twin() -> None:
    """The usual case (a root and its children streaming deltas in 100 ms windows, tool calls
    between them, each run's first event) is the compiled path's own: no event is handed to
    ``Processor._one``; its Python is asked only for a run's links, when first learned."""
    frames: list[bytes] = []
    seqs = dict.fromkeys(RUNS, 0)
    for tick in range(3000):
        run_id = ("r", "r.1", "r.2", "r.1.1")[tick % 4]
        seqs[run_id] += 1
        parent, root = RUNS[run_id]
        links = {} if parent is None else {"parent_id": parent, "root_id": root}
        kind = "tool.start" if tick % 97 == 0 else "text.delta"
        payload = {"call_id": "c", "tool": "t"} if kind == "tool.start" else None
        frames.append(encode(event(run_id, seqs[run_id], kind, payload, ts=at(tick * 3), **links)))
    cuts = list(range(512, len(frames), 512))
    calls: list[str] = []

    class Counted(Processor):
        def _one(self, *args: Any, **kwargs: Any) -> None:
            calls.append("_one")
            super()._one(*args, **kwargs)

    original = Processor
    try:
        globals()["Processor"] = Counted
        compiled_run = run_through(compiled(), frames, cuts, True, True)
    finally:
        globals()["Processor"] = original
    assert compiled_run == run_through(None, frames, cuts, True, True)
    assert calls == []
    processor = Processor(core=compiled())
    events = decode_many(frames)
    for run_id in sorted(processor.missing(events)):
        processor.restore(run_id, None)
    outputs, _ = processor.process_each(events, owned=True)
    assert all(output.raw_summary() is not None for output in outputs.values())  # (the log reads none)
