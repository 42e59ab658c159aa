"""The compiled OTLP writer (``runwire.jobs._otlp``) and its pure-Python twin
(``runwire.jobs.otlp.encode_request_python``) write the same bytes for any spans: checked over
generated spans, attributes and events, whichever twin the process otherwise runs."""

from __future__ import annotations

import importlib
import subprocess
import sys
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runwire.jobs import otlp
from runwire.jobs.otlp import encode_request_python
from runwire.jobs.spans import Span, SpanEvent

HINT = ("the compiled OTLP writer is not built: install a C compiler and Python's headers "
        "(Debian: apt-get install gcc python3-dev), then run scripts/bootstrap")


def compiled() -> ModuleType:
    try:
        return importlib.import_module("runwire.jobs._otlp")
    except ImportError:
        pytest.fail(HINT, pytrace=False)


def hex_id(digits: int) -> st.SearchStrategy[str]:
    return st.text("0123456789abcdefABCDEF", min_size=digits, max_size=digits)


texts = st.text(st.characters(exclude_categories=["Cs"]), max_size=300)
"""Any str that encodes as UTF-8 (a lone surrogate does not: both twins raise)."""
scalars = (texts | st.booleans() | st.integers(min_value=-(1 << 70), max_value=1 << 70)
           | st.floats(allow_nan=True) | st.none() | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner), max_leaves=12)
attributes = st.dictionaries(texts, values, max_size=8)
u64 = st.integers(min_value=0, max_value=(1 << 64) - 1)


@st.composite
def spans(draw: Any) -> Span:
    events = draw(st.lists(st.builds(SpanEvent, name=texts, ts=st.just(""), time_ns=u64, attributes=attributes),
                           max_size=3))
    return Span(trace_id=draw(hex_id(32)), span_id=draw(hex_id(16)),
                parent_span_id=draw(st.none() | st.just("") | hex_id(16)), name=draw(texts),
                operation=draw(st.sampled_from(["invoke_agent", "execute_tool", "chat"])), run_id="r",
                start_ts="", start_ns=draw(u64), end_ns=draw(u64), end_seq=1,
                status=draw(st.sampled_from(["unset", "ok", "error"])),
                status_message=draw(st.none() | texts), attributes=draw(attributes), events=events)


@settings(max_examples=400, deadline=None)
@given(st.lists(spans(), max_size=6), st.dictionaries(texts, texts, max_size=4), st.sampled_from(["", "1.2.3"]))
def test_the_compiled_writer_writes_the_python_twins_bytes(
    batch: list[Span], resource: dict[str, str], version: str
) -> None:
    assert compiled().encode_request(batch, resource, version) == encode_request_python(batch, resource, version)


def test_lengths_at_each_varint_boundary_and_large_requests_are_the_same_bytes() -> None:
    """A nested message's length is moved into place once its size is known: lengths of one, two
    and three varint bytes, and a request of several MB, come out as the Python twin's."""
    sizes = [0, 1, 126, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152]
    batch = [Span(trace_id="ab" * 16, span_id=f"{n:016x}", parent_span_id=None, name="chat", operation="chat",
                  run_id="r", start_ts="", start_ns=n, end_ns=n + 1, attributes={"v": "é" * (size // 2)})
             for n, size in enumerate(sizes)]
    assert compiled().encode_request(batch, {"service.name": "t"}) == encode_request_python(batch, {"service.name": "t"})


@pytest.mark.parametrize("change, error", [
    ({"end_ns": None}, ValueError), ({"operation": "fly"}, KeyError), ({"status": "maybe"}, KeyError),
    ({"attributes": {"k": "\ud800"}}, UnicodeEncodeError),
])
def test_what_the_python_twin_refuses_the_compiled_one_refuses(change: dict[str, Any], error: type) -> None:
    fields: dict[str, Any] = {"trace_id": "ab" * 16, "span_id": "01" * 8, "parent_span_id": None, "name": "n",
                              "operation": "chat", "run_id": "r", "start_ts": "", "start_ns": 1, "end_ns": 2}
    span = Span(**{**fields, **change})
    with pytest.raises(error):
        encode_request_python([span], {})
    with pytest.raises(error):
        compiled().encode_request([span], {})


def test_the_process_runs_the_compiled_writer_unless_told_not_to() -> None:
    """Installed with a compiler, the exporter folds (content off) and writes with the compiled
    twins; ``RUNWIRE_PURE=1`` runs the Python ones, and says nothing (it was asked for)."""
    compiled()
    code = ("from runwire.jobs import otlp; print(otlp.NATIVE, type(otlp.span_fold('r', False)).__name__, "
            "type(otlp.span_fold('r', True)).__name__)")
    for env, expected in (({}, "True SpanFold SpanTree"), ({"RUNWIRE_PURE": "1"}, "False SpanTree SpanTree")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={"PATH": "/usr/bin:/bin", **env})
        assert (out.stdout.strip(), out.stderr) == (expected, "")
    assert otlp.NATIVE is (otlp.encode_request is not encode_request_python)


def test_where_it_was_not_built_the_python_twin_runs_and_one_line_says_so() -> None:
    code = ("import sys; sys.modules['runwire.jobs._otlp'] = None\n"  # as where no compiler built it
            "from runwire.jobs import otlp; print(otlp.NATIVE)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "False"
    assert out.stderr.splitlines() == [
        "runwire: the compiled span export (runwire.jobs._otlp) is not built here (no C compiler at install); "
        "its pure-Python twin runs"]
