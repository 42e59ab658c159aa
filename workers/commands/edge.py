"""``runwire edge``: serve runs to SSE / WebSocket / NDJSON clients (uvicorn), and gRPC beside it.

Without ``RUNWIRE_SECRET`` the edge serves without auth and therefore binds
only to a loopback address; set a secret (≥ 32 bytes) to bind anywhere.
``--grpc-port`` adds the gRPC server (the ``grpc`` extra) on the same host,
from the same hub.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import ipaddress
import logging
import socket
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import click

from runwire.core.redaction import redact_logs
from runwire.workers.config import absolute_store, split_addr
from runwire.workers.deliveries import DeliveryThread, allow_private_option, edge_deliveries
from runwire.workers.process import raise_file_limit, tune_gc

if TYPE_CHECKING:
    from runwire.edge import EdgeSettings
    from runwire.edge.grpc.server import GrpcServer

SO_REUSEPORT: int = getattr(socket, "SO_REUSEPORT", 0)
"""0 where the platform lacks it (Windows)."""
LISTEN_BACKLOG = 2048
"""As uvicorn's own ``backlog``: connections the kernel queues before the edge accepts them."""
GRPC_MISSING = "--grpc-port needs the grpc extra: pip install 'runwire[grpc]'"


def check_grpc_available() -> None:
    """A clear error before anything starts when gRPC is asked for but not installed."""
    if importlib.util.find_spec("grpc") is None or importlib.util.find_spec("grpc_health") is None:
        raise click.UsageError(GRPC_MISSING)


def is_loopback(host: str) -> bool:
    """True for localhost and loopback IPs (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@click.command()
@click.option("--bus", default="memory://", show_default=True, envvar="RUNWIRE_BUS", help="Bus URL.")
@click.option("--store", default="sqlite:///.runwire/replay.db", show_default=True, callback=absolute_store,
              envvar="RUNWIRE_STORE", help="Replay log URL (a relative SQLite path is taken from the working directory).")
@click.option("--host", default="127.0.0.1", show_default=True, envvar="RUNWIRE_HOST",
              help="Address to bind (non-loopback needs RUNWIRE_SECRET).")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535),
              envvar="RUNWIRE_PORT", help="Port to bind.")
@click.option("--grpc-port", default=None, type=click.IntRange(0, 65535), envvar="RUNWIRE_GRPC_PORT",
              help="Also serve gRPC (runwire.v1, StreamWeave, health, reflection) on this port.")
@click.option("--secret", default=None, envvar="RUNWIRE_SECRET", show_envvar=True,
              help="HS256 key for bearer tokens (≥ 32 bytes).")
@click.option("--keepalive", "keepalive_s", default=15.0, show_default=True, type=click.FloatRange(min=0.1),
              envvar="RUNWIRE_KEEPALIVE", help="Seconds between SSE keepalive comments.")
@click.option("--silence", "silence_s", default=330.0, show_default=True, type=click.FloatRange(min=0),
              envvar="RUNWIRE_EDGE_SILENCE",
              help="End a run's streams as error after this many silent seconds (0: never).")
@click.option("--unpublished-wait", "unpublished_wait_s", default=30.0, show_default=True,
              type=click.FloatRange(min=0), envvar="RUNWIRE_EDGE_UNPUBLISHED_WAIT",
              help="Seconds a stream request waits for a run nobody has published yet (then an error).")
@click.option("--client-queue-bytes", default=512 * 1024, show_default=True, type=click.IntRange(min=1024),
              envvar="RUNWIRE_CLIENT_QUEUE_BYTES", help="Per-client queue bound in bytes; past it deltas are dropped, reasoning first.")
@click.option("--client-queue-events", default=2048, show_default=True, type=click.IntRange(min=8),
              envvar="RUNWIRE_CLIENT_QUEUE_EVENTS", help="Per-client queue bound in frames; past it deltas are dropped, reasoning first.")
@click.option("--streams-per-token", default=64, show_default=True, type=click.IntRange(min=1),
              envvar="RUNWIRE_STREAMS_PER_TOKEN", help="Streams one token may hold open at once (then 429).")
@click.option("--requests-per-socket", default=8, show_default=True, type=click.IntRange(min=1),
              envvar="RUNWIRE_REQUESTS_PER_SOCKET",
              help="Chat responses one /v1/threads socket may stream at once (then close 1008).")
@click.option("--reuse-port", is_flag=True, envvar="RUNWIRE_EDGE_REUSE_PORT",
              help="Bind with SO_REUSEPORT, so that several runwire edge processes serve one port "
                   "(the kernel spreads connections among them; any of them serves any run).")
@click.option("--own-addr", default=None, envvar="RUNWIRE_EDGE_OWN_ADDR", metavar="[HOST:]PORT",
              help="Also serve at this address, which no other process shares (with --reuse-port: where "
                   "this process's /metrics and /readyz are read) [default: none].")
@allow_private_option
def edge(
    bus: str,
    store: str,
    host: str,
    port: int,
    grpc_port: int | None,
    secret: str | None,
    keepalive_s: float,
    silence_s: float,
    unpublished_wait_s: float,
    client_queue_bytes: int,
    client_queue_events: int,
    streams_per_token: int,
    requests_per_socket: int,
    reuse_port: bool,
    own_addr: str | None,
    webhooks_allow_private: bool,
) -> None:
    """Serve runs over SSE, WebSocket and NDJSON with exact resume, ingest, control and a live page."""
    from runwire.edge import EdgeSettings

    if secret is None and not is_loopback(host):
        raise click.UsageError(
            f"refusing to bind {host} without RUNWIRE_SECRET: without auth the edge binds to loopback only"
        )
    if secret is not None and len(secret.encode()) < 32:
        raise click.UsageError("RUNWIRE_SECRET must be at least 32 bytes (HS256 key)")
    if grpc_port is not None:
        check_grpc_available()
    settings = EdgeSettings(
        secret=secret,
        keepalive_s=keepalive_s,
        silence_s=silence_s,
        unpublished_wait_s=unpublished_wait_s,
        client_queue_bytes=client_queue_bytes,
        client_queue_events=client_queue_events,
        streams_per_token=streams_per_token,
        requests_per_socket=requests_per_socket,
        webhooks_allow_private=webhooks_allow_private,
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    redact_logs()
    sockets = None
    if reuse_port or own_addr:
        sockets = [reuse_port_socket(host, port) if reuse_port else listening_socket(host, port)]
        if own_addr:
            own_host, own_port = split_addr(own_addr, host, "--own-addr")
            if secret is None and not is_loopback(own_host):
                raise click.UsageError(f"refusing to bind {own_host} without RUNWIRE_SECRET: without auth "
                                       "the edge binds to loopback only")
            sockets.append(listening_socket(own_host, own_port))
        for index, sock in enumerate(sockets):
            name = sock.getsockname()
            logging.getLogger("runwire.edge").info(
                "listening on %s:%d%s", name[0], name[1],
                ", shared with SO_REUSEPORT" if reuse_port and index == 0 else " (this process's own)")
    asyncio.run(serve(bus, store, host, port, settings, grpc_port, sockets=sockets))


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` that other processes may bind too (``SO_REUSEPORT``:
    Linux hands each new connection to one of them; the BSDs and macOS accept the option but
    give every connection to one process)."""
    if not SO_REUSEPORT:
        raise click.UsageError("--reuse-port needs SO_REUSEPORT, which this platform lacks")
    return listening_socket(host, port, shared=True)


def listening_socket(host: str, port: int, *, shared: bool = False) -> socket.socket:
    """A socket listening on ``host:port`` (``shared``: with ``SO_REUSEPORT``); a port taken is one
    clear error."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            sock.setsockopt(socket.SOL_SOCKET, SO_REUSEPORT, 1)
        sock.bind(address)
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        how = " with SO_REUSEPORT" if shared else ""
        raise click.ClickException(f"can't bind {host}:{port}{how}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


async def serve(
    bus_url: str, store_url: str, host: str, port: int, settings: EdgeSettings, grpc_port: int | None = None,
    *, sockets: list[socket.socket] | None = None,
) -> None:
    """Open the bus and the replay log, then run uvicorn (and gRPC) until SIGINT/SIGTERM; on
    ``sockets`` (already listening) when given, else on ``host:port``."""

    from runwire.bus import open_bus
    from runwire.edge import create_app
    from runwire.edge.http.server import edge_config
    from runwire.store import open_store

    async with open_bus(bus_url) as bus, open_store(store_url) as store:
        app = create_app(bus, store, settings)
        tune_gc()
        raise_file_limit()
        config = edge_config(
            app, host=host, port=port, log_level="info", lifespan="on",
            timeout_graceful_shutdown=5, proxy_headers=True,
        )
        server = _server_class()(config)
        if grpc_port is not None:
            server.grpc = await start_grpc_or_exit(app.state.edge, host, grpc_port)
            logging.getLogger("runwire.edge").info("gRPC on %s:%d", host, server.grpc.port)
        with edge_deliveries(app.state.edge, store, allow_private=settings.webhooks_allow_private) as server.deliveries:
            await server.serve(sockets=sockets)


async def start_grpc_or_exit(edge: Any, host: str, port: int) -> GrpcServer:
    """The gRPC server, started before anything else so a taken port is one clear error."""
    from runwire.core.errors import ConfigError
    from runwire.edge.grpc.server import start_grpc

    try:
        return await start_grpc(edge, host, port)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def _server_class() -> Any:
    """uvicorn's Server, stopping the gRPC server and the webhook deliveries first when it shuts
    down (the hub still runs)."""
    import uvicorn

    class EdgeServer(uvicorn.Server):
        grpc: GrpcServer | None = None
        deliveries: DeliveryThread | None = None

        @contextlib.contextmanager
        def capture_signals(self) -> Generator[None, None, None]:
            """uvicorn's handlers, without raising the signal again once it has shut down: the
            process is still to close the bus (a Kafka publisher's kept batches, a Redis one's
            retained entries) and the replay log, then exit 0 as the workers do."""
            with super().capture_signals():
                yield
                self._captured_signals.clear()

        async def shutdown(self, sockets: Any = None) -> None:
            if self.grpc is not None:
                await self.grpc.stop(2.0)
            if self.deliveries is not None:  # before uvicorn re-raises the signal that stopped it
                await asyncio.to_thread(self.deliveries.stop)
            await super().shutdown(sockets)

    return EdgeServer
