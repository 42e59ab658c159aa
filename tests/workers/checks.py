"""A run-tree workload and the checks every runtime test makes on what the workers wrote."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from runwire.bus import Bus
from runwire.core.envelope import DELTA_TYPES, Event
from runwire.processing.shaping import shape
from runwire.store import ReplayLog
from tests.workers.events import RunScript


def run_tree(prefix: str, *, deltas: int = 30, children: int = 2) -> tuple[list[Event], dict[str, list[str]]]:
    """One root run with ``children`` children and a grandchild, interleaved like a live agent.

    Returns the events in publish order and each run's ancestors (parent first).
    """
    root = f"{prefix}_root"
    ancestry: dict[str, list[str]] = {root: []}
    scripts = {root: RunScript(root)}
    events = [scripts[root].lifecycle("running", 0)]
    for index in range(children):
        child = f"{prefix}_c{index}"
        scripts[child] = RunScript(child, parent=root)
        ancestry[child] = [root]
        events.append(scripts[root].spawn(child, index))
    grand = f"{prefix}_g"
    first_child = f"{prefix}_c0"
    scripts[grand] = RunScript(grand, parent=first_child, root=root)
    ancestry[grand] = [first_child, root]
    events.append(scripts[first_child].spawn(grand, 5))
    ms = 10.0
    for step in range(deltas):
        for run_id, script in scripts.items():
            ms += 3
            kind = script.reasoning if step % 2 else script.text
            events.append(kind(f"{run_id}:{step} ", ms))
            if step % 10 == 9:
                events.append(script.tool_start(f"{run_id}-call-{step}", ms))
    for run_id in [grand, *[f"{prefix}_c{i}" for i in range(children)], root]:
        ms += 1
        events.append(scripts[run_id].lifecycle("done", ms))
    return events, ancestry


def expected_streams(
    events: Sequence[Event], ancestry: dict[str, list[str]]
) -> dict[str, list[tuple[str, str]]]:
    """Per stream, the (origin run, event id) pairs it must hold, in publish order."""
    streams: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for event in events:
        for run_id in [event.run_id, *ancestry[event.run_id]]:
            streams[run_id].append((event.run_id, event.id))
    return streams


async def assert_delivered_exactly_once(
    bus: Bus,
    store: ReplayLog,
    events: Sequence[Event],
    ancestry: dict[str, list[str]],
    *,
    exact_shape: bool = True,
) -> None:
    """Every published event in every stream it belongs to and in the replay log, once, in order.

    Also: delivery seq contiguous from 1 (invariant 3), per-child order in
    a parent (Koder agent stream §7 T5), and the shaped view holding R1/R3 — equal to shaping the raw
    view when ``exact_shape`` (no crash: every window closed by event time).
    """
    for run_id, wanted in expected_streams(events, ancestry).items():
        raw = await read_all(bus, run_id)
        assert [e.seq for e in raw] == list(range(1, len(raw) + 1)), f"{run_id}: seq not contiguous"
        got = [(e.child_id or e.run_id, e.id) for e in raw if e.type != "x.gap"]
        missing = sorted(set(wanted) - set(got))
        extra = len(got) - len(set(got))
        gaps = [e.payload_dict() for e in raw if e.type == "x.gap"]
        assert sorted(got) == sorted(wanted), (
            f"{run_id}: events missing {missing[:5]} ({len(missing)}), {extra} duplicated, gaps {gaps}"
        )
        for origin in {origin for origin, _ in wanted}:
            assert [i for o, i in got if o == origin] == [i for o, i in wanted if o == origin]
        assert not [e for e in raw if e.type == "x.gap"], f"{run_id}: unexpected gap"
        logged = await store.read(run_id)
        assert [(e.seq, e.id) for e in logged] == [(e.seq, e.id) for e in raw], run_id
        shaped = await bus.read((run_id, "shaped"), 0, limit=100_000)
        if exact_shape:
            assert shaped == shape(raw), f"{run_id}: shaped view differs from shape(raw)"
        assert_r1_r3(raw, shaped)


def assert_r1_r3(raw: Sequence[Event], shaped: Sequence[Event]) -> None:
    """R1: shaped deltas carry every raw delta's text; R3: non-delta events all present, in order."""
    def text_of(events: Sequence[Event], child: str | None, kind: str) -> str:
        return "".join(
            e.payload_dict()["text"] for e in events if e.type == kind and e.child_id == child
        )

    for child in {e.child_id for e in raw}:
        for kind in DELTA_TYPES:
            got, want = text_of(shaped, child, kind), text_of(raw, child, kind)
            if got != want:
                at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                          min(len(got), len(want)))
                covered = sorted(s for e in shaped if e.type == kind and e.child_id == child
                                 for s in range(e.span[0], e.span[1] + 1) if e.span)
                raw_seqs = [e.seq for e in raw if e.type == kind and e.child_id == child]
                raise AssertionError(
                    f"R1: {kind} of child {child!r} in {raw[0].run_id}: shaped text has "
                    f"{len(got)} chars, raw {len(want)}, first difference at {at}; raw seqs "
                    f"not covered by a shaped span: {sorted(set(raw_seqs) - set(covered))[:20]}; "
                    f"covered twice: {sorted({s for s in covered if covered.count(s) > 1})[:20]}")
    assert [e for e in shaped if e.type not in DELTA_TYPES] == [
        e for e in raw if e.type not in DELTA_TYPES
    ]
    seqs = [e.seq for e in shaped]
    assert seqs == sorted(set(seqs))


async def read_all(bus: Bus, run_id: str) -> list[Event]:
    out: list[Event] = []
    while True:
        page = await bus.read((run_id, "raw"), out[-1].seq if out else 0, limit=1000)
        if not page:
            return out
        out.extend(page)
