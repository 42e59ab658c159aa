"""``runwire up``: the bus, the worker stages and the edge in one process and event loop.

Embedded defaults — bus ``memory://``, replay log ``sqlite:///<data-dir>/replay.db`` — so one
command shows runwire working; ``--bus``/``--store`` move any part to Redis, Kafka or PostgreSQL.
``--demo`` keeps publishing synthetic runs so the page moves at once; their tenant (``demo``) has
a retention of ``--demo-keep-minutes`` (10 by default), and ``runwire up`` sweeps the replay log
while the demo runs, so its data stays bounded (about 40 MB at the default rate). With
pydantic-ai installed (``scripts/run`` installs it), a real framework agent runs beside them every
30 s (``runwire.integrations.demo``).

SIGINT/SIGTERM drain: the demo ends its open runs (as aborted), the edge stops accepting and
closes its streams (clients resume elsewhere), the worker finishes and acks its batch, and — on
the in-process bus, which dies with the process — what is still queued is processed into the
replay log before exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import signal
import socket
import sys
from collections.abc import Generator
from datetime import timedelta
from pathlib import Path
from typing import Any

import click
import msgspec
import uvicorn

from runwire.bus import Bus, open_bus
from runwire.core.redaction import redact_url
from runwire.edge.http.app import create_app
from runwire.edge.http.server import edge_config
from runwire.edge.settings import EdgeSettings
from runwire.jobs.demo import DEMO_TENANT, publish_runs
from runwire.sdk.publisher import Publisher
from runwire.store import ReplayLog, RetentionPolicy, open_store
from runwire.workers.commands.edge import check_grpc_available, start_grpc_or_exit
from runwire.workers.config import absolute_dir, absolute_store
from runwire.workers.deliveries import allow_private_option, edge_deliveries
from runwire.workers.process import raise_file_limit, tune_switch_interval
from runwire.workers.runtime import run_worker

log = logging.getLogger("runwire.up")

DEFAULT_DATA_DIR = Path(".runwire")
DEMO_KEEP_S = 600.0
"""How long the demo's runs stay in the replay log by default (``--demo-keep-minutes``)."""
SWEEP_EVERY_S = 60.0
MIN_SECRET_BYTES = 32
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


class UpSettings(msgspec.Struct, kw_only=True, frozen=True):
    """Everything ``runwire up`` runs with."""

    bus: str = "memory://"
    store: str
    host: str = "127.0.0.1"
    port: int = 8765
    grpc_port: int | None = None
    group: str = "runwire"
    name: str
    secret: str | None = None
    demo: bool = False
    demo_rate: float = 0.5
    demo_seed: int = 0
    demo_keep_s: float = DEMO_KEEP_S
    data_dir: str = str(DEFAULT_DATA_DIR)
    webhooks_allow_private: bool = False

    def store_options(self) -> dict[str, Any]:
        """``open_store`` options: with the demo, its tenant's short retention."""
        if not self.demo:
            return {}
        keep = timedelta(seconds=self.demo_keep_s)
        return {"tenant_retention": {DEMO_TENANT: RetentionPolicy(done=keep, failed=keep, unfinished=keep)}}

    def sweep_every_s(self) -> float:
        """How often the demo sweeps: a fraction of its retention, at most a minute."""
        return min(SWEEP_EVERY_S, self.demo_keep_s / 4)


def default_name() -> str:
    """``hostname-pid``: unique per process, stable for its lifetime."""
    return f"{socket.gethostname()}-{os.getpid()}"


def store_for(data_dir: Path) -> str:
    """The embedded replay log URL inside a data directory."""
    return f"sqlite:///{data_dir}/replay.db"


def is_loopback(host: str) -> bool:
    """Whether ``host`` binds only the loopback interface."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command()
@click.option("--demo", is_flag=True, envvar="RUNWIRE_DEMO", help="Keep publishing synthetic runs.")
@click.option(
    "--demo-rate",
    type=click.FloatRange(min=0.01),
    default=0.5,
    show_default=True,
    envvar="RUNWIRE_DEMO_RATE",
    help="Demo runs started per second.",
)
@click.option(
    "--demo-keep-minutes",
    type=click.FloatRange(min=0.01),
    default=DEMO_KEEP_S / 60,
    show_default=True,
    envvar="RUNWIRE_DEMO_KEEP_MINUTES",
    help="Minutes the demo's runs stay in the replay log (swept while the demo runs).",
)
@click.option(
    "--demo-seed",
    type=int,
    default=0,
    show_default=True,
    envvar="RUNWIRE_DEMO_SEED",
    help="Seed of the demo runs' content (same seed, same runs).",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DATA_DIR,
    show_default=True,
    callback=absolute_dir,
    envvar="RUNWIRE_DATA_DIR",
    help="Where the embedded replay log lives.",
)
@click.option(
    "--bus", default="memory://", show_default=True, envvar="RUNWIRE_BUS", help="Bus URL."
)
@click.option(
    "--store",
    default=None,
    callback=absolute_store,
    envvar="RUNWIRE_STORE",
    help="Replay log URL [default: sqlite:///<data-dir>/replay.db].",
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    envvar="RUNWIRE_HOST",
    help="Address the edge binds (non-loopback needs RUNWIRE_SECRET).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8765,
    show_default=True,
    envvar="RUNWIRE_PORT",
    help="Port the edge binds (0: any free port).",
)
@click.option(
    "--grpc-port",
    type=click.IntRange(0, 65535),
    default=None,
    envvar="RUNWIRE_GRPC_PORT",
    help="Also serve gRPC (runwire.v1, StreamWeave, health, reflection) on this port.",
)
@click.option(
    "--group",
    default="runwire",
    show_default=True,
    envvar="RUNWIRE_GROUP",
    help="Worker consumer group.",
)
@click.option(
    "--name",
    default=default_name,
    envvar="RUNWIRE_NAME",
    help="Worker name [default: hostname-pid].",
)
@click.option(
    "--secret",
    default=None,
    envvar="RUNWIRE_SECRET",
    help="HS256 key for bearer tokens (≥ 32 bytes).",
)
@allow_private_option
def up(
    demo: bool,
    demo_rate: float,
    demo_keep_minutes: float,
    demo_seed: int,
    data_dir: Path,
    bus: str,
    store: str | None,
    host: str,
    port: int,
    grpc_port: int | None,
    group: str,
    name: str,
    secret: str | None,
    webhooks_allow_private: bool,
) -> None:
    """Run the workers and the edge in one process (embedded bus and replay log by default)."""
    if not secret and not is_loopback(host):
        raise click.UsageError(
            f"refusing to serve {host} without RUNWIRE_SECRET (auth); bind 127.0.0.1 or set a secret"
        )
    if secret and len(secret.encode()) < MIN_SECRET_BYTES:
        raise click.UsageError(f"RUNWIRE_SECRET must be at least {MIN_SECRET_BYTES} bytes (HS256 key)")
    if grpc_port is not None:
        check_grpc_available()
    settings = UpSettings(
        bus=bus,
        store=store or store_for(data_dir),
        host=host,
        port=port,
        grpc_port=grpc_port,
        group=group,
        name=name,
        secret=secret or None,
        demo=demo,
        demo_rate=demo_rate,
        demo_seed=demo_seed,
        demo_keep_s=demo_keep_minutes * 60,
        data_dir=str(data_dir),
        webhooks_allow_private=webhooks_allow_private,
    )
    if store is None:
        data_dir.mkdir(parents=True, exist_ok=True)
    asyncio.run(serve(settings))


class _EdgeServer(uvicorn.Server):
    """uvicorn without its own signal handling: ``runwire up`` drains everything itself."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def listen(host: str, port: int) -> socket.socket:
    """Bind the edge's socket before anything starts, so a taken port is one clear error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


async def serve(settings: UpSettings) -> None:
    """Run until SIGINT/SIGTERM (or until a part fails), then drain and return."""
    sock = listen(settings.host, settings.port)
    raise_file_limit()  # each client is a descriptor (docs/edge.md § Performance)
    tune_switch_interval()  # it runs a worker (docs/workers.md § Throughput)
    stop = asyncio.Event()
    _install_signal_handlers(stop)
    async with open_bus(settings.bus) as bus, open_store(settings.store, **settings.store_options()) as store:
        parts = _Parts(bus, store, settings)
        with edge_deliveries(parts.app.state.edge, store, allow_private=settings.webhooks_allow_private):
            await parts.start(sock)
            _announce(settings, sock.getsockname()[1], parts.grpc_port)
            await parts.run_until(stop)
            click.echo("runwire up: draining…", err=True)
            failure = await parts.drain()
    if failure is not None:
        raise failure
    click.echo("runwire up: stopped", err=True)


def framework_demo() -> Any:
    """The demo's framework agent (``runwire.integrations.demo.framework_runs``) when pydantic-ai
    is installed (``scripts/run`` installs it), else None."""
    try:
        from runwire.integrations.demo import framework_runs
    except ImportError:
        return None
    return framework_runs


class _Parts:
    """The worker, the edge and the demo publisher of one ``runwire up``, as tasks."""

    def __init__(self, bus: Bus, store: ReplayLog, settings: UpSettings) -> None:
        self.bus, self.store, self.settings = bus, store, settings
        edge = EdgeSettings(secret=settings.secret, webhooks_allow_private=settings.webhooks_allow_private)
        app = create_app(bus, store, edge)
        self.app = app
        self.grpc: Any = None
        config = edge_config(app, log_level="warning", timeout_graceful_shutdown=2, lifespan="on")
        self.server = _EdgeServer(config)
        self.worker_stop = asyncio.Event()
        self.demo_stop = asyncio.Event()
        self.tasks: set[asyncio.Task[Any]] = set()

    async def start(self, sock: socket.socket) -> None:
        settings = self.settings
        if settings.grpc_port is not None:  # first: a taken port is one clear error, nothing to stop
            self.grpc = await start_grpc_or_exit(self.app.state.edge, settings.host, settings.grpc_port)
        self.worker = asyncio.create_task(
            run_worker(
                self.bus,
                self.store,
                group=settings.group,
                name=settings.name,
                stop=self.worker_stop,
                metrics=self.app.state.edge.metrics.registry,
            ),
            name="runwire-worker",
        )
        self.edge = asyncio.create_task(self.server.serve(sockets=[sock]), name="runwire-edge")
        self.tasks = {self.worker, self.edge}
        await _until_started(self.server, self.edge)
        if settings.demo and not self.edge.done():
            self.demo = asyncio.create_task(self._demo(), name="runwire-demo")
            self.sweeper = asyncio.create_task(
                sweep_until(self.store, settings.sweep_every_s(), self.demo_stop), name="runwire-sweep"
            )
            self.tasks |= {self.demo, self.sweeper}

    @property
    def grpc_port(self) -> int | None:
        return None if self.grpc is None else int(self.grpc.port)

    async def _demo(self) -> None:
        async with Publisher(self.bus) as publisher:
            parts = [publish_runs(publisher, self.demo_stop, rate=self.settings.demo_rate,
                                  seed=self.settings.demo_seed)]
            framework = framework_demo()
            if framework is not None:
                parts.append(framework(publisher, self.demo_stop, seed=self.settings.demo_seed))
            await asyncio.gather(*parts)

    async def run_until(self, stop: asyncio.Event) -> None:
        """Until ``stop`` is set or any part ends (which only happens when it fails)."""
        waiter = asyncio.create_task(stop.wait())
        await asyncio.wait({*self.tasks, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()

    async def drain(self) -> BaseException | None:
        """Stop the demo, then the edge, then the worker; return the first failure, if any."""
        failure = _failure(self.tasks)
        self.demo_stop.set()
        if self.grpc is not None:
            await self.grpc.stop(2.0)
        self.server.should_exit = True
        self.worker_stop.set()
        for task in (getattr(self, "demo", None), getattr(self, "sweeper", None), self.edge, self.worker):
            if task is not None:
                await asyncio.gather(task, return_exceptions=True)
        if self.settings.bus.startswith("memory://") and failure is None:
            # The in-process bus dies with us: record what is still queued first.
            await run_worker(
                self.bus, self.store, group=self.settings.group, name=self.settings.name, burst=True
            )
        return failure


async def sweep_until(store: ReplayLog, every_s: float, stop: asyncio.Event) -> None:
    """Delete the runs whose retention expired, every ``every_s`` seconds until ``stop``."""
    while not stop.is_set():
        swept = await store.sweep()
        if swept.runs:
            log.info("swept %d expired runs (%d events)", len(swept.runs), swept.events)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)


def _announce(settings: UpSettings, port: int, grpc_port: int | None = None) -> None:
    host = settings.host if ":" not in settings.host else f"[{settings.host}]"
    url = f"http://{host}:{port}/"
    click.echo(f"runwire up: {url}  (bus {_safe(settings.bus)}, store {_safe(settings.store)})")
    if grpc_port is not None:
        click.echo(f"runwire up: gRPC on {host}:{grpc_port}")
    if settings.demo:
        click.echo(f"runwire up: publishing demo runs ({settings.demo_rate:g}/s, "
                   f"kept {settings.demo_keep_s / 60:g} min)")
    sys.stdout.flush()


def _safe(url: str) -> str:
    return redact_url(url)


async def _until_started(server: uvicorn.Server, edge: asyncio.Task[None]) -> None:
    """uvicorn offers no event for "listening and lifespan done": poll its flag every 20 ms."""
    while True:
        if server.started or edge.done():
            return
        await asyncio.sleep(0.02)


def _failure(parts: set[asyncio.Task[Any]]) -> BaseException | None:
    for task in parts:
        if task.done() and not task.cancelled() and task.exception() is not None:
            return task.exception()
    return None


def _install_signal_handlers(stop: asyncio.Event) -> None:
    """The first SIGINT/SIGTERM drains; a second one exits at once."""
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set():
            click.echo(f"runwire up: {sig.name} again, exiting without draining", err=True)
            os._exit(128 + sig.value)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
