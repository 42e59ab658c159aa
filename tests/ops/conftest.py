"""Helpers for tests that run `runwire` commands as real processes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import connect_sse

from tests.services import free_port

RUNWIRE = str(Path(sys.executable).parent / "runwire")
TERMINAL = ("done", "aborted", "error")


def runwire_env(**extra: str) -> dict[str, str]:
    """The environment for a runwire subprocess: no RUNWIRE_* of the caller, no config file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWIRE_")}
    env.update(extra)
    return env


class UpProcess:
    """`runwire up …` on a free port, with its output captured to files."""

    def __init__(self, tmp: Path, *args: str, port: int | None = None) -> None:
        self.port = port or free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.out = tmp / f"up-{self.port}.out"
        self.err = tmp / f"up-{self.port}.err"
        self.args = ["up", "--port", str(self.port), *args]
        self.cwd = tmp
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> UpProcess:
        with self.out.open("ab") as out, self.err.open("ab") as err:
            self.proc = subprocess.Popen(
                [RUNWIRE, *self.args], stdout=out, stderr=err, cwd=self.cwd, env=runwire_env()
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"runwire up exited: {self.err.read_text()}"
            try:
                if httpx.get(f"{self.base}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"runwire up not healthy after {timeout}s: {self.err.read_text()}")

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def wait_for_run(self, *, terminal: bool = False, timeout: float = 30.0) -> dict[str, Any]:
        """A root demo run listed by the edge (a finished one when ``terminal``).

        Only ``demo-`` runs count: a store shared with other tests lists theirs too.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            runs = httpx.get(f"{self.base}/v1/runs", timeout=5).json()["runs"]
            for run in runs:
                if (
                    run["run_id"].startswith("demo-")
                    and run["parent_id"] is None
                    and (run["terminal"] or not terminal)
                ):
                    return dict(run)
            time.sleep(0.2)
        raise AssertionError("no run listed in time")


def stream_events(
    base: str, run_id: str, *, detail: str = "full", timeout: float = 30.0
) -> list[dict[str, Any]]:
    """Read a run's SSE stream until its own terminal run.lifecycle."""
    events: list[dict[str, Any]] = []
    with (
        httpx.Client(timeout=timeout) as client,
        connect_sse(
            client, "GET", f"{base}/v1/runs/{run_id}/stream", params={"detail": detail}
        ) as source,
    ):
        assert source.response.status_code == 200
        for sse in source.iter_sse():
            if not sse.data:
                continue
            event = httpx.Response(200, content=sse.data).json()
            events.append(event)
            if (
                event["type"] == "run.lifecycle"
                and not event.get("child_id")
                and event["payload"]["state"] in TERMINAL
            ):
                break
    return events


@pytest.fixture
def bus_on(request: pytest.FixtureRequest) -> Any:
    """``bus_on(url)``: the URL with a key/topic prefix of this test's own (shared servers)."""
    tag = re.sub(r"[^A-Za-z0-9]", "", request.node.name)[-40:] + uuid.uuid4().hex[:8]

    def with_prefix(url: str) -> str:
        return f"{url}{'&' if '?' in url else '?'}prefix=t{tag}"

    return with_prefix


@pytest.fixture
def start_up(tmp_path: Path) -> Iterator[Any]:
    """Start `runwire up` processes; each is killed at the end if still running."""
    started: list[UpProcess] = []

    def start(*args: str, port: int | None = None) -> UpProcess:
        process = UpProcess(tmp_path, *args, port=port)
        started.append(process)
        return process.start()

    yield start
    for process in started:
        process.kill()
