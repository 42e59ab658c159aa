"""Which events a feed carries: audience profile (seed 004) and child handling.

``children=link`` leaves events that came from a child run (``child_id``
set) out of the parent stream; the parent's ``child.spawn`` stays as the
link a UI follows to the child's own stream. ``flatten`` keeps them (T5).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from ..envelope import Event
from ..errors import ConfigError

PROFILES = ("default", "user", "debug", "metrics")
CHILDREN = ("flatten", "link")

_METRICS_TYPES = frozenset({"x.usage", "run.lifecycle"})


def _user_chat(event: Event) -> bool:
    # seed 004 UserChatProfile: replies, tools, awaits, usage, workflow, child links — no thoughts.
    kind = event.type
    return kind != "reasoning.delta" and not kind.startswith("x.loom.") and kind != "x.gap"


def _everything(event: Event) -> bool:
    return True


def _metrics(event: Event) -> bool:
    return event.type in _METRICS_TYPES


def profile_filter(profile: str) -> Callable[[Event], bool]:
    """The event predicate of an audience profile (``user`` chat, ``debug``, ``metrics``, ``default``)."""
    try:
        shared: Any = importlib.import_module("pipeline.protocols.profiles")
    except ImportError:
        shared = None
    if shared is not None and hasattr(shared, "accepts"):
        predicate: Callable[[Event], bool] = shared.accepts(profile)
        return predicate
    table: dict[str, Callable[[Event], bool]] = {
        "default": _everything,
        "debug": _everything,
        "user": _user_chat,
        "metrics": _metrics,
    }
    if profile not in table:
        raise ConfigError(f"unknown profile {profile!r}; use one of {', '.join(PROFILES)}")
    return table[profile]


def event_filter(profile: str, children: str) -> Callable[[Event], bool]:
    """The predicate a feed applies before encoding."""
    if children not in CHILDREN:
        raise ConfigError(f"unknown children mode {children!r}; use flatten or link")
    allowed = profile_filter(profile)
    if children == "flatten":
        return allowed
    return lambda event: event.child_id is None and allowed(event)
