"""The egress formats whose clients are strict — ``agui`` (@ag-ui/client's verifyEvents and
@ag-ui/core's schemas) and ``ai-sdk`` (``ai``'s uiMessageChunkSchema and readUIMessageStream) —
checked by those clients themselves: every sample run, a join after every event, 200 random
runs. Each format's own behaviour is in tests/protocols/test_agui.py and test_ai_sdk.py."""

from __future__ import annotations

from typing import Any

import pytest

from tests.nodecheck import validate_many
from tests.protocols.runs import all_runs, joined, random_run, stream

VALIDATORS = {"agui": "verify-agui.mjs", "ai-sdk": "verify-ai-sdk.mjs"}
pytestmark = [pytest.mark.node, pytest.mark.parametrize("codec", sorted(VALIDATORS))]


def test_every_sample_run_passes_the_clients_own_checks(codec: str) -> None:
    """Every run — reasoning, text, tool calls incl. a failing one, steps, plan, children, usage,
    aborted/error endings, no ending — is accepted by the format's client."""
    streams = {name: stream(codec, events) for name, events in all_runs().items()}
    assert len(validate_many(VALIDATORS[codec], streams)) == len(streams)


@pytest.mark.slow
def test_a_client_joining_after_any_event_is_accepted(codec: str) -> None:
    """A mid-stream join: the preamble re-opens what is open, so the client goes on."""
    streams = {
        f"{name}@{n}": joined(codec, events, n)
        for name, events in all_runs().items()
        for n in range(1, len(events))
    }
    validate_many(VALIDATORS[codec], streams)


def test_output_is_deterministic(codec: str) -> None:
    """Egress is a pure function of the events: two encoders give identical frames."""
    for events in all_runs().values():
        assert stream(codec, events) == stream(codec, events)


@pytest.mark.slow
def test_random_runs_and_joins_are_accepted(codec: str) -> None:
    """200 reproducible random runs (any mix of lanes, tools, steps, endings), each also joined mid-way."""
    streams: dict[str, list[Any]] = {}
    for seed in range(200):
        events = random_run(seed)
        streams[f"rand{seed}"] = stream(codec, events)
        cut = 1 + seed % (len(events) - 1)
        streams[f"rand{seed}@{cut}"] = joined(codec, events, cut)
    validate_many(VALIDATORS[codec], streams)
