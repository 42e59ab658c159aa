"""Posting OTLP requests: the span exporter's HTTP side (its pool, retries, proxy and counters).

aiohttp's client, as the webhook sender's: httpx's cost ~2 ms of CPU a request here
(docs/benchmarks.md § Span export). A post that fails is retried with backoff until a deadline;
a final answer (4xx other than 408/429) is not retried. What is sent, retried and dropped is
counted in :class:`ExportMetrics` (``/metrics``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import logging
import ssl
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry, Counter

from .otlp_env import OtlpSettings

__all__ = ["ExportMetrics", "Poster", "env_proxy"]

log = logging.getLogger("runwire.jobs.export")

SPANS_PER_REQUEST = 1000
ANSWER_BYTES = 64 * 1024
"""The most of a backend's answer read (a longer one closes the connection; a refusal's first
200 bytes go in its log line)."""
_RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class ExportMetrics:
    """What the exporter sent, retried and dropped (its own registry; ``/metrics`` shows it)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.exported = Counter("runwire_otel_spans_exported", "Spans the OTLP backend accepted", registry=r)
        self.dropped = Counter("runwire_otel_spans_dropped",
                               "Spans given up (reason: unreachable after retries, refused by the backend)",
                               ["reason"], registry=r)
        self.requests = Counter("runwire_otel_requests", "OTLP export requests by outcome", ["outcome"],
                                registry=r)


class Poster:
    """Sends ended spans to the OTLP endpoint of ``settings``, ``SPANS_PER_REQUEST`` a request."""

    def __init__(self, settings: OtlpSettings, metrics: ExportMetrics, version: str = "") -> None:
        self.settings = settings
        self.metrics = metrics
        self.version = version
        self._client: aiohttp.ClientSession | None = None
        self._proxy: str | None = None

    @contextlib.asynccontextmanager
    async def connected(self) -> AsyncIterator[None]:
        """The connection pool open for the block. A TLS context is made only for ``https:``
        (loading the CA bundle costs ~0.25 s of CPU); redirects are not followed. The proxy the
        environment names for the endpoint (``HTTPS_PROXY``, ``NO_PROXY``, …) is looked up here,
        once: aiohttp's ``trust_env`` looks it up per request, in a thread (~0.8 ms of CPU each,
        four times the rest of a request)."""
        tls: ssl.SSLContext | bool = False
        if self.settings.endpoint.startswith("https:"):
            tls = ssl.create_default_context(cafile=self.settings.certificate)
        self._proxy = env_proxy(self.settings.endpoint)
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=4, ssl=tls), trust_env=False, auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(), timeout=aiohttp.ClientTimeout(total=self.settings.timeout_s),
        ) as self._client:
            yield
        self._client = None

    async def send(self, spans: list[Any], deadline: float) -> int:
        """Post ``spans`` (``Span``, or the compiled fold's bytes of one), retrying until
        ``deadline`` (monotonic); how many the backend accepted (the rest are counted dropped)."""
        from .otlp import encode_request  # loaded by a process that exports, only

        sent = 0
        for start in range(0, len(spans), SPANS_PER_REQUEST):
            chunk = spans[start:start + SPANS_PER_REQUEST]
            outcome = await self.post(encode_request(chunk, self.settings.resource, self.version), deadline)
            if outcome == "sent":
                sent += len(chunk)
                self.metrics.exported.inc(len(chunk))
            else:
                self.metrics.dropped.labels(outcome).inc(len(chunk))
                log.warning("dropped %d span(s): the OTLP backend %s", len(chunk), outcome)
        return sent

    async def post(self, body: bytes, deadline: float) -> str:
        """``sent``, ``refused`` (a final answer) or ``unreachable`` (retried until ``deadline``)."""
        headers = {**self.settings.headers, "content-type": "application/x-protobuf"}
        if self.settings.gzip:
            body = gzip.compress(body, 5)
            headers["content-encoding"] = "gzip"
        pause = 0.25
        if self._client is None:
            raise RuntimeError("post inside connected()")
        while True:
            try:
                async with self._client.post(self.settings.endpoint, data=body, headers=headers,
                                             allow_redirects=False, proxy=self._proxy) as response:
                    answer = await response.content.read(ANSWER_BYTES)
                if 200 <= response.status < 300:
                    self.metrics.requests.labels("sent").inc()
                    return "sent"
                if response.status not in _RETRY_STATUS:
                    self.metrics.requests.labels("refused").inc()
                    log.warning("OTLP backend answered %d: %s", response.status,
                                answer[:200].decode("utf-8", "replace"))
                    return "refused"
                wait = _retry_after(response.headers) or pause
            except (aiohttp.ClientError, OSError, TimeoutError):
                wait = pause
            self.metrics.requests.labels("retried").inc()
            if time.monotonic() + wait > deadline:
                return "unreachable"
            await asyncio.sleep(wait)
            pause = min(pause * 2, 5.0)


def env_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``<SCHEME>_PROXY``, less ``NO_PROXY``), else None."""
    parts = urllib.parse.urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return urllib.request.getproxies().get(parts.scheme)


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("retry-after", "")
    return float(value) if value.strip().isdigit() else None
