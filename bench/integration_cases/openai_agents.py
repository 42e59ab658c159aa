"""OpenAI Agents SDK case of the integration CPU benchmark: the same agent run bare
(``Runner.run_streamed``, its ``stream_events()`` consumed and dropped) and through
``runwire.integrations.openai_agents.run``.

The agent: the SDK's own offline model (:class:`agents.testing.ScriptedModel`) calls its one tool,
then answers with a message of ``(n - OVERHEAD) / 4`` text parts (the SDK streams four events per
part: part added, text delta, text done, part done) — about ``n`` framework events in all. Bare
counts the stream's events; adapted counts the same events (the model's raw events, one per run
item, one agent update) since :func:`run` consumes the stream itself. The count is returned.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.testing import ScriptedModel, function_call
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

PROMPT = "Add 2 and 3, then tell me about it."
OVERHEAD = 20
"""Framework events besides the answer's parts: the agent update; the tool-call response (created,
in progress, item added, arguments delta and done, item done, completed), the tool call and its
output; the answer's response (created, in progress, item added, item done, completed) and its
message item; a few more for rounding."""
PARTS_EVENTS = 4

set_tracing_disabled(True)  # no trace exporter, no network


@function_tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


class CountingModel(ScriptedModel):
    """The SDK's scripted model, counting the raw events it streams."""

    def __init__(self, steps: list[Any]) -> None:
        super().__init__(steps)
        self.streamed = 0

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:  # type: ignore[override]
        async for event in super().stream_response(*args, **kwargs):
            self.streamed += 1
            yield event


def agent(n: int) -> Agent[Any]:
    """The benchmark's agent (a fresh model: a script is used up by one run)."""
    parts = [ResponseOutputText(text=f"w{i} ", type="output_text", annotations=[], logprobs=[])
             for i in range(max(1, (n - OVERHEAD) // PARTS_EVENTS))]
    answer = ResponseOutputMessage(id="answer", type="message", role="assistant",
                                   status="completed", content=parts)
    model = CountingModel([[function_call("add", {"a": 2, "b": 3}, call_id="c1")], [answer]])
    return Agent(name="bench", tools=[add], model=model)


async def bare(n: int) -> int:
    result = Runner.run_streamed(agent(n), PROMPT)
    events = 0
    async for _event in result.stream_events():
        events += 1
    return events


async def adapted(n: int, publisher: Any) -> int:
    from runwire.integrations import openai_agents

    built = agent(n)
    result = await openai_agents.run(built, PROMPT, publisher=publisher)
    assert isinstance(built.model, CountingModel)
    return built.model.streamed + len(result.new_items) + 1  # raw events, run items, agent update
