"""One retry policy: which errors retry, the backoff between attempts, a deadline.

In the style of redis-py's ``Retry`` (``redis/asyncio/retry.py``), whose
backoff strategies (``redis.backoff``: ``compute(failures)``, ``reset()``)
it takes as they are::

    policy = Retry(ExponentialWithJitterBackoff(cap=2.0, base=0.05), deadline_s=30)
    await policy.call(lambda: bus.publish(events), stop=stop.is_set)

By default an error retries when it is a :class:`~runwire.core.errors.RunwireError`
whose type is ``retriable`` (``BusUnavailable``, ``StoreUnavailable``); any
other error is raised at once. The deadline counts from the first failure;
the policy never sleeps past it and makes a last attempt when it is reached,
then raises the last error. ``attempts`` bounds the calls instead of (or
besides) time. ``stop()`` returning true ends the retries too
(a worker that is shutting down raises rather than waits).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.backoff import AbstractBackoff

from .errors import BusError, RunwireError, StoreError

T = TypeVar("T")


def is_retriable(error: BaseException) -> bool:
    """Whether the error tree marks ``error`` as worth another attempt."""
    return isinstance(error, RunwireError) and error.retriable


class Retry:
    """Calls an async function again after errors that may pass (see the module docstring)."""

    def __init__(
        self,
        backoff: AbstractBackoff,
        *,
        deadline_s: float | None = None,
        attempts: int | None = None,
        retry_on: tuple[type[Exception], ...] = (RunwireError,),
        retriable: Callable[[Exception], bool] = is_retriable,
    ) -> None:
        self.backoff = backoff
        self.deadline_s = deadline_s
        self.attempts = attempts
        self.retry_on = retry_on
        self.retriable = retriable

    async def call(
        self,
        do: Callable[[], Awaitable[T]],
        *,
        stop: Callable[[], bool] | None = None,
        on_retry: Callable[[Exception, float], object] | None = None,
    ) -> T:
        """``do()``, again after each retriable error until it succeeds or the policy gives up.

        ``on_retry(error, pause)`` is told of each failure that is retried.
        """
        self.backoff.reset()  # type: ignore[no-untyped-call]
        failures = 0
        first_failure = 0.0
        while True:
            try:
                return await do()
            except self.retry_on as error:
                failures += 1
                if (
                    not self.retriable(error)
                    or (stop is not None and stop())
                    or (self.attempts is not None and failures >= self.attempts)
                ):
                    raise
                now = time.monotonic()
                if failures == 1:
                    first_failure = now
                pause = self.backoff.compute(failures)
                if self.deadline_s is not None:
                    left = first_failure + self.deadline_s - now
                    if left <= 0:
                        raise
                    pause = min(pause, left)
                if on_retry is not None:
                    on_retry(error, pause)
                await asyncio.sleep(pause)


def state_of(error: BaseException) -> str:
    """A retriable error as a state: the part that failed and why (``bus full``)."""
    part = "bus" if isinstance(error, BusError) else "store" if isinstance(error, StoreError) else "call"
    reason = error.reason if isinstance(error, RunwireError) and error.reason else type(error).__name__
    return f"{part} {reason}"


class Outage:
    """What a process's retries say about its dependencies: one log line when a pause starts
    (or its cause changes), one when it ends, however many calls retry meanwhile.

    Each call retried through :meth:`call` counts as failing from its first
    retried error until it returns; the pause ends when no call is failing
    any more and the last one succeeded. ``retried`` counts the retried
    errors by state (``{"bus full": 12}``): a process's metric of it.
    """

    def __init__(self, logger: logging.Logger) -> None:
        self.log = logger
        self.state: str | None = None
        self.retried: dict[str, int] = {}
        self.paused_seconds = 0.0
        self._since = 0.0
        self._failing: set[object] = set()

    def failed(self, call: object, error: BaseException) -> None:
        """``call`` got a retriable error and will try again."""
        state = state_of(error)
        self.retried[state] = self.retried.get(state, 0) + 1
        self._failing.add(call)
        if state != self.state:
            if self.state is None:
                self._since = time.monotonic()
            self.state = state
            self.log.warning("paused: %s (%s); retrying with backoff until it passes", state, error)

    def ended(self, call: object, *, succeeded: bool) -> None:
        """``call`` returned (``succeeded``) or gave up."""
        if call not in self._failing:
            return
        self._failing.discard(call)
        if self._failing or self.state is None:
            return
        seconds = time.monotonic() - self._since
        self.paused_seconds += seconds
        if succeeded:
            self.log.warning("resumed after %.1fs of %s", seconds, self.state)
        self.state = None

    async def call(
        self, policy: Retry, do: Callable[[], Awaitable[T]], *, stop: Callable[[], bool] | None = None
    ) -> T:
        """``policy.call(do)``, its retries reported here."""
        token = object()
        succeeded = False
        try:
            result = await policy.call(do, stop=stop, on_retry=lambda error, _: self.failed(token, error))
            succeeded = True
            return result
        finally:
            self.ended(token, succeeded=succeeded)
