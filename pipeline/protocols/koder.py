"""``koder``: the canonical JSON envelope of the Koder agent stream, in and out."""

from __future__ import annotations

from typing import Any

from ..core import envelope
from ..core.envelope import Event
from .base import Egress, Ingest


class KoderIngest(Ingest):
    name = "koder"

    def feed(self, data: bytes) -> list[Event]:
        return [envelope.decode(data)]


class KoderEgress(Egress):
    name = "koder"

    def convert(self, event: Event) -> list[Any]:
        return [event]

    def encode(self, event: Event) -> list[bytes]:
        return [envelope.encode(event)]
