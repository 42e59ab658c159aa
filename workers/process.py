"""Process-wide settings of runwire's long-running commands (``runwire edge``, ``runwire worker``)."""

from __future__ import annotations

import gc


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
