"""``agui`` egress: AG-UI events that @ag-ui/client's verifyEvents accepts."""

from __future__ import annotations

import pytest

from runwire.protocols import egress
from tests.nodecheck import rejects, validate
from tests.protocols.runs import (
    all_runs,
    child_run,
    error_run,
    joined,
    stream,
    tool_run,
    types,
    unterminated_run,
)

SCRIPT = "verify-agui.mjs"
pytestmark = pytest.mark.node


def test_join_reopens_the_open_message_and_step() -> None:
    events = tool_run()
    n = next(i for i, e in enumerate(events) if e.type == "text.delta" and i > 8) + 1  # inside "Found two files"
    frames = joined("agui", events, n)
    assert types(frames)[:3] == ["RUN_STARTED", "STEP_STARTED", "TEXT_MESSAGE_START"]
    assert frames[2]["messageId"] == next(f for f in stream("agui", events)
                                         if f["type"] == "TEXT_MESSAGE_CONTENT" and f["delta"] == "Found ")["messageId"]


def test_the_ag_ui_client_builds_the_transcript() -> None:
    """@ag-ui/client's own agent (AbstractAgent.runAgent) turns the stream into the run's messages."""
    messages = validate(SCRIPT, stream("agui", tool_run()))["messages"]
    assert [(m["role"], m["content"], m["toolCalls"], m["toolCallId"]) for m in messages] == [
        ("reasoning", "Let me check the files.", [], None),
        ("assistant", "I'll look around.", [], None),
        ("assistant", None, [["fs.list", '{"path":"."}']], None),
        ("tool", '["a.py","b.py"]', [], "call_1"),
        ("assistant", None, [["fs.read", '{"file":"missing.py"}']], None),
        ("tool", "KAI-TOOL-0404: not found", [], "call_2"),
        ("reasoning", "Now summarise.", [], None),
        ("assistant", "Found two files; one was missing.", [], None),
    ]


def test_the_ag_ui_client_keeps_subagent_messages_apart() -> None:
    messages = validate(SCRIPT, stream("agui", child_run()))["messages"]
    by_agent: dict[str | None, list[str]] = {}
    for m in messages:
        if m["content"]:
            by_agent.setdefault(m["subagentRunId"], []).append(m["content"])
    assert by_agent == {
        None: ["Splitting the work.", "Merging."],
        "run_c1": ["child one thinks", "child one says"],
        "run_c2": ["child two ", "timeout"],
    }


def test_a_joining_client_builds_the_rest_of_the_message() -> None:
    """Joined mid-message, the client's transcript holds the rest of the open message."""
    events = tool_run()
    n = next(i for i, e in enumerate(events) if e.type == "text.delta" and e.payload_dict()["text"] == "Found ")
    messages = validate(SCRIPT, joined("agui", events, n + 1))["messages"]
    assert messages[-1]["content"] == "two files; one was missing."


def test_tool_calls_and_results() -> None:
    frames = stream("agui", tool_run())
    validate(SCRIPT, frames)
    starts = [f for f in frames if f["type"] == "TOOL_CALL_START"]
    assert [(f["toolCallId"], f["toolCallName"]) for f in starts] == [("call_1", "fs.list"), ("call_2", "fs.read")]
    args = [f["delta"] for f in frames if f["type"] == "TOOL_CALL_ARGS"]
    assert args == ['{"path":"."}', '{"file":"missing.py"}']
    results = [f for f in frames if f["type"] == "TOOL_CALL_RESULT"]
    assert [r["content"] for r in results] == ['["a.py","b.py"]', "KAI-TOOL-0404: not found"]
    assert [r["metadata"]["runwire"]["ok"] for r in results] == [True, False]
    assert types(frames)[-1] == "RUN_FINISHED" and frames[-1]["outcome"] == {"type": "success"}
    custom = [f for f in frames if f["type"] == "CUSTOM"]
    assert [c["name"] for c in custom] == ["run.lifecycle", "x.usage"]


def test_reasoning_uses_reasoning_events() -> None:
    frames = stream("agui", tool_run())
    kinds = types(frames)
    assert kinds[kinds.index("REASONING_START"):kinds.index("REASONING_START") + 5] == [
        "REASONING_START", "REASONING_MESSAGE_START", "REASONING_MESSAGE_CONTENT", "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END",
    ]
    assert "THINKING_START" not in kinds


def test_children_become_subagents() -> None:
    frames = stream("agui", child_run())
    summary = validate(SCRIPT, frames)
    assert summary["counts"]["SUBAGENT_STARTED"] == 2
    started = [f for f in frames if f["type"] == "SUBAGENT_STARTED"]
    assert started[0]["subagentRunId"] == "run_c1" and started[0]["description"] == "research A"
    c1 = [f for f in frames if f.get("subagentRunId") == "run_c1" and f["type"] == "TEXT_MESSAGE_CONTENT"]
    assert [f["delta"] for f in c1] == ["child one says"]
    ends = {f["subagentRunId"]: f["type"] for f in frames if f["type"].startswith("SUBAGENT_") and
            f["type"] != "SUBAGENT_STARTED"}
    assert ends == {"run_c1": "SUBAGENT_FINISHED", "run_c2": "SUBAGENT_ERROR"}


def test_error_and_aborted_endings() -> None:
    frames = stream("agui", error_run())
    assert frames[-1] == {"type": "RUN_ERROR", "message": "LLM call failed: API rate limit exceeded",
                          "code": "error", "timestamp": frames[-1]["timestamp"]}
    aborted = stream("agui", all_runs()["aborted"])
    assert aborted[-1]["type"] == "RUN_FINISHED" and aborted[-1]["outcome"] == {"type": "cancelled"}
    assert aborted[-2]["type"] == "STEP_FINISHED"


def test_finish_ends_a_stream_without_terminal_event() -> None:
    """Every stream ends — finish() closes what is open and reports the run as errored."""
    frames = stream("agui", unterminated_run())
    validate(SCRIPT, frames)
    assert frames[-1]["type"] == "RUN_ERROR" and frames[-1]["code"] == "incomplete"
    encoder = egress("agui")
    assert encoder.finish() == [] and encoder.preamble() == []


def test_nothing_after_the_terminal_event_and_late_joiners_see_a_complete_run() -> None:
    events = tool_run()
    encoder = egress("agui")
    for event in events:
        encoder.convert(event)
    assert encoder.convert(events[3]) == [] and encoder.finish() == []
    late = encoder.preamble()
    assert types(late) == ["RUN_STARTED", "RUN_FINISHED"]
    validate(SCRIPT, late)


def test_validator_rejects_content_without_start() -> None:
    """The validator itself can fail (a test that cannot fail is a defect)."""
    message = rejects(SCRIPT, [
        {"type": "RUN_STARTED", "threadId": "t", "runId": "r"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "x"},
        {"type": "RUN_FINISHED", "threadId": "t", "runId": "r"},
    ])
    assert "No active text message" in message


