"""``async with`` for the objects that hold connections: buses, consumers,
replay logs, publishers.

Entering runs :meth:`AsyncResource._enter` (connect, start; nothing by
default), leaving runs :meth:`AsyncResource.close` — also when the block
raised.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self


class AsyncResource(ABC):
    """Something to ``close()``; ``async with`` it to close it on the way out."""

    async def _enter(self) -> None:
        """What entering the ``async with`` block does first (nothing by default)."""
        return None

    @abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> Self:
        await self._enter()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class ConnectedResource(AsyncResource):
    """An :class:`AsyncResource` on a server (a bus, a replay log): entering connects."""

    async def _enter(self) -> None:
        await self.connect()

    @abstractmethod
    async def connect(self) -> None:
        """Connect (and create what it needs); raises the part's ``…Unavailable`` error."""

    @abstractmethod
    async def ping(self) -> None:
        """Raise the part's ``…Unavailable`` error unless the server answers."""
