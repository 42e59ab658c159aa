"""Process-wide settings of runwire's long-running commands (``runwire edge``, ``runwire worker``)."""

from __future__ import annotations

import gc
import logging
import resource
import sys

log = logging.getLogger("runwire.process")


def tune_gc() -> None:
    """Fewer, later cyclic GC passes, after startup's objects are frozen out of them.

    Both processes make many short-lived objects that reference counting frees
    (the edge: a client's frames; a worker: a batch's events and outputs), so
    the default thresholds run full passes over long-lived state (thousands of
    connections, a worker's open streams) far more often than cycles appear:
    for the edge a pause every client sees as latency, for a worker ~4 % of
    its loop's CPU per event (docs/workers.md § Throughput).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 1000)


WORKER_SWITCH_INTERVAL_S = 0.001
"""How long a worker's thread holds the GIL while another waits for it (CPython's default: 5 ms)."""


def tune_switch_interval(seconds: float = WORKER_SWITCH_INTERVAL_S) -> None:
    """A shorter GIL switch interval, for a worker: its replay-log thread takes the GIL back
    after each SQLite statement, and while the event loop is busy each take waited out the whole
    interval, so a write's log part took several intervals and the loop, two writes ahead,
    waited for it (docs/workers.md § Throughput: 1 ms against 5 ms, 1.11x events/s on memory,
    1.03x on Redis).
    """
    sys.setswitchinterval(seconds)


def raise_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit; return the limit now.

    Each client connection is a file descriptor, and the soft limit many systems start a
    process with (1024) would cap an edge at about a thousand clients while the hard limit
    allows far more (docs/edge.md § Performance: how many clients a process holds). Never
    fails: a limit that can't be raised stays as it was.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft >= hard:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.warning("open files stay limited to %d (the hard limit is %d): %s", soft, hard, exc)
        return soft
    log.info("open files: soft limit raised from %d to %d", soft, hard)
    return hard
