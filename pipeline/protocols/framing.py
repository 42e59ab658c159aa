"""Pieces shared by the JSON-frame codecs (loom, loom-export, loom-mcp).

* :func:`decode_object` — one NDJSON frame → a dict, with the envelope's size
  limit and ``KAI-STREAM-PROTO-0001`` for anything that is not a JSON object.
* :func:`check_fields` — validates a frame's fields against a small table of
  JSON kinds, naming the field that is wrong.
* :class:`EventStamper` — gives ingested events their envelope: a monotonic
  ULID ``id``, ``seq`` from the source or a counter, ``ts`` from the source or
  now, and the ``ext`` diff that makes the round trip exact.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from ..core import envelope
from ..core.envelope import MAX_FRAME_BYTES, Event
from ..core.errors import MalformedFrame
from ..core.ulid import MonotonicULID
from .framediff import diff

_object_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()

Kind = str
"""A JSON kind: ``str``, ``int``, ``num``, ``bool``, ``obj``, ``arr`` or ``any``."""


def _is_kind(value: Any, kind: Kind) -> bool:
    if kind == "any":
        return True
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "num":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "obj":
        return isinstance(value, dict)
    return isinstance(value, list)


_KIND_NAMES = {
    "str": "a string",
    "int": "an integer",
    "num": "a number",
    "bool": "a boolean",
    "obj": "an object",
    "arr": "an array",
}


def decode_object(data: bytes | str, *, max_bytes: int = MAX_FRAME_BYTES) -> dict[str, Any]:
    """One frame as a JSON object, or ``MalformedFrame`` saying why not."""
    if len(data) > max_bytes:
        raise MalformedFrame(f"frame is {len(data)} bytes, over the {max_bytes}-byte limit")
    try:
        value = _object_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise MalformedFrame(f"not valid JSON: {exc}") from None
    except RecursionError:
        raise MalformedFrame(f"frame is nested deeper than {envelope.MAX_DEPTH} levels") from None
    if not isinstance(value, dict):
        raise MalformedFrame(
            f"a frame must be a JSON object, got {type(value).__name__}", field="$"
        )
    return value


def check_fields(
    frame: Mapping[str, Any],
    kinds: Mapping[str, Kind],
    required: tuple[str, ...] = (),
    *,
    prefix: str = "$",
    context: str = "",
) -> None:
    """Raise ``MalformedFrame`` naming the first missing or mistyped field.

    An optional field may be ``null``; a required one must have its kind.
    """
    for name in required:
        if name not in frame:
            raise MalformedFrame(
                f"{context}missing required field `{name}`", field=f"{prefix}.{name}"
            )
    for name, kind in kinds.items():
        if name not in frame or (frame[name] is None and name not in required):
            continue  # optional fields may be null (Go writes nil maps and slices as null)
        if not _is_kind(frame[name], kind):
            got = type(frame[name]).__name__
            raise MalformedFrame(
                f"{context}`{name}` must be {_KIND_NAMES[kind]}, got {got}",
                field=f"{prefix}.{name}",
            )


def as_int(value: Any) -> int:
    """A count for a typed payload field (0..int64); anything else is 0 (the ext diff keeps the original)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= envelope.INT64_MAX:
        return value
    return 0


def json_text(value: Any) -> str:
    """A value as text: strings as they are, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return _encoder.encode(value).decode()


class EventStamper:
    """Envelope fields for one ingested stream: ids, seq, ts, run id and the ext diff."""

    def __init__(self, fmt: str, default_run_id: str) -> None:
        self.fmt = fmt
        self.default_run_id = default_run_id
        self._ids = MonotonicULID("evt_")
        self.last_seq = 0

    def next_seq(self, source_seq: Any) -> int:
        """``source_seq`` when it is a usable sequence number, else the counter (from 1)."""
        if isinstance(source_seq, int) and not isinstance(source_seq, bool) and source_seq >= 0:
            seq = source_seq
        else:
            seq = self.last_seq + 1
        self.last_seq = seq
        return seq

    def build(
        self,
        kind: str,
        payload: Mapping[str, Any],
        *,
        run_id: str,
        seq: int,
        ts: str | None,
        source: dict[str, Any],
        render: Callable[[Event], dict[str, Any]],
        child_id: str | None = None,
        marked: bool = False,
    ) -> Event:
        """The canonical event, with ``ext[fmt]`` holding what ``render`` cannot restore.

        ``marked``: ``ext[fmt]`` is set even when ``render`` restores the frame
        exactly (an empty diff), for a format whose egress treats events without
        it as foreign ones."""
        event = envelope.make(
            kind,
            payload,
            id=self._ids.new(),
            ts=ts if ts is not None else envelope.now_ts(),
            run_id=run_id,
            seq=seq,
            **({"child_id": child_id} if child_id is not None else {}),
        )
        change = diff(source, render(event))
        if change is None:
            if not marked:
                return event
            change = {}
        return envelope.replace(event, ext={self.fmt: change})


def source_ts(value: Any) -> str | None:
    """``value`` when it is an RFC 3339 timestamp the envelope accepts, else ``None``."""
    return value if envelope.is_timestamp(value) else None
