"""Exact differences between two JSON values, so a source frame survives a round trip (Koder agent stream §7 T1).

An ingest codec maps a frame onto a canonical event, then renders that event
back with its format's own (stateless) egress rendering and stores here only
what the rendering got wrong: fields whose value differs (``set``), fields the
source did not have (``del``) and nested objects that differ in part
(``sub``). The egress side of the same format applies the diff to its
rendering and gets the source frame back, field for field. Because the diff is
computed against the very function egress uses, the round trip is exact by
construction, and an event whose frame the rendering reproduces carries no
``ext`` at all.

Values compare by JSON type as well as value (``1``, ``1.0`` and ``true``
are three different things on the wire).
"""

from __future__ import annotations

from typing import Any

FrameDiff = dict[str, Any]


def same(a: Any, b: Any) -> bool:
    """JSON equality that also tells ``1`` from ``1.0`` from ``true``."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def diff(source: dict[str, Any], rendered: dict[str, Any]) -> FrameDiff | None:
    """What turns ``rendered`` into ``source``; ``None`` when they are equal."""
    changed: dict[str, Any] = {}
    nested: dict[str, FrameDiff] = {}
    for key, value in source.items():
        if key not in rendered:
            changed[key] = value
            continue
        other = rendered[key]
        if same(value, other):
            continue
        if isinstance(value, dict) and isinstance(other, dict):
            sub = diff(value, other)
            if sub is not None:
                nested[key] = sub
        else:
            changed[key] = value
    dropped = [key for key in rendered if key not in source]
    out: FrameDiff = {}
    if changed:
        out["set"] = changed
    if dropped:
        out["del"] = dropped
    if nested:
        out["sub"] = nested
    return out or None


def apply(rendered: dict[str, Any], change: FrameDiff | None) -> dict[str, Any]:
    """``rendered`` with ``change`` applied (a new dict; ``rendered`` is not modified)."""
    if not change:
        return rendered
    out = dict(rendered)
    for key in change.get("del", ()):
        out.pop(key, None)
    for key, sub in change.get("sub", {}).items():
        base = out.get(key)
        out[key] = apply(base if isinstance(base, dict) else {}, sub)
    out.update(change.get("set", {}))
    return out
