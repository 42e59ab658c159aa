"""``runwire worker --bus kafka://…``: the Kafka worker runtime wired up.

Opens the bus and the replay log, stops on SIGTERM/SIGINT, serves the pauses and exports spans
(as :mod:`runwire.workers.runtime` does for the consumer-group runtime) around
:class:`~runwire.processing.faust.worker.FaustWorker`, which does the work.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import CollectorRegistry

from runwire.bus import open_bus
from runwire.bus.kafka.bus import KafkaBus
from runwire.processing.faust.worker import DEFAULT_DATA_DIR, FaustWorker
from runwire.processing.processor import DEFAULT_QUIET_S, DEFAULT_SILENCE_S
from runwire.processing.stages import WorkerStats
from runwire.store import open_store
from runwire.workers.runtime import exporting, serving_pauses, span_exporter, stop_on_signals

__all__ = ["run_faust_worker"]


def run_faust_worker(
    bus_url: str, store_url: str, *,
    group: str,
    name: str,
    burst: bool = False,
    silence_s: float = DEFAULT_SILENCE_S,
    data_dir: str | Path = DEFAULT_DATA_DIR,
    quiet_s: float = DEFAULT_QUIET_S,
    metrics: CollectorRegistry | None = None,
) -> WorkerStats:
    """``runwire worker --bus kafka://…``: run the faust app until SIGTERM/SIGINT (or idle with burst)."""
    return asyncio.run(_main(bus_url, store_url, group, name, burst, silence_s, Path(data_dir),
                             quiet_s, metrics))


async def _main(
    bus_url: str, store_url: str, group: str, name: str, burst: bool, silence_s: float,
    data_dir: Path, quiet_s: float, metrics: CollectorRegistry | None,
) -> WorkerStats:
    stop = stop_on_signals()
    async with open_bus(bus_url) as bus, open_store(store_url) as store:
        if not isinstance(bus, KafkaBus):
            raise TypeError(f"the faust worker needs a kafka:// bus, not {bus_url!r}")
        worker = FaustWorker(
            bus, store, group=group, name=name, silence_s=silence_s, burst=burst, stop=stop,
            data_dir=data_dir, quiet_s=quiet_s,
        )
        with serving_pauses(worker.stages, metrics):  # spans beside it (OTEL_*)
            async with exporting(span_exporter(worker.stages, store, name, metrics)):
                return await worker.run()
