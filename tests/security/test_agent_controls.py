"""Invariant 6 at the agent's control read (``GET /v1/runs/{run}/control``, what the
``http://`` bus's ``run.controls()`` reads): it needs the ``write`` scope, and a run that turns
out to be another tenant's shows none of its commands, even to a stream opened before anyone
had seen the run."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from runwire import Publisher
from runwire.edge import EdgeSettings
from tests.e2e_harness import Pipeline, pipeline, unique, wait_for_terminal
from tests.edge.harness import SECRET, token


@pytest.fixture
async def guarded(redis_url: str, tmp_path: Path) -> AsyncIterator[Pipeline]:
    async with pipeline(redis_url, f"sqlite:///{tmp_path}/replay.db",
                        EdgeSettings(secret=SECRET)) as running:
        yield running


def bearer(value: str) -> dict[str, str]:
    return {"authorization": f"Bearer {value}"}


async def test_reading_a_runs_commands_needs_the_write_scope(guarded: Pipeline) -> None:
    async with httpx.AsyncClient(base_url=guarded.edge.url, timeout=10) as http:
        answer = await http.get(f"/v1/runs/{unique('r')}/control",
                                headers=bearer(token("A", "read", "control")))
    assert answer.status_code == 403
    assert answer.json()["code"] == "KAI-STREAM-AUTH-0002"


async def test_a_stream_opened_before_the_run_existed_shows_nothing_of_another_tenants_run(
    guarded: Pipeline,
) -> None:
    run_id = unique("taken")
    got: list[str] = []
    async with httpx.AsyncClient(base_url=guarded.edge.url, timeout=30) as http:
        async with http.stream("GET", f"/v1/runs/{run_id}/control",
                               headers=bearer(token("B", "write"))) as early:
            assert early.status_code == 200

            async def read() -> None:
                async for line in early.aiter_lines():
                    if line.strip():
                        got.append(line)

            reader = asyncio.create_task(read())
            async with Publisher.connect(f"{guarded.edge.url}?token={token('A', 'write')}") as pub:
                run = pub.run(run_id)
                await run.emit("run.lifecycle", {"state": "running"})
                await pub.flush()
                for _ in range(100):
                    sent = await http.post(f"/v1/runs/{run_id}/control", json={"command": "cancel"},
                                           headers=bearer(token("A", "control")))
                    if sent.status_code != 404:
                        break
                    await asyncio.sleep(0.05)
                assert sent.status_code == 202, sent.text
                await asyncio.wait_for(reader, 10)  # B's stream ends instead of showing it
                await run.finish("aborted")
    assert got == []
    await wait_for_terminal(guarded.store, run_id)


async def test_the_owner_reads_its_runs_commands_through_the_edge(guarded: Pipeline) -> None:
    run_id = unique("mine")
    async with Publisher.connect(f"{guarded.edge.url}?token={token('A', 'write')}") as pub:
        run = pub.run(run_id)
        commands = run.controls()
        first = asyncio.ensure_future(anext(commands))
        await run.emit("run.lifecycle", {"state": "running"})
        await pub.flush()
        async with httpx.AsyncClient(base_url=guarded.edge.url, timeout=10) as http:
            for _ in range(100):
                sent = await http.post(f"/v1/runs/{run_id}/control",
                                       json={"command": "approve", "args": {"call_id": "c1"}},
                                       headers=bearer(token("A", "control")))
                if sent.status_code != 404:
                    break
                await asyncio.sleep(0.05)
        command = await asyncio.wait_for(first, 10)
        await commands.aclose()  # type: ignore[attr-defined]
        await run.finish()
    assert (command.command, command.args, command.run_id) == ("approve", {"call_id": "c1"}, run_id)


async def test_an_agents_control_streams_count_against_its_tokens_stream_quota(
    redis_url: str, tmp_path: Path
) -> None:
    """Each open control read is one of the token's streams: a token can't hold the edge's
    connections to the bus with control reads of made-up runs."""
    settings = EdgeSettings(secret=SECRET, streams_per_token=2)
    async with pipeline(redis_url, f"sqlite:///{tmp_path}/replay.db", settings) as guarded:
        writer = bearer(token("A", "write"))
        async with httpx.AsyncClient(base_url=guarded.edge.url, timeout=10) as http:
            async with (http.stream("GET", f"/v1/runs/{unique('q')}/control", headers=writer) as one,
                        http.stream("GET", f"/v1/runs/{unique('q')}/control", headers=writer) as two):
                assert (one.status_code, two.status_code) == (200, 200)
                third = await http.get(f"/v1/runs/{unique('q')}/control", headers=writer)
                assert third.status_code == 429
                assert third.headers["retry-after"]
            for _ in range(100):  # both closed: the quota is free again
                async with http.stream("GET", f"/v1/runs/{unique('q')}/control", headers=writer) as again:
                    if again.status_code == 200:
                        break
                await asyncio.sleep(0.05)
            assert again.status_code == 200
