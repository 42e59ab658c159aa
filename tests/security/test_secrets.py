"""Secrets stay secret: no password or token in what the edge answers, logs or prints.

Open endpoints (``/readyz``) name the failing part only; bus and store errors
are redacted where they are made; uvicorn's access log never shows
``?access_token=``; ``/metrics`` (process-wide figures of every tenant)
needs the ``ops`` scope.
"""

from __future__ import annotations

import logging
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from runwire.bus import open_bus
from runwire.bus.base import Bus
from runwire.core.errors import BusUnavailable
from runwire.core.redaction import redact_text
from runwire.edge import EdgeSettings, issue_token
from runwire.store.base import ReplayLog
from tests.edge.harness import free_port, serve_edge
from tests.ops.conftest import RUNWIRE, runwire_env
from tests.services import RedisServer, own_server, wait_port

from .conftest import SECRET

PASSWORD = "hunter2-do-not-print-me"


@pytest.fixture
def locked_redis() -> Iterator[RedisServer]:
    """A Redis of the test's own that needs a password."""
    yield from own_server(RedisServer("--requirepass", PASSWORD))


def _url(server: RedisServer) -> str:
    return f"redis://:{PASSWORD}@127.0.0.1:{server.port}/0"


async def test_readyz_names_the_failing_part_only_and_logs_no_password(
    locked_redis: RedisServer, store: ReplayLog, caplog: pytest.LogCaptureFixture
) -> None:
    """Unauthenticated ``/readyz`` with the bus down: 503 ``{"ok": false, "bus": "unavailable"}`` —
    no URL, no password — and the edge's log names the reason without the password."""
    async with open_bus(_url(locked_redis)) as bus, serve_edge(bus, store, EdgeSettings(secret=SECRET)) as edge:
        async with httpx.AsyncClient(timeout=30) as http:
            assert (await http.get(f"{edge.url}/readyz")).json() == {"ok": True}
            locked_redis.stop()
            with caplog.at_level(logging.WARNING):
                down = await http.get(f"{edge.url}/readyz")
        locked_redis.start()
    assert down.status_code == 503
    assert down.json() == {"ok": False, "bus": "unavailable"}
    assert PASSWORD not in caplog.text
    assert "bus is unavailable" in caplog.text


async def test_bus_errors_never_carry_the_password(locked_redis: RedisServer) -> None:
    """A BusUnavailable names the bus with its password replaced by ``***``."""
    locked_redis.stop()
    with pytest.raises(BusUnavailable) as caught:
        async with open_bus(_url(locked_redis)):
            pass
    locked_redis.start()
    assert PASSWORD not in str(caught.value)
    assert f"redis://:***@127.0.0.1:{locked_redis.port}/0" in str(caught.value)


def test_a_worker_that_cannot_reach_its_bus_prints_no_password(locked_redis: RedisServer, tmp_path: Path) -> None:
    """``runwire worker`` against a bus that is down fails, and neither its log nor its error output
    shows the bus password."""
    locked_redis.stop()
    result = subprocess.run(
        [RUNWIRE, "worker", "--bus", _url(locked_redis),
         "--store", f"sqlite:///{tmp_path / 'r.db'}", "--burst"],
        capture_output=True, text=True, timeout=120, env=runwire_env(),
    )
    locked_redis.start()
    assert result.returncode != 0
    assert "unavailable" in (result.stdout + result.stderr).lower() or "connect" in result.stderr.lower()
    assert PASSWORD not in result.stdout + result.stderr


def test_the_access_log_never_shows_a_bearer_token(tmp_path: Path) -> None:
    """``runwire edge`` logs each request (uvicorn's access log); a token passed as
    ``?access_token=`` (EventSource) appears there as ``***``."""
    port = free_port()
    token = issue_token(SECRET, tenant="A", scopes=["read"])
    env = runwire_env(RUNWIRE_SECRET=SECRET)
    proc = subprocess.Popen(
        [RUNWIRE, "edge", "--bus", "memory://",
         "--store", f"sqlite:///{tmp_path / 'r.db'}", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    try:
        wait_port(port, proc=proc)
        answer = httpx.get(f"http://127.0.0.1:{port}/v1/runs?access_token={token}&limit=5", timeout=30)
        assert answer.status_code == 200  # uvicorn logs a request before it answers it
    finally:
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=30)
    assert "/v1/runs?access_token=***&limit=5" in output, output
    assert token not in output
    assert token.split(".")[2] not in output


async def test_metrics_need_the_ops_scope(memory_bus: Bus, store: ReplayLog) -> None:
    """``/metrics`` counts every tenant's traffic: a tenant's read token gets 403 with a code, an
    ``ops`` token gets the figures."""
    reader = issue_token(SECRET, tenant="A", scopes=["read", "write", "control"])
    ops = issue_token(SECRET, tenant="operators", scopes=["ops"])
    async with serve_edge(memory_bus, store, EdgeSettings(secret=SECRET)) as edge, \
            httpx.AsyncClient(base_url=edge.url, timeout=10) as http:
        refused = await http.get("/metrics", headers={"Authorization": f"Bearer {reader}"})
        allowed = await http.get("/metrics", headers={"Authorization": f"Bearer {ops}"})
        anonymous = await http.get("/metrics")
    assert (refused.status_code, refused.json()["code"]) == (403, "KAI-STREAM-AUTH-0002")
    assert (anonymous.status_code, anonymous.json()["code"]) == (401, "KAI-STREAM-AUTH-0001")
    assert allowed.status_code == 200 and "runwire_edge_connections" in allowed.text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ping redis://:pw@h:6379/0: refused", "ping redis://:***@h:6379/0: refused"),
        ("rediss://user:p%40ss@h/0", "rediss://user:***@h/0"),
        ('"GET /v1/runs/r/stream?access_token=abc.def.ghi&detail=full HTTP/1.1"',
         '"GET /v1/runs/r/stream?access_token=***&detail=full HTTP/1.1"'),
        ("kafka://b:9092?sasl_plain_password=s3cret", "kafka://b:9092?sasl_plain_password=***"),
        ("Authorization: Bearer abc.def-ghi", "Authorization: Bearer ***"),
        ("redis://h:6379/0 and postgresql://me@db/x", "redis://h:6379/0 and postgresql://me@db/x"),
    ],
)
def test_redact_text_removes_passwords_and_tokens_only(text: str, expected: str) -> None:
    assert redact_text(text) == expected


