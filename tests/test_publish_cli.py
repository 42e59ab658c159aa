"""``runwire publish``: every recorded sample onto every real bus, bad lines reported.

Every recorded sample of every ingest format goes onto each real backend. A file's events are compared with what the format's own ingest
codec makes of it (ids and timestamps aside, which codecs may mint).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from runwire.core.envelope import Event, to_builtins
from runwire.core.errors import ProtocolError
from runwire.protocols import INGEST, ingest
from runwire.protocols.detect import detect
from runwire.workers.cli import main
from tests.bus.reading import consume

FIXTURES = Path(__file__).parent / "fixtures"
SAMPLES = sorted(p for p in FIXTURES.glob("*/*") if p.is_file() and p.parent.name in INGEST)


def decoded(path: Path) -> tuple[str, list[Event], int]:
    """(format, events, rejected frames) as the ingest codec reads the file itself."""
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    fmt = detect(lines[:20])
    codec = ingest(fmt)
    events: list[Event] = []
    rejected = 0
    for frame in ([line.strip() for line in lines if line.strip()] if codec.line_based else [data]):
        try:
            events += codec.feed(frame)
        except ProtocolError:
            rejected += 1
    return fmt, events + codec.close(), rejected


def comparable(event: Event) -> str:
    """The event without the fields a codec may mint afresh on each read."""
    data: dict[str, Any] = to_builtins(event)
    data.pop("id"), data.pop("ts")
    return msgspec.json.encode(data).decode()


def publish(*args: str, input: bytes | None = None) -> Any:
    return CliRunner().invoke(main, ["publish", *args], input=input)


def test_there_are_samples_of_several_formats() -> None:
    assert {p.parent.name for p in SAMPLES} >= {"koder", "loom", "cogency", "loom-mcp"}


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_publish_reads_each_sample_onto_memory(path: Path) -> None:
    """Each sample's format is detected and all its events are published, per run."""
    fmt, events, rejected = decoded(path)
    result = publish("--bus", "memory://", str(path))
    assert result.exit_code == (1 if rejected else 0), result.output
    per_run = Counter(e.run_id for e in events)
    runs = ", ".join(f"{run} {n}" for run, n in per_run.items())
    assert result.stdout.strip() == (
        f"published {len(events)} event(s) from {fmt} to {len(per_run)} run(s): {runs}"
    )


@pytest.mark.parametrize("backend", ["redis", "kafka"])
def test_publish_moves_every_sample_onto_a_real_bus(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """Every sample file goes onto real Redis and Kafka; consumers read exactly its events."""
    url = f"{request.getfixturevalue(backend + '_url')}?prefix=cli{uuid.uuid4().hex[:10]}"
    if backend == "kafka":
        url += "&session_timeout_ms=2000"
    expected: Counter[str] = Counter()
    for path in SAMPLES:
        _fmt, events, rejected = decoded(path)
        expected.update(comparable(e) for e in events)
        result = publish("--bus", url, str(path))
        assert result.exit_code == (1 if rejected else 0), (path, result.output)
    got = asyncio.run(consume(url, sum(expected.values()), then_nothing=True))
    assert Counter(comparable(e) for e in got) == expected


def test_bad_lines_are_reported_and_the_rest_published(tmp_path: Path) -> None:
    """Bad input never stops the good frames around it; each bad line is named with its
    KAI-STREAM code, and the exit status says something was rejected."""
    good = (FIXTURES / "koder" / "sample_run.ndjson").read_bytes().splitlines()
    lines = [good[0], b'{"type": "text.delta", "run_id": "r"}', good[1], b"not json", *good[2:]]
    result = publish("--bus", "memory://", "--format", "koder", input=b"\n".join(lines) + b"\n")
    assert result.exit_code == 1
    assert "line 2: KAI-STREAM-PROTO-0001" in result.stderr
    assert "line 4: KAI-STREAM-PROTO-0001" in result.stderr
    assert result.stdout.startswith(f"published {len(good)} event(s) from koder")


def test_unreachable_bus_is_a_clear_error(tmp_path: Path) -> None:
    sample = FIXTURES / "koder" / "spec_examples.ndjson"
    result = publish("--bus", "redis://127.0.0.1:1/0", "--delivery-timeout", "0.5", str(sample))
    assert result.exit_code != 0
    assert "127.0.0.1:1" in result.output
