"""Span export's CPU per event beside the worker's: what exporting a run's spans costs the worker.

In the same run, on the in-process bus (``memory://``, where a worker's own CPU per event is
lowest, so the ratio is the strictest) and the embedded SQLite replay log, the same published
workload goes through:

* ``worker`` — ``run_worker`` with no ``OTEL_*`` variable: the worker alone;
* ``worker_exporting`` — ``run_worker`` with ``OTEL_EXPORTER_OTLP_ENDPOINT`` set: the exporter
  runs beside it (its passes, its own SQLite connection) and posts to an OTLP sink in another
  process (whose CPU is not counted); its last pass is included;
* ``export_alone`` — the exporter by itself fed exactly what the baseline worker wrote, one pass
  per worker write (more passes than a live exporter makes: an upper bound of its work). Each
  stream is handed over as the worker hands it over: right after encoding it, so its events are
  in the CPU's cache as they are in the worker (that encode is the worker's: not counted).

In the ``worker_exporting`` round the exporter's own CPU is also metered where it runs
(``Meter``: thread time in its making, in ``stage`` and ``offer`` as the worker calls them, in
each turn of its deferred fold and of its task, and in its replay-log connection's thread):
``export_in_worker_cpu_us_per_event``, and ``export_in_worker_share``, that over the rest of
the same round's CPU (the worker's own). Both halves come from one round, so this share does
not move with the machine between rounds as the difference of two rounds does.

Figures: ``*_cpu_us_per_event`` (this process's CPU, every thread, per published event; the
median of the rounds) and ``export_cpu_us_per_event`` = ``worker_exporting`` − ``worker`` (the
mean of the rounds' own differences, the order of the two alternating round by round, and its
standard error ``export_cpu_se_us_per_event``: on a shared machine it resolves ~0.2 µs in 40
rounds, not the 5 % of a few rounds; ``export_in_worker`` does), then both export figures as a
share of the worker's (``export_share``, ``export_alone_share``; the target is ≤ 0.05); spans
sent per round. The workload is frozen out of the cyclic collector's passes (as ``runwire
worker`` freezes what it starts with) and each part begins with a collection, so no part pays
for a full pass over the bench's own objects or for the allocations of the part before it.
Every figure is per *published* event (the log holds more: a sub-run's events are in its own
stream and, fanned in, in its root's), and the process runs with ``runwire worker``'s GC
settings (``workers/process.py``). ``--deltas`` text deltas per model step: the
default 16 is a dense tool-calling agent (a model step and a tool call every 20 events, a span per
10 events, as dense in spans as ``bench/workers.py``'s workload); a model streaming a 100-token
answer a token at a time is ``--deltas 100``. A quarter-size round first warms up (imports,
first connections: one-time costs, not per event). The workload: ``--runs`` root runs, each with
two sub-runs; each cycle of a run are ``--deltas`` text deltas, a usage report, a model step, a
tool call's start and end (a ``chat`` and an ``execute_tool`` span each time), and every run ends.

``--instructions`` counts instructions instead, under callgrind (``bench/callgrind.py``: steady
to ±0.3 % where CPU time moves ±30 % on a shared machine): the worker alone and the exporter
alone, each in its own process, per published event, and their ratio (use ``--events 20000``:
a part under callgrind runs ~50 times slower). With ``--parts`` it counts instead the fold
(``SpanTree.apply_many`` over the root streams the worker wrote, as a pass gets them) and the
OTLP writer (``encode_request`` of the spans, 1,000 a request) alone: no log, no HTTP, no pass,
so the count does not move with how the worker happened to batch its writes (the exporter's
whole count moves ±4 % between runs of the same code for that reason). Without ``--parts`` it also counts
the worker with the exporter beside it (``live``: its passes' interval and hold scaled by
callgrind's ~50× slow-down, so they are as rare beside the work as at full speed), and
``live_export_ir_share`` is that less the worker alone, over the worker alone.

``--steady K`` runs instead one long-lived worker exporting, as ``runwire worker`` runs: K
generations of ``--events`` over ``--runs`` new root runs each, one after another (and one
before them not counted), all at once (the worker at full speed) or, with ``--rate R``, R
events a second in tenth-of-a-second chunks (a worker that is not busy: smaller writes, more
passes and calls for fewer events). The exporter's start and stop (its making, its HTTP pool,
its log connection) fall outside the counted window and are reported apart, once a process
(``steady_export_start_ms``, ``steady_export_stop_ms``). The window ends when the log holds
every root run finished for the worker's part, and when each run's export cursor is at its last
event for the exporter's: the passes the counted events need are in it, the worker's idle time
while they run is not. The worker's idle CPU (its ticks: ``steady_worker_idle_ms_per_s``,
measured for a second before the window with nothing to do) is taken out of the worker's, and
so is the bench's own (publishing, polling the log), so ``steady_export_share`` is over the
worker's CPU for the events alone: the strict reading.

``python bench/spans.py [--events N] [--runs R] [--deltas D] [--repeat K] [--json] [--instructions [--parts]]``
``python bench/spans.py --steady K [--rate R] [--events N] [--runs R] [--repeat K] [--json]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import inspect
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
import callgrind
from cputime import import_code

import_code()

from prometheus_client import CollectorRegistry  # noqa: E402

from runwire.bus import Bus, open_bus  # noqa: E402 - the tree import_code() names
from runwire.core.envelope import Event, RunLifecycle, format_ts, make  # noqa: E402
from runwire.core.lines import encode_lines  # noqa: E402
from runwire.jobs import otlp  # noqa: E402
from runwire.jobs.export import SpanExporter  # noqa: E402
from runwire.jobs.otlp import OtlpSettings, encode_request  # noqa: E402
from runwire.jobs.spans import SpanTree  # noqa: E402
from runwire.store import open_store  # noqa: E402
from runwire.workers import runtime  # noqa: E402
from runwire.workers.process import tune_gc  # noqa: E402
from runwire.workers.runtime import run_worker  # noqa: E402

TEXT = "x" * 40
STEP = ["x.usage", "step.boundary", "tool.start", "tool.end"]
SINK = """
import asyncio, sys
async def serve(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\\r\\n\\r\\n")
            length = next((int(l.split(b":")[1]) for l in head.split(b"\\r\\n") if l.lower().startswith(b"content-length")), 0)
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\\r\\ncontent-type: application/x-protobuf\\r\\ncontent-length: 0\\r\\n\\r\\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


def workload(count: int, runs: int, deltas: int = 16, prefix: str = "") -> list[Event]:
    """``count`` events over ``runs`` root runs (two sub-runs each), interleaved, then every end
    (``prefix`` on every run and event id: a generation of runs of ``--steady``)."""
    out: list[Event] = []
    seqs: dict[str, int] = {}
    started = time.time()
    cycle = ["text.delta"] * deltas + STEP
    members = [(f"{prefix}s{r}", None) for r in range(runs)]
    members += [(f"{prefix}s{r}.c{c}", f"{prefix}s{r}") for r in range(runs) for c in (1, 2)]

    def emit(run_id: str, parent: str | None, kind: str, payload: dict[str, Any]) -> None:
        seq = seqs[run_id] = seqs.get(run_id, 0) + 1
        links = {} if parent is None else {"parent_id": parent, "root_id": parent}
        ts = format_ts(_at(started + len(out) / 50_000))
        out.append(make(kind, payload, id=f"evt_{prefix}{len(out):020d}", ts=ts, run_id=run_id, seq=seq, **links))

    for run_id, parent in members:
        if parent is not None:
            emit(parent, None, "child.spawn", {"child_id": run_id})
    index = 0
    while len(out) < count:
        run_id, parent = members[index % len(members)]
        n = seqs.get(run_id, 0)
        emit(run_id, parent, cycle[n % len(cycle)], _payload(cycle[n % len(cycle)], run_id, n // len(cycle)))
        index += 1
    for run_id, parent in reversed(members):
        emit(run_id, parent, "run.lifecycle", {"state": "done"})
    return out


def _at(seconds: float):  # type: ignore[no-untyped-def]
    from datetime import UTC, datetime

    return datetime.fromtimestamp(seconds, UTC)


def _payload(kind: str, run_id: str, step: int) -> dict[str, Any]:
    if kind == "text.delta":
        return {"text": TEXT}
    if kind == "x.usage":
        return {"input_tokens": 120, "output_tokens": 40, "model": "bench-model"}
    if kind == "step.boundary":
        return {"step_index": step, "step_kind": "tool-roundtrip"}
    if kind == "tool.start":
        return {"call_id": f"{run_id}-{step}", "tool": "browser", "input": {"q": TEXT}}
    return {"call_id": f"{run_id}-{step}", "ok": step % 7 != 0, "output": TEXT}


async def publish(bus: Bus, events: list[Event]) -> None:
    for start in range(0, len(events), 2000):
        await bus.publish(events[start : start + 2000])


async def worker_round(events: list[Event], store_url: str, endpoint: str | None,
                       written: list[Any] | None = None, counted: bool = False,
                       meter: Meter | None = None) -> dict[str, float]:
    """One worker over the workload; with ``endpoint``, exporting to it (its own CPU metered by
    ``meter``, if given); ``counted``: between callgrind's ready and done (``--instructions``)."""
    if endpoint:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    else:
        os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    registry = CollectorRegistry()
    async with open_bus("memory://?max_backlog=10000000") as bus, open_store(store_url) as store:
        await publish(bus, events)
        if written is not None:  # the baseline records what it wrote, for export_alone
            original = store.append_streams

            async def recording(streams: Any) -> int:
                written.append(list(streams))
                return await original(streams)

            store.append_streams = recording  # type: ignore[method-assign]
        gc.collect()  # each part starts with the collector's counts at zero (see main)
        if counted:
            callgrind.ready()
        with meter.installed() if meter is not None else contextlib.nullcontext():
            began = time.process_time()
            stats = await run_worker(bus, store, group=f"g{uuid.uuid4().hex[:6]}", name="w1", burst=True,
                                     batch=2048, metrics=registry)
            cpu = time.process_time() - began
        if counted:
            callgrind.done(str(len(events)))
    assert stats.entries >= len(events), stats
    sent = registry.get_sample_value("runwire_otel_spans_exported_total") or 0.0
    return {"cpu_us_per_event": cpu / len(events) * 1e6, "spans": sent}


class Meter:
    """The exporter's own CPU inside a live worker (``export_in_worker``): thread time in its
    making and in each of its entry points — ``stage`` and ``offer`` as the worker calls them,
    each turn of the loop its deferred fold and its task run for (not the time it waits, when
    other work runs), and each call made in its replay-log connection's thread, its opening
    included. The clock's own cost inside a window (measured at start) is taken out per window."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.windows = 0
        probe, t = [], time.thread_time
        for _ in range(2000):
            began = t()
            probe.append(t() - began)
        self.overhead = statistics.median(probe)

    def cpu(self) -> float:
        return self.seconds - self.windows * self.overhead

    def sync(self, fn: Any) -> Any:
        def metered(*args: Any, **kwargs: Any) -> Any:
            began = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.thread_time() - began
                self.windows += 1
        return metered

    def task(self, fn: Any) -> Any:
        meter = self

        class Turns:  # each resumption of the coroutine timed; the waits between not
            def __init__(self, coro: Any) -> None:
                self.coro = coro

            def __await__(self) -> Any:
                step, value, error = self.coro.__await__(), None, None
                while True:
                    began = time.thread_time()
                    try:
                        out = step.throw(error) if error is not None else step.send(value)
                    except StopIteration as stop:
                        return stop.value
                    finally:
                        meter.seconds += time.thread_time() - began
                        meter.windows += 1
                    try:
                        value, error = (yield out), None
                    except BaseException as raised:
                        value, error = None, raised

        async def metered(*args: Any) -> Any:
            return await Turns(fn(*args))
        return metered

    @contextlib.contextmanager
    def installed(self) -> Any:
        """Meter the exporter ``run_worker`` makes for the block, and its log connection's thread."""
        made, exporters = runtime.exporter_from_env, []
        from runwire.store.sqlite.log import SQLiteLog

        calling = SQLiteLog._call

        def exporter_from_env(*args: Any, **kwargs: Any) -> Any:
            exporter = self.sync(made)(*args, **kwargs)  # its making is its own CPU too
            if exporter is not None:
                exporters.append((exporter, exporter.store))  # the worker's store: run opens its own
                for name in ("stage", "offer", "_fold_offered"):
                    setattr(exporter, name, self.sync(getattr(exporter, name)))
                exporter.run = self.task(exporter.run)
            return exporter

        async def call(store: Any, fn: Any, *args: Any) -> Any:
            own = bool(exporters) and all(store is not worker for _, worker in exporters)  # (opening, too)
            return await calling(store, self.sync(fn) if own else fn, *args)

        runtime.exporter_from_env = exporter_from_env  # type: ignore[assignment]
        SQLiteLog._call = call  # type: ignore[method-assign]
        try:
            yield
        finally:
            runtime.exporter_from_env = made  # type: ignore[assignment]
            SQLiteLog._call = calling  # type: ignore[method-assign]


@contextlib.asynccontextmanager
async def connected(exporter: Any) -> Any:
    """The exporter's HTTP pool open (a tree before ``connected()`` opened it as ``_http()``)."""
    if hasattr(exporter, "connected"):
        async with exporter.connected():
            yield
    else:
        async with exporter._http() as exporter._client:
            yield


async def export_alone(written: list[Any], store_url: str, endpoint: str, published: int,
                       counted: bool = False) -> dict[str, float]:
    """The exporter fed the baseline worker's writes, a pass after each (its log already holds
    them); per ``published`` event, as the worker's figures (the writes hold more: a sub-run's
    events are in its own stream and, fanned in, in its root's). Each stream is encoded again
    just before it is staged, as the worker's ``Stages.encode`` does, so the fold finds the
    events where it finds them in the worker (in the cache, not long evicted); that encode's CPU
    is the worker's and is taken out of the figure."""
    settings = OtlpSettings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    assert settings is not None
    async with open_store(store_url) as store:
        exporter = SpanExporter(store, settings, holder=f"alone-{uuid.uuid4().hex[:6]}")
        async with connected(exporter):
            stage = getattr(exporter, "stage", None)  # (a tree before the hand-over as encoded has none)
            gc.collect()
            if counted:
                callgrind.ready()
            began = time.process_time()
            sent = 0
            worker = 0.0  # the worker's own encode, replayed (not the exporter's CPU)
            tokens = "taken" in inspect.signature(exporter.offer).parameters  # (a tree before stage's tokens: no)
            for streams in written:
                declined, taken = [], []  # what the worker hands over after the log write
                for stream in streams:
                    if stage is not None:  # as encoded, then logged
                        if not counted:  # (instructions do not see the cache)
                            encoding = time.process_time()
                            encode_lines(stream[1])
                            worker += time.process_time() - encoding
                        token = stage(stream[0], stream[1])
                        if token is None or not tokens:
                            declined.append(stream)
                        else:
                            taken.append(token)
                if tokens:
                    exporter.offer(declined, taken)
                else:
                    exporter.offer(declined if stage is not None else streams)
                sent += await exporter.pass_once()
            cpu = time.process_time() - began - worker
            if counted:
                callgrind.done(str(published))
    return {"cpu_us_per_event": cpu / published * 1e6, "spans": float(sent)}


async def one_round(events: list[Event], tmp: Path, endpoint: str, exporting_first: bool = False) -> dict[str, float]:
    """The worker alone and the worker exporting back to back, in the order asked (rounds
    alternate it: see ``main``); then a third worker, recording its writes, and the exporter
    alone fed them. (With the recording worker first and its writes — ~60,000 events and their
    lines — held through the exporting one, that one's allocations landed on fresh pages,
    ~4,500 more page faults, and it read 10–26 % slower than the worker alone.)"""
    meter = Meter()
    pair: dict[bool, dict[str, float]] = {}
    for exporting_now in (True, False) if exporting_first else (False, True):
        pair[exporting_now] = await worker_round(events, f"sqlite:///{tmp}/{uuid.uuid4().hex[:8]}.db",
                                                 endpoint if exporting_now else None,
                                                 meter=meter if exporting_now else None)
    base, exporting = pair[False], pair[True]
    written: list[Any] = []
    base_db = f"sqlite:///{tmp}/{uuid.uuid4().hex[:8]}.db"
    await worker_round(events, base_db, None, written)
    alone = await export_alone(written, base_db, endpoint, len(events))
    written.clear()
    export = exporting["cpu_us_per_event"] - base["cpu_us_per_event"]
    inside = meter.cpu() / len(events) * 1e6
    return {
        "export_in_worker_cpu_us_per_event": inside,
        "export_in_worker_share": inside / (exporting["cpu_us_per_event"] - inside),
        "worker_cpu_us_per_event": base["cpu_us_per_event"],
        "worker_exporting_cpu_us_per_event": exporting["cpu_us_per_event"],
        "export_cpu_us_per_event": export,
        "export_alone_cpu_us_per_event": alone["cpu_us_per_event"],
        "export_alone_share": alone["cpu_us_per_event"] / base["cpu_us_per_event"],
        "spans_sent_exporting": exporting["spans"],
        "spans_sent_alone": alone["spans"],
    }


async def steady(generations: list[list[Event]], tmp: Path, endpoint: str, rate: float | None) -> dict[str, float]:
    """``--steady``: one long-lived worker exporting, as ``runwire worker`` runs, through
    generations of runs one after another (each generation's runs begin and end; its run ids are
    new). The first generation warms it up and is not counted; the exporter's start (its making,
    its HTTP pool, its log connection) and its stop fall outside the counted window and are
    reported apart, once a process. ``rate``: published at that many events a second, in chunks
    of a tenth of a second (a worker that is not busy: smaller writes, more passes for fewer
    events); else all at once (the worker at full speed). The worker's part of the window ends
    when the log holds every root run finished, less its idle ticks (measured for a second
    before) and the bench's own thread time (publishing, sleeping, asking the log whether it is
    done); the exporter's when each run's export cursor is at its last event: the passes the
    counted events need are in it."""
    import sqlite3

    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    path = tmp / f"{uuid.uuid4().hex[:8]}.db"
    meter, registry, stop = Meter(), CollectorRegistry(), asyncio.Event()
    own = 0.0  # the bench's thread time inside the window
    roots = 0

    async def feed(events: list[Event]) -> None:
        nonlocal own, roots
        roots += sum(1 for event in events if event.parent_id is None and isinstance(event, RunLifecycle))
        chunk = 2000 if rate is None else max(1, int(rate / 10))
        began_at = time.monotonic()
        for start in range(0, len(events), chunk):
            began = time.thread_time()
            await bus.publish(events[start:start + chunk])  # (never waits: the backlog is not bounded here)
            own += time.thread_time() - began
            if rate is not None:  # on a schedule: the rate asked, whatever each chunk took
                await asyncio.sleep(max(0.0, began_at + (start + chunk) / rate - time.monotonic()))

    async def until(done: str) -> None:
        """Until the log says ``done`` of every root run published (polled; its CPU the bench's)."""
        nonlocal own
        while True:
            began = time.thread_time()
            with contextlib.closing(sqlite3.connect(path, timeout=5)) as db:
                count = db.execute(done).fetchone()[0]
            own += time.thread_time() - began
            if count >= roots:
                return
            await asyncio.sleep(0.02)

    finished = "SELECT count(*) FROM runs WHERE parent_id IS NULL AND terminal = 1"
    exported = ("SELECT count(*) FROM runs r JOIN span_exports x ON x.root_id = r.run_id"
                " WHERE r.parent_id IS NULL AND r.terminal = 1 AND x.seq = r.last_seq")
    async with open_bus("memory://?max_backlog=100000000") as bus, open_store(f"sqlite:///{path}") as store:
        gc.collect()
        with meter.installed():
            worker = asyncio.create_task(run_worker(bus, store, group="g", name="w1", stop=stop, batch=2048,
                                                    metrics=registry))
            await asyncio.sleep(0.2)  # the exporter made and started: its start is metered by now
            start = meter.cpu()
            await feed(generations[0])
            await until(exported)
            gc.collect()
            began, meter_began, wall = time.process_time(), meter.cpu(), time.monotonic()
            await asyncio.sleep(1.0)  # the worker idle: its ticks, taken out of the window below
            idle = (time.process_time() - began - (meter.cpu() - meter_began)) / (time.monotonic() - wall)
            start_meter, own = meter.cpu(), 0.0
            began, wall = time.process_time(), time.monotonic()
            for events in generations[1:]:
                await feed(events)
            await until(finished)  # the worker's part ends here: what follows is the exporter's last pass
            worker_s = time.process_time() - began - own - (meter.cpu() - start_meter) - idle * (time.monotonic() - wall)
            await until(exported)
            inside = meter.cpu() - start_meter
            stop.set()
            await worker
        stopping = meter.cpu() - start_meter - inside
    counted = sum(len(events) for events in generations[1:])
    exporter = inside / counted * 1e6
    worker_cpu = worker_s / counted * 1e6
    return {"steady_worker_idle_ms_per_s": idle * 1e3, "steady_worker_cpu_us_per_event": worker_cpu,
            "steady_export_cpu_us_per_event": exporter, "steady_export_share": exporter / worker_cpu,
            "steady_export_start_ms": start * 1e3,
            "steady_export_stop_ms": stopping * 1e3,
            "steady_spans_sent": registry.get_sample_value("runwire_otel_spans_exported_total") or 0.0}


def root_streams(written: list[Any]) -> list[tuple[str, list[Event]]]:
    """The root runs' streams of each write, in order (what the exporter folds)."""
    roots: dict[str, bool] = {}
    out: list[tuple[str, list[Event]]] = []
    for streams in written:
        for stream in streams:
            run_id, events = stream[0], stream[1]
            if run_id not in roots and events:
                own = next((event for event in events if event.child_id is None), None)
                roots[run_id] = own is None or own.parent_id is None
            if events and roots[run_id]:
                out.append((run_id, events))
    return out


def fold(streams: list[tuple[str, list[Event]]]) -> list[Any]:
    """The exporter's fold (the compiled one where built and not ``RUNWIRE_PURE=1``; a tree
    from before ``span_fold`` existed: ``SpanTree``)."""
    make = getattr(otlp, "span_fold", None) or (lambda root, content: SpanTree(root, keep=False))
    trees: dict[str, Any] = {}
    ended: list[Any] = []
    for run_id, events in streams:
        tree = trees.get(run_id)
        if tree is None:
            tree = trees[run_id] = make(run_id, False)
        ended += tree.apply_many(events, 0)
    return ended


def write(spans: list[Any]) -> None:
    for start in range(0, len(spans), 1000):
        encode_request(spans[start:start + 1000], {"service.name": "bench"}, "0")


async def counted_part(part: str, events: list[Event], endpoint: str) -> None:
    """``--instructions``' child: one part counted under callgrind (a warm-up round first)."""
    tmp = Path(tempfile.mkdtemp(prefix="runwire-bench-spans-"))
    if part in ("fold", "write"):
        stored: list[Any] = []
        await worker_round(events, f"sqlite:///{tmp}/parts.db", None, stored)
        streams = root_streams(stored)
        spans = fold(streams)
        write(spans)  # warm: the writer's tables
        tune_gc()
        callgrind.ready()
        if part == "fold":
            fold(streams)
        else:
            write(spans)
        callgrind.done(str(len(events)))
        return
    if part == "live":  # the worker exporting, its passes as rare beside its work as at full speed
        slow_down = 50.0  # callgrind runs Python ~50 times slower
        made = runtime.exporter_from_env

        def scaled(*args: Any, **kwargs: Any) -> SpanExporter | None:
            exporter = made(*args, **kwargs)
            if exporter is not None:
                exporter.interval_s *= slow_down
                exporter.hold_s *= slow_down
                if hasattr(exporter.settings, "delay_s"):  # (a tree before OTEL_BSP_SCHEDULE_DELAY has none)
                    exporter.settings = msgspec.structs.replace(exporter.settings,
                                                                delay_s=exporter.settings.delay_s * slow_down)
            return exporter

        runtime.exporter_from_env = scaled  # type: ignore[assignment]
        await worker_round(events[: len(events) // 4], f"sqlite:///{tmp}/warm.db", endpoint)
        await worker_round(events, f"sqlite:///{tmp}/counted.db", endpoint, counted=True)
        return
    warm: list[Any] = []
    warm_db = f"sqlite:///{tmp}/warm.db"
    await worker_round(events[: len(events) // 4], warm_db, None, warm)
    await export_alone(warm, warm_db, endpoint, len(events) // 4)
    written: list[Any] = []
    db = f"sqlite:///{tmp}/counted.db"
    await worker_round(events, db, None, written, counted=part == "worker")
    if part == "export":
        await export_alone(written, db, endpoint, len(events), counted=True)


def count_instructions(args: argparse.Namespace) -> dict[str, float]:
    """Instructions per published event of the worker alone and of the exporter alone."""
    if not callgrind.available():
        raise SystemExit("--instructions needs valgrind (Debian: apt install valgrind)")
    out: dict[str, float] = {}
    if args.parts:
        for part in ("fold", "write"):
            total, said = callgrind.count([__file__, "--child", part, "--events", str(args.events),
                                           "--runs", str(args.runs), "--deltas", str(args.deltas)])
            out[f"{part}_ir_per_event"] = total / int(said[-1])
        return out
    for part in ("worker", "export", "live"):
        total, said = callgrind.count([__file__, "--child", part, "--events", str(args.events),
                                       "--runs", str(args.runs), "--deltas", str(args.deltas)])
        out[f"{part}_ir_per_event"] = total / int(said[-1])
    out["export_ir_share"] = out["export_ir_per_event"] / out["worker_ir_per_event"]
    out["live_export_ir_per_event"] = out["live_ir_per_event"] - out["worker_ir_per_event"]
    out["live_export_ir_share"] = out["live_export_ir_per_event"] / out["worker_ir_per_event"]
    return out


def run_steady(args: argparse.Namespace, generations: list[list[Event]]) -> dict[str, float]:
    """``--steady``'s rounds (each a long-lived worker of its own), their medians."""
    sink = subprocess.Popen([sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout is not None
        endpoint = f"http://127.0.0.1:{sink.stdout.readline().strip()}"
        tmp = Path(tempfile.mkdtemp(prefix="runwire-bench-spans-"))
        rounds = [asyncio.run(steady(generations, tmp, endpoint, args.rate)) for _ in range(args.repeat)]
    finally:
        sink.terminate()
    return {"events_counted": float(sum(len(events) for events in generations[1:])),
            **{key: statistics.median(r[key] for r in rounds) for key in rounds[0]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=60_000)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--deltas", type=int, default=16, help="text deltas per model step")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--steady", type=int, default=0, metavar="K",
                        help="one long-lived worker through K generations of --events (after one not counted)")
    parser.add_argument("--rate", type=float, help="with --steady: published at this many events a second")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions under callgrind (bench/callgrind.py) instead of CPU time")
    parser.add_argument("--parts", action="store_true",
                        help="with --instructions: the fold and the OTLP writer alone, no log, no HTTP")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # a part run under callgrind
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    tune_gc()  # as `runwire worker` runs (workers/process.py)
    if args.instructions:
        counted = count_instructions(args)
        print(json.dumps(counted, indent=2) if args.json else
              "\n".join(f"{key:40s} {value:>14,.3f}" for key, value in counted.items()))
        return
    if args.steady:
        generations = [workload(args.events, args.runs, args.deltas, prefix=f"g{n}-") for n in range(args.steady + 1)]
        gc.collect()
        gc.freeze()
        figures = run_steady(args, generations)
        print(json.dumps(figures, indent=2) if args.json else
              "\n".join(f"{key:40s} {value:>14,.3f}" for key, value in figures.items()))
        return
    events = workload(args.events, args.runs, args.deltas)
    # The workload is the bench's, not the worker's: out of the collector's passes, as `runwire
    # worker` freezes what it starts with. Left in, a full pass over its ~60,000 events cost
    # ~200 ms (3 µs an event) to whichever round it fell in — most often the exporting one,
    # which allocates more — and the live difference read 10–34 % of the worker's.
    gc.collect()
    gc.freeze()
    sink = subprocess.Popen([sys.executable, "-c", SINK], stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout is not None
        endpoint = f"http://127.0.0.1:{sink.stdout.readline().strip()}"
        if args.child:
            asyncio.run(counted_part(args.child, events, endpoint))
            return
        tmp = Path(tempfile.mkdtemp(prefix="runwire-bench-spans-"))
        asyncio.run(one_round(events[: len(events) // 4], tmp, endpoint))  # warm-up: imports, first connections
        rounds = [asyncio.run(one_round(events, tmp, endpoint, exporting_first=n % 2 == 1))
                  for n in range(args.repeat)]
    finally:
        sink.terminate()
    figures = {"events": float(len(events)),
               **{key: statistics.median(r[key] for r in rounds) for key in rounds[0]}}
    # The live difference: the mean of the rounds' own, the rounds alternating which worker runs
    # first (whichever runs second reads a few % faster or slower, the process's memory as the
    # first left it: the mean evens that out, a median of the two groups would not), with its
    # standard error. Two identical workers read −0.15 ± 0.20 µs so over 40 rounds.
    differences = [r["export_cpu_us_per_event"] for r in rounds]
    figures["export_cpu_us_per_event"] = statistics.mean(differences)
    figures["export_cpu_se_us_per_event"] = (statistics.stdev(differences) / len(differences) ** 0.5
                                             if len(differences) > 1 else float("nan"))
    figures["export_share"] = figures["export_cpu_us_per_event"] / figures["worker_cpu_us_per_event"]
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for key, value in figures.items():
            print(f"{key:40s} {value:>14,.3f}")


if __name__ == "__main__":
    main()
