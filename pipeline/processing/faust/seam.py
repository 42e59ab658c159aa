"""The seam between runwire and faust-streaming's private consumer internals.

The Kafka worker hands each fetched batch of ingest records to the worker
whole (:class:`Intake`) instead of one message at a time through faust's
conductor, channel and stream, whose per-message tasks cost more than all
of the pipeline's own work (about 90 µs a message). That means replacing
faust's consumer drain loop, and everything here leans on internals of
faust-streaming's ``Consumer`` that are not a public API:

=============================  ===============================================
``_drain_messages(fetcher)``   the loop replaced (:meth:`IngestConsumer._drain_messages`)
``_wait_next_records``         one fetch, as faust's own loop does it
``_read_offset``               faust's last read offset per partition
``_add_gap``                   records an offset gap (acks past it still commit)
``_n_acked``, ``_commit_every``  faust's commit-after-N-acks counter
``_to_message``, ``_buffered_partitions``, ``_stopped``  as faust's loop uses them
``_seek``                      a seek, replaced: on the consumer thread (:meth:`IngestConsumer._seek`)
``_new_consumer_thread``,      the thread's aiokafka consumer, its client's closed connections counted
``_create_consumer``, ``_client._on_connection_closed``  (:class:`IngestConsumerThread`)
``_fetch_max_wait_ms``         aiokafka's, set before the consumer starts (faust hardcodes 1,500),
``_consumer._fetcher``          then per fetch (:func:`~runwire.bus.kafka.hold.hold_fetches`)
``_thread.call_thread``        runs a call on the thread owning the aiokafka consumer
``App._fetcher``               faust's Fetcher service, watched for a crash (:func:`faust_crash`)
=============================  ===============================================

They were written and tested against the versions in
:data:`TESTED_FAUST_VERSIONS`; :func:`check_faust_version` refuses any other
at the worker's start (``RUNWIRE_FAUST_UNTESTED=1`` runs it anyway), since
a change to any of them could lose or reorder entries silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any, cast

import faust
from aiokafka.conn import CloseReason
from aiokafka.errors import IllegalStateError, KafkaError
from faust.transport.consumer import CONSUMER_FETCHING
from faust.transport.drivers import aiokafka as faust_kafka
from faust.types import TP

from ...bus.kafka.hold import BACKLOG_FETCH_WAIT_MS, hold_fetches
from ...bus.kafka.io import ingest_event_count
from ...core.errors import ConfigError, RunwireError

log = logging.getLogger("runwire.faust")

TESTED_FAUST_VERSIONS = frozenset({"0.15.3"})
"""faust-streaming releases the seam was tested with."""
UNTESTED_ENVVAR = "RUNWIRE_FAUST_UNTESTED"
_PRIVATE = ("_drain_messages", "_wait_next_records", "_to_message", "_add_gap",
            "track_message", "perform_seek", "_seek", "_new_consumer_thread")
SEEK_TIMEOUT_S = 10.0
"""How long a seek may wait for the consumer thread (busy with a fetch or a commit); past it the
seek is dropped with a warning (the worker seeks again if it still has to)."""


class FaustCrashed(RunwireError):
    """A faust service of the Kafka worker's app crashed: the worker stops, exiting non-zero."""


def faust_crash(app: faust.App) -> BaseException | None:
    """Why faust's Fetcher or the app crashed; None while both run (or stop normally).

    A crashed Fetcher fetches nothing ever again while the process, its group
    membership and its heartbeats live on: the partitions it owns would stall
    with no error a supervisor sees. A crash without a supervisor marks the
    app crashed too (mode walks up to the root); faust's own cancelling of the
    Fetcher around a rebalance (a ``CancelledError``) is not a crash here.
    """
    for service in (cast(Any, app)._fetcher, app):
        reason = service.crash_reason if service.crashed else None
        if reason is not None and not isinstance(reason, asyncio.CancelledError):
            return cast(BaseException, reason)
    return None


def raise_if_crashed(app: faust.App, name: str) -> None:
    """Raise :class:`FaustCrashed` (one line naming the crash) if :func:`faust_crash` finds one."""
    crash = faust_crash(app)
    if crash is not None:
        raise FaustCrashed(f"{name}: faust's consumer crashed ({crash!r}); exiting so that the "
                           "group moves its partitions to a live worker") from crash


def check_faust_version(version: str | None = None) -> None:
    """Raise ConfigError unless ``version`` (default: the installed faust) was tested here.

    Also checks that the private consumer methods the seam uses exist.
    """
    version = faust.__version__ if version is None else version
    missing = [name for name in _PRIVATE if not callable(getattr(faust_kafka.Consumer, name, None))]
    if missing:
        raise ConfigError(
            f"faust-streaming {version} has no Consumer.{', '.join(missing)}, which the Kafka "
            f"worker relies on; install faust-streaming=={max(TESTED_FAUST_VERSIONS)}")
    if version not in TESTED_FAUST_VERSIONS and not os.environ.get(UNTESTED_ENVVAR):
        tested = ", ".join(sorted(TESTED_FAUST_VERSIONS))
        raise ConfigError(
            f"the Kafka worker replaces internals of faust-streaming's consumer and was tested "
            f"with faust-streaming {tested}, not {version}: install one of those, or set "
            f"{UNTESTED_ENVVAR}=1 to run it anyway")


class Intake:
    """Fetched ingest messages waiting for the worker, in fetch order per partition.

    Counted in events (a record may hold several, see
    :mod:`runwire.bus.ingest_entries`): at :attr:`limit` events waiting, faust's
    consumer stops fetching. Faust's flow control clears it at the start of a
    rebalance, as it clears its stream buffers: entries not yet taken are
    dropped (never acked, so read again by whoever owns their partition next).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.messages: list[Any] = []
        self.sizes: list[int] = []
        """Events per message."""
        self.events = 0
        self.ready = asyncio.Event()
        self.space = asyncio.Event()
        self.space.set()

    def __len__(self) -> int:
        return len(self.messages)

    def put(self, messages: list[Any], sizes: list[int]) -> None:
        self.messages.extend(messages)
        self.sizes.extend(sizes)
        self.events += sum(sizes)
        self.ready.set()
        if self.events >= self.limit:
            self.space.clear()

    def take(self, most: int) -> list[Any]:
        """The first messages holding about ``most`` events (at least one message)."""
        count, events = 0, 0
        for size in self.sizes:
            if count and events + size > most:
                break
            count += 1
            events += size
        taken = self.messages[:count]
        del self.messages[:count]
        del self.sizes[:count]
        self.events -= events
        if not self.messages:
            self.ready.clear()
        if self.events < self.limit:
            self.space.set()
        return taken

    def clear(self) -> None:
        """Drop what is waiting (``FlowControlEvent.clear`` on a rebalance)."""
        self.messages.clear()
        self.sizes.clear()
        self.events = 0
        self.ready.clear()
        self.space.set()


class IngestConsumer(faust_kafka.Consumer):
    """Faust's aiokafka consumer, handing fetched ingest records to :class:`Intake` in bulk.

    The stock drain loop passes every message through the conductor into a
    channel queue, the stream and the take buffer, creating tasks for each
    (about 90 µs a message, more than the whole pipeline's work). Here a
    fetched batch of ingest records is checked the same way (flow active,
    generation unchanged, partition active, read offset and gaps), tracked as
    unacked and appended to the intake at once. Records of other topics (the
    table changelog during recovery) take faust's own path.
    """

    breaks = 0
    """Connections of the aiokafka consumer's client closed so far."""

    def _new_consumer_thread(self) -> IngestConsumerThread:
        return IngestConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def _drain_messages(self, fetcher: Any) -> None:
        intake: Intake | None = getattr(self.app, "intake", None)  # None: not a WorkerApp
        if intake is None:
            await super()._drain_messages(fetcher)
            return
        consumer_should_stop = self._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                while not intake.space.is_set() and not self.should_stop:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(intake.space.wait(), 1.0)
                if not self.flow_active:  # a rebalance or a stop: wait, checking for a stop
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.can_resume_flow.wait(), 1.0)
                    continue
                self.diag.set_flag(CONSUMER_FETCHING)
                try:
                    await self._fetch_once(intake)
                finally:
                    self.diag.unset_flag(CONSUMER_FETCHING)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                return
            raise

    async def _fetch_once(self, intake: Intake) -> None:
        """One fetch: ingest records to the intake, others through faust's callback."""
        app = cast(WorkerApp, self.app)
        records, active = await self._wait_next_records(1.0)
        await asyncio.sleep(0)
        if self.should_stop:
            return
        # fetched since a connection closed, from a broker that lost its state (or one that can't
        # be asked)? Then no ingest record is handed over (the worker reads them again, as any
        # hole); the table recovery's changelog records go on (it never reads one twice)
        hold = app.broker_check is not None and await app.broker_check() is not False
        if records is None:
            return
        if not self.flow_active:
            # as faust's getmany: fetched while the flow was stopped -> back to the commits
            with contextlib.suppress(Exception):
                await self.perform_seek()
            return
        generation = app.consumer_generation_id
        for tp, tp_records in records.items():
            if not self.flow_active or app.consumer_generation_id != generation:
                break
            if not tp_records or not (
                active is None or tp in active or tp in self._buffered_partitions
            ):
                continue
            app.monitor.track_tp_end_offset(tp, self.highwater(tp))
            if tp.topic == app.ingest_topic:
                if not hold:
                    await self._hand_over(intake, tp, tp_records)
            else:
                await self._deliver_each(tp, tp_records)
        await self._maybe_commit()

    async def _hand_over(self, intake: Intake, tp: TP, records: list[Any]) -> None:
        read_offset = self._read_offset[tp]
        acks_enabled = self.app.topics.acks_enabled_for(tp.topic)
        messages: list[Any] = []
        sizes: list[int] = []
        to_message = self._to_message
        for record in records:
            offset = record.offset
            if read_offset is not None and offset < read_offset:
                continue  # faust drops what is below its read offset (re-read after a seek)
            if read_offset and offset - read_offset > 1 and acks_enabled:
                await self._add_gap(tp, read_offset + 1, offset)
            messages.append(to_message(tp, record))
            sizes.append(ingest_event_count(record.value, record.headers) if record.headers else 1)
            read_offset = offset
        if messages and self.flow_active:
            track = self.track_message
            for message in messages:
                track(message)
            intake.put(messages, sizes)
            self._read_offset[tp] = read_offset

    async def _deliver_each(self, tp: TP, records: list[Any]) -> None:
        callback = self.callback
        for record in records:
            offset = record.offset
            read_offset = self._read_offset[tp]
            if read_offset is None or offset >= read_offset:
                if offset - (read_offset or 0) > 1 and read_offset:
                    if self.app.topics.acks_enabled_for(tp.topic):
                        await self._add_gap(tp, read_offset + 1, offset)
                await self._maybe_commit()
                await self.wait_first(callback(self._to_message(tp, record)),
                                      self.suspend_flow.wait())
                self._read_offset[tp] = offset

    async def _seek(self, partition: TP, offset: int) -> None:
        """Seek on the thread that owns the aiokafka consumer, never from the event loop.

        Faust's own ``_seek`` calls aiokafka's ``seek`` from the event loop
        while the consumer thread may be inside a fetch: aiokafka's fetcher
        then deletes the partition's fetched records (``Fetcher._records``)
        under ``fetched_records``, which deletes them too and raises
        ``KeyError``: faust's Fetcher crashed and the worker fetched nothing
        more. Run through the thread's method queue (as faust's own
        ``seek_wait``), a seek happens between two steps of a fetch there,
        never inside one. A partition no longer assigned (revoked meanwhile)
        has nothing to re-read here: its next owner reads it from the
        committed offset. Nor is one sought during a rebalance (the flow
        stopped): the rebalance waits for the worker's batch, whose seek would
        wait for the thread the rebalance holds; faust seeks every partition
        to its committed offset after it, and the worker seeks again if it
        still has to.
        """
        if not self.flow_active:  # a rebalance: its thread is busy, and it seeks to the commits
            log.info("not seeking %s to offset %d during a rebalance", partition, offset)
            return
        thread = self._thread

        async def seek() -> bool:  # on the thread's loop, between the awaits of a fetch
            try:
                thread.seek(partition, offset)
            except IllegalStateError:
                return False
            return True

        try:
            sought = await asyncio.wait_for(thread.call_thread(seek), SEEK_TIMEOUT_S)
        except TimeoutError:
            log.warning("cannot seek %s to offset %d: the consumer thread is busy for %.0f s",
                        partition, offset, SEEK_TIMEOUT_S)
            return
        if not sought:
            log.info("not seeking %s to offset %d: no longer assigned", partition, offset)
            return
        committed = self._committed_offset.get(partition)
        if committed is not None and offset < committed:
            # Sought below the offset committed: that commit is not of the records there now
            # (the broker lost its state, :meth:`PartitionTracker.check_life`). Faust would
            # track no ack below it, so commit nothing for them: start its accounting again.
            for accounting in (self._acked, self._acked_index, self._gap, self._committed_offset):
                accounting.pop(partition, None)

    async def _maybe_commit(self) -> None:
        if self._commit_every is not None and self._n_acked >= self._commit_every:
            self._n_acked = 0
            await self.commit()


class IngestConsumerThread(faust_kafka.AIOKafkaConsumerThread):
    """Faust's consumer thread, counting its aiokafka client's closed connections, its fetches
    held by the broker as the bus's own consumer's are (:func:`~runwire.bus.kafka.hold.hold_fetches`)."""

    def _create_consumer(self, loop: asyncio.AbstractEventLoop) -> Any:
        consumer = super()._create_consumer(loop)
        consumer._fetch_max_wait_ms = BACKLOG_FETCH_WAIT_MS  # faust passes 1,500; read at start()
        client, owner = consumer._client, cast(IngestConsumer, self.consumer)
        closed = client._on_connection_closed

        def on_closed(conn: Any, reason: Any) -> None:  # on the thread: an int's increment
            owner.breaks += 1
            closed(conn, reason)

        client._on_connection_closed = on_closed  # before any connection is made (each takes it)
        return consumer

    async def on_start(self) -> None:
        await super().on_start()
        hold_fetches(self._ensure_consumer())

    async def on_thread_stop(self) -> None:
        """Stop the consumer, even when the broker is gone.

        aiokafka's fetcher, closed while a fetch waits out its retry backoff, raises the
        ``CancelledError`` of its own cancelled task out of ``stop``; out of the thread's
        stop it killed the thread before it said it had stopped, and the worker, SIGTERMed,
        waited for it for ever.
        """
        try:
            await super().on_thread_stop()
        except (asyncio.CancelledError, KafkaError, OSError) as exc:
            log.warning("faust's consumer stopped with an error (%r); going on", exc)

    async def _gather_remaining_tasks(self) -> None:
        """mode's last sweep of the thread's loop (it cancels what is left), then every
        connection of the consumer's client closed on that loop, which closes next: a task
        that asked the broker something after the consumer stopped (a metadata refresh, a
        coordinator request) can have opened one again, and one left open is collected later
        with "unclosed transport" and "loop is closed" (aiokafka issues #715, #1019)."""
        await super()._gather_remaining_tasks()
        client = getattr(self._consumer, "_client", None)
        for conn in list(getattr(client, "_conns", {}).values()):
            conn.close(reason=CloseReason.SHUTDOWN)
        for _ in range(2):  # the transports' close and the reader tasks' cancellation, on this loop
            await asyncio.sleep(0)


class IngestTransport(faust_kafka.Transport):
    Consumer = IngestConsumer


class WorkerApp(faust.App):
    """The faust app, with its consumer handing ingest batches to :attr:`intake`."""

    intake: Intake | None = None
    ingest_topic: str = ""
    broker_check: Callable[[], Awaitable[bool | None]] | None = None
    """Asked after each fetch, before its records are handed over: whether the broker lost its
    state since a connection closed (then they are dropped), None while that can't be told
    (dropped too); False (the common case, no request) hands them over."""

    def _new_transport(self) -> Any:
        return IngestTransport(self.conf.broker_consumer, self)

