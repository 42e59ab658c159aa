"""What the edge's endpoints share: the bus, the replay log, the hub, the gate, the metrics.

Its own module so the endpoint modules (``app.py``, ``chat.py``, ``threads.py``,
the gRPC server) can all take an :class:`Edge` without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable

from ...bus.base import Bus
from ...store.base import ReplayLog
from ..fanout.hub import Hub
from ..metrics import EdgeMetrics
from ..settings import EdgeSettings
from .auth import Gate
from .busgate import GatedBus
from .quotas import WEBHOOK_TESTS, Quotas, Throttle


class Edge:
    """What the endpoints share: the bus, the replay log, the hub, the gate, the quotas, the metrics."""

    def __init__(self, bus: Bus, store: ReplayLog, settings: EdgeSettings) -> None:
        bus = GatedBus(bus)  # a reconnect storm queues for the bus instead of failing (busgate.py)
        self.bus = bus
        self.store = store
        self.settings = settings
        self.metrics = EdgeMetrics()
        self.hub = Hub(bus, store, settings, self.metrics)
        self.gate = Gate(settings.secret, bus, store, refusal_floor_s=settings.refusal_floor_s)
        self.quotas = Quotas(settings.streams_per_token)
        self.webhook_tests = Throttle(WEBHOOK_TESTS)
        self.readiness: dict[str, Callable[[], str | None]] = {}
        """More parts ``/readyz`` asks (name → why it is not ready, or None): the process's
        webhook deliveries (``runwire.workers.deliveries``), where it runs them."""
