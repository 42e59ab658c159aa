"""gRPC ``Ingest``: canonical ``Event`` messages through the HTTP ingest path.

Messages are grouped by the run they are posted to (``root_id``, else
``run_id``, as the path of ``POST /v1/runs/{run_id}/events``);
:func:`.authz.authorize_write` runs once per run when it is first seen, and
every :data:`INGEST_BATCH` messages (and at the end) each run's messages go
through :func:`.ingest.publish_body` as one koder NDJSON body — decode, the
write rule (:func:`.authz.admit`), publish. Rejections come back by the
message's 1-based index in the call. A call is bounded like an HTTP ingest
body (:mod:`runwire.core.limits`: bytes and events): the message past a bound
ends the call with ``RESOURCE_EXHAUSTED`` and ``KAI-STREAM-REQ-0002``;
batches published before it stay published.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from ...core import limits
from ...core.errors import PROTO_MALFORMED
from ..proto.runwire.v1 import runwire_pb2 as pb
from ..service.auth import Principal
from ..service.authz import authorize_write
from ..service.context import Edge
from ..service.ingest import IngestRequest, publish_body
from .messages import event_line

INGEST_BATCH = 1000
"""Ingest publishes every this many messages (and at the end of the call)."""


class Ingestion:
    """One ``Ingest`` call: messages grouped by run, published through the HTTP ingest path."""

    def __init__(self, edge: Edge, principal: Principal | None) -> None:
        self.edge = edge
        self.principal = principal
        self.accepted = 0
        self.rejected: list[pb.IngestError] = []
        self.allowed: set[str] = set()
        self.pending: dict[str, list[tuple[int, bytes]]] = {}
        self.count = 0
        self.size = 0
        """Bytes of the call's messages so far (bounded like an HTTP ingest body)."""

    async def run(self, messages: AsyncIterator[pb.Event]) -> pb.IngestReply:
        index = 0
        settings = self.edge.settings
        async for message in messages:
            index += 1
            limits.check_count(index, settings.max_ingest_events, "the Ingest call")
            self.size += message.ByteSize()
            limits.check_size(self.size, settings.max_ingest_bytes, "the Ingest call")
            await self.add(index, message)
            if self.count >= INGEST_BATCH:
                await self.flush()
        await self.flush()
        self.rejected.sort(key=_index)
        return pb.IngestReply(accepted=self.accepted, rejected=self.rejected)

    async def add(self, index: int, message: pb.Event) -> None:
        run_id = message.root_id or message.run_id
        if not run_id:
            self.rejected.append(pb.IngestError(
                index=index, code=PROTO_MALFORMED, message="an event needs a run_id", field="$.run_id"
            ))
            return
        if run_id not in self.allowed:
            await authorize_write(self.edge.gate, self.principal, run_id)
            self.allowed.add(run_id)
        self.pending.setdefault(run_id, []).append((index, event_line(message)))
        self.count += 1

    async def flush(self) -> None:
        pending, self.pending, self.count = self.pending, {}, 0
        for run_id, items in pending.items():
            body = b"\n".join(line for _, line in items)
            result = await publish_body(self.edge, self.principal, IngestRequest(run_id, body, "koder"))
            self.accepted += result.accepted
            for error in result.rejected:
                index = items[min(error.line, len(items)) - 1][0]
                self.rejected.append(
                    pb.IngestError(index=index, code=error.code, message=error.message, field=error.field or "")
                )


def _index(error: pb.IngestError) -> int:
    return error.index
