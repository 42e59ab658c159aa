"""``runwire worker``: fan in, sequence, shape and record runs from the bus.

``memory://`` and ``redis://`` (and ``redis+cluster://``) run the
consumer-group runtime (:mod:`runwire.workers.runtime`); ``kafka://`` runs the
faust-streaming app (:mod:`runwire.workers.faust_app`). SIGTERM/SIGINT drain: the
batch in flight is written and acked, then the worker leaves its group, so a
rolling restart loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys

import click
import msgspec
from prometheus_client import CollectorRegistry, start_http_server

from runwire.core.redaction import redact_logs
from runwire.processing.stages import WorkerStats
from runwire.workers.config import absolute_store, split_addr
from runwire.workers.deliveries import allow_private_option, deliveries
from runwire.workers.process import tune_gc, tune_switch_interval


def default_name() -> str:
    """``hostname-pid``: unique per process."""
    return f"{socket.gethostname()}-{os.getpid()}"


@click.command()
@click.option("--bus", default="memory://", show_default=True, envvar="RUNWIRE_BUS", help="Bus URL.")
@click.option(
    "--store",
    default="sqlite:///.runwire/replay.db",
    callback=absolute_store,
    show_default=True,
    envvar="RUNWIRE_STORE",
    help="Replay log URL.",
)
@click.option("--group", default="runwire", show_default=True, envvar="RUNWIRE_GROUP",
              help="Consumer group; workers of one group share the shards.")
@click.option("--name", default=default_name, envvar="RUNWIRE_NAME",
              help="This worker's name in the group [default: hostname-pid].")
@click.option("--burst", is_flag=True, envvar="RUNWIRE_BURST",
              help="Process everything available, then exit.")
@click.option("--silence", "silence_s", type=click.FloatRange(min=0.1), default=300.0,
              show_default=True, envvar="RUNWIRE_SILENCE",
              help="Seconds without events after which a run without a terminal event is ended as error.")
@click.option("--quiet-ms", type=click.IntRange(min=1), default=250, show_default=True,
              envvar="RUNWIRE_QUIET_MS",
              help="How long a run's stream must be quiet before the tick closes its open shaping "
                   "windows (a quiet agent's last words wait about this plus 100 ms).")
@click.option("--claim-idle-ms", type=click.IntRange(min=1), default=None,
              envvar="RUNWIRE_CLAIM_IDLE_MS",
              help="Idle time before a dead worker's pending entries are claimed [default: bus's].")
@click.option("--data-dir", type=click.Path(file_okay=False), default=".runwire",
              show_default=True, envvar="RUNWIRE_DATA_DIR",
              help="runwire's data directory (the Kafka worker keeps faust's files under it).")
@click.option("--metrics-addr", default=None, envvar="RUNWIRE_METRICS_ADDR", metavar="[HOST:]PORT",
              help="Serve the worker's Prometheus metrics (pauses at a limit; span export: sent, retried, dropped) at "
                   "/metrics here (HOST defaults to 127.0.0.1) [default: none].")
@allow_private_option
def worker(
    bus: str,
    store: str,
    group: str,
    name: str,
    burst: bool,
    silence_s: float,
    quiet_ms: int,
    claim_idle_ms: int | None,
    data_dir: str,
    metrics_addr: str | None,
    webhooks_allow_private: bool,
) -> None:
    """Run a worker until SIGTERM/SIGINT (or, with --burst, until the bus is drained)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    redact_logs()
    if os.environ.get("RUNWIRE_DEBUG"):
        logging.getLogger("runwire").setLevel(logging.DEBUG)
    tune_gc()
    tune_switch_interval()
    metrics = serve_metrics(metrics_addr)
    if bus.startswith("kafka://"):
        from runwire.processing.faust.seam import FaustCrashed
        from runwire.workers.faust_app import run_faust_worker

        try:
            with contextlib.ExitStack() as stack:
                if not burst:
                    stack.enter_context(deliveries(store, allow_private=webhooks_allow_private,
                                                   registry=metrics))
                stats = run_faust_worker(
                    bus, store, group=group, name=name, burst=burst, silence_s=silence_s,
                    data_dir=data_dir, quiet_s=quiet_ms / 1000, metrics=metrics,
                )
        except FaustCrashed as exc:  # one error line, exit status 1: a supervisor restarts it
            raise click.ClickException(str(exc)) from exc
    else:
        stats = asyncio.run(_run(bus, store, group, name, burst, silence_s, quiet_ms / 1000, claim_idle_ms,
                                 webhooks_allow_private, metrics))
    sys.stdout.write(msgspec.json.encode(stats).decode() + "\n")


async def _run(
    bus_url: str,
    store_url: str,
    group: str,
    name: str,
    burst: bool,
    silence_s: float,
    quiet_s: float,
    claim_idle_ms: int | None,
    allow_private: bool = False,
    metrics: CollectorRegistry | None = None,
) -> WorkerStats:
    from runwire.bus import open_bus
    from runwire.store import open_store
    from runwire.workers.runtime import run_worker, stop_on_signals

    stop = stop_on_signals()
    async with open_bus(bus_url) as bus, open_store(store_url) as store:
        with contextlib.ExitStack() as stack:
            if not burst:  # a burst worker records what is queued and exits: nothing to wait for
                stack.enter_context(deliveries(store, allow_private=allow_private, registry=metrics))
            return await run_worker(
                bus, store, group=group, name=name, stop=stop, burst=burst,
                silence_s=silence_s, quiet_s=quiet_s, claim_idle_ms=claim_idle_ms, metrics=metrics,
            )


def serve_metrics(addr: str | None) -> CollectorRegistry | None:
    """``--metrics-addr``: a registry served at ``http://HOST:PORT/metrics`` (a thread of
    prometheus-client's), or None without the option."""
    if not addr:
        return None
    host, port = split_addr(addr, "127.0.0.1", "--metrics-addr")
    registry = CollectorRegistry()
    start_http_server(port, addr=host, registry=registry)
    return registry
