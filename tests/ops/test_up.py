"""`runwire up`: the whole pipeline in one process, reached over HTTP."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from runwire.store import open_store
from tests.ops.conftest import RUNWIRE, TERMINAL, runwire_env, stream_events

pytestmark = pytest.mark.slow


def assert_demo_run(events: list[dict[str, Any]]) -> None:
    """A complete demo run on the raw view: seq contiguous from 1, the event kinds, a terminal end."""
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    types = {e["type"] for e in events}
    assert {"run.lifecycle", "reasoning.delta", "tool.start", "tool.end", "x.usage"} <= types
    assert events[-1]["type"] == "run.lifecycle"
    assert events[-1]["payload"]["state"] in TERMINAL


async def runs_in_store(url: str, prefix: str | None = None) -> list[Any]:
    async with open_store(url) as store:
        runs = await store.runs(limit=10_000)
    return [r for r in runs if prefix is None or r.run_id.startswith(prefix)]


def test_up_demo_serves_the_page_runs_and_live_streams(start_up: Any, tmp_path: Path) -> None:
    """`runwire up --demo` → /healthz, the page, a run in /v1/runs, an SSE stream to a terminal event."""
    data = tmp_path / "data"
    up = start_up("--demo", "--demo-rate", "2", "--data-dir", str(data))
    assert httpx.get(f"{up.base}/healthz").status_code == 200
    assert httpx.get(f"{up.base}/readyz").status_code == 200
    assert "runwire_edge_connections" in httpx.get(f"{up.base}/metrics").text
    page = httpx.get(f"{up.base}/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    run = up.wait_for_run()
    assert run["run_id"].startswith("demo-")
    events = stream_events(up.base, run["run_id"])
    assert_demo_run(events)
    assert httpx.get(f"{up.base}/runs/{run['run_id']}").status_code == 200
    assert f"runwire up: {up.base}/" in up.out.read_text()

    assert up.terminate() == 0
    assert "stopped" in up.err.read_text()
    runs = asyncio.run(runs_in_store(f"sqlite:///{data}/replay.db"))
    assert run["run_id"] in {r.run_id for r in runs}
    unfinished = [r.run_id for r in runs if not r.terminal]
    assert unfinished == [], "SIGTERM drains: every demo run ends (aborted) and is recorded"


def test_up_demo_runs_are_swept_after_their_retention(start_up: Any, tmp_path: Path) -> None:
    """The demo's runs (tenant ``demo``) leave the replay log ``--demo-keep-minutes`` after their
    last event: the demo's data stays bounded however long it runs."""
    up = start_up("--demo", "--demo-rate", "2", "--demo-keep-minutes", "0.05", "--data-dir",
                  str(tmp_path / "data"))
    run = up.wait_for_run(terminal=True, timeout=60)
    assert run["tenant"] == "demo"
    assert "kept 0.05 min" in up.out.read_text()
    deadline = time.monotonic() + 60
    while run["run_id"] in {r["run_id"] for r in httpx.get(f"{up.base}/v1/runs?limit=1000").json()["runs"]}:
        assert time.monotonic() < deadline, "the finished demo run was never swept"
        time.sleep(0.2)
    assert httpx.get(f"{up.base}/v1/runs/{run['run_id']}/events.jsonl").status_code == 404
    assert up.terminate() == 0


def test_up_restarts_on_the_same_data_dir_and_keeps_history(start_up: Any, tmp_path: Path) -> None:
    """The replay log outlives the in-process bus: a finished run is served after a restart."""
    data = tmp_path / "data"
    first = start_up("--demo", "--demo-rate", "2", "--data-dir", str(data))
    run = first.wait_for_run(terminal=True)
    assert first.terminate() == 0
    second = start_up("--data-dir", str(data), port=first.port)
    replayed = stream_events(second.base, run["run_id"])
    assert_demo_run(replayed)


def test_up_on_redis_and_postgresql(
    start_up: Any, bus_on: Any, redis_url: str, postgres_url: str
) -> None:
    """`--bus redis://` and `--store postgresql://` switch the parts to real services."""
    up = start_up("--demo", "--demo-rate", "2", "--bus", bus_on(redis_url), "--store", postgres_url)
    run = up.wait_for_run(terminal=True)
    streamed = stream_events(up.base, run["run_id"])
    assert_demo_run(streamed)
    assert up.terminate() == 0
    stored = {r.run_id: r for r in asyncio.run(runs_in_store(postgres_url, "demo-"))}
    assert stored[run["run_id"]].terminal
    assert stored[run["run_id"]].events == len(streamed)


def test_up_refuses_a_public_address_without_a_secret(tmp_path: Path) -> None:
    result = subprocess.run(
        [RUNWIRE, "up", "--host", "0.0.0.0", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=runwire_env(),
        timeout=30,
    )
    assert result.returncode == 2
    assert "RUNWIRE_SECRET" in result.stderr


def test_up_on_kafka(start_up: Any, bus_on: Any, kafka_url: str, tmp_path: Path) -> None:
    """`--bus kafka://` runs the same single-process pipeline on a Kafka-protocol broker."""
    bus = bus_on(f"{kafka_url}?session_timeout_ms=2000")  # (Tansu answers a join after half of it)
    up = start_up("--demo", "--demo-rate", "1", "--bus", bus, "--data-dir", str(tmp_path / "d"))
    run = up.wait_for_run(terminal=True, timeout=60)
    assert_demo_run(stream_events(up.base, run["run_id"]))
    assert up.terminate() == 0


def test_up_on_a_taken_port_fails_with_one_clear_error(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = subprocess.run(
            [RUNWIRE, "up", "--port", str(port), "--data-dir", str(tmp_path)],
            capture_output=True,
            text=True,
            env=runwire_env(),
            timeout=30,
        )
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr
