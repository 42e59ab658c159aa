"""Cogency streaming protocol, "Storage → Messages Transformation": stored events → chat messages.

"Events grouped by role (user vs assistant turns)"; "Tool results become user
messages (API constraint)"; "Turn structure matches wire protocol (think →
execute → results → respond)"; "Chronological reconstruction collects granular
call events, batches them in JSON array".
"""

from __future__ import annotations

import json
from pathlib import Path

from runwire.core.envelope import Event
from runwire.jobs.messages import SEPARATOR, to_messages
from runwire.protocols.cogency import CogencyIngest
from runwire.store import open_store
from tests.events import event

FIXTURES = Path(__file__).parent.parent / "fixtures" / "cogency"


def _cogency_events(name: str, run_id: str = "run") -> list[Event]:
    codec = CogencyIngest(run_id=run_id, clock=lambda: "2026-01-01T00:00:00.000Z")
    events: list[Event] = []
    for line in (FIXTURES / name).read_bytes().splitlines():
        events.extend(codec.feed(line))
    return events


SEED_OUTPUT = [
    {"role": "user", "content": "debug app.py"},
    {"role": "assistant", "content": "<think>should read file</think>\n\n<execute>\n"
     '[{"name": "read", "args": {"file": "app.py"}}]\n</execute>'},
    {"role": "user", "content": '<results>\n[{"tool": "read", "status": "success", '
     '"content": "..."}]\n</results>'},
    {"role": "assistant", "content": "fixed the bug"},
]


def test_cogency_example_in_cogency_style() -> None:
    """The Cogency streaming protocol's example input gives its example output (less the system prompt runwire can't know)."""
    assert to_messages(_cogency_events("storage.ndjson"), style="cogency") == SEED_OUTPUT


def test_cogency_example_in_chat_completions_shape() -> None:
    messages = to_messages(_cogency_events("storage.ndjson"))
    assert messages == [
        {"role": "user", "content": "debug app.py"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "run.call.3", "type": "function",
            "function": {"name": "read", "arguments": '{"file": "app.py"}'}}]},
        {"role": "tool", "tool_call_id": "run.call.3", "content": "..."},
        {"role": "assistant", "content": "fixed the bug"},
    ]


def test_calls_batch_in_one_turn_and_failures_carry_the_outcome() -> None:
    """Several calls of one turn → one assistant message; a failed call's result says why."""
    messages = to_messages(_cogency_events("tools_failing.ndjson"), reasoning=True)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assistant = messages[1]
    assert assistant["reasoning_content"] == "I should check what files exist first."
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["list", "read"]
    assert json.loads(messages[2]["content"]) == ["main.py", "config.json", "README.md"]
    assert messages[3] == {"role": "tool", "tool_call_id": assistant["tool_calls"][1]["id"],
                           "content": "File not found: config.json"}
    assert messages[4]["content"].endswith("héllo")


def test_streamed_deltas_join_and_child_events_stay_out() -> None:
    events = [
        event("r", 1, "x.cogency.user", {"content": "hi"}),
        event("r", 2, "text.delta", {"text": "Hel"}),
        event("r", 3, "text.delta", {"text": "sub-agent says"}, child_id="kid"),
        event("r", 4, "reasoning.delta", {"text": "hmm"}),
        event("r", 5, "text.delta", {"text": "lo"}),
        event("r", 6, "run.lifecycle", {"state": "done"}),
    ]
    assert to_messages(events) == [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"}]
    assert to_messages(events, children=True)[1]["content"] == "Hello\n\nsub-agent says"


def test_with_children_each_runs_text_stays_whole_between_separators() -> None:
    """Children answering at once interleave their deltas; a message keeps each run's text in
    one piece — the run's own first, then each child's as it first spoke — a blank line apart."""
    events = [
        event("r", 1, "text.delta", {"text": "a"}, child_id="kid-2"),
        event("r", 2, "text.delta", {"text": "x"}, child_id="kid-1"),
        event("r", 3, "text.delta", {"text": "Sum"}),
        event("r", 4, "text.delta", {"text": "b"}, child_id="kid-2"),
        event("r", 5, "reasoning.delta", {"text": "why"}, child_id="kid-1"),
        event("r", 6, "text.delta", {"text": "y"}, child_id="kid-1"),
        event("r", 7, "text.delta", {"text": "mary"}),
    ]
    (chat,) = to_messages(events, children=True, reasoning=True)
    assert chat["content"] == "Summary" + SEPARATOR + "ab" + SEPARATOR + "xy"
    assert chat["reasoning_content"] == "why"
    (cogency,) = to_messages(events, children=True, style="cogency")
    assert cogency["content"] == "<think>why</think>\n\nSummary\n\nab\n\nxy"


async def test_messages_of_a_stored_run(tmp_path: Path) -> None:
    """The replay job reads the run back from the log and gets the same messages."""
    async with open_store(f"sqlite:///{tmp_path}/r.db") as log:
        await log.append(_cogency_events("storage.ndjson", run_id="stored"))
        stored = [e async for e in log.iter_events("stored")]
    assert to_messages(stored, style="cogency") == SEED_OUTPUT
