"""The Redis bus's connection and wire helpers, shared by the bus and its consumers.

:class:`RedisLink` owns the client (standalone or Cluster), runs the bus's
Lua scripts by SHA (reloading them when the server lost them), and sends
pipelines packed as RESP here for the hot paths. Connection errors become
:class:`~runwire.core.errors.BusUnavailable` after redis-py's own ``Retry``
(exponential backoff with jitter) gave up; the next call reconnects. A write
refused at ``maxmemory`` becomes :class:`~runwire.core.errors.BusFull`, which
callers retry the same way (:func:`retriable` is the one place that decides).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import redis.exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from ...core.errors import BusFull, BusUnavailable, ConfigError
from . import scripts

CONNECTION_ERRORS = (
    rexc.ConnectionError, rexc.TimeoutError, rexc.ClusterDownError, rexc.TryAgainError,
    rexc.MasterDownError, rexc.RedisClusterException, rexc.BusyLoadingError, OSError,
)


def retriable(exc: BaseException, what: str) -> BusUnavailable | None:
    """The bus's one classification of Redis errors that pass: a lost/refused connection is
    :class:`BusUnavailable`, a write refused at ``maxmemory`` (``OOM …``) is :class:`BusFull`;
    ``None`` for any other error (a bug or bad input: not worth a retry)."""
    if isinstance(exc, rexc.OutOfMemoryError):
        return BusFull(f"{what}: Redis is at maxmemory ({exc})")
    if isinstance(exc, CONNECTION_ERRORS):
        return BusUnavailable(f"{what}: {exc}")
    return None


def at_maxmemory(memory: dict[str, Any]) -> bool:
    """Whether ``INFO memory`` shows a server that refuses writes: ``used_memory`` over a
    set ``maxmemory`` under ``noeviction`` (an evicting policy frees memory instead)."""
    limit = int(memory.get("maxmemory") or 0)
    return (limit > 0 and int(memory.get("used_memory") or 0) > limit
            and memory.get("maxmemory_policy") == "noeviction")


@contextlib.contextmanager
def retriable_bus_errors(what: str) -> Iterator[None]:
    """Turn the errors that pass (see :func:`retriable`) into the retriable bus errors."""
    try:
        yield
    except Exception as exc:
        error = retriable(exc, what)
        if error is None:
            raise
        raise error from exc


class Script:
    """A Lua script called by SHA, reloaded when the server lost it (restart, failover)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


APPEND = Script(scripts.APPEND)
APPEND_MANY = Script(scripts.APPEND_MANY)
MEMBERSHIP = Script(scripts.MEMBERSHIP)
INGEST_ADD = Script(scripts.INGEST_ADD)
INGEST_CONFIRM = Script(scripts.INGEST_CONFIRM)
ScriptCall = tuple[Script, Sequence[str], Sequence[Any]]


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def resp_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return str(int(value)).encode()


def resp_command(parts: Sequence[Any]) -> bytes:
    """One command in RESP (arguments: bytes, str or int; bytes is the fast path).

    Each argument is copied once, by the final join: formatting it into its
    ``$<len>`` frame first (``%b``) costs ~3.5 times as much for the large
    entry arguments of an append.
    """
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        if type(part) is not bytes:
            part = resp_bytes(part)
        out += (b"$%d\r\n" % len(part), part, _CRLF)
    return b"".join(out)


_CRLF = b"\r\n"


def resp_evalsha(script: Script, call_keys: Sequence[str], args: Sequence[Any]) -> bytes:
    """One ``EVALSHA`` command in RESP."""
    return resp_command([b"EVALSHA", script.sha, len(call_keys), *call_keys, *args])


def raise_errors(results: list[Any], what: str = "Redis") -> list[Any]:
    """The replies of a pipeline, raising the first error reply among them (classified)."""
    for result in results:
        if isinstance(result, Exception):
            error = retriable(result, what)
            if error is not None:
                raise error from result
            raise result
    return results



class RedisLink:
    """One bus's Redis client, and the ways it talks to the server."""

    def __init__(self, url: str, connect_url: str, *, cluster: bool) -> None:
        self.url = url
        self.connect_url = connect_url
        self.cluster = cluster
        self._redis: Redis | RedisCluster | None = None

    @property
    def redis(self) -> Redis | RedisCluster:
        if self._redis is None:
            raise BusUnavailable(f"bus {self.url} is not connected (use `async with`)")
        return self._redis

    @property
    def connected(self) -> bool:
        return self._redis is not None

    def open(self) -> None:
        """Create the client (it connects on first use)."""
        if self._redis is None:
            self._redis = self._client()

    async def close(self) -> None:
        if self._redis is not None:
            client, self._redis = self._redis, None
            await client.aclose()

    def _client(self) -> Redis | RedisCluster:
        retry = Retry(ExponentialWithJitterBackoff(cap=1.0, base=0.05), retries=4)
        try:
            if self.cluster:
                return RedisCluster.from_url(
                    self.connect_url, retry=retry, socket_timeout=None,
                    socket_connect_timeout=5,
                )
            return Redis.from_url(
                self.connect_url, retry=retry, socket_timeout=None, socket_connect_timeout=5,
                socket_keepalive=True,
                retry_on_error=[rexc.ConnectionError, rexc.TimeoutError, rexc.BusyLoadingError],
            )
        except ValueError as exc:
            raise ConfigError(f"bad Redis URL {self.url!r}: {exc}") from None

    async def _load_scripts(self) -> None:
        for script in (APPEND, APPEND_MANY, MEMBERSHIP, INGEST_ADD, INGEST_CONFIRM):
            await self.redis.script_load(script.source)

    async def run_scripts(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """EVALSHA each call, all in one pipeline; reload scripts the server lost."""
        with retriable_bus_errors(f"script on {self.url}"):
            results = await self._evalsha(calls)
            missing = [i for i, r in enumerate(results) if isinstance(r, rexc.NoScriptError)]
            if missing:
                await self._load_scripts()
                again = await self._evalsha([calls[i] for i in missing])
                for index, result in zip(missing, again, strict=True):
                    results[index] = result
        return raise_errors(results, f"script on {self.url}")

    async def _evalsha(self, calls: Sequence[ScriptCall]) -> list[Any]:
        if len(calls) == 1:
            script, call_keys, args = calls[0]
            try:
                return [await self.redis.execute_command(
                    "EVALSHA", script.sha, len(call_keys), *call_keys, *args)]
            except rexc.NoScriptError as exc:
                return [exc]
        pipe = self.redis.pipeline(transaction=False)
        for script, call_keys, args in calls:
            pipe.execute_command("EVALSHA", script.sha, len(call_keys), *call_keys, *args)
        return list(await pipe.execute(raise_on_error=False))

    async def run_packed(self, calls: Sequence[ScriptCall]) -> list[Any]:
        """:meth:`run_scripts` for a standalone server, with the pipeline packed here.

        redis-py's pipeline packs each argument through its encoder (a few
        Python calls per event); an append batch has thousands of arguments,
        all ``bytes``/``str``/``int``, so they are written as RESP directly and
        sent in one write on one pooled connection. The replies are read
        exactly as redis-py's pipeline reads them; scripts the server lost are
        reloaded and those calls run again through :meth:`run_scripts`.
        """
        packed = resp_evalsha(*calls[0]) if len(calls) == 1 else b"".join(
            resp_evalsha(*call) for call in calls)
        return await self.run_prepacked(packed, len(calls), lambda: calls)

    async def run_prepacked(
        self, packed: bytes, count: int, calls: Callable[[], Sequence[ScriptCall]]
    ) -> list[Any]:
        """:meth:`run_packed` of ``count`` calls already packed as RESP; ``calls()`` gives
        them as :data:`ScriptCall` only if the server lost a script (to reload it)."""
        with retriable_bus_errors(f"script on {self.url}"):
            results = await self._send_packed(packed, count)
        missing = [i for i, r in enumerate(results) if isinstance(r, rexc.NoScriptError)]
        if missing:
            listed = calls()
            again = await self.run_scripts([listed[i] for i in missing])
            for index, result in zip(missing, again, strict=True):
                results[index] = result
        return raise_errors(results, f"script on {self.url}")

    async def commands(self, commands: Sequence[Sequence[bytes | str | int]]) -> list[Any]:
        """Commands in one round trip per node, their replies raw: :meth:`raw_commands` on a
        standalone server, a pipeline on a Cluster (which routes each by its key)."""
        if not self.cluster:
            return await self.raw_commands(commands)
        pipe = self.redis.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(await pipe.execute())

    async def raw_commands(self, commands: Sequence[Sequence[bytes | str | int]]) -> list[Any]:
        """Commands on a standalone server, their replies raw (no redis-py response parsing).

        For the hot paths (a worker's fetch and ack): redis-py turns every
        stream entry of an ``XREADGROUP`` reply into a dict and packs every
        id of an ``XACK`` through its encoder; here the replies stay nested
        lists of bytes. An error reply is raised (``ResponseError`` …).
        """
        packed = b"".join(resp_command(command) for command in commands)
        return raise_errors(await self._send_packed(packed, len(commands)), f"command on {self.url}")

    async def _send_packed(self, packed: bytes, replies: int) -> list[Any]:
        client = self.redis
        assert isinstance(client, Redis)  # a Cluster client routes through run_scripts
        pool = client.connection_pool
        connection = await pool.get_connection()  # type: ignore[no-untyped-call]
        complete = False
        try:
            await connection.send_packed_command(packed)
            results: list[Any] = []
            for _ in range(replies):
                try:
                    results.append(await connection.read_response())
                except rexc.ResponseError as exc:
                    results.append(exc)
            complete = True
            return results
        finally:
            if not complete:  # replies left unread: the connection can't be reused
                await connection.disconnect()
            await pool.release(connection)
