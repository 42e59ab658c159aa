"""The edge ASGI app: ``create_app(bus, store, settings)``.

Endpoints (``docs/edge.md`` has the full table):

=============================================  ==========================================
``GET  /v1/runs/{run_id}/stream``               SSE, NDJSON (``Accept``) or WebSocket
``POST /v1/runs/{run_id}/events``               HTTP ingest (NDJSON, any ingest format)
``POST /v1/runs/{run_id}/control``              cancel / pause / resume / redirect / …
``GET  /v1/runs/{run_id}/control``              the run's commands, for its agent (NDJSON)
``GET  /v1/runs``                               the tenant's runs (``state``, ``since``, ``thread_id`` …)
``GET /v1/runs/{run_id}`` · ``POST …/fork``     one run's metadata · fork it at a seq (``fork.py``)
``GET  /v1/threads/{thread_id}/stream``         a thread's active run for AI SDK resume (or 204)
``WS   /v1/threads``                            AI SDK ``WebSocketChatTransport`` (send/resume/abort)
``GET  /v1/runs/{run_id}/events.jsonl``         export (``?format=``)
``/v1/webhooks``                                a tenant's webhooks (``edge/http/webhooks.py``)
``GET  /v1/runs/{run_id}/spans``                the run's span tree (what the timeline draws)
``GET  /healthz`` · ``/readyz`` · ``/metrics``  operations
``GET  /`` · ``/runs/{run_id}``                 the live page
``/.well-known/agent-card.json`` · ``/a2a/…``  A2A 1.0 (``docs/a2a.md``)
=============================================  ==========================================
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import msgspec
from starlette.applications import Starlette
from starlette.requests import HTTPConnection, Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.types import ExceptionHandler, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketState

from ... import protocols
from ...bus.base import Bus
from ...core.errors import (
    REQ_BAD_BODY,
    REQ_BAD_PARAMETER,
    ConfigError,
    QuotaExceeded,
    RequestError,
    RunwireError,
)
from ...core.redaction import redact_logs, redact_text
from ...core.retry import state_of
from ...sdk.runcontext import CONTEXT_HEADER, RunContext
from ...store.base import ReplayLog
from ..a2a import a2a_routes
from ..chat.serve import serve_chat
from ..durable.read import DurableRead
from ..durable.write import DurableWrite
from ..fanout.session import StreamRequest
from ..fanout.transports import (
    NDJSON_MEDIA_TYPE,
    http_status,
    refuse_websocket,
    serve_http_stream,
    serve_websocket,
)
from ..service.auth import Principal
from ..service.authz import authorize_write
from ..service.context import Edge
from ..service.control import agent_controls, send_control
from ..service.ingest import IngestRequest, publish_body, resolve_format
from ..service.params import bounded_body, list_limit
from ..service.runs import list_runs
from ..service.streams import parse_time, stream_request
from ..service.threads import AI_SDK_HEADERS
from ..settings import EdgeSettings
from .fork import fork_routes
from .runlog import export_endpoint, spans_endpoint
from .threads import thread_stream
from .webhooks import webhook_routes

log = logging.getLogger(__name__)
STATIC = Path(__file__).parents[1] / "static"
_json = msgspec.json.Encoder()


def error_response(exc: RunwireError) -> JSONResponse:
    """A RunwireError as a JSON error body with the right status (the one mapping: see :func:`refusal`)."""
    status = http_status(exc)
    body: dict[str, Any] = {"error": str(exc)}
    code = exc.code or (REQ_BAD_PARAMETER if status == 400 else None)
    if code:
        body["code"] = code
    headers = ({"www-authenticate": "Bearer"} if status == 401
               else {"retry-after": "1"} if status == 503 else None)
    if isinstance(exc, QuotaExceeded):
        headers = {"retry-after": str(exc.retry_after_s)}
    return JSONResponse(body, status_code=status, headers=headers)


async def refusal(conn: HTTPConnection, exc: Exception) -> Response | None:
    """The app's one handler of :class:`RunwireError`: whatever endpoint raises it, before it has
    answered, the client gets :func:`error_response` over HTTP, or :func:`refuse_websocket`'s
    error frame and close code over a WebSocket not yet accepted."""
    assert isinstance(exc, RunwireError)
    if not isinstance(conn, WebSocket):
        return error_response(exc)
    if conn.application_state is not WebSocketState.CONNECTING:
        raise exc  # mid-session: the session's own error, as any other
    await refuse_websocket(conn, exc)
    return None


def json_response(data: Any, status: int = 200) -> Response:
    return Response(_json.encode(data), status_code=status, media_type="application/json")


# ---- streams ----------------------------------------------------------------
class StreamEndpoint:
    """``GET /v1/runs/{run_id}/stream`` over HTTP: SSE, or NDJSON by ``Accept``."""

    def __init__(self, edge: Edge) -> None:
        self.edge = edge

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        stream = await authorize_stream(self.edge, request)
        hold = self.edge.quotas.stream(stream.holder)
        sse = NDJSON_MEDIA_TYPE not in request.headers.get("accept", "")
        del request  # not held (with its parsed headers) for the stream's whole life
        headers = dict(protocols.egress(stream.format).headers)
        with hold:
            await serve_http_stream(self.edge.hub, stream, scope, receive, send, sse=sse, headers=headers)


class ThreadStreamEndpoint:
    """``GET /v1/threads/{thread_id}/stream``: the thread's active run for AI SDK resume, or 204."""

    def __init__(self, edge: Edge) -> None:
        self.edge = edge

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        stream = await thread_stream(self.edge, Request(scope, receive))
        hold = self.edge.quotas.stream(stream.holder) if stream is not None else None
        if stream is None or hold is None:
            await Response(status_code=204)(scope, receive, send)
            return
        with hold:
            await serve_http_stream(self.edge.hub, stream, scope, receive, send, sse=True, headers=AI_SDK_HEADERS)


async def authorize_stream(edge: Edge, conn: HTTPConnection) -> StreamRequest:
    """Check read access to the run and parse the stream parameters (HTTP or WebSocket)."""
    run_id = conn.path_params["run_id"]
    principal = edge.gate.principal(conn.headers, conn.query_params)
    await edge.gate.check_run(principal, run_id, "read")
    stream = stream_request(run_id, dict(conn.query_params), dict(conn.headers), edge.settings)
    return msgspec.structs.replace(stream, holder=principal.token_id) if principal is not None else stream


def chat_endpoint(edge: Edge) -> Any:
    async def endpoint(websocket: WebSocket) -> None:
        await serve_chat(edge, websocket)

    return endpoint


def websocket_endpoint(edge: Edge) -> Any:
    async def endpoint(websocket: WebSocket) -> None:
        stream = await authorize_stream(edge, websocket)
        with edge.quotas.stream(stream.holder):
            await serve_websocket(edge.hub, websocket, stream)

    return endpoint


# ---- ingest, control, runs, export ------------------------------------------
def ingest_endpoint(edge: Edge) -> Any:
    async def endpoint(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        principal = edge.gate.principal(request.headers, request.query_params)
        await authorize_write(edge.gate, principal, run_id)
        body = await bounded_body(
            request, edge.settings.max_ingest_bytes, timeout_s=edge.settings.body_timeout_s, what="ingest"
        )
        format_name = resolve_format(request.query_params.get("format"), body)
        token = request.headers.get(CONTEXT_HEADER)
        context = RunContext.parse(token) if token else None
        thread_id = request.headers.get("thread-id") or request.query_params.get("thread_id") or None
        try:
            result = await publish_body(edge, principal, IngestRequest(run_id, body, format_name, thread_id, context))
        except RequestError as exc:  # over a limit of the request as a whole: nothing published
            return error_response(exc)
        except RunwireError as exc:  # the replay log holding the claims, or the bus, is down or full
            if exc.retriable:
                edge.metrics.pause(state_of(exc))
            response = json_response({"error": str(exc), "accepted": 0}, status=503)
            response.headers["retry-after"] = "1"
            return response
        return json_response(result, status=422 if result.rejected else 200)

    return endpoint


class ControlRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    command: str
    args: dict[str, Any] = {}


def control_request(body: bytes) -> ControlRequest:
    """A control body, decoded (``send_control`` checks the command and the args' nesting)."""
    try:
        return msgspec.json.decode(body, type=ControlRequest)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise RequestError(f"bad control body: {exc}", code=REQ_BAD_BODY) from None
    except RecursionError:
        raise RequestError("bad control body: nested too deep", code=REQ_BAD_BODY) from None


def control_endpoint(edge: Edge) -> Any:
    async def endpoint(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        if request.method == "GET":  # the run's agent reads its commands (NDJSON, live)
            principal = edge.gate.principal(request.headers, request.query_params)
            hold = edge.quotas.stream(principal.token_id if principal else "")  # one of its streams
            lines = await agent_controls(edge.bus, edge.gate, principal, run_id, hold)
            return StreamingResponse(lines, media_type=NDJSON_MEDIA_TYPE)
        try:
            principal = edge.gate.principal(request.headers, request.query_params)
            body = control_request(await bounded_body(
                request, edge.settings.max_control_bytes, timeout_s=edge.settings.body_timeout_s, what="control"
            ))
            command = await send_control(edge.bus, edge.gate, principal, run_id, body.command, body.args)
        except RunwireError as exc:
            if exc.retriable:
                edge.metrics.pause(state_of(exc))
            return error_response(exc)
        return json_response({"id": command.id, "command": command.command}, status=202)

    return endpoint


def runs_endpoint(edge: Edge) -> Any:
    async def endpoint(request: Request) -> Response:
        query = request.query_params
        principal = edge.gate.principal(request.headers, query)
        visible = await list_runs(
            edge,
            principal,
            tenant=query.get("tenant"),
            state=query.get("state"),
            since=parse_time(query.get("since"), "since"),
            until=parse_time(query.get("until"), "until"),
            limit=list_limit(query.get("limit")),
            thread_id=query.get("thread_id") or None,
        )
        return json_response({"runs": visible})

    return endpoint


# ---- operations and the page ------------------------------------------------
def ops_routes(edge: Edge) -> list[Route]:
    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def readyz(request: Request) -> Response:
        """Open to anyone, so it names the failing part only; the reason goes to the log, redacted."""
        problems: dict[str, str] = {}
        for name, check in (("bus", edge.bus.ping), ("store", edge.store.ping)):
            try:
                await check()
            except Exception as exc:  # readiness reports any failure, it never raises
                reason = exc.reason if isinstance(exc, RunwireError) and exc.reason else "unavailable"
                problems[name] = reason  # "full": Redis at maxmemory refuses writes
                edge.metrics.pause(f"{name} {reason}")
                log.warning("readyz: the %s is %s: %s", name, reason,
                            redact_text(str(exc) or type(exc).__name__))
        for name, part in edge.readiness.items():
            why = part()
            if why is not None:  # the part logged why itself, once
                problems[name] = why
                edge.metrics.pause(f"{name} {why}")
        status = 503 if problems else 200
        return JSONResponse({"ok": not problems, **problems}, status_code=status)

    async def metrics(request: Request) -> Response:
        try:
            principal = edge.gate.principal(request.headers, request.query_params)
            edge.gate.require_scope(principal, "ops")
        except RunwireError as exc:
            return error_response(exc)
        try:
            for group, lost in (await edge.bus.ingest_lost()).items():
                edge.metrics.ingest_lost.labels(group).set(lost)
        except RunwireError as exc:  # the bus is down: the other metrics still answer
            log.debug("metrics: ingest losses unavailable: %s", exc)
        return Response(edge.metrics.render(), media_type="text/plain; version=0.0.4")

    return [
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics),
    ]


def page_routes(edge: Edge) -> list[Route | Mount]:
    def page(name: str) -> Any:
        async def endpoint(request: Request) -> Response:
            principal: Principal | None = edge.gate.principal(request.headers, request.query_params)
            edge.gate.require_scope(principal, "read")
            return FileResponse(STATIC / name, media_type="text/html")

        return endpoint

    return [
        Route("/", page("index.html")),
        Route("/runs/{run_id}", page("run.html")),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]


class EdgeApp(Starlette):
    """Starlette, but a run's HTTP stream goes straight to its endpoint: no middleware or routing
    coroutines held for a stream's whole life (~3.7 KB a client; ``bench/edge_memory.py``). The
    one error mapping still answers what it raises before answering (:func:`error_response`);
    anything else is uvicorn's 500, as it is behind Starlette's middleware."""

    def __init__(self, stream: StreamEndpoint, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] == "http" and scope["method"] == "GET" and path.endswith("/stream") \
                and path.startswith("/v1/runs/") and not scope.get("root_path"):
            run_id = path[len("/v1/runs/"):-len("/stream")]
            if run_id and "/" not in run_id:
                scope["app"] = self
                scope["path_params"] = {"run_id": run_id}
                try:
                    await self.stream(scope, receive, send)
                except RunwireError as exc:
                    await error_response(exc)(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_app(bus: Bus, store: ReplayLog, settings: EdgeSettings | None = None) -> Starlette:
    """The edge as an ASGI app. ``bus`` and ``store`` must be connected; the app starts its hub."""
    settings = settings or EdgeSettings()
    redact_logs()  # request paths in uvicorn's access log may carry ?access_token=
    if settings.secret is not None and len(settings.secret.encode()) < 32:
        raise ConfigError("the edge secret must be at least 32 bytes (HS256 key)")
    edge = Edge(bus, store, settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await edge.hub.start()
        try:
            yield
        finally:
            await edge.hub.stop()

    routes: list[Any] = [
        Route("/v1/runs", runs_endpoint(edge)),
        *fork_routes(edge),
        Route("/v1/runs/{run_id}/stream", stream := StreamEndpoint(edge)),
        WebSocketRoute("/v1/runs/{run_id}/stream", websocket_endpoint(edge)),
        Route("/v1/runs/{run_id}/events", ingest_endpoint(edge), methods=["POST"]),
        Route("/v1/runs/{run_id}/events.jsonl", export_endpoint(edge)),
        Route("/v1/runs/{run_id}/spans", spans_endpoint(edge)),
        Route("/v1/runs/{run_id}/control", control_endpoint(edge), methods=["GET", "POST"]),
        Route("/v1/threads/{thread_id}/stream", ThreadStreamEndpoint(edge)),
        Route("/v1/ds/runs/{run_id}", DurableRead(edge, authorize_stream), methods=["GET", "HEAD"]),
        Route("/v1/ds/runs/{run_id}", DurableWrite(edge).endpoint, methods=["PUT", "POST"]),
        WebSocketRoute("/v1/threads", chat_endpoint(edge)),
        *webhook_routes(edge),
        *a2a_routes(edge),
        *ops_routes(edge),
        *page_routes(edge),
    ]
    app = EdgeApp(stream, routes=routes, lifespan=lifespan,
                  exception_handlers={RunwireError: cast(ExceptionHandler, refusal)})
    app.state.edge = edge
    return app
