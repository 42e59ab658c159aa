"""How a value a framework hands over (tool arguments, outputs, errors) becomes JSON: one rule.

:func:`to_json` converts, in this order:

* JSON already (``None``, bool, int, float, str, lists/tuples and dicts of them): as it is;
  dict keys become strings;
* a pydantic model: ``model_dump(mode="json")``; a dataclass or a ``msgspec.Struct``: its fields;
* ``bytes``: ``{"$bytes": <base64>, "size": n}``;
* ``datetime``/``date``/``time``: ISO 8601; ``UUID``, ``Decimal``, ``Path``, an ``Enum``: its
  string (an Enum: its value);
* a set: a sorted list when it sorts, else a list;
* anything else: ``repr(value)`` (never an error: publishing must not crash the agent).

A string that is itself JSON stays a string (the framework's own choice).

:func:`bounded` then keeps what :data:`~runwire.core.limits.TOOL_VALUE_BYTES` allows and
:data:`~runwire.core.limits.DEPTH` can carry: a larger value becomes
``{"$truncated": true, "size": <bytes of its JSON>, "head": <its first bytes, as text>}``,
a deeper one is cut at the depth with ``"$deep"`` in its place — and the run goes on.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import enum
import uuid
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

import msgspec

from ..core import limits

TRUNCATED = "$truncated"
DEEP = "$deep"
_encoder = msgspec.json.Encoder()
_NESTING = limits.DEPTH - 8
"""How deep a value may nest inside an event (the envelope and payload take some levels)."""


def to_json(value: Any, depth: int = 0) -> Any:
    """``value`` as plain JSON (see the module docstring)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if depth >= _NESTING:
        return DEEP
    if isinstance(value, Mapping):
        return {str(k): to_json(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v, depth + 1) for v in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        try:
            return to_json(dump(mode="json"), depth)
        except Exception:  # a model that can't dump itself: its repr below
            return repr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value)}
    if isinstance(value, msgspec.Struct):
        return to_json(msgspec.to_builtins(value), depth)
    return _scalar(value, depth)


def _scalar(value: Any, depth: int) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        return {"$bytes": base64.b64encode(raw).decode(), "size": len(raw)}
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return to_json(value.value, depth)
    if isinstance(value, uuid.UUID | decimal.Decimal | PurePath):
        return str(value)
    if isinstance(value, set | frozenset):
        items = [to_json(v, depth + 1) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    return repr(value)


def bounded(value: Any, limit: int = limits.TOOL_VALUE_BYTES) -> Any:
    """:func:`to_json` of ``value``, cut to ``limit`` bytes of JSON with a marker when larger."""
    plain = to_json(value)
    if plain is None or isinstance(plain, bool | int | float):
        return plain
    try:
        data = _encoder.encode(plain)
    except UnicodeEncodeError:  # a lone surrogate, which no UTF-8 encodes: U+FFFD in its place
        plain = _mended(plain)
        data = _encoder.encode(plain)
    if len(data) <= limit:
        return plain
    return {TRUNCATED: True, "size": len(data),
            "head": data[: max(0, limit - 128)].decode("utf-8", "ignore")}


def _mended(plain: Any) -> Any:
    """``plain`` (JSON) with each lone surrogate of its strings and keys replaced by U+FFFD."""
    if isinstance(plain, str):
        return plain.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(plain, list):
        return [_mended(item) for item in plain]
    if isinstance(plain, dict):
        return {_mended(key): _mended(item) for key, item in plain.items()}
    return plain
