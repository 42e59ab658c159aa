"""The compose topology, run: Redis, PostgreSQL, two workers and two edges, and a run streamed through it.

Without a Docker engine (``docker info`` fails) each runwire container of
``deploy/compose.yaml`` becomes a process with the container's command
(the Dockerfile's ENTRYPOINT + the service's ``command``), the image's ``ENV``
and the service's ``environment``, one per replica, each in a data directory
of its own. Redis and PostgreSQL are the test fixtures' servers: URLs that name
the ``redis`` or ``postgres`` service are pointed at them (host and port; the
database gets a name of this test's own), and the edge's published port
becomes a free port per replica. With a Docker engine the same test runs
``docker compose up`` on the file itself.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest
from httpx_sse import connect_sse
from psycopg import sql

from runwire.core.envelope import Event, encode, now_ts
from runwire.edge.service.auth import issue_token
from tests.deploy import compose
from tests.events import event
from tests.ops.conftest import RUNWIRE, runwire_env
from tests.services import RedisServer, docker_available, free_port

RUN_EVENTS = 40
HEALTHY_WITHIN = 60.0


@dataclass
class Topology:
    edges: list[str]
    secret: str
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: Path | None = None

    def output(self) -> str:
        if self.logs is None:
            return ""
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.logs.glob("*.log")))


# ---- processes in place of containers -----------------------------------------------------


def relocate(value: str, hosts: dict[str, str], databases: dict[str, str]) -> str:
    """A URL that names a compose service, pointed at the server that stands in for it."""
    if "://" not in value:
        return value
    parts = urlsplit(value)
    if parts.hostname not in hosts:
        return value
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{hosts[parts.hostname]}" if userinfo else hosts[parts.hostname]
    path = f"/{databases[parts.hostname]}" if parts.hostname in databases else parts.path
    return urlunsplit((parts.scheme, netloc, path, parts.query, parts.fragment))


@contextlib.contextmanager
def compose_database(postgres_url: str, service: dict[str, Any]) -> Iterator[str]:
    """The role the postgres service's environment creates, and a database of this test's own."""
    env = service["environment"]
    user, password = env["POSTGRES_USER"], env["POSTGRES_PASSWORD"]
    name = f"{env['POSTGRES_DB']}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (user,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(user), sql.Literal(password)))
        conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name), sql.Identifier(user)))
    try:
        yield name
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def wait_healthy(argv: list[str], proc: subprocess.Popen[bytes], topology: Topology) -> None:
    deadline = time.monotonic() + HEALTHY_WITHIN
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"{argv} : the service exited\n{topology.output()}"
        if subprocess.run(argv, capture_output=True, timeout=30, check=False).returncode == 0:
            return
        time.sleep(0.3)
    raise AssertionError(f"healthcheck {argv} failing after {HEALTHY_WITHIN}s\n{topology.output()}")


@contextlib.contextmanager
def as_processes(tmp_path: Path, redis: RedisServer, postgres_url: str) -> Iterator[Topology]:
    secret = secrets.token_hex(32)
    services = compose.load({"RUNWIRE_SECRET": secret})
    image = compose.image()
    pg = urlsplit(postgres_url)
    hosts = {"redis": f"127.0.0.1:{redis.port}", "postgres": f"{pg.hostname}:{pg.port or 5432}"}
    topology = Topology(edges=[], secret=secret, logs=tmp_path)
    with compose_database(postgres_url, services["postgres"]) as database:
        databases = {"postgres": database}
        try:
            for name, service in services.items():
                if "build" not in service:  # redis, postgres: the fixtures' servers
                    continue
                for replica in range(1, compose.replicas(service) + 1):
                    start(topology, f"{name}-{replica}", service, image, hosts, databases, tmp_path)
            yield topology
        finally:
            for proc in topology.processes.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)


def start(
    topology: Topology, name: str, service: dict[str, Any], image: compose.Image,
    hosts: dict[str, str], databases: dict[str, str], tmp_path: Path,
) -> None:
    data = tmp_path / name
    data.mkdir()
    env = runwire_env()
    for key, value in image.env.items():  # the image's volume is this replica's own directory
        env[key] = str(data) + value[len(image.workdir):] if value.startswith(image.workdir) else value
    for key, value in service.get("environment", {}).items():
        env[key] = relocate(str(value), hosts, databases)
    argv = [*image.entrypoint, *service["command"]]
    argv[0] = RUNWIRE if argv[0] == "runwire" else argv[0]
    inside = compose.container_port(service)
    port = free_port() if inside else None
    if inside:
        argv = [str(port) if arg == str(inside) else arg for arg in argv]
    with (tmp_path / f"{name}.log").open("wb") as log:
        proc = subprocess.Popen(argv, cwd=data, env=env, stdout=log, stderr=subprocess.STDOUT)
    topology.processes[name] = proc
    check = compose.healthcheck(service)
    if check is not None:
        check = [sys.executable if arg == "python" else arg for arg in check]
        if inside:
            check = [arg.replace(f":{inside}/", f":{port}/") for arg in check]
        wait_healthy(check, proc, topology)
    if port is not None:
        topology.edges.append(f"http://127.0.0.1:{port}")


# ---- docker compose -----------------------------------------------------------------------


@contextlib.contextmanager
def with_docker(tmp_path: Path) -> Iterator[Topology]:
    secret = secrets.token_hex(32)
    project = f"runwiretest{uuid.uuid4().hex[:8]}"
    base = ["docker", "compose", "-f", str(compose.COMPOSE), "-p", project]
    env = {**os.environ, "RUNWIRE_SECRET": secret}

    def docker(*args: str, timeout: float = 120) -> str:
        done = subprocess.run([*base, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)
        assert done.returncode == 0, f"docker compose {' '.join(args)}:\n{done.stdout}{done.stderr}"
        return done.stdout

    try:
        docker("up", "--detach", "--build", "--wait", "--wait-timeout", "300", timeout=900)
        edge = compose.load({"RUNWIRE_SECRET": secret})["edge"]
        inside = str(compose.container_port(edge))
        edges = []
        for index in range(1, compose.replicas(edge) + 1):
            host_port = docker("port", "--index", str(index), "edge", inside).strip().rsplit(":", 1)[-1]
            edges.append(f"http://127.0.0.1:{host_port}")
        yield Topology(edges=edges, secret=secret)
    finally:
        subprocess.run([*base, "down", "--volumes", "--remove-orphans"], env=env, capture_output=True, timeout=300,
                       check=False)


# ---- the run ------------------------------------------------------------------------------


def run_events(run_id: str) -> list[Event]:
    stamp = now_ts()
    kinds: list[tuple[str, dict[str, Any]]] = [("run.lifecycle", {"state": "running"})]
    kinds += [("reasoning.delta", {"text": f"r{i} "}) for i in range(5)]
    kinds += [("tool.start", {"call_id": "c1", "tool": "search"}), ("tool.end", {"call_id": "c1", "ok": True})]
    kinds += [("text.delta", {"text": f"t{i} "}) for i in range(RUN_EVENTS - len(kinds) - 1)]
    kinds += [("run.lifecycle", {"state": "done"})]
    return [event(run_id, seq, kind, payload, ts=stamp) for seq, (kind, payload) in enumerate(kinds, 1)]


def read_stream(base: str, run_id: str, token: str, *, after: int = 0, stop_at: int | None = None) -> list[dict[str, Any]]:
    """The run's raw SSE stream from ``after``, until seq ``stop_at`` or the run's terminal event."""
    headers = {"Authorization": f"Bearer {token}"}
    if after:
        headers["Last-Event-ID"] = str(after)
    got: list[dict[str, Any]] = []
    with (
        httpx.Client(timeout=30) as client,
        connect_sse(client, "GET", f"{base}/v1/runs/{run_id}/stream", params={"detail": "full"},
                    headers=headers) as source,
    ):
        assert source.response.status_code == 200, source.response.read()
        for sse in source.iter_sse():
            if not sse.data:
                continue
            got.append(httpx.Response(200, content=sse.data).json())
            if got[-1]["seq"] == stop_at or (
                got[-1]["type"] == "run.lifecycle" and got[-1]["payload"]["state"] == "done"
            ):
                break
    return got


def stream_a_run_through(topology: Topology) -> None:
    """Ingest on one edge; read half the run there, resume on the other edge; the replay log has it all."""
    first, second = topology.edges[0], topology.edges[-1]
    run_id = f"deploy-{uuid.uuid4().hex[:10]}"
    token = issue_token(topology.secret, tenant="deploy", runs=[run_id], scopes=("read", "write"))
    events = run_events(run_id)
    body = b"".join(encode(e) + b"\n" for e in events)
    posted = httpx.post(f"{first}/v1/runs/{run_id}/events", params={"format": "koder"}, content=body,
                        headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert posted.status_code == 200, posted.text
    half = RUN_EVENTS // 2
    head = read_stream(first, run_id, token, stop_at=half)
    tail = read_stream(second, run_id, token, after=half)
    got = head + tail
    assert [e["seq"] for e in got] == list(range(1, RUN_EVENTS + 1)), topology.output()
    assert [(e["type"], e["payload"]) for e in got] == [(e.type, payload_of(e)) for e in events]
    deadline = time.monotonic() + 30
    while True:
        export = httpx.get(f"{second}/v1/runs/{run_id}/events.jsonl",
                           headers={"Authorization": f"Bearer {token}"}, timeout=30)
        lines = export.text.splitlines() if export.status_code == 200 else []
        if len(lines) == RUN_EVENTS or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert len(lines) == RUN_EVENTS, f"replay log export: {export.status_code} {export.text[:500]}"


def payload_of(e: Event) -> Any:
    return httpx.Response(200, content=encode(e)).json()["payload"]


def grace_seconds(service: dict[str, Any]) -> float:
    match = re.fullmatch(r"(\d+)s", str(service.get("stop_grace_period", "10s")))
    return float(match.group(1)) if match else 10.0


# ---- the tests ----------------------------------------------------------------------------


def test_the_compose_file_refuses_to_start_without_a_secret() -> None:
    with pytest.raises(compose.MissingVariable, match="set RUNWIRE_SECRET"):
        compose.load({})


def test_the_topology_has_two_workers_and_two_edges() -> None:
    services = compose.load({"RUNWIRE_SECRET": "x" * 32})
    assert {name: compose.replicas(s) for name, s in services.items()} == {
        "redis": 1, "postgres": 1, "worker": 2, "edge": 2,
    }


@pytest.mark.slow
def test_a_run_streams_through_the_compose_topology(
    tmp_path: Path, own_redis: RedisServer, postgres_url: str
) -> None:
    if docker_available():
        with with_docker(tmp_path) as topology:
            stream_a_run_through(topology)
        return
    with as_processes(tmp_path, own_redis, postgres_url) as topology:
        assert len(topology.edges) == 2 and len(topology.processes) == 4
        stream_a_run_through(topology)
        grace = grace_seconds(compose.load({"RUNWIRE_SECRET": topology.secret})["worker"])
        for proc in topology.processes.values():  # what `docker compose stop` does
            proc.send_signal(signal.SIGTERM)
        codes = {name: proc.wait(grace) for name, proc in topology.processes.items()}
        # Workers drain, edges shut down gracefully and close the bus and the log: all exit 0.
        clean = {name: code == 0 for name, code in codes.items()}
        assert all(clean.values()), f"{codes}\n{topology.output()}"
