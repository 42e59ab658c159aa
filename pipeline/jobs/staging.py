"""The span exporter's fold as the worker encodes (:class:`Staging`), and its compiled twin.

The worker's loop calls it for each root run's stream it encodes, before the log write, and
:meth:`Staging.release` once a write, after it: thousands of times a second each. What it does
is small (a look-up, a check, the run's fold, a note of what is kept back), so the Python around
the fold was most of its cost: ``runwire.jobs._otlp.Staging`` is the same, compiled, and
:func:`staging` gives whichever of the two runs (the compiled one where it was built, not with
``RUNWIRE_PURE=1``). ``tests/jobs/test_staging.py`` checks the two call for call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..core.envelope import Event
from ..core.native import load

__all__ = ["Staging", "staging"]


class Staging:
    """``staging(run_id, events)``: a stream's events as the worker encodes them. When
    ``trees`` holds the run (else ``begin(run_id, events)`` may hold it: a run that begins), and
    the events continue its tree (``held.tree``, folded past ``held.cursor``), and fewer than
    ``limit`` spans are pending: the events are folded, the spans they end kept back in
    ``held.staged`` as ``(first seq, last seq, spans)``, counted in :attr:`pending`, and the
    call returns a token, ``(held, last seq)``; else None (the worker hands the stream over
    after the write). A fold that raises is told to ``failed(run_id, error)``: None.

    :meth:`release` takes the tokens of a write the log now holds: ``held.logged(last)`` each
    (its spans may be sent)."""

    __slots__ = ("begin", "failed", "limit", "pending", "trees")

    def __init__(self, trees: dict[str, Any], begin: Callable[[str, Sequence[Event]], Any],
                 failed: Callable[[str, Exception], None], limit: int) -> None:
        self.trees, self.begin, self.failed, self.limit = trees, begin, failed, limit
        self.pending = 0

    def __call__(self, run_id: str, events: Sequence[Event]) -> tuple[Any, int] | None:
        held = self.trees.get(run_id)
        if held is None:
            held = self.begin(run_id, events)
            if held is None:
                return None
        if not events or self.pending > self.limit:
            return None
        try:
            tree = held.tree
            first, last = events[0].seq, events[-1].seq
            if first != tree.last_seq + 1:
                return None
            ended = tree.apply_many(events, held.cursor)
        except Exception as exc:  # the exporter drops the tree and folds the run again from the log
            self.failed(run_id, exc)
            return None
        held.staged.append((first, last, ended))
        self.pending += len(ended)
        return held, last

    def release(self, taken: Sequence[tuple[Any, int]]) -> None:
        for held, last in taken:
            held.logged(last)


_compiled = load("jobs._otlp", "span export")


def staging(trees: dict[str, Any], begin: Callable[[str, Sequence[Event]], Any],
            failed: Callable[[str, Exception], None], limit: int) -> Staging:
    """A :class:`Staging`, compiled where it was built (see the module docs)."""
    if _compiled is not None:
        made: Staging = _compiled.Staging(trees, begin, failed, limit)
        return made
    return Staging(trees, begin, failed, limit)
