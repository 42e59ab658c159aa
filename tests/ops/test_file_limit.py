"""Each client of an edge is a file descriptor: `runwire edge` and `runwire up` raise their soft limit
on open files to the hard one, so a process started with the common 1024 is not capped at about a
thousand clients (docs/edge.md § Performance)."""

from __future__ import annotations

import resource
import subprocess
from pathlib import Path

import httpx

from tests.edge.harness import free_port
from tests.ops.conftest import RUNWIRE
from tests.services import wait_port

LOW = 256


def open_files_limit(pid: int) -> tuple[int, int]:
    """(soft, hard) of a process's "Max open files", as the kernel reports them."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError(f"no 'Max open files' in /proc/{pid}/limits")


def low_soft_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (LOW, hard))


def test_the_edge_raises_its_open_files_limit_to_the_hard_one(tmp_path: Path) -> None:
    port = free_port()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard > LOW, "this machine's hard limit leaves nothing to raise"
    process = subprocess.Popen(
        [str(RUNWIRE), "edge", "--port", str(port), "--store", f"sqlite:///{tmp_path / 'replay.db'}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path, preexec_fn=low_soft_limit,
    )
    try:
        wait_port(port, 30.0)
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        assert open_files_limit(process.pid) == (hard, hard)
    finally:
        process.terminate()
        process.communicate(timeout=20)
