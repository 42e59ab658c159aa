"""CPU time per part of a benchmark run: this process's threads, a Redis server, a broker process.

On a machine shared with other work, wall-clock rates move with the load;
the CPU time a part spends on each event moves far less. :class:`CpuMeter`
takes a snapshot of every part before and after a measured span:

* each thread of this process, by its CPU clock (``pthread_getcpuclockid``),
  grouped as ``loop`` (the main thread, which runs the event loop), ``log``
  (the replay log's SQLite thread, ``runwire-sqlite*``) and ``other``; a
  thread that ended during the span (the faust app's consumer thread, which
  stops with the app) counts as ``other``: the process's CPU time less its
  live threads';
* a Redis server: ``INFO cpu`` (``used_cpu_user`` + ``used_cpu_sys``, all its
  threads) and ``INFO commandstats`` (calls per command, scripts' inner calls
  included);
* any other process by pid (``/proc/<pid>/stat``, 10 ms ticks).

``python bench/alternate.py`` runs a bench against two source trees in
turn; a bench imports the tree named by ``RUNWIRE_CODE`` (see :func:`code_root`).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any


def code_root() -> str:
    """The source tree a bench imports: ``$RUNWIRE_CODE``, else the bench's own checkout."""
    return os.environ.get("RUNWIRE_CODE") or str(Path(__file__).resolve().parents[1])


class _Tree(importlib.abc.MetaPathFinder):
    """``runwire`` from a source tree's ``pipeline/`` and ``runwire.workers`` from its ``workers/``,
    as pip installs them (pyproject's package-dir), whatever is installed."""

    def __init__(self, root: Path) -> None:
        self.folders = {"runwire": root / "pipeline", "runwire.workers": root / "workers"}

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        folder = self.folders.get(name)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(
            name, folder / "__init__.py", submodule_search_locations=[str(folder)])


def import_code() -> None:
    """Make ``import runwire`` load the tree :func:`code_root` names (call before importing it)."""
    sys.meta_path.insert(0, _Tree(Path(code_root())))


def _threads() -> dict[int, tuple[str, float]]:
    main = threading.main_thread().ident
    out: dict[int, tuple[str, float]] = {}
    for thread in threading.enumerate():
        if thread.ident is None:
            continue
        try:
            seconds = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, ProcessLookupError):  # ended meanwhile
            continue
        if thread.ident == main:
            part = "loop"
        elif thread.name.startswith("runwire-sqlite"):
            part = "log"
        else:
            part = "other"
        out[thread.ident] = (part, seconds)
    return out


def _proc_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds per part between :meth:`start` and :meth:`stop` (see the module docstring)."""

    def __init__(self, *, redis_url: str | None = None, pids: dict[str, int] | None = None) -> None:
        self.redis_url = redis_url
        self.pids = pids or {}
        self._threads: dict[int, tuple[str, float]] = {}
        self._redis: tuple[float, dict[str, int]] = (0.0, {})
        self._procs: dict[str, float] = {}
        self._process = 0.0

    def _redis_now(self) -> tuple[float, dict[str, int]]:
        import redis

        client = redis.Redis.from_url(self.redis_url)  # type: ignore[arg-type]
        try:
            cpu: Any = client.info("cpu")
            stats: Any = client.info("commandstats")
        finally:
            client.close()
        calls = {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}
        return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), calls

    def start(self) -> None:
        if self.redis_url:
            self._redis = self._redis_now()
        self._procs = {name: _proc_seconds(pid) for name, pid in self.pids.items()}
        self._threads = _threads()
        self._process = time.process_time()

    def stop(self) -> dict[str, float]:
        """CPU seconds per part (``loop``, ``log``, ``other``, ``redis``, each pid's name) and,
        with Redis, ``calls_<command>`` per command called meanwhile."""
        now = _threads()
        process = time.process_time() - self._process
        out = {"loop": 0.0, "log": 0.0, "other": 0.0}
        for ident, (part, seconds) in now.items():
            out[part] += seconds - self._threads.get(ident, (part, 0.0))[1]
        out["other"] += max(0.0, process - sum(out.values()))  # threads that ended meanwhile
        for name, pid in self.pids.items():
            out[name] = _proc_seconds(pid) - self._procs[name]
        if self.redis_url:
            cpu, calls = self._redis_now()
            out["redis"] = cpu - self._redis[0]
            for command, count in calls.items():
                delta = count - self._redis[1].get(command, 0)
                if delta and command not in ("info",):
                    out[f"calls_{command}"] = float(delta)
        return out


def per_event_us(seconds: dict[str, float], events: int, prefix: str) -> dict[str, float]:
    """``<prefix>_cpu_us_<part>`` (µs per event) and ``<prefix>_cpu_us_total``;
    with Redis, ``<prefix>_commands_per_event`` and ``<prefix>_<command>_per_event`` for each
    command called at least once per 100 events."""
    out: dict[str, float] = {}
    total = 0.0
    commands = 0.0
    for part, value in seconds.items():
        if part.startswith("calls_"):
            commands += value
            if value / events >= 0.01:
                out[f"{prefix}_{part.removeprefix('calls_')}_per_event"] = value / events
            continue
        out[f"{prefix}_cpu_us_{part}"] = value * 1e6 / events
        total += value
    out[f"{prefix}_cpu_us_total"] = total * 1e6 / events
    if commands:
        out[f"{prefix}_commands_per_event"] = commands / events
    return out
