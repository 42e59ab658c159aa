"""The bus's ports: the three channels its callers use, each a small Protocol. Every backend's
:class:`~runwire.bus.base.Bus` is all three; a caller names the one it needs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Protocol

from ..core.envelope import Event
from .base import Append, Consumer, ControlCommand, DeadLetter, Routed, StreamKey


class IngestLog(Protocol):
    """The ingest channel, as publishers and workers use it: events published onto their
    root's shard, read by consumer groups, poison dead-lettered."""

    shards: int

    def shard_of(self, event: Routed) -> int: ...

    async def publish(self, events: Sequence[Routed], data: Sequence[bytes] | None = None) -> None: ...

    def consumer(self, group: str, name: str, *, claim_idle_ms: int | None = None) -> Consumer: ...

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]: ...

    async def ingest_lost(self) -> dict[str, int]: ...


class DeliveryStreams(Protocol):
    """The delivery streams, as workers write them and edges read them: each run's raw and
    shaped views, with the writer's checkpoint stored atomically beside them."""

    checkpoint_grace_s: float | None

    async def append(self, key: StreamKey, events: Sequence[Event], *, state: bytes | None = None) -> int: ...

    async def append_many(self, appends: Sequence[Append]) -> list[int]: ...

    async def drop_views(self, run_id: str) -> None: ...

    async def load_states(self, keys: Sequence[StreamKey]) -> list[bytes | None]: ...

    async def read(self, key: StreamKey, after: int, limit: int = 1000) -> list[Event]: ...

    async def bounds(self, key: StreamKey) -> tuple[int, int] | None: ...

    async def tail(self, cursors: Mapping[StreamKey, int], block_ms: int = 1000) -> list[tuple[StreamKey, Event]]: ...


class ControlChannel(Protocol):
    """The control channel: commands from clients to the agent of a run."""

    async def send_control(self, command: ControlCommand) -> None: ...

    def controls(self, run_id: str, *, after: str = "$") -> AsyncIterator[ControlCommand]: ...
