"""The span exporter (runwire.jobs.export) on a real SQLite replay log and a real OTLP/HTTP
receiver that decodes each request with ``opentelemetry-proto``."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from runwire.jobs import export, otlp_post
from runwire.jobs.export import SpanExporter, exporting
from runwire.jobs.otlp import SCHEMA_URL, OtlpSettings, encode_request
from runwire.jobs.spans import Span, span_id, trace_id
from runwire.store import ReplayLog, open_store
from tests.events import event
from tests.jobs.otlp_receiver import OtlpReceiver, otlp_receiver
from tests.jobs.traced import GRANDCHILD, ROOT, traced_run
from tests.store.conftest import Clock
from tests.waiting import until


@pytest.fixture
def clock() -> Clock:
    return Clock(datetime.now(UTC))


@pytest.fixture
async def store(tmp_path: Path, clock: Clock) -> AsyncIterator[ReplayLog]:
    """A replay log whose clock (the exporters' holds) the test moves."""
    async with open_store(f"sqlite:///{tmp_path / 'replay.db'}", clock=clock) as log:
        yield log


def settings(receiver: OtlpReceiver, **env: str) -> OtlpSettings:
    found = OtlpSettings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, **env})
    assert found is not None
    return found


def attributes(span: ProtoSpan) -> dict[str, object]:
    out: dict[str, object] = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        value = getattr(kv.value, kind)
        out[kv.key] = [getattr(v, v.WhichOneof("value")) for v in value.values] if kind == "array_value" else value
    return out


async def test_a_runs_spans_reach_an_otlp_receiver_as_protobuf_with_the_standard_headers_and_resource(
    store: ReplayLog,
) -> None:
    events = traced_run()
    await store.append(events)
    async with otlp_receiver() as receiver:
        found = settings(receiver, OTEL_EXPORTER_OTLP_HEADERS="x-api-key=s%20ecret,x-team=ops",
                         OTEL_SERVICE_NAME="trips", OTEL_RESOURCE_ATTRIBUTES="deployment.environment=test")
        exporter = SpanExporter(store, found, holder="w1")
        exporter.offer([(ROOT, events, [], None)])
        async with exporter.connected():
            assert await exporter.pass_once() == 7
    assert len(receiver.requests) == 1
    headers, request = receiver.requests[0]
    assert headers["x-api-key"] == "s ecret" and headers["x-team"] == "ops"
    assert headers["content-type"] == "application/x-protobuf"
    resource = {kv.key: kv.value.string_value for kv in request.resource_spans[0].resource.attributes}
    assert resource["service.name"] == "trips" and resource["deployment.environment"] == "test"
    assert request.resource_spans[0].scope_spans[0].schema_url == SCHEMA_URL
    spans = {span.name: span for span in receiver.spans()}
    assert len(spans) == 7
    assert {span.trace_id.hex() for span in spans.values()} == {trace_id(ROOT)}
    root, grand, grep = spans["invoke_agent planner"], spans["invoke_agent"], spans["execute_tool grep"]
    assert root.parent_span_id == b"" and root.span_id.hex() == span_id(ROOT, "agent", ROOT)
    assert grep.parent_span_id == grand.span_id
    assert grep.status.code == Status.STATUS_CODE_ERROR and grep.status.message == "took too long"
    assert grand.status.code == Status.STATUS_CODE_ERROR
    assert root.status.code == Status.STATUS_CODE_UNSET
    assert (grep.end_time_unix_nano - grep.start_time_unix_nano) == 2_000_000_000
    assert attributes(grand)["runwire.run_id"] == GRANDCHILD
    chat = attributes(spans["chat gpt-test"])
    assert (chat["gen_ai.usage.input_tokens"], chat["gen_ai.usage.output_tokens"]) == (100, 20)
    assert spans["chat gpt-test"].kind == ProtoSpan.SPAN_KIND_CLIENT
    assert [e.name for e in root.events] == ["runwire.approval.requested", "runwire.approval.resolved"]
    assert attributes(root)["gen_ai.conversation.id"] == "chat-1"
    assert not any(k.startswith("gen_ai.tool.call.arguments") for s in spans.values() for k in attributes(s))


async def test_a_successor_sends_only_what_was_not_sent_and_nothing_twice(store: ReplayLog, clock: Clock) -> None:
    """The first exporter sends what ended in the first half and stops (as if killed); the next,
    another worker once the hold lapsed, folds the run from the log and sends the rest."""
    events = traced_run()
    await store.append(events)
    async with otlp_receiver() as receiver:
        first = SpanExporter(store, settings(receiver), holder="w1", hold_s=15)
        first.offer([(ROOT, events[:10], [], None)])
        async with first.connected():
            assert await first.pass_once() == 3  # the first model step, the failed call, its run
        successor = SpanExporter(store, settings(receiver), holder="w2", hold_s=15)
        successor.offer([(ROOT, events[10:], [], None)])
        async with successor.connected():
            assert await successor.pass_once() == 0  # w1's hold is live: w1's spans to send
            clock.advance(seconds=16)
            successor.offer([(ROOT, events[10:], [], None)])
            assert await successor.pass_once() == 4
            assert await successor.pass_once() == 0
    names = [span.name for span in receiver.spans()]
    assert sorted(names) == sorted(set(names)) and len(names) == 7


async def test_a_run_folded_as_it_came_is_sent_only_if_its_export_is_still_unclaimed(
    store: ReplayLog, clock: Clock,
) -> None:
    """An exporter folds a run that begins as its events are handed over, before it holds the
    run's export; its pass sends those spans only if the claim finds the cursor where it assumed
    (at the start). Another exporter that sent the run first, held or not, keeps it sent once."""
    events = traced_run()
    await store.append(events)
    async with otlp_receiver() as receiver:
        other = SpanExporter(store, settings(receiver), holder="w2", hold_s=15)
        late = SpanExporter(store, settings(receiver), holder="w1", hold_s=15)
        async with other.connected(), late.connected():
            other.offer([(ROOT, events, [], None)])
            assert await other.pass_once() == 7
            late.offer([(ROOT, events[:10], [], None)])
            assert await late.pass_once() == 0  # held by w2: its spans are w2's
            clock.advance(seconds=16)  # w2's hold lapsed; its cursor is at the end
            late.offer([(ROOT, events, [], None)])  # folded from the start again, as it comes
            assert await late.pass_once() == 0  # claimed with the cursor at the end: nothing past it
            assert ROOT not in late._trees
    names = [span.name for span in receiver.spans()]
    assert sorted(names) == sorted(set(names)) and len(names) == 7


async def test_spans_past_the_bound_kept_between_passes_are_folded_again_from_the_log(
    store: ReplayLog, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ended spans wait for the next pass (and pile up while it retries the backend): past
    ``MAX_PENDING`` a run handed over is not folded as it comes but read from the log by the
    pass, and every span still reaches the backend once."""
    monkeypatch.setattr(export, "MAX_PENDING", 10)
    runs = [traced_run(f"many{n}", child=f"many{n}.r", grandchild=f"many{n}.r.s") for n in range(3)]
    async with otlp_receiver() as receiver:
        exporter = SpanExporter(store, settings(receiver), holder="w1")
        for run in runs:
            await store.append(run)
            exporter.offer([(run[0].run_id, run[:12], [], None)])
            exporter.offer([(run[0].run_id, run[12:], [], None)])
            await until(lambda: not exporter._offered, what="the hand-over folded")
        assert len(exporter._from_log) == 2  # past the bound in the second run: its tree dropped, the third not folded
        async with exporter.connected():
            assert await exporter.pass_once() == 3 * 7
            assert await exporter.pass_once() == 0
    names = [(span.trace_id, span.span_id) for span in receiver.spans()]
    assert len(names) == len(set(names)) == 3 * 7


async def test_spans_folded_as_the_worker_encodes_wait_for_the_log_write(store: ReplayLog, clock: Clock) -> None:
    """The worker hands a stream over as it encodes it (``stage``), before its log write: the
    spans those events end are sent only once the write is in the log (``offer``, told what
    ``stage`` returned: the stream itself is not handed over again), and the cursor never passes
    them before. A stream that does not continue the tree is not taken. A worker killed between
    the two loses none: whoever writes the events next exports them, and nothing is sent twice."""
    events = traced_run()
    async with otlp_receiver() as receiver:
        first = SpanExporter(store, settings(receiver), holder="w1", hold_s=15)
        async with first.connected():
            token = first.stage(ROOT, events[:10])
            assert token is not None
            assert await first.pass_once() == 0  # not in the log yet
            await store.append(events[:10])
            first.offer([], [token])
            assert first.stage(ROOT, events[11:]) is None  # a gap: handed over after its write instead
            assert first.stage(ROOT, events[10:]) is not None  # encoded; its log write never happens (killed)
            assert await first.pass_once() == 3
            assert await first.pass_once() == 0
        assert len(receiver.spans()) == 3
        clock.advance(seconds=16)
        await store.append(events[10:])  # the next writer of the run
        successor = SpanExporter(store, settings(receiver), holder="w2", hold_s=15)
        async with successor.connected():
            successor.offer([(ROOT, events[10:], [], None)])
            assert await successor.pass_once() == 4
    names = [span.name for span in receiver.spans()]
    assert sorted(names) == sorted(set(names)) and len(names) == 7


async def test_the_proxy_the_environment_names_carries_the_posts(
    store: ReplayLog, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``HTTP_PROXY``/``HTTPS_PROXY`` and ``NO_PROXY`` are honoured, as OpenTelemetry's own
    exporters honour them (looked up once, not per request). The receiver stands in for the proxy
    here: a request through a proxy names the endpoint in its request line, which it answers."""
    for name in ("http_proxy", "https_proxy", "no_proxy", "NO_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(name, raising=False)
    events = traced_run()
    await store.append(events)
    endpoint = "http://collector.invalid:4318"  # resolves nowhere: only the proxy reaches it
    async with otlp_receiver() as receiver:
        monkeypatch.setenv("HTTP_PROXY", receiver.url)
        assert otlp_post.env_proxy(endpoint + "/v1/traces") == receiver.url
        proxied = OtlpSettings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
        assert proxied is not None
        exporter = SpanExporter(store, proxied, holder="w1")
        exporter.offer([(ROOT, events, [], None)])
        async with exporter.connected():
            assert await exporter.pass_once() == 7
    assert len(receiver.spans()) == 7
    monkeypatch.setenv("NO_PROXY", "collector.invalid")
    assert otlp_post.env_proxy(endpoint + "/v1/traces") is None


async def test_runs_left_behind_are_found_by_the_sweep(store: ReplayLog) -> None:
    events = traced_run()
    await store.append(events)
    async with otlp_receiver() as receiver:
        exporter = SpanExporter(store, settings(receiver), holder="w3", hold_s=0.0)
        async with exporter.connected():
            await exporter._sweep_if_due()
            assert await exporter.pass_once() == 7
            exporter._swept_at = 0
            await exporter._sweep_if_due()
            assert await exporter.pass_once() == 0
    assert len(receiver.spans()) == 7


async def test_an_unreachable_backend_is_retried_within_a_bound_then_its_spans_are_dropped_and_counted(
    store: ReplayLog,
) -> None:
    events = traced_run()
    await store.append(events)
    async with otlp_receiver(fail=2) as receiver:  # two 503s, then yes: retried, nothing lost
        exporter = SpanExporter(store, settings(receiver), holder="w1")
        exporter.offer([(ROOT, events, [], None)])
        async with exporter.connected():
            assert await exporter.pass_once() == 7
        assert receiver.refused == 2 and len(receiver.spans()) == 7
        assert exporter.metrics.requests.labels("retried")._value.get() == 2
    gone = OtlpSettings.from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url + "/v1/traces",
                                  "OTEL_EXPORTER_OTLP_TIMEOUT": "500"})
    assert gone is not None
    other = traced_run("trip2", child="trip2.r", grandchild="trip2.r.s")
    await store.append(other)
    exporter = SpanExporter(store, gone, holder="w1", give_up_s=1.0)
    exporter.offer([("trip2", other, [], None)])
    async with exporter.connected():
        assert await exporter.pass_once() == 0
    assert exporter.metrics.dropped.labels("unreachable")._value.get() == 7
    # the backoff (0.25 s, 0.5 s, 1 s …) fits two pauses in the 1 s bound: at most three tries retried
    assert 1 <= exporter.metrics.requests.labels("retried")._value.get() <= 3
    assert await store.export_claim(["trip2"], "w1", 1) == {"trip2": len(other)}  # given up, not redone


async def test_the_worker_side_goes_on_while_the_backend_is_unreachable(store: ReplayLog) -> None:
    """While the exporter's pass retries a backend that is down, the worker's side — writing the
    log and handing each write over — neither waits for it nor loses what it hands over: once the
    backend is back, the runs written meanwhile are exported."""
    async with otlp_receiver() as receiver:  # an address where nothing answers once it stopped
        port = receiver.port
    down = OtlpSettings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_EXPORTER_OTLP_TIMEOUT": "500",
                                  "OTEL_BSP_SCHEDULE_DELAY": "100"})
    assert down is not None
    exporter = SpanExporter(store, down, holder="w1", interval_s=0.05, give_up_s=60.0)
    first = traced_run("trip3", child="trip3.r", grandchild="trip3.r.s")
    async with exporting(exporter, drain_s=30.0):
        await store.append(first)
        exporter.offer([("trip3", first, [], None)])
        await until(lambda: exporter.metrics.requests.labels("retried")._value.get() >= 2, what="retrying")
        later = [traced_run(f"trip4-{n}", child=f"trip4-{n}.r", grandchild=f"trip4-{n}.r.s") for n in range(3)]
        for run in later:  # as a worker delivers: each write handed over while the pass retries
            await store.append(run)
            exporter.offer([(run[0].run_id, run, [], None)])
        assert [run[0].run_id for run in later] == ["trip4-0", "trip4-1", "trip4-2"]
        assert exporter.metrics.dropped.labels("unreachable")._value.get() == 0  # still retrying
        # folded as they come while the pass retries, their ended spans kept for it
        await until(lambda: all(run[0].run_id in exporter._trees and len(exporter._trees[run[0].run_id].pending) == 7
                                for run in later), what="the runs handed over folded meanwhile")
        async with otlp_receiver(port=port) as back:  # the backend back, on the same address
            await until(lambda: len(back.spans()) == 4 * 7, what="every run's spans exported")
    assert exporter.metrics.dropped.labels("unreachable")._value.get() == 0


async def test_a_pass_waits_for_the_schedule_delay_unless_enough_spans_are_ready(store: ReplayLog) -> None:
    """OTEL_BSP_SCHEDULE_DELAY, as OpenTelemetry's batch processor: a few ended spans wait for it
    (a pass's claims, commit and look at each run serve more of the worker's writing), enough
    (``READY_SPANS``: here 70) are sent without waiting for it, and the last pass sends what is left."""
    assert export.READY_SPANS == 5000
    async with otlp_receiver() as receiver:
        exporter = SpanExporter(store, settings(receiver, OTEL_BSP_SCHEDULE_DELAY="60000"), holder="w1",
                                interval_s=0.05, hold_s=600)
        exporter.ready_spans = 70
        async with exporting(exporter):
            first = traced_run("few")
            await store.append(first)
            exporter.offer([("few", first, [], None)])
            await until(lambda: exporter._pending == 7, what="the first run folded")
            for _ in range(20):  # a pass every 0.05 s would send it at once; the delay (60 s) holds it
                assert receiver.spans() == []
                await asyncio.sleep(0.05)
            many = [traced_run(f"many-{n}", child=f"many-{n}.r", grandchild=f"many-{n}.r.s") for n in range(9)]
            for run in many:
                await store.append(run)
            exporter.offer([(run[0].run_id, run, [], None) for run in many])  # 7 + 9 × 7 = 70 spans
            await until(lambda: len(receiver.spans()) == 70, within=20, what="enough spans sent at once")
            last = traced_run("last", child="last.r", grandchild="last.r.s")
            await store.append(last)
            exporter.offer([("last", last, [], None)])
            await until(lambda: exporter._pending == 7, what="the last run folded")
            assert len(receiver.spans()) == 70  # waiting for the delay again
        assert len(receiver.spans()) == 77  # the last pass, on leaving


def test_the_standard_environment_decides_whether_and_where_spans_go() -> None:
    assert OtlpSettings.from_env({}) is None
    base = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}
    assert OtlpSettings.from_env({**base, "OTEL_TRACES_EXPORTER": "none"}) is None
    assert OtlpSettings.from_env({**base, "OTEL_SDK_DISABLED": "true"}) is None
    assert OtlpSettings.from_env({**base, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) is None
    found = OtlpSettings.from_env(base)
    assert found is not None and found.endpoint == "http://collector:4318/v1/traces"
    assert found.resource["service.name"] == "runwire" and not found.content and not found.gzip
    assert found.delay_s == 5.0  # OTEL_BSP_SCHEDULE_DELAY's default, the OpenTelemetry SDKs'
    assert OtlpSettings.from_env({**base, "OTEL_BSP_SCHEDULE_DELAY": "250"}).delay_s == 0.25  # type: ignore[union-attr]
    assert OtlpSettings.from_env({**base, "OTEL_BSP_SCHEDULE_DELAY": "soon"}).delay_s == 5.0  # type: ignore[union-attr]
    found = OtlpSettings.from_env({**base, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://x.example/otel",
                                   "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "a=1", "OTEL_EXPORTER_OTLP_HEADERS": "b=2",
                                   "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip", "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
                                   "OTEL_RESOURCE_ATTRIBUTES": "service.name=fromattrs",
                                   "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"})
    assert found is not None
    assert (found.endpoint, found.headers, found.gzip, found.timeout_s) == ("https://x.example/otel", {"a": "1"},
                                                                             True, 2.5)
    assert found.resource["service.name"] == "fromattrs" and found.content


async def test_a_long_run_is_folded_from_the_log_a_page_at_a_time(
    store: ReplayLog, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An exporter folding runs from the log (after a restart, or taking them over) holds a page
    of each at a time: what it holds meanwhile does not grow with the run's length."""
    monkeypatch.setattr(export, "FOLD_PAGE", 500)

    async def peak(root: str, deltas: int) -> int:
        events = [event(root, 1, "run.lifecycle", {"state": "running"}, second=0)]
        events += [event(root, seq, text="a token ", second=seq / 1000) for seq in range(2, deltas + 2)]
        events.append(event(root, deltas + 2, "run.lifecycle", {"state": "done"}, second=deltas / 1000 + 1))
        await store.append(events)
        async with otlp_receiver() as receiver:
            exporter = SpanExporter(store, settings(receiver), holder="w1", hold_s=0.0)
            async with exporter.connected():
                await exporter._sweep_if_due()  # finds the run left unexported: folded from the log
                tracemalloc.start()
                try:
                    assert await exporter.pass_once() == 1
                    return tracemalloc.get_traced_memory()[1]
                finally:
                    tracemalloc.stop()

    short, long = await peak("short", 4_000), await peak("long", 32_000)
    assert long < 2 * short, (short, long)


def test_encoding_keeps_no_copy_of_long_attribute_values() -> None:
    """With content on, tool results and model text are long and nearly all distinct: encoding
    them keeps nothing of them once the request is written (its memory does not grow with them)."""
    def spans(first: int) -> list[Span]:
        return [Span(trace_id="ab" * 16, span_id=f"{n:016x}", parent_span_id=None, name="execute_tool t",
                     operation="execute_tool", run_id="r", start_ts="", start_ns=n, end_ns=n + 1, end_seq=n,
                     attributes={"gen_ai.tool.call.result": f"{n:08d}" + "x" * 16_000})
                for n in range(first, first + 100)]

    encode_request(spans(0), {"service.name": "t"})
    tracemalloc.start()
    try:
        for first in range(100, 1100, 100):
            encode_request(spans(first), {"service.name": "t"})
        kept = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert kept < 1_000_000, kept  # the values encoded come to 16 MB


def test_attribute_values_keep_their_types_on_the_wire() -> None:
    """Decoded with opentelemetry-proto, each value is what the span holds: strings short, long and
    not ASCII, ints small, large and negative, bools (never an int written before for ``1``),
    floats and lists."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    values: dict[str, object] = {"s": "tool", "long": "é" * 300, "n": 1, "big": 1 << 40, "neg": -3,
                                 "f": 1.5, "list": ["a", "b"]}
    first = Span(trace_id="ab" * 16, span_id="01" * 8, parent_span_id="02" * 8, name="chat m", operation="chat",
                 run_id="r", start_ts="", start_ns=5, end_ns=9, end_seq=3, status="error", status_message="no",
                 attributes=values)
    second = Span(trace_id="ab" * 16, span_id="03" * 8, parent_span_id=None, name="invoke_agent",
                  operation="invoke_agent", run_id="r", start_ts="", start_ns=1, end_ns=10, end_seq=4,
                  attributes={"n": True})
    request = ExportTraceServiceRequest()
    request.ParseFromString(encode_request([first, second], {"service.name": "t"}, "1.2.3"))
    scope = request.resource_spans[0].scope_spans[0]
    assert (scope.scope.name, scope.scope.version) == ("runwire", "1.2.3")
    one, two = scope.spans
    assert attributes(one) == values and attributes(two) == {"n": True}
    assert two.attributes[0].value.WhichOneof("value") == "bool_value"
    assert (one.kind, two.kind) == (ProtoSpan.SPAN_KIND_CLIENT, ProtoSpan.SPAN_KIND_INTERNAL)
    assert (one.start_time_unix_nano, one.end_time_unix_nano, one.parent_span_id) == (5, 9, bytes.fromhex("02" * 8))
    assert (one.status.code, one.status.message) == (Status.STATUS_CODE_ERROR, "no") and two.parent_span_id == b""


def test_every_length_of_a_field_reads_back_at_the_boundaries_of_its_varint() -> None:
    """A length is one varint byte below 128, two below 16,384, three above: spans and attribute
    values on each side of both boundaries decode with opentelemetry-proto to what they hold."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    sizes = [0, 1, 60, 100, 126, 127, 128, 129, 16_250, 16_383, 16_384, 16_385, 40_000]
    spans = [Span(trace_id="ab" * 16, span_id=f"{n:016x}", parent_span_id=None, name="chat",
                  operation="chat", run_id="r", start_ts="", start_ns=n, end_ns=n + 1, end_seq=n,
                  attributes={"v": "x" * size} if size else {})
             for n, size in enumerate(sizes)]
    request = ExportTraceServiceRequest()
    request.ParseFromString(encode_request(spans, {"service.name": "t"}))
    decoded = request.resource_spans[0].scope_spans[0].spans
    assert [attributes(span) for span in decoded] == [{"v": "x" * size} if size else {} for size in sizes]
    assert [span.start_time_unix_nano for span in decoded] == list(range(len(sizes)))
