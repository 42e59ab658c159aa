"""The span derivation (runwire.jobs.spans): a run's events → its OpenTelemetry GenAI span tree."""

from __future__ import annotations

from runwire.jobs.spans import Span, SpanTree, derive_spans, span_id, trace_id
from tests.events import T0, event
from tests.jobs.traced import CHILD, GRANDCHILD, ROOT, traced_run

MS = 1_000_000
T0_NS = int(T0.timestamp() * 1000) * MS


def by_name(spans: list[Span]) -> dict[str, Span]:
    named = {span.name: span for span in spans}
    assert len(named) == len(spans), [s.name for s in spans]
    return named


def at(seconds: float) -> int:
    return T0_NS + int(seconds * 1000) * MS


def test_a_run_with_two_levels_of_sub_runs_becomes_one_tree_timed_by_its_events() -> None:
    spans = by_name(derive_spans(ROOT, traced_run()))
    assert set(spans) == {"invoke_agent planner", "chat gpt-test", "invoke_agent researcher", "invoke_agent",
                          "execute_tool grep", "chat", "execute_tool book"}
    root, child, grand = spans["invoke_agent planner"], spans["invoke_agent researcher"], spans["invoke_agent"]
    assert {s.trace_id for s in spans.values()} == {trace_id(ROOT)}
    assert root.parent_span_id is None
    assert child.parent_span_id == root.span_id and grand.parent_span_id == child.span_id
    assert spans["execute_tool grep"].parent_span_id == grand.span_id
    assert spans["execute_tool book"].parent_span_id == root.span_id
    assert spans["chat gpt-test"].parent_span_id == root.span_id and spans["chat"].parent_span_id == child.span_id
    # times are the events' own: a sub-run from its spawn, a model step from what ended before it
    assert (root.start_ns, root.end_ns) == (at(0), at(18))
    assert (child.start_ns, child.end_ns) == (at(3), at(12))
    assert (grand.start_ns, grand.end_ns) == (at(5), at(9))
    assert (spans["execute_tool grep"].start_ns, spans["execute_tool grep"].end_ns) == (at(6), at(8))
    assert (spans["chat gpt-test"].start_ns, spans["chat gpt-test"].end_ns) == (at(0), at(2))
    assert (spans["chat"].start_ns, spans["chat"].end_ns) == (at(9), at(11))
    assert root.attributes["runwire.run_id"] == ROOT and grand.attributes["runwire.run_id"] == GRANDCHILD
    assert root.attributes["gen_ai.conversation.id"] == "chat-1"
    assert root.attributes["gen_ai.agent.name"] == "planner" and "gen_ai.agent.name" not in grand.attributes
    assert child.attributes["gen_ai.agent.id"] == CHILD


def test_a_failing_tool_and_a_failed_run_have_error_status_and_usage_sits_on_its_model_step() -> None:
    spans = by_name(derive_spans(ROOT, traced_run()))
    grep = spans["execute_tool grep"]
    assert (grep.status, grep.status_message, grep.attributes["error.type"]) == ("error", "took too long", "Timeout")
    assert spans["execute_tool book"].status == "unset"
    assert spans["invoke_agent"].status == "error" and spans["invoke_agent"].status_message == "grep failed"
    assert spans["invoke_agent planner"].status == "unset"
    chat = spans["chat gpt-test"].attributes
    assert (chat["gen_ai.usage.input_tokens"], chat["gen_ai.usage.output_tokens"]) == (100, 20)
    assert chat["gen_ai.request.model"] == "gpt-test" and chat["gen_ai.operation.name"] == "chat"
    assert spans["chat"].attributes["gen_ai.usage.input_tokens"] == 50
    assert "gen_ai.usage.input_tokens" not in spans["invoke_agent planner"].attributes
    # no content without the opt-in; with it, the call's arguments and result and the step's text
    assert not any(k.startswith(("gen_ai.tool.call.arguments", "gen_ai.output")) for k in grep.attributes)
    with_content = by_name(derive_spans(ROOT, traced_run(), content=True))
    assert with_content["execute_tool book"].attributes["gen_ai.tool.call.arguments"] == '{"hotel":7}'
    assert with_content["execute_tool book"].attributes["gen_ai.tool.call.result"] == '"booked"'
    assert "nothing found" in with_content["chat"].attributes["gen_ai.output.messages"]


def test_an_approval_is_two_span_events_on_the_run_that_waited() -> None:
    root = by_name(derive_spans(ROOT, traced_run()))["invoke_agent planner"]
    assert [(e.name, e.time_ns) for e in root.events] == [
        ("runwire.approval.requested", at(13)), ("runwire.approval.resolved", at(15))]
    assert root.events[0].attributes == {"runwire.approval.calls": 1, "runwire.approval.tools": ["book"],
                                         "runwire.reason": "1 call(s) wait for a decision"}
    assert root.events[1].attributes == {"runwire.run.state": "running", "runwire.approval.wait_ms": 2000}


def test_spans_end_with_the_event_that_ends_them_children_first_and_ids_do_not_depend_on_who_derives() -> None:
    events = traced_run()
    tree = SpanTree(ROOT, keep=False)
    ended = [(event.seq, span.name) for event in events for span in tree.apply(event)]
    assert ended == [(3, "chat gpt-test"), (8, "execute_tool grep"), (9, "invoke_agent"), (12, "chat"),
                     (13, "invoke_agent researcher"), (17, "execute_tool book"), (18, "invoke_agent planner")]
    assert tree.spans() == [] and tree.open_spans() == []
    # a derivation resumed part way (a successor worker) gives the same spans with the same ids
    again = SpanTree(ROOT, keep=False)
    for e in events[:10]:
        again.apply(e)
    later = {s.span_id: s for e in events[10:] for s in again.apply(e)}
    whole = {s.span_id: s for s in derive_spans(ROOT, events)}
    assert all(later[k] == whole[k] for k in later)
    assert span_id(ROOT, "agent", ROOT) == whole[span_id(ROOT, "agent", ROOT)].span_id
    # a repeated event changes nothing
    assert tree.apply(events[-1]) == []


def test_what_is_open_is_open_and_a_run_ending_closes_what_it_left_open() -> None:
    events = [event("r", 1, "tool.start", {"call_id": "c", "tool": "slow"}, second=1),
              event("r", 2, "child.spawn", {"child_id": "r.k"}, second=2)]
    tree = SpanTree("r")
    for e in events:
        tree.apply(e)
    assert sorted(s.name for s in tree.open_spans()) == ["execute_tool slow", "invoke_agent", "invoke_agent"]
    assert all(s.end_ts is None for s in tree.spans())
    ended = tree.apply(event("r", 3, "run.lifecycle", {"state": "aborted", "reason": "stop"}, second=3))
    assert [s.name for s in ended] == ["invoke_agent", "execute_tool slow", "invoke_agent"]
    assert ended[1].status == "error" and ended[2].attributes["runwire.run.state"] == "aborted"
    assert ended[2].status == "unset"


def test_folding_many_at_once_is_folding_one_by_one() -> None:
    events = traced_run()
    for content in (False, True):
        one = SpanTree(ROOT, content=content)
        for e in events:
            one.apply(e)
        many = SpanTree(ROOT, content=content)
        assert [s.name for s in many.apply_many(events[:9])] == ["chat gpt-test", "execute_tool grep", "invoke_agent"]
        assert [s.name for s in many.apply_many(events[9:], past=13)] == ["execute_tool book", "invoke_agent planner"]
        assert many.spans() == one.spans() and many.last_seq == one.last_seq == len(events)


def test_a_stream_naming_a_run_under_itself_as_its_parent_keeps_the_tree_a_tree() -> None:
    """``r.a`` spawns ``r.b``; then an event of ``r.a`` names ``r.b`` its parent. Adopted, the two
    would be each other's parent, cut off from the root: the root's end would leave both open,
    their spans never sent. The first parent stays, and every span ends once."""
    events = [event("r", 1, "child.spawn", {"child_id": "r.a"}, second=1),
              event("r", 2, "child.spawn", {"child_id": "r.b"}, second=2, child_id="r.a"),
              event("r", 3, "x.usage", {"input_tokens": 1}, second=3, child_id="r.a", parent_id="r.b"),
              event("r", 4, "run.lifecycle", {"state": "done"}, second=4)]
    spans = SpanTree("r").apply_many(events)
    assert [s.run_id for s in spans] == ["r.b", "r.a", "r"]
    assert spans[0].parent_span_id == spans[1].span_id and spans[1].parent_span_id == spans[2].span_id
