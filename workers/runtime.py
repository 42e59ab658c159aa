"""The consumer-group worker runtime: a bus consumer wired to the worker loop.

:func:`run_worker` joins the group, builds the batch stages
(:mod:`runwire.processing.stages`) and runs the loop (:mod:`runwire.processing.worker_loop`)
until a stop (or, with ``burst``, until idle), then leaves the group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from runwire.bus import Bus
from runwire.core.retry import Outage
from runwire.jobs.export import SpanExporter, exporter_from_env, exporting
from runwire.processing.processor import DEFAULT_QUIET_S, DEFAULT_SILENCE_S, Processor
from runwire.processing.stages import BATCH, FETCH, TICK_S, Stages, WorkerStats
from runwire.processing.worker_loop import ConsumerLoop
from runwire.store import ReplayLog

__all__ = ["BATCH", "FETCH", "TICK_S", "Stages", "WorkerStats", "exporting", "run_worker", "span_exporter",
           "stop_on_signals"]


def stop_on_signals() -> asyncio.Event:
    """An event that SIGINT or SIGTERM sets (handlers on the running loop): a worker's stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


class PauseMetrics(Collector):
    """A worker's pauses as Prometheus metrics (``--metrics-addr``): ``runwire_worker_paused``
    {part, reason} is 1 while the worker waits out a dependency at its limit (``store full``: the
    replay log's disk; ``bus unavailable``, …), and ``runwire_worker_retried_total`` {part,
    reason} counts the calls retried for it."""

    def __init__(self, outage: Outage) -> None:
        self.outage = outage

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        paused = GaugeMetricFamily("runwire_worker_paused", "1 while the worker is paused on a "
                                   "dependency at its limit", labels=["part", "reason"])
        if self.outage.state is not None:
            paused.add_metric(self.outage.state.split(" ", 1), 1)
        yield paused
        retried = CounterMetricFamily("runwire_worker_retried", "calls retried while paused",
                                      labels=["part", "reason"])
        for state, count in sorted(self.outage.retried.items()):
            retried.add_metric(state.split(" ", 1), count)
        yield retried


@contextlib.contextmanager
def serving_pauses(stages: Stages, metrics: CollectorRegistry | None) -> Iterator[None]:
    """``stages``' pauses in ``metrics`` (:class:`PauseMetrics`) while in the block (either runtime)."""
    pauses = PauseMetrics(stages.outage)
    if metrics is not None:
        metrics.register(pauses)
    try:
        yield
    finally:
        if metrics is not None:
            metrics.unregister(pauses)


def span_exporter(
    stages: Stages, store: ReplayLog, name: str, metrics: CollectorRegistry | None = None
) -> SpanExporter | None:
    """The span exporter the ``OTEL_*`` variables ask for, told of each of ``stages``' log
    writes (either runtime's worker); None when they ask for none."""
    exporter = exporter_from_env(os.environ, store, holder=name, registry=metrics)
    stages.on_logged = exporter.offer if exporter is not None else None
    stages.on_encoded = exporter.stage if exporter is not None else None
    return exporter


async def run_worker(
    bus: Bus,
    store: ReplayLog,
    *,
    group: str,
    name: str,
    stop: asyncio.Event | None = None,
    burst: bool = False,
    silence_s: float = DEFAULT_SILENCE_S,
    quiet_s: float = DEFAULT_QUIET_S,
    batch: int = FETCH,
    tick_s: float = TICK_S,
    claim_idle_ms: int | None = None,
    metrics: CollectorRegistry | None = None,
) -> WorkerStats:
    """Consume ``group`` as ``name`` until ``stop`` is set (or, with ``burst``, until idle).

    With the standard ``OTEL_EXPORTER_OTLP_*`` variables set, the runs it writes are exported as
    spans beside it (:mod:`runwire.jobs.export`; its counters in ``metrics``)."""
    stop = stop if stop is not None else asyncio.Event()
    consumer = (
        bus.consumer(group, name)
        if claim_idle_ms is None
        else bus.consumer(group, name, claim_idle_ms=claim_idle_ms)
    )
    stages = Stages(
        bus, store, Processor(silence_s=silence_s, quiet_s=quiet_s), stop,
        dead_letter=consumer.dead_letter,
    )
    worker = ConsumerLoop(consumer, stages)
    started = time.monotonic()
    try:
        with serving_pauses(stages, metrics):
            async with exporting(span_exporter(stages, store, name, metrics)):
                await worker.loop(batch=batch, tick_s=tick_s, burst=burst)
    finally:
        await consumer.close()
        stages.stats.seconds = time.monotonic() - started
    return stages.finish_stats()
