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
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.backoff import AbstractBackoff

from .errors import RunwireError

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
