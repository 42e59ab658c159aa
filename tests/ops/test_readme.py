"""The README's first example, run as written against a running `runwire up` (the URL line changed
to the test's port): an agent in another process publishes a run with a sub-agent over HTTP."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.ops.conftest import runwire_env, stream_events

pytestmark = pytest.mark.slow
README = Path(__file__).resolve().parents[2] / "README.md"
BUS_LINE = 'BUS = "http://127.0.0.1:8765"'


def example(heading: str) -> str:
    """The first python example under ``heading`` in the README."""
    section = README.read_text().split(heading, 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"the README's {heading} has a python example"
    return match[1]


def run_as_written(code: str, start_up: Any, tmp_path: Path) -> tuple[str, str]:
    """Run a README example against a running ``runwire up`` (its ``BUS`` line pointed there);
    returns the edge's base URL and what the example printed."""
    up = start_up("--data-dir", str(tmp_path / "data"))
    agent = tmp_path / "agent.py"
    agent.write_text(code.replace(BUS_LINE, f'BUS = "{up.base}"'))
    done = subprocess.run([sys.executable, str(agent)], cwd=tmp_path, env=runwire_env(), capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return up.base, done.stdout


def test_the_readme_agent_reaches_a_running_up_and_its_child_fans_into_the_run(
    start_up: Any, tmp_path: Path
) -> None:
    code = example("## First steps")
    assert BUS_LINE in code and "from runwire import Publisher" in code
    base, _printed = run_as_written(code, start_up, tmp_path)
    events = stream_events(base, "hello-run")
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    mine = "".join(e["payload"]["text"] for e in events if e["type"] == "text.delta")
    assert mine == "Let me look that up. Found three results."
    child = [(e["type"], e["child_id"]) for e in events if e.get("child_id")]
    assert ("tool.start", "hello-run.search") in child and ("tool.end", "hello-run.search") in child
    assert events[-1]["payload"]["state"] == "done"


def test_the_readme_framework_agent_publishes_its_run_with_its_tool_call(
    start_up: Any, tmp_path: Path
) -> None:
    """The README's framework example as written (pydantic-ai and its offline test model):
    three lines publish the run — its text, its tool call paired with arguments and output."""
    code = example("### From your agent framework")
    assert BUS_LINE in code and "from runwire.integrations import pydantic_ai" in code
    base, printed = run_as_written(code, start_up, tmp_path)
    assert printed.strip() == "Sunny, 21 degrees."
    events = stream_events(base, "weather-run")
    text = "".join(e["payload"]["text"] for e in events if e["type"] == "text.delta")
    assert text == "Sunny, 21 degrees."
    start = next(e["payload"] for e in events if e["type"] == "tool.start")
    end = next(e["payload"] for e in events if e["type"] == "tool.end")
    assert start["tool"] == "forecast" and set(start["input"]) == {"city"}
    assert end["call_id"] == start["call_id"] and end["ok"] is True and end["output"].endswith(": sunny")
    assert [e["payload"]["state"] for e in events if e["type"] == "run.lifecycle"] == ["running", "done"]
