"""Pydantic AI case of the integration CPU benchmark: the same agent run bare (``agent.run`` with
an ``event_stream_handler``: the framework's streaming, events consumed and dropped) and through
``runwire.integrations.pydantic_ai.run``.

The agent: :class:`~pydantic_ai.models.test.TestModel` calls its one tool, then answers with a
text of ``n - OVERHEAD`` words streamed a word per event — about ``n`` framework events in all
(counted by the same event stream handler in both cases; the count is returned).
"""

from __future__ import annotations

from collections.abc import AsyncIterable
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import AgentStreamEvent
from pydantic_ai.models.test import TestModel
from pydantic_ai.tools import RunContext

PROMPT = "Add 2 and 3, then tell me about it."
OVERHEAD = 7
"""Framework events besides the answer's words: the tool call's part start and end, its call and
result events, the final-result event, the answer part's end; one more for rounding."""


def agent(n: int) -> Agent[None, str]:
    """The benchmark's agent, answering in ``n - OVERHEAD`` words (at least one)."""
    words = " ".join(f"w{i}" for i in range(max(1, n - OVERHEAD)))
    built = Agent(TestModel(custom_output_text=words), name="bench")

    @built.tool_plain
    def add(a: int, b: int) -> int:
        return a + b

    return built


class Counter:
    """An ``event_stream_handler`` that consumes the framework's events and counts them."""

    def __init__(self) -> None:
        self.events = 0

    async def __call__(self, _ctx: RunContext[Any], events: AsyncIterable[AgentStreamEvent]) -> None:
        async for _event in events:
            self.events += 1


async def bare(n: int) -> int:
    counter = Counter()
    await agent(n).run(PROMPT, event_stream_handler=counter)
    return counter.events


_COUNTS: dict[int, int] = {}
"""Framework events of a bare run of each size (the run is deterministic)."""


async def adapted(n: int, publisher: Any) -> int:
    """The same run through the integration, whose own ``event_stream_handler`` is the stream's
    one consumer, as the counter is in :func:`bare` (a handler of the caller's own would get the
    events passed on, through one async generator more). Returns the bare run's count for the
    same ``n``."""
    from runwire.integrations import pydantic_ai

    if n not in _COUNTS:
        _COUNTS[n] = await bare(n)
    await pydantic_ai.run(agent(n), PROMPT, publisher=publisher)
    return _COUNTS[n]
