"""``streamweave`` egress: the StreamWeave RPC's WeaveProgress view computed from a run's events."""

from __future__ import annotations

from typing import Any

from runwire.protocols import egress
from tests.protocols.runs import (
    Run,
    all_runs,
    child_run,
    error_run,
    joined,
    plan_run,
    stream,
    tool_run,
)

STAGES = {
    "EXECUTION_STAGE_PATTERN_SELECTION", "EXECUTION_STAGE_SCHEMA_DISCOVERY", "EXECUTION_STAGE_LLM_GENERATION",
    "EXECUTION_STAGE_TOOL_EXECUTION", "EXECUTION_STAGE_GUARDRAIL_CHECK", "EXECUTION_STAGE_SELF_CORRECTION",
    "EXECUTION_STAGE_COMPLETED", "EXECUTION_STAGE_FAILED",
}


def view(frames: list[dict[str, Any]]) -> list[tuple[str, int, str | None]]:
    return [(f["stage"].removeprefix("EXECUTION_STAGE_"), f["progress"], f.get("tool_name")) for f in frames]


def test_tool_run_follows_the_stage_progress_table() -> None:
    """StreamWeave RPC: LLM_GENERATION "20% + (turn × 10%)", TOOL_EXECUTION "50% + (execution_count × 5%)",
    ending "COMPLETED 100" with partial_result."""
    frames = stream("streamweave", tool_run())
    assert view(frames) == [
        ("LLM_GENERATION", 20, None),
        ("TOOL_EXECUTION", 55, "fs.list"),
        ("TOOL_EXECUTION", 60, "fs.read"),
        ("SELF_CORRECTION", 90, "fs.read"),
        ("LLM_GENERATION", 30, None),
        ("COMPLETED", 100, None),
    ]
    assert frames[0]["message"] == "Generating response (turn 1)"
    assert frames[1]["message"] == "Executing tool: fs.list"
    assert frames[-1]["partial_result"] == {"type": "text", "data_json": "Found two files; one was missing."}
    assert frames[-1]["timestamp"] == 1778787733  # unix seconds of the done event
    assert all(set(f) <= {"stage", "progress", "message", "tool_name", "timestamp", "partial_result"}
               for f in frames)


def test_progress_caps_at_the_table_maximum() -> None:
    """LLM_GENERATION max 40 %, TOOL_EXECUTION max 80 %."""
    r = Run("run_many")
    for i in range(10):
        r.say(f"turn {i}").tool(f"c{i}", "t", {}).result(f"c{i}", i)
    r.life("done")
    frames = stream("streamweave", r.events)
    llm = [f["progress"] for f in frames if f["stage"].endswith("LLM_GENERATION")]
    tools = [f["progress"] for f in frames if f["stage"].endswith("TOOL_EXECUTION")]
    assert llm == [20, 30, 40, 40, 40, 40, 40, 40, 40, 40]
    assert tools == [55, 60, 65, 70, 75, 80, 80, 80, 80, 80]
    assert frames[-1]["partial_result"]["data_json"] == "turn 9"


def test_plan_and_failed_endings() -> None:
    """Planning is PATTERN_SELECTION 10; an error ends FAILED 0 with the error message."""
    assert view(stream("streamweave", plan_run()))[:3] == [
        ("PATTERN_SELECTION", 10, None), ("PATTERN_SELECTION", 10, None), ("PATTERN_SELECTION", 10, None)]
    failed = stream("streamweave", error_run())
    assert failed[-1] == {"stage": "EXECUTION_STAGE_FAILED", "progress": 0,
                          "message": "LLM call failed: API rate limit exceeded", "timestamp": failed[-1]["timestamp"]}
    aborted = stream("streamweave", all_runs()["aborted"])
    assert aborted[-1]["stage"] == "EXECUTION_STAGE_FAILED" and "user cancelled" in aborted[-1]["message"]


def test_every_stream_ends_completed_or_failed() -> None:
    for name, events in all_runs().items():
        frames = stream("streamweave", events)
        assert frames, name
        assert {f["stage"] for f in frames} <= STAGES
        assert all(0 <= f["progress"] <= 100 and isinstance(f["timestamp"], int) for f in frames)
        last = frames[-1]
        assert (last["stage"], last["progress"]) in {("EXECUTION_STAGE_COMPLETED", 100),
                                                     ("EXECUTION_STAGE_FAILED", 0)}, name
        assert ("partial_result" in last) == (last["progress"] == 100)


def test_child_events_do_not_move_the_parent() -> None:
    frames = stream("streamweave", child_run())
    assert all(f.get("tool_name") != "web.search" for f in frames)
    assert frames[-1]["partial_result"] == {"type": "text", "data_json": "Merging."}


def test_structured_result_when_no_text() -> None:
    r = Run("run_q").tool("c", "execute_query", {"sql": "select 1"}).result("c", {"rows": [[1]]}).life("done")
    assert stream("streamweave", r.events)[-1]["partial_result"] == {
        "type": "structured", "data_json": '{"rows": [[1]]}'}


def test_joining_client_gets_the_current_progress_first() -> None:
    events = tool_run()
    frames = joined("streamweave", events, 5)  # just after the first tool call
    assert view(frames)[0] == ("TOOL_EXECUTION", 55, "fs.list")
    assert frames[1:] == stream("streamweave", events)[2:]


def test_deterministic() -> None:
    for events in all_runs().values():
        assert stream("streamweave", events) == stream("streamweave", events)
    assert egress("streamweave").finish() == []
