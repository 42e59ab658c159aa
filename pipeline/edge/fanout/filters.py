"""Which events a feed carries: audience profile (loom-mcp stream package) and child handling.

Profiles come from :mod:`runwire.protocols.profiles` (``default``,
``debug``, ``user`` / ``user-chat``, ``metrics``). ``children=link`` leaves
events that came from a child run (``child_id`` set) out of the parent
stream; the parent's ``child.spawn`` stays as the link a UI follows to the
child's own stream. ``flatten`` keeps them (Koder agent stream §7 T5).
"""

from __future__ import annotations

from collections.abc import Callable

from ...core.envelope import Event
from ...protocols.profiles import ALIASES, PROFILES, profile

PROFILE_NAMES: tuple[str, ...] = (*PROFILES, *ALIASES)
CHILDREN = ("flatten", "link")


def event_filter(profile_name: str, children: str) -> Callable[[Event], bool]:
    """The predicate a feed applies before encoding (ConfigError for an unknown profile)."""
    allowed = profile(profile_name)
    if children == "flatten":
        return allowed
    return lambda event: event.child_id is None and allowed(event)
