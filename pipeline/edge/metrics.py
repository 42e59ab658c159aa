"""Prometheus metrics of one edge app (its own registry, so several apps can share a process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from ..core.envelope import ts_ms
from ..core.errors import ProtocolError


class EdgeMetrics:
    """Connections, events in/out per format, drops, resumes by source, lag."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.connections = Gauge("runwire_edge_connections", "Open stream connections", registry=r)
        self.events_in = Counter(
            "runwire_edge_events_in", "Events read from delivery streams", registry=r
        )
        self.events_out = Counter(
            "runwire_edge_frames_out", "Frames written to clients", ["format"], registry=r
        )
        self.drops = Counter(
            "runwire_edge_drops", "Events dropped for slow clients (reasoning deltas first, then text deltas)", ["type"], registry=r
        )
        self.disconnects = Counter(
            "runwire_edge_disconnects", "Streams closed by the edge", ["code"], registry=r
        )
        self.resumes = Counter(
            "runwire_edge_resumes", "Resumed streams by history source", ["source"], registry=r
        )
        self.lag = Histogram(
            "runwire_edge_lag_seconds",
            "Event timestamp to edge dispatch",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30),
            registry=r,
        )
        self.ingested = Counter(
            "runwire_edge_ingested", "Events accepted by HTTP ingest", registry=r
        )
        self.bus_errors = Counter("runwire_edge_bus_errors", "Failed bus reads", registry=r)
        self.ingest_lost = Gauge(
            "runwire_ingest_lost_entries",
            "Ingest entries a consumer group lost to ingest_maxlen before reading them"
            " (each held up to 64 events)", ["group"], registry=r,
        )
        self.paused = Counter(
            "runwire_edge_paused",
            "Requests and readiness checks that found the bus or the replay log at a limit"
            " (part: bus, store; reason: full, unavailable)", ["part", "reason"], registry=r,
        )

        self._drop_counters: dict[str, Counter] = {}

    def dropped(self, event_type: str) -> None:
        """Count one slow-client drop (label children cached: this runs once per dropped delivery)."""
        counter = self._drop_counters.get(event_type)
        if counter is None:
            counter = self._drop_counters[event_type] = self.drops.labels(event_type)
        counter.inc()

    def pause(self, state: str) -> None:
        """Count one request or check that met a retriable state (``bus full``)."""
        part, _, reason = state.partition(" ")
        self.paused.labels(part, reason).inc()

    def observe_lag(self, now_s: float, ts: str) -> None:
        try:
            self.lag.observe(max(0.0, now_s - ts_ms(ts) / 1000))
        except ProtocolError:
            pass

    def render(self) -> bytes:
        return generate_latest(self.registry)
