"""Google ADK case of the integration CPU benchmark: the same scripted agent run bare (ADK's own
streaming call, events consumed and dropped) and through ``runwire.integrations.google_adk.run``.

The agent: one model turn calling a tool, the tool's response, then a text turn streamed as
``n - 3`` partial chunks and ADK's aggregated final event — ``n`` framework events in all
(counted by a plugin on the runner in both cases). The model is a scripted
:class:`~google.adk.models.BaseLlm`: no network, no Google auth.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from google.adk.agents import LlmAgent, RunConfig
from google.adk.agents.invocation_context import InvocationContext
from google.adk.agents.run_config import StreamingMode
from google.adk.apps import App
from google.adk.events.event import Event
from google.adk.models import BaseLlm, LlmRequest, LlmResponse
from google.adk.plugins.base_plugin import BasePlugin
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.genai import types
from pydantic import PrivateAttr

PROMPT = "Add 2 and 3, then tell me about it."
USAGE = types.GenerateContentResponseUsageMetadata(
    prompt_token_count=20, candidates_token_count=10, total_token_count=30)


class Scripted(BaseLlm):
    """Turn 1: a call of ``add``; turn 2: ``chunks`` text chunks (partial when streaming), then
    the aggregated final response."""

    model: str = "scripted"
    chunks: int = 1
    _turn: int = PrivateAttr(default=0)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self._turn += 1
        if self._turn == 1:
            call = types.FunctionCall(id="c1", name="add", args={"a": 2, "b": 3})
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(
                function_call=call)]), usage_metadata=USAGE, model_version="scripted-1")
            return
        pieces = [f"token{i} " for i in range(self.chunks)]
        if stream:
            for piece in pieces:
                yield LlmResponse(content=types.Content(role="model", parts=[types.Part(
                    text=piece)]), partial=True)
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(
            text="".join(pieces))]), usage_metadata=USAGE, model_version="scripted-1")


def add(a: int, b: int) -> int:
    """Adds two numbers."""
    return a + b


class Counter(BasePlugin):
    """Counts the events the runner yields (partial ones included)."""

    def __init__(self) -> None:
        super().__init__(name="bench-counter")
        self.events = 0

    async def on_event_callback(self, *, invocation_context: InvocationContext,
                                event: Event) -> Event | None:
        self.events += 1
        return None


def _runner(n: int) -> tuple[Runner, Counter]:
    counter = Counter()
    agent = LlmAgent(name="bench", model=Scripted(chunks=max(1, n - 3)), tools=[add])
    app = App(name="bench", root_agent=agent, plugins=[counter])
    return Runner(app=app, session_service=InMemorySessionService()), counter


async def bare(n: int) -> int:
    """ADK's streaming call, every event consumed and dropped; the number of events."""
    runner, counter = _runner(n)
    await runner.session_service.create_session(app_name="bench", user_id="u", session_id="s")
    message = types.Content(role="user", parts=[types.Part(text=PROMPT)])
    config = RunConfig(streaming_mode=StreamingMode.SSE)
    async for _event in runner.run_async(user_id="u", session_id="s", new_message=message,
                                         run_config=config):
        pass
    return counter.events


async def adapted(n: int, publisher: Any) -> int:
    """The same through ``google_adk.run`` onto ``publisher``; the number of events."""
    from runwire.integrations import google_adk

    runner, counter = _runner(n)
    await google_adk.run(runner, PROMPT, publisher=publisher, user_id="u", session_id="s")
    return counter.events
