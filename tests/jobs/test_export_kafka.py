"""``runwire worker`` on Kafka (the faust runtime) exports spans as the consumer-group runtime does."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path

import pytest

from runwire.sdk.publisher import Publisher
from tests.jobs.otlp_receiver import otlp_receiver
from tests.jobs.traced import NAMES, TracedAgent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
RUNWIRE = str(Path(sys.executable).parent / "runwire")


async def test_a_kafka_worker_exports_the_runs_it_writes(kafka_url: str, tmp_path: Path) -> None:
    prefix = f"s{uuid.uuid4().hex[:8]}"
    bus_url = f"{kafka_url}?prefix={prefix}&session_timeout_ms=2000"
    async with Publisher.connect(bus_url) as pub:
        agent = TracedAgent(pub, f"{prefix}-trip")
        await agent.first()
        await agent.second()
        await agent.third()
    async with otlp_receiver() as receiver:
        env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": "kafka-test"}
        worker = await asyncio.create_subprocess_exec(
            RUNWIRE, "worker", "--bus", bus_url, "--store", f"sqlite:///{tmp_path / 'replay.db'}", "--burst",
            "--group", f"{prefix}-g", "--name", "k1", "--data-dir", str(tmp_path / "data"), env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        output, _ = await asyncio.wait_for(worker.communicate(), 240)
        assert worker.returncode == 0, output.decode()[-3000:]
    names = [span.name for span in receiver.spans()]
    assert sorted(names) == sorted(NAMES), output.decode()[-3000:]
