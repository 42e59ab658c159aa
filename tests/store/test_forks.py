"""Forks in the replay log, on SQLite and PostgreSQL: the fork job, its records, retention and
``runwire replay fork`` / ``replay export`` as a user runs them."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest
from click.testing import CliRunner, Result

from runwire.core.errors import RequestError, UnknownRun
from runwire.jobs.fork import RunExists, fork_run
from runwire.processing.checkpoint import decode_checkpoint
from runwire.store import open_store
from runwire.store.base import ForkPoint
from runwire.workers.cli import main
from tests.events import T0, event

from .conftest import Clock


def _source(run_id: str = "src", tenant: str = "acme") -> list:  # type: ignore[type-arg]
    """A root run with a child's events fanned in (``child_id`` set), ended ``done``."""
    return [
        event(run_id, 1, "run.lifecycle", {"state": "running"}, tenant=tenant),
        event(run_id, 2, "child.spawn", {"child_id": "kid"}, tenant=tenant),
        event(run_id, 3, "text.delta", {"text": "from the kid"}, child_id="kid", tenant=tenant),
        event(run_id, 4, "text.delta", {"text": "hello "}, tenant=tenant),
        event(run_id, 5, "tool.start", {"call_id": "c1", "tool": "read"}, tenant=tenant),
        event(run_id, 6, "run.lifecycle", {"state": "done"}, tenant=tenant),
    ]


def _runwire(*args: str) -> Result:
    return CliRunner().invoke(main, ["replay", *args], catch_exceptions=False)


async def test_a_fork_copies_the_history_up_to_its_seq_and_is_marked_in_both_runs(
    store_url: str, clock: Clock
) -> None:
    """The fork holds the source's events 1 … at — the child's with its ``child_id`` — as its own
    run, a root; its checkpoint of record continues after ``at`` with no publisher seq seen; both
    runs' metadata name the fork; the same fork again answers as the first, another under the id
    is refused, and a seq past the end is a clear error."""
    async with open_store(store_url, clock=clock) as log:
        await log.append(_source())
        result = await fork_run(log, "src", at=4, run_id="f1")
        assert result.created and result.fork == ForkPoint(run_id="f1", source_id="src", at=4)
        copied, source = await log.read("f1"), await log.read("src")
        assert [(e.seq, e.id, e.type, e.child_id) for e in copied] == [
            (e.seq, e.id, e.type, e.child_id) for e in source[:4]]
        assert {e.run_id for e in copied} == {"f1"} and copied[2].child_id == "kid"
        logged = (await log.logged_runs(["f1"]))["f1"]
        state = decode_checkpoint(logged.checkpoint or b"").sequencer
        assert (state.last_seq, state.sources, state.terminal, state.tenant) == (4, {}, False, "acme")
        assert logged.state == "running" and logged.tenant == "acme"

        [fork_info, source_info] = await log.with_forks([logged, await log.require_run("src")])
        assert fork_info.forked_from == result.fork and fork_info.forks == []
        assert source_info.forks == [result.fork] and source_info.forked_from is None

        again = await fork_run(log, "src", at=4, run_id="f1")
        assert not again.created and len(await log.read("f1")) == 4
        with pytest.raises(RunExists):
            await fork_run(log, "src", at=3, run_id="f1")
        with pytest.raises(RunExists):
            await fork_run(log, "src", at=3, run_id="src")
        await log.append([event("other", 1, "run.lifecycle", {"state": "running"})])
        with pytest.raises(RunExists):
            await fork_run(log, "src", at=3, run_id="other")
        with pytest.raises(RequestError, match="past its end"):
            await fork_run(log, "src", at=7)
        with pytest.raises(UnknownRun):
            await fork_run(log, "nope", at=1)
        chained = await fork_run(log, "f1", at=3, run_id="f1-again")  # a fork of a fork: a copy of a copy
        assert [e.id for e in await log.read("f1-again")] == [e.id for e in source[:3]]
        [middle] = await log.with_forks([await log.require_run("f1")])
        assert middle.forked_from == result.fork and middle.forks == [chained.fork]
        whole = await fork_run(log, "src")  # default: the whole run, ended as its source
        assert whole.fork.at == 6 and whole.fork.run_id.startswith("run_")
        assert (await log.require_run(whole.fork.run_id)).terminal


async def test_forks_survive_retention_like_any_run(store_url: str, clock: Clock) -> None:
    """A fork's events are its own: the source swept, the fork stays (still naming its source) until
    its own retention ends, and then its record goes with it."""
    async with open_store(store_url, clock=clock) as log:
        await log.append(_source())
        await fork_run(log, "src", at=5, run_id="f1")  # unfinished: 30 days from its last activity
        clock.advance(days=80)  # the fork goes on: active on day 80, so kept to day 110
        await log.append([event("f1", 6, "text.delta", {"text": "on"}, tenant="acme")])
        assert (await log.sweep(now=T0 + timedelta(days=91))).runs == ["src"]
        assert await log.run("src") is None
        assert [e.seq for e in await log.read("f1")] == [1, 2, 3, 4, 5, 6]
        [info] = await log.with_forks([await log.require_run("f1")])
        assert info.forked_from == ForkPoint(run_id="f1", source_id="src", at=5)
        assert (await log.sweep(now=T0 + timedelta(days=111))).runs == ["f1"]
        assert await log.fork_points(["f1", "src"]) == []


def test_replay_fork_and_export_on_the_command_line(store_url: str) -> None:
    """``runwire replay fork RUN --at K --run-id ID``, then ``replay export`` of both: the fork's lines
    are the source's first K with the fork's run id."""
    async def stored() -> None:
        async with open_store(store_url) as log:
            await log.append(_source())

    asyncio.run(stored())
    made = _runwire("fork", "--store", store_url, "src", "--at", "3", "--run-id", "f2", "--json")
    assert made.exit_code == 0, made.output
    assert json.loads(made.output) == {"run_id": "f2", "source_id": "src", "at": 3, "created": True}
    past = CliRunner().invoke(main, ["replay", "fork", "--store", store_url, "src", "--at", "9"])
    assert past.exit_code == 1 and "past its end" in past.output
    source = [json.loads(line) for line in _runwire("export", "--store", store_url, "src").output.splitlines()]
    fork = [json.loads(line) for line in _runwire("export", "--store", store_url, "f2").output.splitlines()]
    assert len(source) == 6 and len(fork) == 3
    assert fork == [{**line, "run_id": "f2"} for line in source[:3]]
