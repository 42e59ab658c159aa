"""Frames ⇄ ``runwire.v1`` protobuf messages, for the gRPC server.

A feed encodes each event once per format (``hub.py``); the gRPC server
turns that frame into a serialized protobuf message once more per frame
(cached on the frame, :meth:`Frame.encoded`), and every gRPC client of the
feed is written the same bytes.

* ``koder`` frames (the canonical JSON envelope) become ``Event`` with the
  envelope's fields; the payload is copied as JSON text without being
  decoded (``msgspec.Raw``).
* frames of any other format become ``Event`` with ``seq``, ``type`` and
  ``frames`` (one JSON document per frame of that format).
* ``streamweave`` frames become ``WeaveProgress`` for the StreamWeave RPC.

The other way, an ``Event`` sent to ``Ingest`` becomes one canonical JSON
line for the HTTP ingest path (``ingest.publish_body``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...store.base import RunInfo
from ..fanout.frames import Frame
from ..proto.runwire.v1 import runwire_pb2 as pb

EVENT = "grpc-event"
WEAVE = "grpc-weave"
"""Cache keys of the two renderings (a feed's frames may be read by both RPCs)."""


_IDS = ("child_id", "parent_id", "root_id", "tenant", "thread_id")
"""The envelope's optional string fields: ``""`` in an ``Event`` stands for absent."""


class _Envelope(msgspec.Struct, kw_only=True):
    """The canonical JSON envelope with its payload and ``ext`` left as raw JSON."""

    id: str
    ts: str
    type: str
    run_id: str
    seq: int
    payload: msgspec.Raw
    child_id: str | None = None
    ext: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    """Empty when absent (msgspec decodes ``Raw`` only outside a union)."""
    span: tuple[int, int] | None = None
    parent_id: str | None = None
    root_id: str | None = None
    tenant: str | None = None
    thread_id: str | None = None


_envelope = msgspec.json.Decoder(_Envelope)
_json = msgspec.json.Encoder()


def event_message(frame: Frame) -> bytes:
    """A ``koder`` frame (one canonical envelope) as a serialized ``Event``."""
    env = _envelope.decode(frame.payloads[0])
    ext = bytes(env.ext)
    message = pb.Event(
        id=env.id,
        ts=env.ts,
        type=env.type,
        run_id=env.run_id,
        seq=env.seq,
        payload=bytes(env.payload).decode(),
        ext="" if ext == b"null" else ext.decode(),
    )
    for name in _IDS:
        setattr(message, name, getattr(env, name) or "")
    if env.span is not None:
        message.span.first, message.span.last = env.span
    return message.SerializeToString()


def frames_message(frame: Frame) -> bytes:
    """A frame of any other format as a serialized ``Event`` carrying that format's frames."""
    message = pb.Event(
        seq=frame.seq or 0,
        type=frame.event_type,
        frames=[payload.decode() for payload in frame.payloads],
    )
    return message.SerializeToString()


def weave_progress(data: dict[str, Any]) -> pb.WeaveProgress:
    """One ``streamweave`` egress frame as the StreamWeave RPC's ``WeaveProgress``."""
    message = pb.WeaveProgress(
        stage=data["stage"],
        progress=data["progress"],
        message=data["message"],
        tool_name=data.get("tool_name") or "",
        timestamp=data["timestamp"],
    )
    result = data.get("partial_result")
    if result is not None:
        message.partial_result.type = result["type"]
        message.partial_result.data_json = result["data_json"]
    return message


def weave_message(frame: Frame) -> bytes:
    """A one-payload ``streamweave`` frame as a serialized ``WeaveProgress``."""
    return weave_progress(msgspec.json.decode(frame.payloads[0])).SerializeToString()


class _Line(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An ``Event`` message as a canonical JSON line (empty fields omitted)."""

    id: str
    ts: str
    type: str
    run_id: str
    seq: int
    payload: msgspec.Raw
    child_id: str | None = None
    ext: msgspec.Raw | None = None
    span: tuple[int, int] | None = None
    parent_id: str | None = None
    root_id: str | None = None
    tenant: str | None = None
    thread_id: str | None = None


def _raw_json(text: str, default: bytes | None) -> msgspec.Raw | None:
    if not text:
        return None if default is None else msgspec.Raw(default)
    # A raw newline in JSON can only be whitespace: flatten it so the line stays one line.
    return msgspec.Raw(text.replace("\r", " ").replace("\n", " ").encode())


def event_line(message: pb.Event) -> bytes:
    """An ``Event`` sent to ``Ingest`` as one canonical JSON line (validated downstream).

    The payload text is spliced in as it is; if it is not JSON, the line is
    not either, and the ingest path rejects it with ``KAI-STREAM-PROTO-0001``.
    """
    payload = _raw_json(message.payload, b"{}")
    assert payload is not None
    line = _Line(
        id=message.id,
        ts=message.ts,
        type=message.type,
        run_id=message.run_id,
        seq=message.seq,
        payload=payload,
        ext=_raw_json(message.ext, None),
        span=(message.span.first, message.span.last) if message.HasField("span") else None,
        **{name: getattr(message, name) or None for name in _IDS},
    )
    return _json.encode(line)


def run_info(info: RunInfo) -> pb.RunInfo:
    return pb.RunInfo(
        run_id=info.run_id,
        tenant=info.tenant or "",
        parent_id=info.parent_id or "",
        root_id=info.root_id or "",
        state=info.state or "",
        terminal=info.terminal,
        events=info.events,
        last_seq=info.last_seq,
        input_tokens=info.input_tokens,
        output_tokens=info.output_tokens,
        dropped=info.dropped,
        first_ts=info.first_ts or "",
        last_ts=info.last_ts or "",
    )
