"""Which ingest format a stream is in, from its first frames.

Each non-blank line is classified into the formats whose frame shape it fits;
the answer is the one format every line fits. The shapes:

* ``koder`` — an object with ``id``, ``ts``, ``type``, ``run_id``, ``seq`` and
  ``payload``;
* ``loom-export`` — an object with exactly one key, a Loom streaming output §6 name
  (``RunStart``, ``Messages`` …) whose value is an object;
* ``loom-mcp`` — a Pulse envelope: ``type`` a loom-mcp event type (or a
  canonical type name), every key one of ``type, event_key, run_id,
  session_id, timestamp, payload, server_data``, and ``run_id`` present;
* ``loom`` — ``type`` a Loom streaming output event type (payload fields alongside it), or
  no ``type`` and a ``reply``;
* ``cogency`` — ``type`` one of the Cogency streaming protocol's ten event types;
* ``cogency-wire`` — lines that are not JSON objects, when the text holds one
  of the ``<think>``, ``<execute>``, ``<results>``, ``<respond>`` markers.

Formats that share type names (``tool_start``, ``usage`` in loom and
loom-mcp) are told apart by the envelope shape. When no single format fits,
:func:`detect` raises :class:`~runwire.core.errors.ConfigError` saying what it
saw, so the user can pass ``--from`` explicitly.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..core.envelope import EVENT_CLASSES, is_extension_type
from ..core.errors import ConfigError
from .cogency import COGENCY_TYPES
from .loom import LOOM_TYPES
from .loom_export import LOOM_TYPES_BY_KEY
from .loom_mcp import MCP_TYPES

FORMATS = ("koder", "loom", "loom-export", "cogency", "cogency-wire", "loom-mcp")
WIRE_MARKERS = (b"<think>", b"<execute>", b"<results>", b"<respond>", b"</think>", b"</respond>")
KODER_KEYS = frozenset({"id", "ts", "type", "run_id", "seq", "payload"})
PULSE_KEYS = frozenset(
    {"type", "event_key", "run_id", "session_id", "timestamp", "payload", "server_data"}
)
_decoder = msgspec.json.Decoder()


def _json_formats(frame: dict[str, Any]) -> set[str]:
    kind = frame.get("type")
    fits: set[str] = set()
    if KODER_KEYS <= frame.keys():
        fits.add("koder")
    if len(frame) == 1:
        ((key, body),) = frame.items()
        if key in LOOM_TYPES_BY_KEY and isinstance(body, dict):
            fits.add("loom-export")
    if not isinstance(kind, str):
        if kind is None and "reply" in frame:
            fits.add("loom")
        return fits
    pulse = frame.keys() <= PULSE_KEYS and "run_id" in frame
    if pulse and (kind in MCP_TYPES or kind in EVENT_CLASSES or is_extension_type(kind)):
        fits.add("loom-mcp")
    if kind in LOOM_TYPES and not (pulse and "payload" in frame):
        fits.add("loom")
    if kind in COGENCY_TYPES and "koder" not in fits:
        fits.add("cogency")
    return fits


def classify(line: bytes) -> set[str]:
    """The ingest formats one line's shape fits (empty when none)."""
    try:
        frame = _decoder.decode(line)
    except msgspec.DecodeError:
        frame = None
    except RecursionError:  # JSON too deep to read fits no format; the codec reports it per line
        return set()
    if isinstance(frame, dict):
        return _json_formats(frame)
    if any(marker in line for marker in WIRE_MARKERS):
        return {"cogency-wire"}
    return set() if frame is not None else {"text"}


def detect(first_lines: list[bytes]) -> str:
    """The ingest format of a stream whose first lines are ``first_lines``.

    Raises :class:`~runwire.core.errors.ConfigError` when the lines fit no format
    or several.
    """
    lines = [line.strip() for line in first_lines if line.strip()]
    if not lines:
        raise ConfigError("cannot detect the input format: the input is empty")
    shapes = [classify(line) for line in lines]
    if any("cogency-wire" in s for s in shapes) and all(
        s <= {"cogency-wire", "text"} for s in shapes
    ):
        return "cogency-wire"
    candidates = set(FORMATS)
    for number, fits in enumerate(shapes, start=1):
        candidates &= fits
        if not candidates:
            raise ConfigError(
                f"cannot detect the input format: line {number} ({lines[number - 1][:80]!r}) "
                f"fits none of {', '.join(FORMATS)} together with the lines before it; "
                "pass --from FORMAT"
            )
    if len(candidates) > 1:
        raise ConfigError(
            f"cannot detect the input format: the first lines fit {', '.join(sorted(candidates))}; "
            "pass --from FORMAT"
        )
    (found,) = candidates
    return found
