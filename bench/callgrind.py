"""Instructions a part of a benchmark executes, counted by valgrind's callgrind.

CPU time per event moves by ±30 % on a machine shared with other work, and a few µs on a
base of 30–400 µs is lost in it; the number of instructions the same code executes hardly
moves (±0.3 % between runs here), so a change of 2 % is seen at once. It is not time —
an instruction of the interpreter's loop and one of msgspec's C take different times — so
a bench reports both: instructions to compare code, CPU µs for the figure a target names.

:func:`count` runs a Python script under ``valgrind --tool=callgrind`` with instrumentation
off (the interpreter's start, imports and warm-up run at valgrind's base speed and are not
counted); the script calls :func:`ready` when the part to count is next, which waits until
the counting is on, and :func:`done` after it. Needs ``valgrind`` (Debian: ``apt install
valgrind``); slow: a part of ~0.1 s runs for ~1 min.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def available() -> bool:
    return shutil.which("valgrind") is not None and shutil.which("callgrind_control") is not None


def count(argv: list[str], *, timeout: float = 1800) -> tuple[int, list[str]]:
    """The instructions ``python argv…`` executes between its :func:`ready` and :func:`done`,
    and the lines it printed meanwhile."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        child = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
             sys.executable, *argv],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert child.stdin is not None and child.stdout is not None
        try:
            _expect(child, "ready")
            _control(child.pid, "on")
            child.stdin.write("go\n")
            child.stdin.flush()
            said = _expect(child, "done")
            _control(child.pid, "off")
            child.stdin.close()
            child.wait(timeout)
        finally:
            if child.poll() is None:
                child.kill()
        found = re.search(r"^totals: (\d+)", out.read_text(), re.M)
        if found is None:
            raise RuntimeError(f"callgrind counted nothing for {argv}")
        return int(found.group(1)), said


def _expect(child: subprocess.Popen[str], word: str) -> list[str]:
    """The lines ``child`` prints before ``word``."""
    assert child.stdout is not None
    said: list[str] = []
    for line in child.stdout:
        if line.strip() == word:
            return said
        said.append(line.strip())
    raise RuntimeError(f"the counted script ended before saying {word!r} (exit {child.wait()})")


def _control(pid: int, state: str) -> None:
    subprocess.run(["callgrind_control", "-i", state, str(pid)], check=True, capture_output=True)


def ready() -> None:
    """In the counted script: the part to count is next; returns once counting is on."""
    print("ready", flush=True)
    sys.stdin.readline()


def done(*said: str) -> None:
    """In the counted script: the counted part is over (``said``: lines for :func:`count` to
    return); the script may exit after this."""
    for line in said:
        print(line, flush=True)
    print("done", flush=True)
    sys.stdin.read()
