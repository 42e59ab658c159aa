"""``runwire replay …`` on SQLite and PostgreSQL: every subcommand, as a user runs it."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from runwire.bus import open_bus
from runwire.core import envelope
from runwire.core.envelope import Event
from runwire.jobs.replay import play_run
from runwire.store import open_store
from runwire.store.base import RunInfo
from runwire.workers.cli import main
from tests.events import event


def _runwire(*args: str) -> Result:
    return CliRunner().invoke(main, ["replay", *args], catch_exceptions=False)


def _with_params(url: str, params: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{params}"


def _sample_runs() -> list[Event]:
    """r1: a finished tool-using conversation of tenant acme; r2: an unfinished run of beta."""
    return [
        event("r1", 1, "x.cogency.user", {"content": "debug app.py"}, tenant="acme"),
        *(event("r1", seq, "text.delta", {"text": f"w{seq} "}, second=1 + seq / 100)
          for seq in range(2, 7)),
        event("r1", 7, "tool.start", {"call_id": "c1", "tool": "read", "input": {"f": "app.py"}}),
        event("r1", 8, "tool.end", {"call_id": "c1", "ok": False, "error": "missing"}),
        event("r1", 9, "x.usage", {"input_tokens": 12, "output_tokens": 5}),
        event("r1", 10, "run.lifecycle", {"state": "done"}),
        event("r2", 1, "text.delta", {"text": "hi"}, tenant="beta"),
    ]


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "runs.jsonl"
    path.write_bytes(b"".join(envelope.encode(e) + b"\n" for e in _sample_runs()))
    return path


@pytest.fixture
def loaded(store_url: str, jsonl: Path) -> str:
    """A store holding the sample runs, imported through the CLI."""
    result = _runwire("import", str(jsonl), "--store", store_url)
    assert result.exit_code == 0, result.output
    assert "11 events added, 2 runs, 0 bad lines" in result.output
    return store_url


def test_import_is_idempotent_and_reports_bad_lines(
    store_url: str, jsonl: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.jsonl"
    lines = jsonl.read_bytes().splitlines()
    bad.write_bytes(b"\n".join([*lines[:3], b'{"id": 1}', *lines[3:]]) + b"\n")
    result = _runwire("import", str(bad), "--store", store_url)
    assert result.exit_code == 1
    assert f"{bad}:4: KAI-STREAM-PROTO-0001" in result.stderr
    again = _runwire("import", str(jsonl), "--json", "--store", store_url)
    assert again.exit_code == 0
    assert json.loads(again.stdout)[str(jsonl)]["added"] == 0


def test_ls_filters_by_tenant_and_state(loaded: str) -> None:
    every = json.loads(_runwire("ls", "--json", "--store", loaded).stdout)
    assert {(r["run_id"], r["tenant"], r["state"], r["events"]) for r in every} == {
        ("r1", "acme", "done", 10), ("r2", "beta", None, 1)}
    acme = json.loads(_runwire("ls", "--json", "--tenant", "acme", "--store", loaded).stdout)
    assert [r["run_id"] for r in acme] == ["r1"]
    done = json.loads(_runwire("ls", "--json", "--state", "done", "--store", loaded).stdout)
    assert [r["run_id"] for r in done] == ["r1"]
    future = _runwire("ls", "--json", "--since", "2999-01-01", "--store", loaded)
    assert json.loads(future.stdout) == []
    table = _runwire("ls", "--since", "1h", "--store", loaded)
    assert table.exit_code == 0 and "r1" in table.stdout and "acme" in table.stdout


LONG = "run-" + "0123456789abcdef" * 5  # a run id longer than a default 80-column table


def test_tables_are_not_cut_at_80_columns(store_url: str) -> None:
    """Piped (not a terminal), ``ls`` and ``stats`` print whole rows at their natural width; in
    a narrow terminal a run id folds onto more lines but keeps every character."""
    from rich.console import Console

    from runwire.workers.commands.replay import _runs_table

    async def stored() -> list[RunInfo]:
        async with open_store(store_url) as log:
            await log.append([event(LONG, 1, tenant="acme"), event(LONG, 2, "run.lifecycle", {"state": "done"})])
            return await log.runs()

    runs = asyncio.run(stored())
    for args in (("ls",), ("stats", LONG)):
        out = _runwire(*args, "--store", store_url).stdout
        assert LONG in out and "…" not in out, out
        assert max(map(len, out.splitlines())) > 80
    narrow = Console(width=60, record=True, force_terminal=True)
    narrow.print(_runs_table(runs))
    text = narrow.export_text()
    assert LONG in "".join(line.split("│")[1].strip() for line in text.splitlines() if "│" in line)


def test_export_streams_many_runs_as_imported(loaded: str, jsonl: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    result = _runwire("export", "r1", "r2", "-o", str(out), "--store", loaded)
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == jsonl.read_bytes()


def test_export_shaped_in_another_format(loaded: str) -> None:
    """--detail shaped coalesces the five deltas (Koder agent stream §4 R1); --format renders cogency frames."""
    result = _runwire("export", "r1", "--detail", "shaped", "--format", "cogency",
                      "--store", loaded)
    assert result.exit_code == 0, result.output
    frames = [json.loads(line) for line in result.stdout.splitlines()]
    assert [f["type"] for f in frames] == [
        "user", "respond", "call", "result", "metric", "end"]
    assert frames[1]["content"] == "w2 w3 w4 w5 w6 "


def test_messages_prints_the_chat(loaded: str) -> None:
    result = _runwire("messages", "r1", "--store", loaded)
    assert result.exit_code == 0, result.output
    messages = json.loads(result.stdout)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["content"] == "w2 w3 w4 w5 w6 "
    assert messages[1]["tool_calls"][0]["function"] == {
        "name": "read", "arguments": '{"f": "app.py"}'}
    assert messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "missing"}


def test_stats_per_run(loaded: str) -> None:
    result = _runwire("stats", "r1", "r2", "--json", "--store", loaded)
    assert result.exit_code == 0, result.output
    r1, r2 = json.loads(result.stdout)
    assert r1["by_type"] == {"run.lifecycle": 1, "text.delta": 5, "tool.end": 1,
                             "tool.start": 1, "x.cogency.user": 1, "x.usage": 1}
    assert (r1["tool_calls"], r1["tool_errors"], r1["input_tokens"], r1["output_tokens"]) == (
        1, 1, 12, 5)
    assert r1["duration_ms"] == 9000 and r1["state"] == "done"
    assert r2["events"] == 1 and r2["state"] is None
    assert "r1" in _runwire("stats", "r1", "--store", loaded).stdout


def test_sweep_dry_run_then_delete(loaded: str) -> None:
    """Unfinished runs expire by last activity: with 0 days kept, r2 goes; r1 (done) stays."""
    url = _with_params(loaded, "retention_unfinished_days=0")
    preview = json.loads(_runwire("sweep", "--dry-run", "--json", "--store", url).stdout)
    assert preview == {"dry_run": True, "runs": ["r2"], "events": 1}
    assert len(json.loads(_runwire("ls", "--json", "--store", url).stdout)) == 2
    result = _runwire("sweep", "--store", url)
    assert result.exit_code == 0 and "deleted 1 runs (1 events)" in result.stdout
    assert [r["run_id"] for r in json.loads(_runwire("ls", "--json", "--store", url).stdout)] == [
        "r1"]


@pytest.mark.parametrize("command", ["export", "messages", "stats"])
def test_unknown_or_expired_run_exits_1(loaded: str, command: str) -> None:
    unknown = _runwire(command, "nope", "--store", loaded)
    assert unknown.exit_code == 1
    assert "unknown run 'nope'" in unknown.stderr
    expired = _runwire(command, "r1", "--store", _with_params(loaded, "retention_done_days=0"))
    assert expired.exit_code == 1
    assert "run 'r1' expired" in expired.stderr


def test_play_of_an_unknown_run_exits_1(loaded: str) -> None:
    result = _runwire("play", "nope", "--bus", "memory://", "--store", loaded)
    assert result.exit_code == 1 and "unknown run 'nope'" in result.stderr


async def _published(bus_url: str, group: str, count: int) -> list[Event]:
    out: list[Event] = []
    async with open_bus(bus_url) as bus:
        consumer = bus.consumer(group, "reader")
        for _ in range(50):
            deliveries = await consumer.fetch(max_count=100, block_ms=200)
            out.extend(envelope.decode(d.data) for d in deliveries)
            await consumer.ack(deliveries)
            if len(out) >= count:
                break
        await consumer.close()
    return out


async def _join(bus_url: str, group: str) -> None:
    async with open_bus(bus_url) as bus:
        await bus.consumer(group, "reader").close()


def test_play_republishes_onto_redis(loaded: str, redis_url: str) -> None:
    """Re-published as publisher events: seq from 1 under the new id, original timing scaled."""
    bus_url = _with_params(redis_url, f"prefix=play{uuid.uuid4().hex[:8]}")
    asyncio.run(_join(bus_url, "g"))
    result = _runwire("play", "r1", "--bus", bus_url, "--speed", "4", "--as", "copy",
                      "--store", loaded)
    assert result.exit_code == 0, result.output
    events = asyncio.run(_published(bus_url, "g", 10))
    originals = [e for e in _sample_runs() if e.run_id == "r1"]
    assert [(e.run_id, e.seq, e.type) for e in events] == [
        ("copy", i, e.type) for i, e in enumerate(originals, start=1)]
    assert [e.payload_dict() for e in events] == [e.payload_dict() for e in originals]
    span_ms = envelope.ts_ms(events[-1].ts) - envelope.ts_ms(events[0].ts)
    assert span_ms >= 9000 / 4 - 50  # the original 9 s, four times faster


async def test_play_keeps_relative_timing_and_plays_child_events_as_the_child_run(
    new_store_url: Callable[[], str],
) -> None:
    stored = [
        event("p", 1, second=0.0),
        event("p", 2, child_id="kid", second=0.1),
        event("p", 3, "x.gap", {"run_id": "p", "first": 9, "last": 9}, second=0.2),
        event("p", 4, second=0.6),
    ]
    async with open_store(new_store_url()) as log, open_bus("memory://") as bus:
        await log.append(stored)
        consumer = bus.consumer("g", "c")
        assert await play_run(log, bus, "p", speed=2) == 3
        got = [envelope.decode(d.data) for d in await consumer.fetch(block_ms=100)]
    assert [(e.run_id, e.seq, e.parent_id, e.root_id, e.child_id) for e in got] == [
        ("p", 1, None, None, None), ("kid", 1, "p", "p", None), ("p", 2, None, None, None)]
    assert envelope.ts_ms(got[2].ts) - envelope.ts_ms(got[0].ts) >= 290


def test_export_speaks_every_egress_format(loaded: str) -> None:
    """Each egress format renders a stored run: one JSON frame a line."""
    from runwire.protocols import EGRESS

    for name in sorted(EGRESS):
        result = _runwire("export", "r1", "--format", name, "--store", loaded)
        assert result.exit_code == 0, (name, result.output)
        frames = [json.loads(line) for line in result.stdout.splitlines()]
        assert frames, name
    unknown = _runwire("export", "r1", "--format", "nope", "--store", loaded)
    assert unknown.exit_code == 1 and "unknown egress format 'nope'" in unknown.stderr
