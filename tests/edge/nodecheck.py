"""Run the Node validators of tests/node (AG-UI verifyEvents, AI SDK readUIMessageStream)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

NODE_DIR = Path(__file__).resolve().parents[1] / "node"


async def validate(script: str, frames: list[dict[str, Any]], *, partial: bool = False) -> dict[str, Any]:
    """Feed frames (NDJSON) to ``tests/node/<script>``; fail the test with its reason when invalid."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed: install Node.js 20 (Debian: apt-get install nodejs npm)", pytrace=False)
    if not (NODE_DIR / "node_modules").is_dir():
        pytest.fail(f"run `npm ci` in {NODE_DIR} (scripts/bootstrap does it)", pytrace=False)
    args = [node, str(NODE_DIR / script)] + (["--partial"] if partial else [])
    proc = await asyncio.create_subprocess_exec(
        *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=NODE_DIR,
    )
    body = "".join(json.dumps(frame) + "\n" for frame in frames).encode()
    out, err = await asyncio.wait_for(proc.communicate(body), 60)
    assert proc.returncode == 0, f"{script} rejected the stream: {err.decode()}"
    summary: dict[str, Any] = json.loads(out)
    return summary
