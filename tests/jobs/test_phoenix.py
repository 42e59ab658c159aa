"""Spans in a real Phoenix: an agent publishes through the SDK to a real Redis, a real ``runwire
worker`` process exports its runs over OTLP/HTTP (the standard ``OTEL_*`` variables), and the
spans are read back through Phoenix's REST API. The exporter's requests pass through a recording
proxy (which decodes them with ``opentelemetry-proto``), so a span sent twice would show even
though Phoenix keeps one span per id. Once straight through, once with the worker SIGKILLed
mid-run and started again."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from runwire.jobs.spans import trace_id
from runwire.sdk.publisher import Publisher
from tests.jobs.otlp_receiver import OtlpReceiver, otlp_receiver
from tests.jobs.traced import NAMES, TracedAgent
from tests.phoenix import phoenix_spans, serve_phoenix
from tests.services import free_port
from tests.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # Phoenix's first start can take minutes
RUNWIRE = str(Path(sys.executable).parent / "runwire")


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from serve_phoenix(tmp_path_factory.mktemp("phoenix"))


def start_worker(bus_url: str, store_url: str, receiver: OtlpReceiver, project: str, log: Path,
                 *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
           "OTEL_EXPORTER_OTLP_HEADERS": f"x-project-name={project}", "OTEL_SERVICE_NAME": "runwire-test"}
    with open(log, "ab") as out:
        return subprocess.Popen([RUNWIRE, "worker", "--bus", bus_url, "--store", store_url, "--name", "w1",
                                 "--group", project, "--claim-idle-ms", "1500", "--silence", "600", *extra],
                                stdout=out, stderr=subprocess.STDOUT, env=env)


def sent_ids(receiver: OtlpReceiver) -> list[str]:
    return [span.span_id.hex() for span in receiver.spans()]


async def until_in_phoenix(phoenix: str, project: str, count: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    async def enough() -> bool:
        found[:] = await phoenix_spans(phoenix, project)
        return len(found) >= count

    await until(enough, within=60, what=f"{count} spans in Phoenix")
    return found


def check_tree(spans: list[dict[str, Any]], root: str) -> None:
    """One trace; the expected spans, parents, attributes, durations and error status."""
    by_name = {span["name"]: span for span in spans}
    assert len(spans) == 7 and set(by_name) == NAMES, sorted(span["name"] for span in spans)
    assert {span["context"]["trace_id"] for span in spans} == {trace_id(root)}
    ids = {name: span["context"]["span_id"] for name, span in by_name.items()}
    parent = {name: span.get("parent_id") for name, span in by_name.items()}
    assert parent["invoke_agent planner"] is None
    assert parent["invoke_agent researcher"] == ids["invoke_agent planner"]
    assert parent["invoke_agent"] == ids["invoke_agent researcher"]
    assert parent["execute_tool grep"] == ids["invoke_agent"]
    assert parent["chat"] == ids["invoke_agent researcher"]
    assert parent["chat gpt-test"] == parent["execute_tool book"] == ids["invoke_agent planner"]
    attrs = {name: span["attributes"] for name, span in by_name.items()}
    assert attrs["invoke_agent planner"]["gen_ai.agent.name"] == "planner"
    assert attrs["invoke_agent planner"]["runwire.run_id"] == root
    assert attrs["invoke_agent planner"]["gen_ai.conversation.id"] == "chat-1"
    assert attrs["invoke_agent"]["runwire.run_id"] == f"{root}.research.search"
    assert attrs["execute_tool grep"]["gen_ai.tool.name"] == "grep"
    assert attrs["chat gpt-test"]["gen_ai.usage.input_tokens"] == 100
    assert attrs["chat gpt-test"]["gen_ai.usage.output_tokens"] == 20
    assert attrs["chat"]["gen_ai.usage.input_tokens"] == 50
    assert by_name["execute_tool grep"]["status_code"] == "ERROR"
    assert by_name["execute_tool grep"]["status_message"] == "took too long"
    assert by_name["invoke_agent"]["status_code"] == "ERROR"
    assert by_name["execute_tool book"]["status_code"] != "ERROR"

    def took(name: str) -> float:
        span = by_name[name]
        return (datetime.fromisoformat(span["end_time"]) - datetime.fromisoformat(span["start_time"])).total_seconds()

    assert took("execute_tool grep") >= 0.2 and took("execute_tool book") >= 0.1
    assert took("invoke_agent planner") >= took("invoke_agent researcher") >= took("invoke_agent")
    events = [event["name"] for event in by_name["invoke_agent planner"]["events"]]
    assert events == ["runwire.approval.requested", "runwire.approval.resolved"]


def bus_of(redis_url: str, prefix: str) -> str:
    return f"{redis_url}{'&' if '?' in redis_url else '?'}prefix={prefix}"


async def test_a_run_of_two_levels_reaches_phoenix_as_one_trace_of_genai_spans(
    redis_url: str, tmp_path: Path, phoenix: str
) -> None:
    project = f"p{uuid.uuid4().hex[:8]}"
    bus_url, store_url = bus_of(redis_url, project), f"sqlite:///{tmp_path / 'replay.db'}"
    async with otlp_receiver(forward=phoenix) as receiver:
        metrics = free_port()
        worker = start_worker(bus_url, store_url, receiver, project, tmp_path / "w1.log",
                              "--metrics-addr", f"127.0.0.1:{metrics}")
        try:
            async with Publisher.connect(bus_url) as pub:
                agent = TracedAgent(pub, f"{project}-trip")
                await agent.first()
                await agent.second()
                await agent.third()
            spans = await until_in_phoenix(phoenix, project, 7)
            async with httpx.AsyncClient() as http:  # the worker's own /metrics counts what it sent
                counted = (await http.get(f"http://127.0.0.1:{metrics}/metrics")).text
            assert "runwire_otel_spans_exported_total 7.0" in counted
            assert 'runwire_otel_spans_dropped_total{reason="unreachable"}' not in counted
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(20)
    check_tree(spans, f"{project}-trip")
    assert sorted(sent_ids(receiver)) == sorted(span["context"]["span_id"] for span in spans)
    headers, request = receiver.requests[0]
    resource = {kv.key: kv.value.string_value for kv in request.resource_spans[0].resource.attributes}
    assert resource["service.name"] == "runwire-test" and headers["x-project-name"] == project


async def test_a_worker_sigkilled_mid_run_and_started_again_exports_every_span_once(
    redis_url: str, tmp_path: Path, phoenix: str
) -> None:
    """Killed while the backend refuses the spans of the run's second part (they were sent and not
    taken); started again, it sends them from the replay log, then the rest: each span once."""
    project = f"p{uuid.uuid4().hex[:8]}"
    root = f"{project}-trip"
    bus_url, store_url = bus_of(redis_url, project), f"sqlite:///{tmp_path / 'replay.db'}"
    log = tmp_path / "w1.log"
    async with otlp_receiver(forward=phoenix) as receiver:
        worker = start_worker(bus_url, store_url, receiver, project, log)
        try:
            async with Publisher.connect(bus_url) as pub:
                agent = TracedAgent(pub, root)
                await agent.first()
                await until(lambda: len(receiver.spans()) == 3, within=30, what="the first part's spans")

                def cursor() -> int:
                    with sqlite3.connect(tmp_path / "replay.db") as db:
                        row = db.execute("SELECT seq FROM span_exports WHERE root_id = ?", (root,)).fetchone()
                    return int(row[0]) if row else 0

                await until(lambda: cursor() > 0, within=10, what="the exporter's cursor moved")
                receiver.refusing = True
                await agent.second()
                await until(lambda: receiver.refused > 0, within=30, what="the second part's spans sent")
                worker.send_signal(signal.SIGKILL)
                assert worker.wait(10) == -signal.SIGKILL
                receiver.refusing = False
                worker = start_worker(bus_url, store_url, receiver, project, log)
                await agent.third()
            spans = await until_in_phoenix(phoenix, project, 7)
            await asyncio.sleep(1.5)  # anything sent twice would have been sent by now
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(20)
    ids = sent_ids(receiver)
    assert len(ids) == len(set(ids)) == 7, [span.name for span in receiver.spans()]
    check_tree(await phoenix_spans(phoenix, project), root)
    assert sorted(ids) == sorted(span["context"]["span_id"] for span in spans)
