"""Run the npm validators in tests/node on frames a codec wrote.

A missing ``node`` or missing npm modules fail the test with the install
hint (never a skip): the AG-UI and AI SDK codecs are only as good as the
packages' own validators say.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import msgspec
import pytest

NODE_DIR = Path(__file__).resolve().parent / "node"
HINT = "install Node.js ≥ 20 and run `npm install` in tests/node (scripts/bootstrap does both)"
MODULES = ("@ag-ui/client", "@ag-ui/core", "ai", "rxjs")


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.fail(f"node not found: {HINT}", pytrace=False)
    missing = [m for m in MODULES if not (NODE_DIR / "node_modules" / m / "package.json").exists()]
    if missing:
        pytest.fail(f"npm modules missing in tests/node ({', '.join(missing)}): {HINT}", pytrace=False)
    return node


def _run(script: str, body: bytes, *flags: str) -> subprocess.CompletedProcess[bytes]:
    node = _node()
    env = {**os.environ, "SUPPRESS_TRANSFORMATION_WARNINGS": "1"}  # @ag-ui/client's legacy-bridge notes
    return subprocess.run([node, str(NODE_DIR / script), *flags], input=body, capture_output=True,
                          cwd=NODE_DIR, timeout=120, check=False, env=env)


def validate(script: str, frames: list[Any], *, partial: bool = False) -> dict[str, Any]:
    """Feed ``frames`` as NDJSON to ``tests/node/<script>``; the validator's summary if valid.

    Fails the test with the validator's message if it rejects the stream.
    """
    body = b"".join(msgspec.json.encode(frame) + b"\n" for frame in frames)
    proc = _run(script, body, *(["--partial"] if partial else []))
    if proc.returncode != 0:
        shown = "\n".join(json.dumps(f) for f in frames[:80])
        pytest.fail(f"{script} rejected the stream:\n{proc.stderr.decode()}\n--- frames ---\n{shown}", pytrace=False)
    summary: dict[str, Any] = json.loads(proc.stdout)
    return summary


def validate_many(script: str, streams: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Validate several complete streams in one node process; fails naming the first bad one."""
    names = list(streams)
    body = b"".join(msgspec.json.encode(streams[name]) + b"\n" for name in names)
    proc = _run(script, body, "--streams")
    if proc.returncode != 0:
        message = proc.stderr.decode()
        bad = message.split("stream ", 1)[-1].split(":", 1)[0]
        name = names[int(bad) - 1] if bad.isdigit() else "?"
        shown = "\n".join(json.dumps(f) for f in streams.get(name, [])[:80])
        pytest.fail(f"{script} rejected stream {name!r}:\n{message}\n--- frames ---\n{shown}", pytrace=False)
    summaries: list[dict[str, Any]] = json.loads(proc.stdout)
    return summaries


def rejects(script: str, frames: list[Any]) -> str:
    """The validator's message for a stream it must reject (so the validator can fail)."""
    body = b"".join(msgspec.json.encode(frame) + b"\n" for frame in frames)
    proc = _run(script, body)
    assert proc.returncode != 0, f"{script} accepted an invalid stream"
    return proc.stderr.decode()
