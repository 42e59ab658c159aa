"""The compiled fold (``runwire.jobs._otlp.SpanFold``) and its Python twin (``SpanTree``, as the
exporter runs it: ``keep=False``, content off) end the same spans: generated streams of a root run
and its sub-runs — every event type the fold reads, seqs repeated and going back, times out of
order, parents named late or wrongly, ``ext`` and threads — folded chunk by chunk with a cursor by
both, give the same OTLP request, ``last_seq`` and ``is_open`` after every chunk."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runwire.core.envelope import Event
from runwire.jobs.otlp import encode_request_python
from runwire.jobs.spans import SpanTree
from tests.events import event
from tests.jobs.test_otlp_native import compiled
from tests.jobs.traced import ROOT, traced_run

RUNS = ["r", "r.a", "r.b", "r.a.x"]
CALLS = ["c1", "c2", "c3"]
RESOURCE = {"service.name": "t"}

payloads: dict[str, Any] = {
    "text.delta": st.fixed_dictionaries({"text": st.just("x")}),
    "reasoning.delta": st.fixed_dictionaries({"text": st.just("y")}),
    "x.acme.note": st.just({}),
    "x.usage": st.fixed_dictionaries({"input_tokens": st.integers(0, 50), "output_tokens": st.integers(0, 50)},
                                     optional={"model": st.none() | st.sampled_from(["", "m1", "m2"])}),
    "step.boundary": st.fixed_dictionaries({
        "step_index": st.integers(0, 3),
        "step_kind": st.sampled_from(["plan", "tool-roundtrip", "text-only", "fan-out", "fan-in", "done"])}),
    "tool.start": st.fixed_dictionaries({"call_id": st.sampled_from(CALLS), "tool": st.sampled_from(["grep", "book"])}),
    "tool.end": st.fixed_dictionaries({"call_id": st.sampled_from(CALLS), "ok": st.booleans()}, optional={
        "error": st.sampled_from(["boom", {"type": "Timeout", "message": "slow"}, {"error": 3}, None])}),
    "child.spawn": st.fixed_dictionaries({"child_id": st.sampled_from(RUNS[1:])}),
    "run.lifecycle": st.fixed_dictionaries({"state": st.sampled_from(
        ["running", "awaiting_approval", "awaiting_approval", "paused", "done", "aborted", "error"])},
        optional={"reason": st.sampled_from(["why", "x" * 600, None])}),
}
exts = st.none() | st.sampled_from([{}, {"agent": {"name": "planner"}}, {"agent": {"name": 7}}, {"agent": "x"},
                                    {"approval": {"calls": [{"tool": "book"}, 3, {"call_id": "c"}]}},
                                    {"approval": {"calls": "none"}}, {"agent": {"name": "é" * 300}}])


@st.composite
def one(draw: Any, seq: int) -> Event:
    kind = draw(st.sampled_from(list(payloads)))
    fields: dict[str, Any] = {}
    source = draw(st.sampled_from(RUNS + [None]))  # None: the field present and null
    if source != "r":
        fields["child_id"] = source
    for name, values in (("parent_id", st.sampled_from(RUNS)), ("ext", exts), ("thread_id", st.sampled_from(["t1", "t2"])),
                         ("tenant", st.sampled_from(["acme"]))):
        if draw(st.booleans()):
            fields[name] = draw(values)
    return event("r", seq, kind, draw(payloads[kind]), second=draw(st.integers(0, 3000)) / 100, **fields)


@st.composite
def streams(draw: Any) -> list[Event]:
    seq, out = 0, []
    for _ in range(draw(st.integers(0, 60))):
        seq = max(1, seq + draw(st.sampled_from([1, 1, 1, 1, 2, 0, -1, -3])))
        out.append(draw(one(seq)))
    return out


def fold_both(events: list[Event], cuts: list[int], cursor: int) -> None:
    tree, fold = SpanTree("r", keep=False), compiled().SpanFold("r")
    bounds = sorted({0, len(events), *[c % (len(events) + 1) for c in cuts]})
    for start, stop in zip(bounds, bounds[1:], strict=False):
        chunk = events[start:stop]
        python = encode_request_python(tree.apply_many(chunk, cursor), RESOURCE)
        native = compiled().encode_request(fold.apply_many(chunk, cursor), RESOURCE)
        assert native == python, (start, stop)
        assert (fold.last_seq, fold.is_open) == (tree.last_seq, tree.is_open)


@settings(max_examples=600, deadline=None)
@given(streams(), st.lists(st.integers(0, 100), max_size=4), st.sampled_from([0, 0, 5, 20]))
def test_the_compiled_fold_ends_the_python_twins_spans(events: list[Event], cuts: list[int], cursor: int) -> None:
    fold_both(events, cuts, cursor)


def test_a_traced_run_of_two_levels_folds_to_the_same_request_at_every_cut() -> None:
    """The run the span and Phoenix tests export: a failed tool, usage, an approval, two levels."""
    events = traced_run()
    for cut in range(len(events) + 1):
        tree, fold = SpanTree(ROOT, keep=False), compiled().SpanFold(ROOT)
        python = [*tree.apply_many(events[:cut]), *tree.apply_many(events[cut:], past=cut // 2)]
        native = [*fold.apply_many(events[:cut]), *fold.apply_many(events[cut:], past=cut // 2)]
        assert compiled().encode_request(native, RESOURCE) == encode_request_python(python, RESOURCE)
    assert len(native) == 7 and not fold.is_open


@pytest.mark.parametrize("accelerated", [False, True], ids=["plain", "cpu-extensions"])
def test_span_ids_of_every_length_are_the_python_twins(accelerated: bool) -> None:
    """The compiled fold hashes span ids itself (SHA-256, the root's part once; with the CPU's SHA
    extensions where it has them, else plain C: both are run): ids whose input ends on each side
    of a 64-byte block and of its 56-byte padding limit, and spans over several blocks, not
    ASCII, come out as ``hashlib``'s."""
    module = compiled()
    default = module._sha_accelerated()
    module._sha_accelerated(accelerated)
    try:
        for length in [*range(1, 140), 300]:
            root = ("r" * length)[:length - 1] + "é"
            events = traced_run(root, child=f"{root}.c", grandchild=f"{root}.c.{'g' * (length % 70)}")
            python = SpanTree(root, keep=False).apply_many(events)
            native = module.SpanFold(root).apply_many(events)
            assert module.encode_request(native, RESOURCE) == encode_request_python(python, RESOURCE), length
    finally:
        module._sha_accelerated(default)


def test_a_chain_of_sub_runs_as_deep_as_the_stream_ends_in_both_twins() -> None:
    """Each sub-run spawns the next, 20,000 deep, then the root ends: every span ends, deepest
    first, in both twins alike (neither recurses: a hostile stream can't exhaust a stack)."""
    depth, events, parent = 20_000, [], "r"
    for n in range(depth):
        child = f"{parent}.{n}" if n < 3 else f"r.deep{n}"
        fields = {} if parent == "r" else {"child_id": parent}
        events.append(event("r", n + 1, "child.spawn", {"child_id": child}, second=1, **fields))
        parent = child
    events.append(event("r", depth + 1, "run.lifecycle", {"state": "done"}, second=2))
    python = SpanTree("r", keep=False).apply_many(events)
    native = compiled().SpanFold("r").apply_many(events)
    assert len(python) == len(native) == depth + 1 and python[-1].run_id == "r"
    assert compiled().encode_request(native, RESOURCE) == encode_request_python(python, RESOURCE)


def test_more_tool_and_model_names_than_the_fold_keeps_name_every_span_as_the_twin() -> None:
    """The compiled fold makes each ``execute_tool {tool}`` and ``chat {model}`` name once and
    keeps it, up to a bound: 2,500 names of each (past the bound twice; some a tool's and a
    model's both) and as many model steps (a count of 1 to 4 digits in their ids) end as the
    Python twin's spans."""
    events, seq = [], 0

    def add(kind: str, payload: dict[str, Any]) -> None:
        nonlocal seq
        seq += 1
        events.append(event("r", seq, kind, payload, second=seq / 1000))

    for n in range(2_500):
        name = f"tool-{n % 1_250}" if n % 2 else f"name-{n}"  # some repeat after the bound emptied
        add("tool.start", {"call_id": f"c{n}", "tool": name})
        add("tool.end", {"call_id": f"c{n}", "ok": n % 3 != 0})
        add("x.usage", {"input_tokens": n, "output_tokens": 1, "model": name if n % 4 == 1 else f"model-{n}"})
        add("step.boundary", {"step_index": n, "step_kind": "tool-roundtrip"})
    add("run.lifecycle", {"state": "done"})
    python = SpanTree("r", keep=False).apply_many(events)
    native = compiled().SpanFold("r").apply_many(events)
    assert len(python) == len(native) == 5_001
    assert {span.name for span in python} >= {"execute_tool name-0", "execute_tool tool-1", "chat tool-1", "chat model-2498"}
    assert compiled().encode_request(native, RESOURCE) == encode_request_python(python, RESOURCE)
