"""The write pipeline every worker runtime drives: processed outputs → replay log → views → acks.

A runtime (the consumer-group loop, the faust app) hands it what it processed — each stream's
output, unsealed, and the entries to ack after them — and asks it to write. Three things
overlap: processing the next batches (the runtime's task), the replay-log part of one write
(the log's thread), and the delivery appends and acks of the write before it. A write starts
once the previous one's log part is done; until then further batches are merged into it (one
replay-log transaction and one delivery append per stream for all of them). A write that is
full (or flushed) before then is sealed, encoded and queued behind that log part, so the log's
thread goes on to it at once. Each write's views go out after its own log part and after the
previous write's views, so streams stay in order; each entry is acked after its writes. At most
two writes are in flight.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Generic, TypeVar

from .processor import Processor, StreamOutput
from .stages import EncodedWrite, Stages

log = logging.getLogger("runwire.worker")

A = TypeVar("A")
"""What the runtime acks: a bus's deliveries, faust's messages."""


class _Write:
    """A write in flight: its task, whether its replay-log part is done (and went through),
    the streams it writes."""

    __slots__ = ("logged", "logged_ok", "runs", "task")

    def __init__(self, runs: frozenset[str]) -> None:
        self.runs = runs
        self.logged = asyncio.Event()
        self.logged_ok = False
        self.task: asyncio.Task[None] | None = None


class WritePipeline(Generic[A]):
    """See the module docstring. ``ack`` acks a write's entries once it is durable."""

    def __init__(self, stages: Stages, ack: Callable[[list[A]], Awaitable[None]]) -> None:
        self.stages = stages
        self._ack = ack
        self._writes: list[_Write] = []
        """Writes in flight, oldest first (at most two: one in its views, one in its log)."""
        self.pending: dict[str, StreamOutput] = {}
        """Processed batches waiting for the next write (each stream's events in one output, unsealed)."""
        self.pending_acks: list[A] = []
        self.pending_entries = 0
        """Ingest entries processed into :attr:`pending` (the runtime's bound on a write's size)."""
        self._starting = asyncio.Lock()
        """One write started at a time: the faust app prepares partitions concurrently, and each
        may flush (:meth:`drain_for`) while another is starting a write."""

    def add(self, acks: Iterable[A], entries: int) -> None:
        """Entries processed into :attr:`pending` (by ``Stages.prepare(into=...)``), to ack after
        the write that takes them."""
        self.pending_acks.extend(acks)
        self.pending_entries += entries

    def merge(self, outputs: dict[str, StreamOutput]) -> None:
        """Outputs processed apart (a tick's, a partition's) into :attr:`pending`: a stream's later
        events follow its earlier ones, and its newest checkpoint wins."""
        pending = self.pending
        for run_id, output in outputs.items():
            earlier = pending.get(run_id)
            if earlier is None:
                pending[run_id] = output
            else:
                earlier.raw.extend(output.raw)
                earlier.shaped.extend(output.shaped)
                earlier.state, earlier.stream = output.state, output.stream

    def ready(self) -> bool:
        """Whether a new write may start: none in flight, or one whose log part is done."""
        for write in [w for w in self._writes if w.task is not None and w.task.done()]:
            self._writes.remove(write)
            write.task.result()  # type: ignore[union-attr]  # a failed write fails the runtime
        return not self._writes or (len(self._writes) < 2 and self._writes[-1].logged.is_set())

    def idle(self) -> bool:
        """Whether no write is in flight (the one before has its views written and acked too)."""
        self.ready()  # (drops what is done; a failed write fails the runtime)
        return not self._writes

    @property
    def has_pending(self) -> bool:
        """Whether anything processed waits for a write."""
        return bool(self.pending or self.pending_acks)

    async def until_logged(self) -> None:
        """Until the newest write in flight has its replay-log part done (at once: none in flight)."""
        if self._writes:
            await self._writes[-1].logged.wait()

    def writing(self, run_ids: set[str]) -> bool:
        """Whether any of ``run_ids`` is pending or in a write in flight."""
        return not run_ids.isdisjoint(self.pending) or any(
            not write.runs.isdisjoint(run_ids) for write in self._writes)

    async def write_pending(self) -> None:
        """Start writing (then acking) everything pending (see the module docstring)."""
        async with self._starting:
            await self._write_pending()

    async def _write_pending(self) -> None:
        if not self.pending and not self.pending_acks:
            return
        encoded = None
        if not self.ready():
            encoded = self.stages.encode(self.pending)  # (overlaps the write before's log part)
            while len(self._writes) >= 2:
                assert self._writes[0].task is not None
                await asyncio.wait([self._writes[0].task])
                self.ready()  # (drops what is done; a failed write fails the runtime)
        outputs, acks = Processor.seal(self.pending), self.pending_acks
        self.pending, self.pending_acks, self.pending_entries = {}, [], 0
        previous = self._writes[-1] if self._writes else None
        write = _Write(frozenset(outputs))
        write.task = asyncio.create_task(self._write_and_ack(outputs, encoded, acks, previous, write))
        self._writes.append(write)

    async def flush(self) -> None:
        """Write and ack everything processed so far, and wait for it."""
        await self.write_pending()
        await self.drain()

    async def drain(self) -> None:
        """Wait for every write in flight (and its acks). A write leaves the list once done, so
        drains running at once (partitions prepared concurrently) each wait for all of them."""
        while self._writes:
            write = self._writes[0]
            assert write.task is not None
            await write.task
            if self._writes and self._writes[0] is write:
                self._writes.pop(0)

    async def drain_for(self, run_ids: set[str]) -> None:
        """Before loading checkpoints: write what is pending or in flight for any of them first.

        A stream this process does not hold but is writing (it ended in a batch not yet durable
        and was dropped from memory, or a rebalance made the runtime forget it) must be read
        back only after that write; any other stream's stored checkpoint is final.
        """
        if not run_ids.isdisjoint(self.pending):
            await self.flush()
        elif any(not write.runs.isdisjoint(run_ids) for write in self._writes):
            await self.drain()

    async def abandon(self) -> None:
        """The runtime failed: write nothing more, so no checkpoint covers a write that failed.

        Writes in flight are cancelled (each is idempotent and acks only after it is complete);
        what was processed but not written is dropped. All of it stays pending on the bus and is
        redone — by the runtime's successor, from the stored checkpoints — exactly as after a crash.
        """
        writes, self._writes = self._writes, []
        for write in writes:
            if write.task is not None:
                write.task.cancel()
        for write in writes:
            if write.task is not None:
                try:
                    await write.task
                except BaseException as error:
                    log.debug("write abandoned with %r", error)
        self.pending, self.pending_acks, self.pending_entries = {}, [], 0
        self.stages.processor.forget_all()

    async def _write_and_ack(
        self,
        outputs: dict[str, StreamOutput],
        encoded: EncodedWrite | None,
        acks: list[A],
        previous: _Write | None,
        write: _Write,
    ) -> None:
        """Replay log (after the write before's), views (after the write before's), acks."""
        try:
            if previous is not None and not previous.logged.is_set():
                await previous.logged.wait()
            if previous is not None and not previous.logged_ok:  # it failed: so does this one
                assert previous.task is not None
                await previous.task
            if encoded is None:
                encoded = self.stages.encode(outputs)
            await self.stages.write_log(encoded)
            write.logged_ok = True
        finally:
            write.logged.set()
        # a write queued behind this one's log part starts that part before these views run
        await asyncio.sleep(0)
        if previous is not None:  # views in write order (a failed write fails this one too)
            assert previous.task is not None
            await previous.task
        await self.stages.write_views(encoded)
        await self._ack(acks)
        self.stages.busy_until_now()
