"""Format auto-detection from a stream's first frames."""

from __future__ import annotations

import pytest

from runwire.core.errors import ConfigError
from runwire.protocols.detect import detect
from tests.protocols.roundtrip import FIXTURES


def _first_lines(path: str, count: int = 20) -> list[bytes]:
    return (FIXTURES / path).read_bytes().splitlines(keepends=True)[:count]


@pytest.mark.parametrize(
    ("fmt", "name"),
    [
        (fmt, path.name)
        for fmt in ("koder", "loom", "loom-export", "loom-mcp", "cogency", "cogency-wire")
        for path in sorted((FIXTURES / fmt).iterdir())
    ],
)
def test_every_fixture_is_detected_as_its_format(fmt: str, name: str) -> None:
    assert detect(_first_lines(f"{fmt}/{name}")) == fmt


def test_each_fixture_is_detected_from_its_first_line_alone() -> None:
    for fmt in ("koder", "loom", "loom-export", "loom-mcp", "cogency"):
        for path in sorted((FIXTURES / fmt).glob("*.ndjson")):
            assert detect(_first_lines(f"{fmt}/{path.name}", 1)) == fmt, path


def test_shared_type_names_are_told_apart_by_the_envelope_shape() -> None:
    """loom and loom-mcp both have tool_start/tool_end/usage: flat payload vs Pulse envelope."""
    assert (
        detect([b'{"type":"usage","prompt_tokens":1,"completion_tokens":2,"total_tokens":3}'])
        == "loom"
    )
    mcp = b'{"type":"usage","run_id":"r","timestamp":"2026-01-01T00:00:00Z","payload":{"input_tokens":1}}'
    assert detect([mcp]) == "loom-mcp"
    assert detect([b'{"type":"tool_start","name":"shell"}']) == "loom"


def test_loom_reply_frame_is_loom() -> None:
    assert detect([b'{"reply":"done","event_id":3}']) == "loom"


def test_raw_llm_text_with_markers_is_cogency_wire() -> None:
    assert (
        detect([b"Sure.\n", b"<think>plan</think>\n", b"<respond>hi</respond>\n"]) == "cogency-wire"
    )


@pytest.mark.parametrize(
    "lines",
    [
        [],
        [b"\n", b"  \n"],
        [b"hello world\n"],
        [b'{"foo":1}\n'],
        [b"[1,2,3]\n"],
        [b'{"type":"node_enter","id":"a"}\n', b'{"type":"think","content":"x"}\n'],
    ],
)
def test_undecidable_input_is_a_clear_config_error(lines: list[bytes]) -> None:
    with pytest.raises(ConfigError, match="cannot detect the input format"):
        detect(lines)
