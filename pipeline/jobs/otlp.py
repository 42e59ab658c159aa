"""Spans on the OTLP/HTTP wire: the standard ``OTEL_*`` environment read once, and an
``ExportTraceServiceRequest`` (protobuf, ``opentelemetry-proto``) built from derived spans.

What is read (docs/observability.md § Environment): ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (as
it is) or ``OTEL_EXPORTER_OTLP_ENDPOINT`` (+ ``/v1/traces``); their ``_HEADERS``, ``_TIMEOUT``
(ms), ``_COMPRESSION`` (``gzip``/``none``), ``_CERTIFICATE`` and ``_PROTOCOL`` (only
``http/protobuf``); ``OTEL_TRACES_EXPORTER`` (``none`` turns export off; only ``otlp`` is
spoken); ``OTEL_SDK_DISABLED``; ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``; and the
content opt-in ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``. The trace-specific
variable wins over the generic one, as the OTLP exporter specification says.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote

import msgspec
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import (
    AnyValue,
    ArrayValue,
    InstrumentationScope,
    KeyValue,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Status
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

from .spans import Span

__all__ = ["SCHEMA_URL", "OtlpSettings", "encode_request"]

log = logging.getLogger("runwire.jobs.otlp")

SCHEMA_URL = "https://opentelemetry.io/schemas/1.37.0"
"""The semantic conventions version the spans follow (GenAI attributes of 1.37: still
"Development", so pinned here and in the docs)."""
SCOPE = "runwire"
_KINDS = {"invoke_agent": ProtoSpan.SPAN_KIND_INTERNAL, "execute_tool": ProtoSpan.SPAN_KIND_INTERNAL,
          "chat": ProtoSpan.SPAN_KIND_CLIENT}
_STATUS = {"unset": Status.STATUS_CODE_UNSET, "ok": Status.STATUS_CODE_OK, "error": Status.STATUS_CODE_ERROR}


class OtlpSettings(msgspec.Struct, kw_only=True, frozen=True):
    """Where and how spans are sent; :meth:`from_env` reads the standard variables."""

    endpoint: str
    headers: dict[str, str] = {}
    timeout_s: float = 10.0
    gzip: bool = False
    certificate: str | None = None
    resource: dict[str, str] = {}
    content: bool = False
    """Message content on spans (the documented opt-in)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> OtlpSettings | None:
        """The settings the environment asks for; None when it asks for no trace export."""
        def pick(name: str) -> str | None:
            value = env.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or env.get(f"OTEL_EXPORTER_OTLP_{name}")
            return value.strip() if value and value.strip() else None

        if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return None
        exporters = {part.strip().lower() for part in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")}
        if "otlp" not in exporters:
            if exporters - {"none", ""}:
                log.warning("OTEL_TRACES_EXPORTER=%s: runwire exports spans over OTLP only; none sent",
                            env["OTEL_TRACES_EXPORTER"])
            return None
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        if not endpoint:
            base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
            if not base:
                return None
            endpoint = base.rstrip("/") + "/v1/traces"
        protocol = pick("PROTOCOL") or "http/protobuf"
        if protocol != "http/protobuf":
            log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s: runwire speaks http/protobuf only; no spans sent", protocol)
            return None
        timeout = pick("TIMEOUT")
        return cls(
            endpoint=endpoint,
            headers=parse_pairs(pick("HEADERS") or ""),
            timeout_s=float(timeout) / 1000 if timeout else 10.0,
            gzip=(pick("COMPRESSION") or "none").lower() == "gzip",
            certificate=pick("CERTIFICATE"),
            resource=resource_of(env),
            content=env.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "").strip().lower() == "true",
        )


def parse_pairs(text: str) -> dict[str, str]:
    """``k1=v1,k2=v2`` (W3C Baggage without properties, values percent-decoded), as the
    ``*_HEADERS`` and ``OTEL_RESOURCE_ATTRIBUTES`` variables are written; malformed pairs skipped."""
    pairs: dict[str, str] = {}
    for part in text.split(","):
        key, eq, value = part.partition("=")
        if eq and key.strip():
            pairs[unquote(key.strip())] = unquote(value.strip())
    return pairs


def resource_of(env: Mapping[str, str]) -> dict[str, str]:
    """The resource's attributes: ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME`` over its
    ``service.name``, else ``runwire``."""
    resource = parse_pairs(env.get("OTEL_RESOURCE_ATTRIBUTES", ""))
    service = env.get("OTEL_SERVICE_NAME", "").strip()
    resource["service.name"] = service or resource.get("service.name") or "runwire"
    resource.setdefault("telemetry.sdk.name", "runwire")
    return resource


def _value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, list | tuple):
        return AnyValue(array_value=ArrayValue(values=[_value(v) for v in value]))
    return AnyValue(string_value=str(value))


def _attributes(attributes: Mapping[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=key, value=_value(value)) for key, value in attributes.items()]


def _span(span: Span) -> ProtoSpan:
    assert span.end_ns is not None, "only ended spans are exported"
    return ProtoSpan(
        trace_id=bytes.fromhex(span.trace_id),
        span_id=bytes.fromhex(span.span_id),
        parent_span_id=bytes.fromhex(span.parent_span_id) if span.parent_span_id else b"",
        name=span.name,
        kind=_KINDS[span.operation],
        start_time_unix_nano=span.start_ns,
        end_time_unix_nano=span.end_ns,
        attributes=_attributes(span.attributes),
        events=[ProtoSpan.Event(time_unix_nano=e.time_ns, name=e.name, attributes=_attributes(e.attributes))
                for e in span.events],
        status=Status(code=_STATUS[span.status], message=span.status_message or ""),
    )


def encode_request(spans: Sequence[Span], resource: Mapping[str, str], version: str = "") -> bytes:
    """One ``ExportTraceServiceRequest`` carrying ``spans`` (all ended), serialized."""
    request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=Resource(attributes=_attributes(resource)),
        scope_spans=[ScopeSpans(scope=InstrumentationScope(name=SCOPE, version=version),
                                spans=[_span(span) for span in spans], schema_url=SCHEMA_URL)],
        schema_url=SCHEMA_URL,
    )])
    data: bytes = request.SerializeToString()
    return data
