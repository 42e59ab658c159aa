"""Shaping for any input (pure code): Koder agent stream §4 R1/R3 and §7 T2 on the shaped view.

Alternating reasoning and text, several children streaming at once, a child whose clock lags,
a worker that dies with windows open, a replay log with a hole: at most 10 shaped deltas a second
per (child, type) between control events, every character once, spans that tile the seq space,
and the live path equal to ``shape()``.
"""

from __future__ import annotations

import copy
import random

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from runwire.core.envelope import Event, replace, ts_ms
from runwire.processing.checkpoint import decode_checkpoint, settle_windows
from runwire.processing.processor import Processor
from runwire.processing.shaping import DeltaCoalescer, is_delta, shape
from tests.shaped_checks import as_dicts, max_per_second, r1_excess, t2_problems, texts
from tests.workers.events import BASE, RunScript
from tests.workers.test_logic import Streams


def published(children: int, *, seconds: float = 2.0, rate: int = 1000, seed: int = 0,
              lag_ms: float = 0.0) -> list[Event]:
    """What ``children`` sources publish (the run itself first, then its children), each
    alternating reasoning and text deltas, ~``rate`` deltas a second in all with a 4 ms pause
    every tenth event, between the run's running and done; the last child's clock lags by
    ``lag_ms``."""
    rng = random.Random(seed)
    root = RunScript("run_alt")
    sources = [root] + [RunScript(f"run_alt_c{i}", parent="run_alt") for i in range(1, children)]
    events = [root.lifecycle("running", 0)]
    events += [root.spawn(child.run_id, 0) for child in sources[1:]]
    ms = 1.0
    for index in range(int(seconds * rate)):
        which = index % len(sources)
        script = sources[which]
        kind = script.reasoning if (index // len(sources)) % 2 else script.text
        ms += rng.choice((0.3, 0.6, 0.6, 0.9)) * 1000 / rate  # 0.6 on average, pauses included: 1
        if index % 10 == 9:
            ms += 4
        lag = lag_ms if which and which == len(sources) - 1 else 0.0
        events.append(kind(f"{which}:{index};", ms - lag))
    events.append(root.lifecycle("done", ms + 1))
    return events


def alternating(children: int, **options: float) -> list[Event]:
    """The run's raw view (its delivery stream) of :func:`published`."""
    streams = Streams()
    streams.feed(published(children, **options))  # type: ignore[arg-type]
    return streams.raw["run_alt"]


def assert_shaped_view(raw: list[Event], shaped: list[Event]) -> None:
    """R1 (≤ 10/s per child and type between control events), every character once, R3, T2."""
    got, want = as_dicts(shaped), as_dicts(raw)
    assert r1_excess(got) == [], max_per_second(got)
    assert texts(got) == texts(want)
    assert [e for e in shaped if not is_delta(e)] == [e for e in raw if not is_delta(e)]
    assert t2_problems(got) == []


def test_r1_alternating_reasoning_and_text_at_1000_deltas_a_second() -> None:
    """The run alternates reasoning and text deltas for 2 s: about 10 shaped deltas a second per
    type (not one per raw delta), every character kept, spans tiling the seq space."""
    raw = alternating(1)
    shaped = shape(raw)
    assert_shaped_view(raw, shaped)
    assert max_per_second(as_dicts(shaped)) == 10
    per_type = {kind: sum(e.type == kind for e in shaped) for kind in ("reasoning.delta", "text.delta")}
    assert all(18 <= count <= 22 for count in per_type.values()), per_type


def test_r1_three_children_streaming_at_once() -> None:
    """The parent stream interleaves three sources, each alternating both types."""
    raw = alternating(3)
    shaped = shape(raw)
    assert_shaped_view(raw, shaped)
    keys = {(e.child_id, e.type) for e in shaped if is_delta(e)}
    assert len(keys) == 6
    assert len([e for e in shaped if is_delta(e)]) <= 6 * 21  # 2 s: 20 windows per child and type


def test_r1_holds_for_a_child_whose_clock_lags() -> None:
    """A child 300 ms behind the others: windows run on the stream's clock (the latest delta's
    ``ts``), so the lagging child's windows are not cut short by the others' later timestamps."""
    raw = alternating(3, lag_ms=300)
    assert_shaped_view(raw, shape(raw))


def quiet_child() -> list[Event]:
    """Child a streams one delta and goes quiet inside b's first window; b goes on streaming."""
    a, b = RunScript("a"), RunScript("b")
    stamps = [("b", 0), ("a", 10), ("b", 50), ("b", 100), ("b", 130), ("b", 160), ("b", 190), ("b", 220)]
    scripts = {"a": a, "b": b}
    return [replace(scripts[who].text(f"{who}{seq}", ms), seq=seq, child_id=who)
            for seq, (who, ms) in enumerate(stamps, start=1)]


def test_a_window_that_went_quiet_holds_back_later_ones_so_seq_increases() -> None:
    """b's first window ends (100 ms) while a's, opened later, is still open and holds an earlier
    raw seq: b's waits for it, so the shaped stream's seq increases and no append is dropped;
    neither window is cut short (R1)."""
    raw = quiet_child()
    coalescer = DeltaCoalescer()
    assert [e for event in raw[:4] for e in coalescer.feed(event)] == []
    assert [w.last_seq for w in coalescer.state.held] == [3]  # b's first window, waiting for a's
    out = coalescer.feed(raw[4])  # 130 ms: a's window ends too, both go out
    assert [(e.child_id, e.seq, e.span, e.payload.text) for e in out] == [  # type: ignore[union-attr]
        ("a", 2, (1, 2), "a2"), ("b", 3, (3, 3), "b1b3")
    ]
    shaped = shape(raw)
    assert [(e.child_id, e.seq, e.span) for e in shaped] == [
        ("a", 2, (1, 2)), ("b", 3, (3, 3)), ("b", 7, (4, 7)), ("b", 8, (8, 8))
    ]
    assert t2_problems(as_dicts(shaped)) == []


def test_the_live_path_in_batches_with_ticks_equals_shape() -> None:
    """The worker's processor, fed in small batches with ticks between, gives ``shape(raw)``."""
    events = published(3, seconds=1.0)
    now = BASE.timestamp()  # the events' own time: each tick finds the stream busy, as live
    streams = Streams(Processor(clock=lambda: now))
    for start in range(0, len(events), 37):
        streams.feed(events[start : start + 37])
        streams.tick(now)
    raw = streams.raw["run_alt"]
    assert streams.shaped["run_alt"] == shape(raw)
    assert_shaped_view(raw, streams.shaped["run_alt"])


def test_a_successor_restored_mid_run_with_windows_held_continues_exactly() -> None:
    """A checkpoint taken while windows are open and held (a worker SIGKILLed there) restores to
    the same shaped view: spans go on tiling, no text twice, none lost."""
    raw = quiet_child()
    first = DeltaCoalescer()
    sent = [e for event in raw[:4] for e in first.feed(event)]
    assert first.state.held and first.state.windows
    stored = msgspec.msgpack.encode(first.state)
    successor = DeltaCoalescer(msgspec.msgpack.decode(stored, type=type(first.state)), floor=first.floor,
                                raw=raw[:4])
    sent += [e for event in raw[4:] for e in successor.feed(event)] + successor.flush()
    assert sent == shape(raw)


def test_shaping_from_a_control_event_equals_the_live_view_after_it() -> None:
    """Every window is closed after a non-delta event, so ``shape(after=that seq)`` of the events
    after it is exactly the tail of the whole run's shaped view (a catch-up costs the stretch)."""
    raw = alternating(3, seconds=0.5)
    middle = len(raw) // 2
    raw[middle] = replace(RunScript("run_alt").tool_start("call-1", 250), seq=middle + 1)
    whole = shape(raw)
    tail = shape(raw[middle + 1 :], after=middle + 1)
    assert tail == [e for e in whole if e.seq > middle + 1]


def test_t2_a_hole_in_the_raw_input_stays_visible_in_the_shaped_view() -> None:
    """A replay log missing raw seqs 5..7: no shaped span covers them, so a client sees the gap."""
    run = RunScript("run_hole")
    raw = [replace(run.text(f"t{i}", i), seq=i) for i in range(1, 11)]
    shaped = shape(raw[:4] + raw[7:])
    assert t2_problems(as_dicts(shaped)) == ["seq 10: span starts at 8, after 4: seqs 5..7 are missing"]
    assert t2_problems(as_dicts(shape(raw[3:]))) == [
        "seq 10: span starts at 4, after 0: seqs 1..3 are missing"
    ]


def test_t2_the_client_checker_catches_a_dropped_shaped_event() -> None:
    """The checker a client runs on the shaped view finds one shaped event taken out of it."""
    raw = alternating(3, seconds=0.5)
    shaped = as_dicts(shape(raw))
    assert t2_problems(shaped) == []
    dropped = shaped[:7] + shaped[8:]
    problems = t2_problems(dropped)
    assert len(problems) == 1 and "missing" in problems[0]
    resumed = [e for e in shaped if e["seq"] > shaped[9]["seq"]]
    assert t2_problems(resumed, after=shaped[9]["seq"]) == []


def test_a_writer_that_died_between_its_shaped_and_raw_appends_is_continued_exactly() -> None:
    """The writer shaped a batch and appended its shaped events, then died before the raw append
    that stores its checkpoint. The successor restores the older checkpoint and gets the batch
    again; the windows close where the shaped view shows they did, so a window whose deltas lie on
    both sides of the checkpoint is not sent twice (R1: every character once) and spans go on
    tiling (T2)."""
    root = RunScript("run")
    a, b = RunScript("a", parent="run"), RunScript("b", parent="run")
    scripts = {"a": a, "b": b}
    published = [root.spawn("a"), root.spawn("b")]
    stamps = [("a", 0), ("a", 50), ("b", 100), ("a", 120), ("b", 250), ("a", 260)]
    published += [scripts[who].text(f"{who}{n};", ms) for n, (who, ms) in enumerate(stamps)]
    published.append(root.lifecycle("done", 300))
    whole = Streams()
    whole.feed(published)
    writer = Streams()
    writer.feed(published[:3])  # checkpoint: a's window open with a0
    checkpoint = writer.states["run"]
    dead = Streams()
    dead.states, dead.raw = dict(writer.states), copy.deepcopy(writer.raw)  # (the log has the raw events)
    dead.feed(published[3:6])  # a's window takes a1 and closes at 100 ms: sent
    sent = dead.shaped["run"]
    assert [(e.seq, e.payload.text) for e in sent] == [(4, "a0;a1;")]  # type: ignore[union-attr]
    successor = Streams()
    successor.states, successor.raw = dict(dead.states), copy.deepcopy(writer.raw)
    successor.states["run"] = settle_windows(checkpoint, sent)  # the raw append never happened
    successor.shaped["run"] = list(writer.shaped["run"]) + list(sent)
    successor.feed(published[3:])  # the unacked batch again, then the rest
    assert successor.shaped["run"] == whole.shaped["run"] == shape(whole.raw["run"])
    assert texts(as_dicts(successor.shaped["run"])) == texts(as_dicts(whole.raw["run"]))


@st.composite
def streams_of_events(draw: st.DrawFn) -> list[Event]:
    """A parent's published events: up to four sources (the run first), deltas of either type in
    any order, control events anywhere, timestamps that jitter, lag and jump."""
    sources = draw(st.integers(1, 4))
    root = RunScript("run_any")
    scripts = [root] + [RunScript(f"run_any_c{i}", parent="run_any") for i in range(1, sources)]
    events = [root.lifecycle("running", 0)] + [root.spawn(s.run_id, 0) for s in scripts[1:]]
    lags = [0.0] + [draw(st.sampled_from([0.0, 3.0, 40.0, 300.0])) for _ in scripts[1:]]
    ms = 1.0
    for step in draw(st.lists(st.tuples(st.integers(0, sources - 1), st.integers(0, 20),
                                        st.floats(0, 60)), min_size=1, max_size=400)):
        which, kind, gap = step
        ms += gap
        script = scripts[which]
        if kind == 0:
            events.append(script.tool_start(f"call-{len(events)}", ms - lags[which]))
        else:
            delta = script.reasoning if kind % 2 else script.text
            events.append(delta(f"{which}.{len(events)};", ms - lags[which]))
    events.append(root.lifecycle("done", ms + 1))
    return events


@settings(max_examples=150, deadline=None)
@given(streams_of_events(), st.data())
def test_any_input_r1_t2_every_character_once_and_live_equals_shape(
    events: list[Event], data: st.DataObject
) -> None:
    """For any order of types, sources, control events and timestamps: R1 between control events
    (≤ 10 shaped deltas a second per child and type, by their ``ts``), every character once, R3,
    spans that tile (T2) — and the live path, in random batches with a worker replaced at a random
    point (restored from its checkpoint), gives exactly ``shape(raw)``."""
    whole = Streams()
    whole.feed(events)
    raw = whole.raw["run_any"]
    shaped = shape(raw)
    assert_shaped_view(raw, shaped)
    assert whole.shaped["run_any"] == shaped
    cut = data.draw(st.integers(0, len(events)))
    size = data.draw(st.integers(1, 50))
    first, second = Streams(), Streams()
    for start in range(0, cut, size):
        first.feed(events[start : min(cut, start + size)])
    second.states = dict(first.states)  # a new process: only the checkpoints ...
    second.raw = copy.deepcopy(first.raw)  # ... and the raw events stored (the replay log)
    for start in range(cut, len(events), size):
        second.feed(events[start : start + size])
    assert first.shaped["run_any"] + second.shaped["run_any"] == shaped


def test_a_delta_stamped_before_the_end_of_a_window_a_tick_closed_opens_the_next_at_that_end() -> None:
    """Live, a tick closes a window once the wall clock passed its end; a delta that arrives later
    but is stamped earlier (a lagging publisher) opens the next window at that end, not before it,
    so the two shaped deltas stay 100 ms apart (R1)."""
    run = RunScript("run_late")
    coalescer = DeltaCoalescer()
    first = replace(run.text("a", 0), seq=1)
    coalescer.feed(first)
    start = ts_ms(first.ts)
    closed = coalescer.tick(start + 200)
    coalescer.feed(replace(run.text("b", 50), seq=2))
    later = coalescer.flush()
    assert [e.payload.text for e in closed + later] == ["a", "b"]  # type: ignore[union-attr]
    assert ts_ms(later[0].ts) - ts_ms(closed[0].ts) == 100
    assert t2_problems(as_dicts(closed + later)) == []


def test_a_checkpoint_keeps_its_windows_spans_not_their_deltas() -> None:
    """A window's deltas are in the raw view already: the checkpoint holds the window's span of
    raw seqs, so it stays small however much text waits in it (here 200 KB), and a successor
    given the raw events stored continues exactly (R1: every character once)."""
    run = RunScript("run_big")
    events = [run.text("x" * 1000 + f"{i};", ms=i // 4) for i in range(200)]
    events.append(run.lifecycle("done", 100))
    whole = Streams()
    whole.feed(events)
    first = Streams()
    first.feed(events[:150])
    state = first.states["run_big"]
    assert len(state) < 1000
    windows = decode_checkpoint(state).shaper.windows
    assert [(window.first_seq, window.last_seq) for window in windows.values()] == [(1, 150)]
    second = Streams()
    second.states, second.raw = dict(first.states), copy.deepcopy(first.raw)
    second.feed(events[150:])
    assert first.shaped["run_big"] + second.shaped["run_big"] == whole.shaped["run_big"]
    assert whole.shaped["run_big"] == shape(whole.raw["run_big"])
    assert texts(as_dicts(whole.shaped["run_big"])) == {
        (None, "text.delta"): "".join("x" * 1000 + f"{i};" for i in range(200))}


def test_a_checkpoint_of_the_version_before_with_window_texts_is_continued_exactly() -> None:
    """Checkpoints written before windows kept spans held each window's newest delta and texts
    (on a bus or in a replay log when a worker is upgraded): restored, they continue exactly."""
    run = RunScript("run_old")
    events = [run.text(f"t{i};", ms=i * 10) for i in range(12)] + [run.lifecycle("done", 200)]
    whole = Streams()
    whole.feed(events)
    first = Streams()
    first.feed(events[:5])
    old = msgspec.msgpack.decode(first.states["run_old"])
    raw = first.raw["run_old"]
    windows = old["shaper"]["windows"]
    assert windows
    for window in windows.values():
        spanned = raw[window["first_seq"] - 1 : window.pop("last_seq")]
        window["last"] = msgspec.to_builtins(spanned[-1])
        window["texts"] = [event.payload.text for event in spanned]  # type: ignore[union-attr]
    second = Streams()
    second.states, second.raw = {"run_old": msgspec.msgpack.encode(old)}, copy.deepcopy(first.raw)
    second.feed(events[5:])
    assert first.shaped["run_old"] + second.shaped["run_old"] == whole.shaped["run_old"]
    assert texts(as_dicts(whole.shaped["run_old"])) == {(None, "text.delta"): "".join(f"t{i};" for i in range(12))}
