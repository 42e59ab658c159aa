"""The page's run model (pipeline/edge/static/model.js) in Chromium, on event sequences a live
page can meet: a sub-run's events before its parent's spawn, a repeat, a call whose start it
never saw, several usage reports. The model is imported from the edge like the page does."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runwire.core.envelope import Event, to_builtins
from runwire.edge import EdgeSettings
from tests.browser.browser import BrowserMissing, browser
from tests.edge.harness import serve_edge
from tests.events import event

pytestmark = pytest.mark.slow

SUMMARY = """(async () => {
  const { RunModel } = await import('/static/model.js');
  const model = new RunModel(%s);
  for (const e of %s) model.apply(e);
  const nodes = {};
  for (const n of model.ordered()) nodes[n.id] = {
    parent: n.parent ? n.parent.id : null, state: n.state, events: n.events,
    text: n.items.filter((i) => i.kind === 'text').map((i) => i.parts.join('')),
    tools: n.tools.map((t) => [t.name, t.ok, t.durationMs]),
    usage: [n.usage.input, n.usage.output, n.usage.total], tree: n.treeUsage(),
  };
  return { nodes, count: model.count, lastSeq: model.lastSeq };
})()"""


async def summary(root: str, events: list[Event], store: Any, bus: Any) -> dict[str, Any]:
    try:
        async with serve_edge(bus, store, EdgeSettings()) as edge, browser() as page:
            await page.goto(f"{edge.url}/")
            data = json.dumps([to_builtins(e) for e in events])
            result: dict[str, Any] = await page.eval(SUMMARY % (json.dumps(root), data))
            return result
    except BrowserMissing as exc:
        pytest.fail(str(exc), pytrace=False)


async def test_the_model_nests_repeats_nothing_and_sums_usage(memory_bus: Any, store: Any) -> None:
    r = "root"
    events = [
        event(r, 1, "run.lifecycle", {"state": "running"}),
        # a grandchild's event before its parent's spawn: parent_id places it
        event(r, 2, "text.delta", {"text": "deep"}, child_id="root.a.b", parent_id="root.a", root_id=r),
        event(r, 3, "child.spawn", {"child_id": "root.a"}),
        event(r, 4, "text.delta", {"text": "hello"}),
        event(r, 4, "text.delta", {"text": "hello"}),  # a repeat (same seq): ignored
        event(r, 5, "text.delta", {"text": " world"}),
        # a call whose start the page never saw
        event(r, 6, "tool.end", {"call_id": "c0", "ok": False, "error": "boom", "duration_ms": 7}),
        event(r, 7, "tool.start", {"call_id": "c1", "tool": "search"}),
        event(r, 8, "tool.end", {"call_id": "c1", "ok": True, "duration_ms": 30}),
        event(r, 9, "x.usage", {"input_tokens": 10, "output_tokens": 2, "total_tokens": 12}),
        event(r, 10, "x.usage", {"input_tokens": 5, "output_tokens": 1}),  # no total: in + out
        event(r, 11, "x.usage", {"input_tokens": 100, "output_tokens": 20, "total_tokens": 120},
              child_id="root.a.b", parent_id="root.a", root_id=r),
        event(r, 12, "run.lifecycle", {"state": "done"}, child_id="root.a.b", parent_id="root.a", root_id=r),
        event(r, 13, "run.lifecycle", {"state": "done"}),
    ]
    got = await summary(r, events, store, memory_bus)
    nodes = got["nodes"]
    assert list(nodes) == ["root", "root.a", "root.a.b"]
    assert (nodes["root.a"]["parent"], nodes["root.a.b"]["parent"]) == ("root", "root.a")
    assert nodes["root"]["text"] == ["hello world"]
    assert nodes["root.a.b"]["text"] == ["deep"]
    assert got["count"] == len(events) - 1 and got["lastSeq"] == 13
    assert nodes["root"]["tools"] == [["(tool)", False, 7], ["search", True, 30]]
    assert nodes["root"]["usage"] == [15, 3, 18]
    assert nodes["root"]["tree"] == {"input": 115, "output": 23, "total": 138}
    assert nodes["root.a"]["tree"] == {"input": 100, "output": 20, "total": 120}
    assert (nodes["root"]["state"], nodes["root.a"]["state"], nodes["root.a.b"]["state"]) == ("done", None, "done")
