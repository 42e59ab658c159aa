"""A framework agent for the demo: what ``runwire up --demo`` runs beside its synthetic runs
when pydantic-ai is installed (``scripts/run`` installs it).

A pydantic-ai "incident triage" agent on the framework's own offline ``FunctionModel`` (no
network, no key): it thinks, calls ``search_logs`` — whose tool delegates to a second agent,
"log-reader", published as a child run through the same :func:`~.pydantic_ai.run` — then
answers at token pace. Everything on the page comes from the integration's mapping: reasoning
and text deltas, the tool call with its arguments and output, the sub-agent as a child run,
usage and steps. A client's cancel stops it like any framework run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import AsyncIterator
from typing import Any

from ..jobs.demo import DEMO_TENANT, TOKEN_PACE_S, run_prefix
from ..sdk.publisher import Publisher
from . import require

require("pydantic_ai")

from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.messages import ModelMessage, ToolCallPart  # noqa: E402
from pydantic_ai.models.function import (  # noqa: E402
    AgentInfo,
    DeltaThinkingCalls,
    DeltaThinkingPart,
    DeltaToolCall,
    DeltaToolCalls,
    FunctionModel,
)

from . import pydantic_ai  # noqa: E402

SERVICES = ("checkout", "ingest", "payments", "search")


def _words(text: str) -> list[str]:
    return [word + " " for word in text.split()]


def _model(name: str, thoughts: str, tool: tuple[str, dict[str, Any]] | None, answer: str,
           pace: float) -> FunctionModel:
    """A scripted model: it thinks, calls ``tool`` once (if any), then answers word by word."""
    async def stream(messages: list[ModelMessage], _info: AgentInfo) -> AsyncIterator[
            str | DeltaThinkingCalls | DeltaToolCalls]:
        called = any(isinstance(p, ToolCallPart) for m in messages for p in m.parts)
        if tool is not None and not called:
            for word in _words(thoughts):
                await asyncio.sleep(pace)
                yield {0: DeltaThinkingPart(content=word)}
            yield {1: DeltaToolCall(name=tool[0], json_args=json.dumps(tool[1]), tool_call_id="call_1")}
            return
        for word in _words(answer):
            await asyncio.sleep(pace)
            yield word

    return FunctionModel(stream_function=stream, model_name=name)


def _agents(service: str, pace: float, publisher: Publisher) -> Agent[None, str]:
    reader = Agent(_model("demo-reader-1", "", None,
                          f"{service} shows 1,204 timeouts against the database in the last hour, "
                          "all after the 14:02 deploy.", pace), name="log-reader")
    triage = Agent(_model(
        "demo-triage-1", f"The alert is about {service}. Its logs will say what changed first.",
        ("search_logs", {"service": service, "since": "1h"}),
        f"The {service} errors started with the 14:02 deploy: its database calls time out. "
        "Roll the deploy back, then raise the pool's timeout before the next release.", pace),
        name="triage")

    @triage.tool_plain
    async def search_logs(service: str, since: str) -> str:
        """Delegate the log search to the log-reader agent (a child run)."""
        result = await pydantic_ai.run(reader, f"Read the {service} logs of the last {since}.",
                                       publisher=publisher, tenant=DEMO_TENANT)
        return str(result.output)

    return triage


async def framework_runs(publisher: Publisher, stop: asyncio.Event, *, every_s: float = 30.0,
                         pace: float = TOKEN_PACE_S, seed: int = 0, limit: int | None = None) -> int:
    """Start a triage run every ``every_s`` seconds (the first at once) until ``stop`` is set;
    returns how many started. Runs still going when ``stop`` is set are cancelled (aborted)."""
    rng = random.Random(seed)
    prefix = run_prefix()
    running: set[asyncio.Task[Any]] = set()
    started = 0
    try:
        while not stop.is_set() and (limit is None or started < limit):
            service = rng.choice(SERVICES)
            run_id = f"{prefix}-triage-{started + 1:04d}"
            task = asyncio.create_task(pydantic_ai.run(
                _agents(service, pace, publisher), f"Why is {service} alerting?", publisher=publisher,
                run_id=run_id, tenant=DEMO_TENANT), name=run_id)
            running.add(task)
            task.add_done_callback(running.discard)
            started += 1
            if limit is not None and started >= limit:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=every_s)
        if limit is not None and not stop.is_set():
            await asyncio.gather(*running)
    finally:
        for task in list(running):
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    return started
