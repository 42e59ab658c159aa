"""``ai-sdk`` egress: a UI message stream that ``ai``'s readUIMessageStream accepts."""

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

SCRIPT = "verify-ai-sdk.mjs"
pytestmark = pytest.mark.node


def test_headers_announce_the_ui_message_stream() -> None:
    assert egress("ai-sdk").headers == {"x-vercel-ai-ui-message-stream": "v1"}


def test_tool_run_builds_the_assistant_message() -> None:
    summary = validate(SCRIPT, stream("ai-sdk", tool_run()))
    message = summary["message"]
    assert message["id"] == "run_tools"
    parts = [p for p in message["parts"] if p["type"] != "step-start"]
    assert [p["type"] for p in parts] == [
        "data-run.lifecycle", "reasoning", "text", "dynamic-tool", "dynamic-tool",
        "reasoning", "text", "data-x.usage",
    ]
    assert parts[1]["text"] == "Let me check the files."
    assert parts[6]["text"] == "Found two files; one was missing."
    ok, failed = parts[3], parts[4]
    assert (ok["toolName"], ok["state"], ok["input"], ok["output"]) == (
        "fs.list", "output-available", {"path": "."}, ["a.py", "b.py"])
    assert (failed["state"], failed["errorText"]) == ("output-error", "KAI-TOOL-0404: not found")
    assert sum(p["type"] == "step-start" for p in message["parts"]) == 2
    assert types(stream("ai-sdk", tool_run()))[-1] == "finish"


def test_children_keep_their_own_parts() -> None:
    frames = stream("ai-sdk", child_run())
    summary = validate(SCRIPT, frames)
    texts = [p for p in summary["message"]["parts"] if p["type"] == "text"]
    by_child = {p["text"]: (p.get("providerMetadata") or {}).get("runwire", {}).get("child_id") for p in texts}
    assert by_child == {"Splitting the work.": None, "child two ": "run_c2", "child one says": "run_c1",
                        "Merging.": None}
    spawn = [f for f in frames if f["type"] == "data-child.spawn"]
    assert [f["data"]["child_id"] for f in spawn] == ["run_c1", "run_c2"]


def test_endings() -> None:
    """done → finish(stop); aborted → abort; error → error + finish(error); no terminal → finish() errors."""
    assert stream("ai-sdk", all_runs()["aborted"])[-1] == {"type": "abort", "reason": "user cancelled"}
    error = stream("ai-sdk", error_run())
    assert error[-2:] == [{"type": "error", "errorText": "LLM call failed: API rate limit exceeded"},
                          {"type": "finish", "finishReason": "error"}]
    summary = validate(SCRIPT, error)
    assert summary["errors"] == ["LLM call failed: API rate limit exceeded"]
    dead = stream("ai-sdk", unterminated_run())
    assert dead[-1] == {"type": "finish", "finishReason": "error"}
    validate(SCRIPT, dead)


def test_join_after_the_end_sees_a_finished_message() -> None:
    encoder = egress("ai-sdk")
    for event in tool_run():
        encoder.convert(event)
    assert types(encoder.preamble()) == ["start", "finish"]
    assert encoder.finish() == []


def test_validator_rejects_a_delta_without_start() -> None:
    message = rejects(SCRIPT, [{"type": "start"}, {"type": "text-delta", "id": "t", "delta": "x"},
                               {"type": "finish"}])
    assert "text-start" in message


def test_a_joining_client_builds_the_rest_of_the_message() -> None:
    """Joined mid-text, readUIMessageStream's message holds the rest of the open text part."""
    events = tool_run()
    n = next(i for i, e in enumerate(events) if e.type == "text.delta" and e.payload_dict()["text"] == "Found ")
    parts = validate(SCRIPT, joined("ai-sdk", events, n + 1))["message"]["parts"]
    texts = [p["text"] for p in parts if p["type"] == "text"]
    assert texts == ["two files; one was missing."]
