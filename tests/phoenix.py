"""A real Phoenix (arize-phoenix) for the span export tests, started on free ports.

Phoenix is heavy (~850 MB with its dependencies) and pins its own, so it lives in a virtualenv
of its own, ``.services/phoenix``, which ``scripts/test`` makes (``scripts/phoenix``); or set
``RUNWIRE_TEST_PHOENIX`` to a ``phoenix`` executable, or ``RUNWIRE_TEST_PHOENIX_URL`` to a
running one. Missing, the test fails with that hint; it never skips.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.services import free_port

ROOT = Path(__file__).resolve().parent.parent
HINT = "run scripts/phoenix (a virtualenv with arize-phoenix in .services/phoenix) or set RUNWIRE_TEST_PHOENIX"
START_S = 180.0
"""A first start compiles and migrates (about a minute on a busy machine)."""


def phoenix_binary() -> Path:
    given = os.environ.get("RUNWIRE_TEST_PHOENIX")
    binary = Path(given) if given else ROOT / ".services" / "phoenix" / "bin" / "phoenix"
    if not binary.exists():
        pytest.fail(f"no Phoenix for tests ({binary} is missing); {HINT}", pytrace=False)
    return binary


def serve_phoenix(workdir: Path) -> Iterator[str]:
    """A Phoenix serving on free ports with its SQLite in ``workdir``, until the generator closes."""
    given = os.environ.get("RUNWIRE_TEST_PHOENIX_URL")
    if given:
        yield given.rstrip("/")
        return
    port = free_port()
    env = {**os.environ, "PHOENIX_PORT": str(port), "PHOENIX_GRPC_PORT": str(free_port()),
           "PHOENIX_HOST": "127.0.0.1", "PHOENIX_WORKING_DIR": str(workdir),
           "PHOENIX_TELEMETRY_ENABLED": "false"}
    with open(workdir / "phoenix.log", "wb") as log:
        process = subprocess.Popen([str(phoenix_binary()), "serve"], stdout=log, stderr=subprocess.STDOUT,
                                   env=env, cwd=workdir)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"Phoenix exited ({process.returncode}): {(workdir / 'phoenix.log').read_text()[-2000:]}",
                            pytrace=False)
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"Phoenix did not answer within {START_S:.0f} s", pytrace=False)
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def phoenix_spans(url: str, project: str) -> list[dict[str, Any]]:
    """Every span Phoenix holds in ``project``, through its REST API (``GET /v1/projects/…/spans``)."""
    spans: list[dict[str, Any]] = []
    cursor: str | None = None
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        while True:
            params: dict[str, Any] = {"limit": 1000, **({"cursor": cursor} if cursor else {})}
            response = await http.get(f"/v1/projects/{project}/spans", params=params)
            if response.status_code == 404:  # no span reached the project yet
                return []
            response.raise_for_status()
            body = response.json()
            spans.extend(body["data"])
            cursor = body.get("next_cursor")
            if not cursor:
                return spans
