"""The compiled staging (``runwire.jobs._otlp.Staging``) and its Python twin
(``runwire.jobs.staging.Staging``) do the same, call for call: generated calls — streams that
continue a run's tree, skip ahead, repeat, are empty, runs not held (begun or not), a fold that
raises, the pending limit reached, and the release of some tokens — made on both give the same
answers, the same spans kept back and made pending, and the same count, over the compiled fold
and over ``SpanTree`` (content on: the compiled staging's general path)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from runwire.core.envelope import Event
from runwire.jobs.export import _Held
from runwire.jobs.otlp import encode_request_python
from runwire.jobs.spans import SpanTree
from runwire.jobs.staging import Staging
from tests.jobs.test_otlp_native import compiled
from tests.jobs.traced import traced_run

RUNS = {"a": traced_run("a", child="a.1", grandchild="a.2"), "b": traced_run("b", child="b.1", grandchild="b.2")}


class Broken:
    """A fold that raises (as a fold meeting what it cannot read would): the staging tells ``failed``."""

    last_seq = 0

    def apply_many(self, events: Any, past: int = 0) -> list[Any]:
        raise ValueError("unreadable")


class Twin:
    """One staging (compiled or not) over its own trees, and what it told its callbacks."""

    def __init__(self, make: Any, native_folds: bool, limit: int) -> None:
        self.trees: dict[str, _Held] = {}
        self.told: list[tuple[str, ...]] = []
        self.native_folds = native_folds
        self.staging = make(self.trees, self.begin, self.failed, limit)

    def fold(self, run_id: str) -> Any:
        if run_id == "broken":
            return Broken()
        return compiled().SpanFold(run_id) if self.native_folds else SpanTree(run_id, keep=False)

    def begin(self, run_id: str, events: Any) -> _Held | None:
        self.told.append(("begin", run_id, str(len(events))))
        if not events or events[0].seq != 1:
            return None
        held = self.trees[run_id] = _Held(self.fold(run_id), 0, 0.0)
        return held

    def failed(self, run_id: str, exc: Exception) -> None:
        self.told.append(("failed", run_id, str(exc)))
        self.trees.pop(run_id, None)

    def state(self) -> Any:
        def spans(items: list[Any]) -> bytes:
            return compiled().encode_request(items, {}) if self.native_folds else encode_request_python(items, {})
        return (self.staging.pending, self.told,
                {run_id: (held.cursor, [(first, last, spans(ended)) for first, last, ended in held.staged],
                          spans(held.pending)) for run_id, held in sorted(self.trees.items())})


calls = st.lists(st.one_of(
    st.tuples(st.just("stage"), st.sampled_from(["a", "b", "broken"]), st.integers(1, 30), st.integers(0, 12)),
    st.tuples(st.just("release"), st.integers(0, 8)),
    st.tuples(st.just("limit"), st.integers(0, 30)),
), max_size=40)


def run(twin: Twin, script: list[tuple[Any, ...]]) -> list[Any]:
    """The script's calls on ``twin``; what each returned, the state after each."""
    out, tokens = [], []
    for call in script:
        if call[0] == "stage":
            _, run_id, first, size = call
            events: list[Event] = RUNS.get(run_id, RUNS["a"])[first - 1:first - 1 + size]
            token = twin.staging(run_id, events)
            if token is not None:
                tokens.append(token)
                token = (token[0] is twin.trees.get(run_id), token[1])
            out.append(token)
        elif call[0] == "release":
            twin.staging.release(tokens[:call[1]])
            del tokens[:call[1]]
        else:
            twin.staging.limit = call[1]
        out.append(twin.state())
    return out


@settings(max_examples=300, deadline=None)
@given(calls, st.booleans(), st.integers(0, 30))
def test_the_compiled_staging_does_what_its_python_twin_does(script: list[tuple[Any, ...]], native: bool,
                                                            limit: int) -> None:
    python = run(Twin(Staging, native, limit), script)
    assert run(Twin(compiled().Staging, native, limit), script) == python


def test_a_run_staged_stream_by_stream_and_released_keeps_its_spans_back_until_then() -> None:
    """The worker's order: each stream as encoded, its write's tokens once logged. Spans wait in
    ``staged`` until then, counted in ``pending`` from the start; a gap is not taken."""
    for make in (Staging, compiled().Staging):
        twin = Twin(make, True, 100)
        events = RUNS["a"]
        first = twin.staging("a", events[:10])
        assert first is not None and first[1] == 10
        held = twin.trees["a"]
        assert [stretch[:2] for stretch in held.staged] == [(1, 10)] and held.pending == []
        counted = twin.staging.pending
        assert counted == len(held.staged[0][2]) > 0
        assert twin.staging("a", events[11:]) is None  # a gap
        second = twin.staging("a", events[10:])
        assert second is not None
        twin.staging.release([first])
        assert [stretch[:2] for stretch in held.staged] == [(11, len(events))] and len(held.pending) == counted
        twin.staging.release([second])
        assert held.staged == [] and len(held.pending) == twin.staging.pending
