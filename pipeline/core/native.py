"""The compiled twins of pure-Python hot paths, and which of the two a process runs.

A compiled twin (``runwire.jobs._otlp``: the OTLP request writer of :mod:`runwire.jobs.otlp` and
the span fold; ``runwire.core._native``: the worker's per-event path of
:mod:`runwire.processing.processor`, the Redis write's packing and a decoded batch's
timestamp and line checks, an append's order check) is built from C at install where a compiler is
(``setup.py``: an optional extension) and does exactly what its Python twin does: a test checks
the two against each other over generated input (``tests/jobs/test_otlp_native.py``,
``tests/workers/test_core.py``, ``tests/bus/test_pack_native.py``,
``tests/test_ts_native.py``, ``tests/test_joined_native.py``,
``tests/bus/test_kafka_hot.py``), and the tests that reach a twin run on both
(``scripts/test``: the whole suite as installed, then those again with ``RUNWIRE_PURE=1``).
Where it was not built, the Python twin runs and the process says so once, in one log line.
``RUNWIRE_PURE=1`` asks for the Python twins everywhere (to compare, or to rule the compiled
code out of a problem).
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

__all__ = ["PURE_ENV", "load", "pure_requested"]

log = logging.getLogger("runwire")

PURE_ENV = "RUNWIRE_PURE"


def pure_requested() -> bool:
    """Whether ``RUNWIRE_PURE=1`` asks for the pure-Python twins."""
    return os.environ.get(PURE_ENV, "") == "1"


_LOADED: dict[str, ModuleType | None] = {}


def load(name: str, what: str) -> ModuleType | None:
    """The compiled module ``runwire.{name}``; None (the Python twin runs) when
    ``RUNWIRE_PURE=1`` or when it was not built, which is then said once per module, in one
    log line (naming ``what`` its first caller wanted of it)."""
    if pure_requested():
        return None
    if name not in _LOADED:
        try:
            _LOADED[name] = importlib.import_module(f"runwire.{name}")
        except ImportError:
            _LOADED[name] = None
            log.warning("runwire: the compiled %s (runwire.%s) is not built here (no C compiler at "
                        "install); its pure-Python twin runs", what, name)
    return _LOADED[name]
