"""LangGraph case for ``bench/integrations.py``: the classic agent loop (a model node and a
``ToolNode``) driven by a scripted offline model that streams word by word, one tool call.

``bare`` streams it as a user of LangGraph's streaming typically does, ``graph.astream(input,
stream_mode="messages")`` (the token stream), and drops the events; ``adapted`` runs the same
graph on the same input through ``runwire.integrations.langgraph.run``, which asks for more
(``messages``, ``updates``, ``custom``, ``values``, ``tasks`` with ``subgraphs=True``): what those
cost LangGraph beyond the token stream is part of what ``run`` adds. Both count the framework
events through the same wrapper around ``astream`` and return the number of ``messages`` events
(the model's chunks and the tool's message: ``n`` about), the other modes' few events not counted.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGenerationChunk
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition


class WordModel(GenericFakeChatModel):
    """Streams each scripted message word by word, then its tool calls and usage."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> WordModel:
        return self

    async def _astream(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        message = next(self.messages)
        assert isinstance(message, AIMessage) and isinstance(message.content, str)
        for word in message.content.split(" "):
            yield ChatGenerationChunk(message=AIMessageChunk(content=word + " ", id=message.id))
        calls = [{"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": i}
                 for i, c in enumerate(message.tool_calls)]
        yield ChatGenerationChunk(message=AIMessageChunk(
            content="", id=message.id, chunk_position="last", tool_call_chunks=calls,
            usage_metadata={"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
            response_metadata={"model_name": "bench-model"}))


@tool
def lookup(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def graph(n: int) -> Any:
    """About ``n`` events: two model responses of ``n/2 - 4`` words each, one tool call."""
    words = max(1, n // 2 - 4)
    text = " ".join(f"w{i}" for i in range(words))
    model = WordModel(messages=iter([
        AIMessage(content=text, id="m1", tool_calls=[{"name": "lookup", "args": {"city": "Oslo"},
                                                      "id": "c1"}]),
        AIMessage(content=text, id="m2"),
    ]))

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    built = StateGraph(MessagesState)
    built.add_node("agent", agent)
    built.add_node("tools", ToolNode([lookup]))
    built.add_edge(START, "agent")
    built.add_conditional_edges("agent", tools_condition)
    built.add_edge("tools", "agent")
    return built.compile()


def question() -> dict[str, Any]:
    return {"messages": [HumanMessage("Weather in Oslo?", id="q")]}


def counting(agent: Any, is_message: Callable[[Any], bool]) -> list[int]:
    """Count the ``messages`` events of ``agent.astream`` (the same wrapper in both rounds)."""
    streamed = agent.astream
    count = [0]

    async def counted(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async for item in streamed(*args, **kwargs):
            if is_message(item):
                count[0] += 1
            yield item

    agent.astream = counted
    return count


async def bare(n: int) -> int:
    agent = graph(n)
    count = counting(agent, lambda _item: True)  # stream_mode="messages": each is a message event
    async for _message, _metadata in agent.astream(question(), stream_mode="messages"):
        pass
    return count[0]


async def adapted(n: int, publisher: Any) -> int:
    from runwire.integrations import langgraph as integration

    agent = graph(n)
    count = counting(agent, lambda item: item[1] == "messages")  # (namespace, mode, chunk)
    await integration.run(agent, question(), publisher=publisher)
    return count[0]
