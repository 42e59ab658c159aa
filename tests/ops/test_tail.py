"""`runwire tail`: a run followed live from an edge's SSE stream."""

from __future__ import annotations

import asyncio
import subprocess
from typing import Any

import msgspec
import pytest
from rich.console import Console

from runwire.bus.memory.bus import MemoryBus
from runwire.core.envelope import make
from runwire.jobs.demo import DemoScript
from runwire.sdk.publisher import Publisher
from runwire.workers.tailview import RunView, plain_line
from tests.ops.conftest import RUNWIRE, TERMINAL, runwire_env, stream_events
from tests.ops.test_demo import _no_wait, published


def tail(
    base: str, run_id: str, *extra: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RUNWIRE, "tail", run_id, "--plain", "--url", base, *extra],
        capture_output=True,
        text=True,
        env=runwire_env(),
        timeout=timeout,
    )


def parse(lines: str) -> list[tuple[int, str, str, str]]:
    rows = []
    for line in lines.splitlines():
        seq, kind, child, *rest = line.split(" ", 3)
        rows.append((int(seq), kind, child, rest[0] if rest else ""))
    return rows


@pytest.mark.slow
def test_tail_plain_follows_a_run_live_to_its_end(start_up: Any) -> None:
    """One line per event, in seq order with no gap (detail=full), ending on the run's terminal event."""
    up = start_up("--demo", "--demo-rate", "2")
    run = up.wait_for_run()
    result = tail(up.base, run["run_id"], "--detail", "full")
    assert result.returncode == 0, result.stderr
    rows = parse(result.stdout)
    assert [r[0] for r in rows] == list(range(1, len(rows) + 1))
    seq, kind, child, summary = rows[-1]
    assert (kind, child) == ("run.lifecycle", "-")
    assert summary.split()[0] in TERMINAL
    assert [r[1] for r in rows] == [e["type"] for e in stream_events(up.base, run["run_id"])]


@pytest.mark.slow
def test_tail_of_a_finished_run_replays_it_and_exits(start_up: Any) -> None:
    up = start_up("--demo", "--demo-rate", "2")
    run = up.wait_for_run(terminal=True)
    result = tail(up.base, run["run_id"])
    assert result.returncode == 0, result.stderr
    assert parse(result.stdout)[-1][1] == "run.lifecycle"
    live = subprocess.run(
        [RUNWIRE, "tail", run["run_id"], "--url", up.base],
        capture_output=True,
        text=True,
        env=runwire_env(COLUMNS="160"),
        timeout=60,
    )
    assert live.returncode == 0, live.stderr
    assert f"run {run['run_id']}" in live.stdout
    assert run["state"] in live.stdout and "tools" in live.stdout and "run ended" in live.stdout


def test_tail_exits_with_an_error_when_the_edge_is_unreachable() -> None:
    result = tail("http://127.0.0.1:9", "r1", "--retry-for", "0.2")
    assert result.returncode == 1
    assert "unreachable" in result.stderr


async def demo_run_events() -> list[dict[str, Any]]:
    async with MemoryBus("memory://") as bus:
        async with Publisher(bus) as pub:
            await DemoScript(pub, seed=3, sleep=_no_wait).run("r0", 0)
        events = await published(bus)
    # As the parent's delivery stream shows them: child events fanned in with child_id.
    out = []
    for event in events:
        data = msgspec.to_builtins(event)
        if event.parent_id:
            data["child_id"], data["run_id"] = event.run_id, event.parent_id
        out.append(data)
    return out


def test_live_view_shows_tools_children_and_the_end() -> None:
    """The rich view: tool cards with status, duration and errors, child runs, lifecycle, tokens."""
    events = asyncio.run(demo_run_events())
    view = RunView("r0")
    for event in events:
        view.apply(event)
    console = Console(record=True, width=160)
    console.print(view.render())
    screen = console.export_text()
    assert view.ended and view.state == "done"
    assert "failed" in screen and "upstream unavailable" in screen
    assert "r0.c1" in screen and "r0.c2" in screen
    assert " ms" in screen
    assert view.input_tokens > 0 and f"tokens {view.input_tokens}/" in screen
    assert all(card.status in ("ok", "failed") for card in view.tools.values())
    assert all(child.state == "done" for child in view.children.values())
    assert plain_line(events[0]).startswith("1 run.lifecycle - planning")


async def publish_part(url: str, run_id: str, first: int, count: int, *, finish: bool) -> None:
    """Publish text deltas ``first``..``first+count-1`` of a run (seq = index), then maybe its end."""
    async with Publisher.connect(url) as pub:
        events = [
            make(
                "text.delta",
                {"text": f"w{i} "},
                id=f"evt_{run_id}_{i:05d}",
                ts="2026-01-01T00:00:00Z",
                run_id=run_id,
                seq=i,
            )
            for i in range(first, first + count)
        ]
        if finish:
            end = first + count
            events.append(
                make(
                    "run.lifecycle",
                    {"state": "done"},
                    id=f"evt_{run_id}_{end:05d}",
                    ts="2026-01-01T00:00:01Z",
                    run_id=run_id,
                    seq=end,
                )
            )
        await pub.publish_events(events)


@pytest.mark.slow
def test_tail_resumes_on_a_restarted_edge_without_gap_or_duplicate(
    start_up: Any, bus_on: Any, redis_url: str, tmp_path: Any
) -> None:
    """Koder agent stream §7 T3 from the terminal: after the edge goes away, tail reconnects with Last-Event-ID and
    continues at exactly seq + 1 on the new edge."""
    store = f"sqlite:///{tmp_path}/replay.db"
    bus = bus_on(redis_url)
    up = start_up("--bus", bus, "--store", store, "--group", "t3")
    asyncio.run(publish_part(bus, "t3run", 1, 50, finish=False))
    proc = subprocess.Popen(
        [RUNWIRE, "tail", "t3run", "--plain", "--detail", "full", "--url", up.base],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=runwire_env(),
    )
    assert proc.stdout is not None
    seen = [proc.stdout.readline() for _ in range(50)]
    assert seen[-1].startswith("50 text.delta")
    assert up.terminate() == 0
    start_up("--bus", bus, "--store", store, "--group", "t3", port=up.port)
    asyncio.run(publish_part(bus, "t3run", 51, 50, finish=True))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    rows = parse("".join(seen) + out)
    assert [r[0] for r in rows] == list(range(1, 102))
    assert [r[3] for r in rows[:100]] == [f'"w{i} "' for i in range(1, 101)]
    assert rows[-1][1:] == ("run.lifecycle", "-", "done")
    assert "resuming after 50" in err
