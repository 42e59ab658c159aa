"""Tests sync on conditions (``tests/waiting.py``), not on fixed sleeps.

A fixed sleep is a call to ``sleep`` with a constant duration outside any loop's body: in a
polling loop the sleep is the pause between two checks of a condition, outside one it is a guess
at how long something takes. The few left wait on time itself (a heartbeat outliving a ttl, a
header deadline passing, a run's silence limit) or slow down an injected fault; ``sleep(0)``
yields to the event loop and waits for nothing.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from tests.waiting import until

TESTS = Path(__file__).resolve().parent
MAX_FIXED_SLEEPS = 10
LOOPS = (ast.For, ast.AsyncFor, ast.While)
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _is_fixed_sleep(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call) or not node.args:
        return False
    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
    duration = node.args[0]
    return name == "sleep" and isinstance(duration, ast.Constant) and duration.value != 0


def _fixed_sleeps(node: ast.AST, in_loop: bool = False) -> list[int]:
    """Lines of fixed sleeps under ``node``; a function's body starts outside any loop."""
    if isinstance(node, SCOPES):
        in_loop = False
    found = [node.lineno] if _is_fixed_sleep(node) and not in_loop else []  # type: ignore[attr-defined]
    for child in ast.iter_child_nodes(node):
        inside = in_loop or (isinstance(node, LOOPS) and child in (*node.body, *node.orelse))
        found += _fixed_sleeps(child, inside)
    return found


def fixed_sleeps(root: Path = TESTS) -> list[str]:
    """``path:line`` of each fixed sleep under ``root``."""
    return [
        f"{path.relative_to(root)}:{line}"
        for path in sorted(root.rglob("*.py"))
        if "node_modules" not in path.parts
        for line in _fixed_sleeps(ast.parse(path.read_text()))
    ]


def test_tests_wait_for_conditions_not_fixed_times() -> None:
    found = fixed_sleeps()
    assert len(found) <= MAX_FIXED_SLEEPS, (
        f"{len(found)} fixed sleeps outside polling loops (at most {MAX_FIXED_SLEEPS}); wait for a "
        "condition with tests.waiting.until instead:\n" + "\n".join(found)
    )


def test_the_count_sees_sleeps_outside_loops_only(tmp_path: Path) -> None:
    (tmp_path / "sample.py").write_text(
        "import asyncio, time\n"
        "async def f():\n"
        "    await asyncio.sleep(0.3)\n"          # counted
        "    while True:\n"
        "        await asyncio.sleep(0.05)\n"     # a polling loop's pause
        "    for _ in range(3):\n"
        "        def g():\n"
        "            time.sleep(1)\n"             # a function of its own: outside a loop
        "    await asyncio.sleep(0)\n"            # a yield
        "    await asyncio.sleep(delay)\n"        # not a constant
    )
    assert fixed_sleeps(tmp_path) == ["sample.py:3", "sample.py:8"]


async def test_until_returns_the_value_once_it_holds_and_names_what_never_did() -> None:
    calls: list[int] = []

    async def third_time() -> int | None:
        calls.append(1)
        return len(calls) if len(calls) == 3 else None

    assert await until(third_time) == 3
    with pytest.raises(AssertionError, match="the queue to drain did not hold within 0.1 s"):
        await until(lambda: False, within=0.1, what="the queue to drain")
    assert await until(lambda: asyncio.sleep(0, result="ready")) == "ready"
