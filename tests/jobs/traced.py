"""One run as its root's stored stream: a sub-run with a sub-run of its own (two levels), a tool
call that fails, usage in model steps and an approval — what the span tests derive and export."""

from __future__ import annotations

import asyncio
from typing import Any

from runwire.core.envelope import Event
from runwire.sdk.publisher import Publisher, Run
from tests.events import event

ROOT = "trip"
CHILD = "trip.research"
GRANDCHILD = "trip.research.search"


def traced_run(root: str = ROOT, *, child: str = CHILD, grandchild: str = GRANDCHILD) -> list[Event]:
    """The root's stream (sub-runs fanned in with ``child_id``), one event a second from t=0."""
    own: dict[str, Any] = {"tenant": "acme"}
    # fanned in, as workers store them: the run they came from in child_id, no parent_id/root_id
    in_child: dict[str, Any] = {"tenant": "acme", "child_id": child}
    in_grand: dict[str, Any] = {"tenant": "acme", "child_id": grandchild}
    rows: list[tuple[float, str, dict[str, Any], dict[str, Any]]] = [
        (0, "run.lifecycle", {"state": "running"}, {**own, "thread_id": "chat-1", "ext": {"agent": {"name": "planner"}}}),
        (1, "x.usage", {"input_tokens": 100, "output_tokens": 20, "model": "gpt-test"}, own),
        (2, "step.boundary", {"step_index": 0, "step_kind": "tool-roundtrip"}, own),
        (3, "child.spawn", {"child_id": child, "prompt": "find hotels"}, own),
        (4, "run.lifecycle", {"state": "running"}, {**in_child, "ext": {"agent": {"name": "researcher"}}}),
        (5, "child.spawn", {"child_id": grandchild}, in_child),
        (6, "tool.start", {"call_id": "g1", "tool": "grep", "input": {"q": "hotels"}}, in_grand),
        (8, "tool.end", {"call_id": "g1", "ok": False, "error": {"type": "Timeout", "message": "took too long"}},
         in_grand),
        (9, "run.lifecycle", {"state": "error", "reason": "grep failed"}, in_grand),
        (9.5, "text.delta", {"text": "nothing found"}, in_child),
        (10, "x.usage", {"input_tokens": 50, "output_tokens": 10}, in_child),
        (11, "step.boundary", {"step_index": 0, "step_kind": "text-only"}, in_child),
        (12, "run.lifecycle", {"state": "done"}, in_child),
        (13, "run.lifecycle", {"state": "awaiting_approval", "reason": "1 call(s) wait for a decision"},
         {**own, "ext": {"approval": {"calls": [{"call_id": "a1", "tool": "book", "input": {}}]}}}),
        (15, "run.lifecycle", {"state": "running"}, own),
        (15.5, "tool.start", {"call_id": "a1", "tool": "book", "input": {"hotel": 7}}, own),
        (17, "tool.end", {"call_id": "a1", "ok": True, "output": "booked"}, own),
        (18, "run.lifecycle", {"state": "done"}, own),
    ]
    return [event(root, seq, type, payload, second=at, **fields)
            for seq, (at, type, payload, fields) in enumerate(rows, start=1)]


NAMES = {"invoke_agent planner", "chat gpt-test", "invoke_agent researcher", "invoke_agent",
         "execute_tool grep", "chat", "execute_tool book"}
"""The spans of :class:`TracedAgent`'s run (and of :func:`traced_run`)."""



async def working(seconds: float) -> None:
    """The agent at work for ``seconds``: these pauses are the spans' durations the tests
    read back (times come from the events' ``ts``), not a wait for anything to happen."""
    await asyncio.sleep(seconds)

class TracedAgent:
    """A run with a sub-run that has a sub-run (two levels), a failing tool call, usage in model
    steps and an approval, published in three parts so a test can act between them."""

    def __init__(self, publisher: Publisher, root: str) -> None:
        self.pub, self.root = publisher, root
        self.runs: dict[str, Run] = {}

    async def first(self) -> None:
        """Ends: the root's first model step, the failed call and the sub-sub-run."""
        root = self.runs["root"] = self.pub.run(self.root, tenant="acme", thread="chat-1", agent="planner")
        await root.emit("run.lifecycle", {"state": "running"})
        await working(0.05)
        await root.emit("x.usage", {"input_tokens": 100, "output_tokens": 20, "model": "gpt-test"})
        await root.emit("step.boundary", {"step_index": 0, "step_kind": "tool-roundtrip"})
        child = self.runs["child"] = self.pub.run(f"{self.root}.research", parent=root, agent="researcher")
        await root.emit("child.spawn", {"child_id": child.run_id})
        await child.emit("run.lifecycle", {"state": "running"})
        grand = self.pub.run(f"{self.root}.research.search", parent=child)
        await child.emit("child.spawn", {"child_id": grand.run_id})
        await grand.emit("tool.start", {"call_id": "g1", "tool": "grep", "input": {"q": "hotels"}})
        await working(0.2)
        await grand.emit("tool.end", {"call_id": "g1", "ok": False,
                                      "error": {"type": "Timeout", "message": "took too long"}})
        await grand.finish("error", "grep failed")
        await self.pub.flush()

    async def second(self) -> None:
        """Ends: the sub-run's model step and the sub-run; the root asks for an approval."""
        child, root = self.runs["child"], self.runs["root"]
        await child.emit("text.delta", {"text": "nothing found"})
        await working(0.05)
        await child.emit("x.usage", {"input_tokens": 50, "output_tokens": 10})
        await child.emit("step.boundary", {"step_index": 0, "step_kind": "text-only"})
        await child.finish("done")
        await root.emit("run.lifecycle", {"state": "awaiting_approval", "reason": "1 call(s) wait"},
                        {"approval": {"calls": [{"call_id": "a1", "tool": "book", "input": {}}]}})
        await self.pub.flush()

    async def third(self) -> None:
        """Approved: the call it waited for, and the end."""
        root = self.runs["root"]
        await working(0.1)
        await root.emit("run.lifecycle", {"state": "running"})
        await root.emit("tool.start", {"call_id": "a1", "tool": "book", "input": {"hotel": 7}})
        await working(0.1)
        await root.emit("tool.end", {"call_id": "a1", "ok": True, "output": "booked"})
        await root.finish("done")
        await self.pub.flush()
