"""Fan-in, sequencing and shaping as pure code (no I/O): Koder agent stream §4 R1, R3, T2, T4, T5."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence

from runwire.core.envelope import DELTA_TYPES, Event, replace, ts_ms
from runwire.processing.checkpoint import decode_checkpoint, settle_windows
from runwire.processing.fanin import ParentMap
from runwire.processing.processor import Processor
from runwire.processing.sequencing import Sequencer
from runwire.processing.shaping import DeltaCoalescer, shape
from tests.workers.events import BASE, RunScript


class Streams:
    """Drives a Processor the way a runtime does, keeping each stream's appends and checkpoint."""

    def __init__(self, processor: Processor | None = None) -> None:
        self.processor = processor or Processor()
        self.raw: dict[str, list[Event]] = defaultdict(list)
        self.shaped: dict[str, list[Event]] = defaultdict(list)
        self.states: dict[str, bytes] = {}

    def feed(self, events: Sequence[Event]) -> None:
        for run_id in self.processor.missing(events):
            self.processor.restore(run_id, self.states.get(run_id), raw=self.raw[run_id])
        self._write(self.processor.process(events))

    def tick(self, now: float) -> None:
        self._write(self.processor.tick(now))

    def _write(self, outputs: dict) -> None:  # type: ignore[type-arg]
        for run_id, output in outputs.items():
            self.raw[run_id].extend(output.raw)
            last = self.shaped[run_id][-1].seq if self.shaped[run_id] else 0
            self.shaped[run_id].extend(e for e in output.shaped if e.seq > last)
            self.states[run_id] = output.state


def texts(events: Sequence[Event]) -> str:
    return "".join(e.payload_dict()["text"] for e in events if e.type in DELTA_TYPES)


def assert_contiguous(events: Sequence[Event]) -> None:
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


# ---- T4 / R1 ---------------------------------------------------------------


def test_t4_thousand_deltas_in_one_second_shape_to_at_most_ten_events() -> None:
    """T4 — "Throughput: 1000 deltas/run aggregated to ≤10/s by default", text intact."""
    run = RunScript("run_t4")
    raw = [replace(run.text(f"t{i};", ms=i), seq=i + 1) for i in range(1000)]
    shaped = shape(raw)
    assert len(shaped) <= 10
    assert texts(shaped) == "".join(f"t{i};" for i in range(1000))
    assert shaped[-1].span == (901, 1000)
    spans = [e.span for e in shaped]
    assert spans[0] is not None and spans[0][0] == 1
    for (first, last), event in zip(spans, shaped, strict=True):  # type: ignore[misc]
        assert event.seq == last and first <= last
    for before, after in zip(spans, spans[1:], strict=False):
        assert after[0] == before[1] + 1  # type: ignore[index]


def test_r1_windows_are_100ms_of_event_time_anchored_at_first_delta() -> None:
    """R1 — "Aggregation window: 100ms. Multiple deltas within the window concatenate text."""
    run = RunScript("run_r1")
    raw = [replace(run.text(c, ms=ms), seq=i + 1) for i, (c, ms) in enumerate(
        [("a", 0), ("b", 50), ("c", 99), ("d", 100), ("e", 150), ("f", 260)]
    )]
    shaped = shape(raw)
    assert [(texts([e]), e.span) for e in shaped] == [("abc", (1, 3)), ("de", (4, 5)), ("f", (6, 6))]


def test_reasoning_and_text_are_never_mixed_in_one_shaped_event() -> None:
    """Koder agent stream §1: "Text and reasoning never intermix in the same event" — each type has
    its own window, and a switch between them does not close the other's (§4 R1)."""
    run = RunScript("run_mix")
    raw = [
        replace(run.reasoning("r1", 0), seq=1),
        replace(run.text("t1", 10), seq=2),
        replace(run.reasoning("r2", 20), seq=3),
        replace(run.text("t2", 30), seq=4),
    ]
    shaped = shape(raw)
    assert [(e.type, texts([e]), e.seq, e.span) for e in shaped] == [
        ("reasoning.delta", "r1r2", 3, (1, 3)),
        ("text.delta", "t1t2", 4, (4, 4)),
    ]


def test_a_switch_between_reasoning_and_text_keeps_both_windows_and_spans_still_tile() -> None:
    """§4 R1 whatever the order of types: reasoning, text, reasoning again within one 100 ms window
    go out as one reasoning and one text event. The spans tile the seq space all the same
    (Koder agent stream §7 T2: each ``span[0]`` is the previous event's seq + 1), although the
    reasoning window's deltas lie on both sides of the text's."""
    run = RunScript("run_switch")
    raw = [replace(run.lifecycle("running", 0), seq=1)]
    raw += [replace(run.reasoning(f"r{i} ", 1 + i), seq=2 + i) for i in range(20)]
    raw += [replace(run.text(f"t{i} ", 30 + i), seq=22 + i) for i in range(20)]
    raw += [replace(run.reasoning(f"s{i} ", 60 + i), seq=42 + i) for i in range(20)]
    raw.append(replace(run.lifecycle("done", 90), seq=62))
    shaped = shape(raw)
    assert [(e.type, e.seq, e.span) for e in shaped] == [
        ("run.lifecycle", 1, None),
        ("text.delta", 41, (2, 41)),
        ("reasoning.delta", 61, (42, 61)),
        ("run.lifecycle", 62, None),
    ]
    assert texts(shaped[2:3]) == "".join(f"r{i} " for i in range(20)) + "".join(f"s{i} " for i in range(20))


# ---- R3 ----------------------------------------------------------------------


def test_r3_tool_start_right_after_deltas_flushes_them_first() -> None:
    """R3 — "tool.start / tool.end / step.boundary are never batched ... deliver immediately"."""
    run = RunScript("run_r3")
    coalescer = DeltaCoalescer()
    assert coalescer.feed(replace(run.text("Let me ", 0), seq=1)) == []
    assert coalescer.feed(replace(run.text("search", 5), seq=2)) == []
    out = coalescer.feed(replace(run.tool_start("c1", 6), seq=3))
    assert [(e.type, e.seq) for e in out] == [("text.delta", 2), ("tool.start", 3)]
    assert texts(out) == "Let me search"
    assert out[1].span is None  # non-delta events keep their raw seq, no span


def test_processor_tick_waits_until_the_stream_is_quiet() -> None:
    """While a stream's events keep arriving (a backlog), windows close by event time only."""
    now = [time.time()]
    streams = Streams(Processor(clock=lambda: now[0], quiet_s=0.25))
    run = RunScript("run_quiet")
    streams.feed([run.text("a", 0)])
    now[0] += 0.1
    streams.tick(now[0])
    assert streams.shaped["run_quiet"] == []  # window [0, 100) ended long ago, but not quiet
    now[0] += 0.2
    streams.tick(now[0])
    assert texts(streams.shaped["run_quiet"]) == "a"


def test_the_checkpoint_after_a_tick_is_ahead_of_the_one_before() -> None:
    """A tick closes windows without a new delivery seq; a successor that restored the
    checkpoint from before it would close the same deltas again (R1 text doubled)."""
    now = [time.time()]
    streams = Streams(Processor(clock=lambda: now[0], quiet_s=0.25))
    run = RunScript("run_ckpt")
    streams.feed([run.text("a", 0)])
    before = streams.states["run_ckpt"]
    now[0] += 1.0
    streams.tick(now[0])
    after = streams.states["run_ckpt"]
    assert texts(streams.shaped["run_ckpt"]) == "a"
    ahead = decode_checkpoint(after)
    behind = decode_checkpoint(before)
    assert ahead.sequencer.last_seq == behind.sequencer.last_seq  # no new delivery seq ...
    assert ahead.shaped_seq > behind.shaped_seq  # ... yet ahead: its windows are closed

    successor = Streams(Processor(clock=lambda: now[0]))
    successor.states["run_ckpt"] = after
    successor.feed([run.text("b", 2000), run.lifecycle("done", 2001)])
    assert texts(streams.shaped["run_ckpt"] + successor.shaped["run_ckpt"]) == "ab"


def test_a_successor_of_a_writer_that_died_after_a_ticks_shaped_append_keeps_spans_tiling() -> None:
    """A tick's shaped events are appended before the raw append that stores the checkpoint with the
    windows closed. A writer that died between the two left windows open in its checkpoint that
    clients already saw; the successor settles them against the shaped view's last seq, so a late
    delta opens a new window instead of sending the old one again with a span reaching back over the
    events since (Koder agent stream §7 T2)."""
    now = [time.time()]
    streams = Streams(Processor(clock=lambda: now[0], quiet_s=0.25))
    run = RunScript("run_died")
    streams.feed([run.lifecycle("running", 0), run.reasoning("r1 ", 10), run.text("t1 ", 20)])
    stale = streams.states["run_died"]  # both windows open
    now[0] += 1.0
    streams.tick(now[0])  # the shaped view now shows both windows ...
    shown = streams.shaped["run_died"]
    assert [(e.seq, e.span) for e in shown] == [(1, None), (2, (2, 2)), (3, (3, 3))]

    successor = Streams(Processor(clock=lambda: now[0]))
    successor.states["run_died"] = settle_windows(stale, shown)  # ... the checkpoint does not
    successor.shaped["run_died"] = list(shown)
    successor.feed([run.reasoning("r2 ", 30), run.lifecycle("done", 40)])
    assert [(e.seq, e.span) for e in successor.shaped["run_died"]] == [
        (1, None), (2, (2, 2)), (3, (3, 3)), (4, (4, 4)), (5, None)
    ]
    assert settle_windows(streams.states["run_died"], shown) == streams.states["run_died"]


def test_tick_closes_a_quiet_window_after_its_end() -> None:
    """A live tick flushes a window whose end passed, so the last words are not held back."""
    run = RunScript("run_tick")
    coalescer = DeltaCoalescer()
    event = replace(run.text("bye", 0), seq=1)
    coalescer.feed(event)
    start = ts_ms(event.ts)
    assert coalescer.tick(start + 99) == []
    assert texts(coalescer.tick(start + 100)) == "bye"
    assert not coalescer.pending


def test_shaped_seq_increases_when_windows_of_two_children_interleave() -> None:
    """Windows close in order of their last raw seq, so an idempotent append drops nothing."""
    a, b = RunScript("run_a"), RunScript("run_b")
    raw = [
        replace(a.text("a1", 0), seq=1, child_id="run_a"),
        replace(b.text("b1", 50), seq=2, child_id="run_b"),
        replace(a.text("a2", 60), seq=3, child_id="run_a"),
        replace(a.text("a3", 120), seq=4, child_id="run_a"),  # closes a's window [0, 100)
        replace(b.text("b2", 140), seq=5, child_id="run_b"),
    ]
    shaped = shape(raw)
    seqs = [e.seq for e in shaped]
    assert seqs == sorted(set(seqs))
    assert texts([e for e in shaped if e.child_id == "run_a"]) == "a1a2a3"
    assert texts([e for e in shaped if e.child_id == "run_b"]) == "b1b2"


# ---- determinism ---------------------------------------------------------------


def test_shape_of_the_raw_view_equals_the_live_shaped_view() -> None:
    """Shaping is a pure function of raw events and their timestamps: replay == live."""
    run = RunScript("run_det")
    batch = []
    for i in range(300):
        batch.append(run.text(f"{i} ", ms=i * 7))
        if i % 37 == 0:
            batch.append(run.tool_start(f"c{i}", ms=i * 7))
    batch.append(run.lifecycle("done", ms=2200))
    streams = Streams()
    for start in range(0, len(batch), 16):  # arrives in many small batches
        streams.feed(batch[start : start + 16])
    assert streams.shaped["run_det"] == shape(streams.raw["run_det"])
    assert texts(streams.shaped["run_det"]) == texts(batch)


# ---- fan-in / T5 -------------------------------------------------------------------


def test_t5_parent_interleaving_two_children_keeps_each_childs_order() -> None:
    """T5 — "parent stream intercalates child events without corrupting ordering per child_id"."""
    parent = RunScript("run_p")
    one, two = RunScript("run_c1", parent="run_p"), RunScript("run_c2", parent="run_p")
    events = [parent.lifecycle("running"), parent.spawn("run_c1"), parent.spawn("run_c2")]
    for i in range(50):
        events.append(one.tool_start(f"one-{i}", ms=i))
        events.append(two.tool_start(f"two-{i}", ms=i))
    streams = Streams()
    streams.feed(events)
    parent_stream = streams.raw["run_p"]
    assert_contiguous(parent_stream)
    for child in ("run_c1", "run_c2"):
        mine = [e for e in parent_stream if e.child_id == child]
        assert all(e.run_id == "run_p" for e in mine)
        prefix = "one" if child == "run_c1" else "two"
        assert [e.payload_dict()["call_id"] for e in mine] == [f"{prefix}-{i}" for i in range(50)]
        own = streams.raw[child]
        assert_contiguous(own)
        assert [e.id for e in own] == [e.id for e in mine]
        assert all(e.child_id is None for e in own)


def test_grandchild_events_reach_the_root_with_the_originating_child_id() -> None:
    """Fan-in is recursive: a grandchild's event is in its parent's and the root's stream."""
    root = RunScript("run_root")
    child = RunScript("run_child", parent="run_root")
    grandchild = RunScript("run_grand", parent="run_child", root="run_root")
    streams = Streams()
    streams.feed([root.spawn("run_child"), child.spawn("run_grand"), grandchild.tool_start("g1")])
    in_root = [e for e in streams.raw["run_root"] if e.type == "tool.start"]
    in_child = [e for e in streams.raw["run_child"] if e.type == "tool.start"]
    assert [(e.run_id, e.child_id) for e in in_root] == [("run_root", "run_grand")]
    assert [(e.run_id, e.child_id, e.parent_id) for e in in_child] == [
        ("run_child", "run_grand", "run_root")
    ]
    assert [e.type for e in streams.raw["run_grand"]] == ["tool.start"]


def test_unlinked_child_events_are_kept_in_their_own_stream_and_never_guessed() -> None:
    """A child event before the spawn, or with no known parent, is neither lost nor misattributed.

    An event with ``parent_id`` but no ``root_id`` is sharded by its own run id, so it
    may be on another worker than its parent: it stays in its own stream too.
    """
    early = RunScript("run_early")  # publishes before its parent announces it, no link
    parent = RunScript("run_par")
    streams = Streams()
    half_linked = replace(RunScript("run_half").tool_start("y"), parent_id="run_par")
    streams.feed([early.tool_start("x"), parent.spawn("run_early"), half_linked])
    assert [e.type for e in streams.raw["run_early"]] == ["tool.start"]
    assert [e.type for e in streams.raw["run_half"]] == ["tool.start"]
    assert [e.type for e in streams.raw["run_par"]] == ["child.spawn"]


def test_fanin_falls_back_to_parent_and_root_links_on_the_event() -> None:
    parents = ParentMap()
    grand = RunScript("g", parent="c", root="r").tool_start("1")
    assert parents.ancestors(grand) == ["c", "r"]
    parents.link("c", "p")
    parents.link("p", "r")
    assert parents.ancestors(grand) == ["c", "p", "r"]
    assert parents.ancestors(RunScript("x", parent="c").tool_start("1")) == ["c"]


def test_each_ancestors_copy_describes_that_ancestors_run() -> None:
    """A grandchild's event reaches every ancestor's stream as the ancestor's own run: ``child_id`` the
    grandchild, and the ancestor's parent/root links (the root's copy has none)."""
    streams = Streams()
    streams.feed([
        RunScript("p", parent="r", root="r").tool_start("p1"),
        RunScript("c", parent="p", root="r").tool_start("c1"),
        RunScript("g", parent="c", root="r").tool_start("g1"),
    ])
    copies = [next(e for e in streams.raw[run] if e.child_id == "g") for run in ("c", "p", "r")]
    assert [(e.run_id, e.child_id, e.parent_id, e.root_id) for e in copies] == [
        ("c", "g", "p", "r"),
        ("p", "g", "r", "r"),
        ("r", "g", None, None),
    ]


def test_a_link_learned_later_reaches_the_next_events_of_a_run_already_fanned_in() -> None:
    """Fan-in at any depth, whatever order the links arrive in: a grandchild's events,
    fanned in to ``c`` and the root while ``c``'s own parent was unknown, reach ``p``'s
    stream too once ``c``'s events link it to ``p`` (an earlier batch's chain is not reused)."""
    grand = RunScript("g", parent="c", root="r")
    middle = RunScript("c", parent="p", root="r")
    streams = Streams()
    streams.feed([RunScript("p", parent="r", root="r").tool_start("p1"), grand.tool_start("g1"),
                  grand.tool_start("g2")])
    streams.feed([middle.tool_start("c1")])
    streams.feed([grand.tool_start("g3"), grand.tool_start("g4")])

    def calls(run_id: str) -> list[str]:
        return [e.payload_dict()["call_id"] for e in streams.raw[run_id]
                if e.child_id == "g" and e.type == "tool.start"]

    assert calls("c") == calls("r") == ["g1", "g2", "g3", "g4"]
    assert calls("p") == ["g3", "g4"]
    assert [e.payload_dict()["call_id"] for e in streams.raw["p"] if e.child_id == "c"] == ["c1"]


# ---- sequencing: dedupe, T2 --------------------------------------------------------


def test_an_event_delivered_twice_appears_once() -> None:
    run = RunScript("run_dup")
    first, second = run.tool_start("a"), run.tool_start("b")
    streams = Streams()
    streams.feed([first, second, first])
    streams.feed([second])
    assert [e.payload_dict()["call_id"] for e in streams.raw["run_dup"]] == ["a", "b"]
    assert streams.processor.stats.duplicates == 2


def test_t2_publisher_gap_emits_a_visible_x_gap_event() -> None:
    """T2 — "client receiving events out-of-seq detects gap": the gap is in the stream itself."""
    run = RunScript("run_gap")
    events = [run.tool_start("a")]
    run.seq += 3  # publisher seqs 2..4 never arrive
    events.append(run.tool_start("b"))
    sequencer = Sequencer("run_gap")
    out = [e for event in events for e in sequencer.admit(event, "run_gap")]
    assert [(e.type, e.seq) for e in out] == [("tool.start", 1), ("x.gap", 2), ("tool.start", 3)]
    assert out[1].payload_dict() == {"run_id": "run_gap", "first": 2, "last": 4}
    assert sequencer.state.gaps == 1


# ---- crash recovery -----------------------------------------------------------------


def test_a_successor_resumes_sequencer_and_open_windows_from_the_checkpoint() -> None:
    """Kill the writer mid-window: a new Processor restored from checkpoints continues exactly."""
    run = RunScript("run_crash")
    child = RunScript("run_kid", parent="run_crash")
    events = [run.spawn("run_kid", 0)]
    for i in range(40):
        events.append(run.text(f"p{i} ", ms=i * 9))
        events.append(child.reasoning(f"k{i} ", ms=i * 9 + 1))
    events.append(run.tool_start("t", ms=400))
    events.append(run.lifecycle("done", ms=500))
    whole = Streams()
    whole.feed(events)

    first = Streams()
    first.feed(events[:33])  # ends inside open windows
    second = Streams(Processor())  # a new process: nothing in memory
    second.states = dict(first.states)
    second.raw, second.shaped = first.raw, first.shaped
    second.feed(events[20:])  # the unacked tail is delivered again, overlapping
    later = time.time() + 5  # quiet, and past every window's end: a live tick closes them
    whole.tick(later)
    second.tick(later)
    for run_id in ("run_crash", "run_kid"):
        assert second.raw[run_id] == whole.raw[run_id]
        assert second.shaped[run_id] == whole.shaped[run_id]
        assert second.shaped[run_id] == shape(second.raw[run_id])


# ---- silence ---------------------------------------------------------------------------


def test_a_silent_run_is_ended_with_an_error_and_its_state_dropped() -> None:
    """Every stream ends, with an error state when it must."""
    now = [BASE.timestamp()]
    processor = Processor(silence_s=1.0, clock=lambda: now[0])
    streams = Streams(processor)
    parent = RunScript("run_live")
    child = RunScript("run_dead", parent="run_live")
    streams.feed([parent.spawn("run_dead"), child.tool_start("x")])
    now[0] += 0.5
    streams.feed([parent.tool_start("still here")])
    now[0] += 0.6
    streams.tick(now[0])
    last = streams.raw["run_dead"][-1]
    assert (last.type, last.payload_dict()) == (
        "run.lifecycle",
        {"state": "error", "reason": "no events for 1s (agent presumed dead)"},
    )
    in_parent = streams.raw["run_live"][-1]
    assert (in_parent.type, in_parent.child_id) == ("run.lifecycle", "run_dead")
    assert processor.open_streams == 1  # the dead child's state is gone; the parent lives on
    now[0] += 1.1
    streams.tick(now[0])
    assert streams.raw["run_live"][-1].payload_dict()["state"] == "error"
    assert processor.open_streams == 0
