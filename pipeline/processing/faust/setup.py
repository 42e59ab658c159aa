"""How the Kafka worker's faust app is set up: its settings and the ingest
topic subscription (all faust's public API; the private part is
:mod:`runwire.processing.faust.seam`). The app keeps no table: a stream's
checkpoint is on the bus and in the replay log, as for the consumer-group
runtime (:mod:`runwire.workers.faust_app`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from faust.types import TopicT
from mode.utils.queues import FlowControlQueue

from ...bus.kafka.bus import KafkaBus
from ..stages import BATCH
from .seam import Intake, WorkerApp

COMMIT_EVERY = 8 * BATCH
"""Faust commits after this many acks (and every ``broker_commit_interval``)."""


def build_app(
    bus: KafkaBus, group: str, intake: Intake, topic_name: str, data_dir: Path
) -> WorkerApp:
    """The worker's faust app: group ``group``, handing ingest batches to ``intake``."""
    session_s = (bus.kafka.session_timeout_ms or bus.options.lease_ms) / 1000
    app = WorkerApp(
        group,
        broker=f"kafka://{bus.bootstrap}",
        store="memory://",
        web_enabled=False,
        # faust's own files go under runwire's data dir
        datadir=str(data_dir / "faust" / "{conf.name}"),
        topic_partitions=bus.shards,
        topic_replication_factor=1,
        consumer_auto_offset_reset="earliest",
        broker_commit_every=COMMIT_EVERY,
        broker_commit_interval=0.5,
        producer_acks=-1,
        stream_wait_empty=True,
        # a dead worker's partitions move after its session times out (the claim idle time)
        broker_session_timeout=session_s,
        broker_heartbeat_interval=max(0.3, session_s / 5),
        broker_rebalance_timeout=max(session_s, 10.0),
        loghandlers=[],
    )
    app.intake = intake
    app.ingest_topic = topic_name
    # faust only calls clear() on a managed queue (at the start of a rebalance)
    app.flow_control.manage_queue(cast("FlowControlQueue[Any]", intake))
    return app


def subscribe(app: WorkerApp, topic_name: str, shards: int) -> None:
    """Subscribe the app to the ingest topic (the seam hands its records over)."""
    topic = app.topic(
        topic_name,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        partitions=shards,
    )
    # subscribed as an agent's stream would be; IngestConsumer hands its records to the intake
    app.topics.add(cast(TopicT, topic.clone(is_iterator=True)))
