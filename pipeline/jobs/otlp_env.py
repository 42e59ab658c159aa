"""The standard ``OTEL_*`` environment of span export, read once; apart from the wire
(:mod:`runwire.jobs.otlp`) so that a process reading it imports no protobuf unless it exports.

What is read (docs/observability.md § Environment): ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (as
it is) or ``OTEL_EXPORTER_OTLP_ENDPOINT`` (+ ``/v1/traces``); their ``_HEADERS``, ``_TIMEOUT``
(ms), ``_COMPRESSION`` (``gzip``/``none``), ``_CERTIFICATE`` and ``_PROTOCOL`` (only
``http/protobuf``); ``OTEL_TRACES_EXPORTER`` (``none`` turns export off; only ``otlp`` is
spoken); ``OTEL_SDK_DISABLED``; ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``;
``OTEL_BSP_SCHEDULE_DELAY`` (ms: the longest an ended span waits to be sent); and the content
opt-in ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``. The trace-specific variable
wins over the generic one, as the OTLP exporter specification says.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from urllib.parse import unquote

import msgspec

__all__ = ["OtlpSettings", "parse_pairs", "resource_of"]

log = logging.getLogger("runwire.jobs.otlp")

SCHEDULE_DELAY_S = 5.0
"""``OTEL_BSP_SCHEDULE_DELAY``'s default, as the OpenTelemetry SDKs' batch span processor's."""


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
    delay_s: float = SCHEDULE_DELAY_S
    """The longest an ended span waits for the pass that sends it (``OTEL_BSP_SCHEDULE_DELAY``)."""

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
        delay = env.get("OTEL_BSP_SCHEDULE_DELAY", "").strip()
        if delay and not delay.isdigit():
            log.warning("OTEL_BSP_SCHEDULE_DELAY=%s is not a whole number of ms; %d used", delay,
                        SCHEDULE_DELAY_S * 1000)
            delay = ""
        return cls(
            endpoint=endpoint,
            headers=parse_pairs(pick("HEADERS") or ""),
            timeout_s=float(timeout) / 1000 if timeout else 10.0,
            gzip=(pick("COMPRESSION") or "none").lower() == "gzip",
            certificate=pick("CERTIFICATE"),
            resource=resource_of(env),
            content=env.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "").strip().lower() == "true",
            delay_s=int(delay) / 1000 if delay else SCHEDULE_DELAY_S,
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


@functools.cache
def release() -> str:
    """runwire's installed version (the exporter's ``User-Agent``): read once a process (the
    package metadata lookup costs ~1 ms), "" when not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("runwire")
    except PackageNotFoundError:
        return ""
