"""The two A2A bindings served: JSON-RPC 2.0 (``POST /a2a/{agent}``) and HTTP+JSON
(``/a2a/{agent}/rest/…``), and the agent cards. Both call :mod:`.methods` and
:mod:`.stream`; only the envelope of a request, an answer and an error differs.

HTTP+JSON routes (the specification's, under the interface's URL)::

    POST /message:send · /message:stream        GET /tasks · /tasks/{id}
    POST /tasks/{id}:cancel · POST, GET /tasks/{id}:subscribe · GET /extendedAgentCard
    POST · GET /tasks/{id}/pushNotificationConfigs   GET · DELETE …/pushNotificationConfigs/{config}

A request body is at most :data:`runwire.core.limits.FRAME_BYTES` and nests at most
:data:`runwire.core.limits.DEPTH` levels, as a chat message on the WebSocket chat.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from ...core import limits
from ...core.errors import RunwireError
from ...protocols.a2a import RESUME_EXTENSION
from ..fanout.session import StreamRequest
from ..fanout.transports import http_status
from ..service.auth import Principal
from ..service.context import Edge
from ..service.params import bounded_body, check_depth
from . import methods, push
from .card import agent_card
from .errors import A2AFault, as_fault
from .stream import Framing, empty_task, serve_task_stream, settled_task

JSON = "application/json"
VERSION_HEADER = "a2a-version"
_json = msgspec.json.Encoder()


def _answer(data: Any, status: int = 200) -> Response:
    return Response(_json.encode(data), status_code=status, media_type=JSON)


def _check_version(request: Request) -> None:
    """The request's ``A2A-Version`` (header, or the query parameter the specification allows) is 1.x.

    A request without one is a 0.3 request, as the specification has it (§3.6.2); 0.3 names its
    methods and shapes its objects otherwise, so it gets ``VersionNotSupportedError`` like any
    version this edge does not speak.
    """
    version = request.headers.get(VERSION_HEADER) or request.query_params.get("A2A-Version") or ""
    if version.split(".")[0].strip() != "1":
        shown = repr(version[:16]) if version else "none (a 0.3 request)"
        raise A2AFault("VERSION_NOT_SUPPORTED", f"A2A-Version {shown}: this agent speaks 1.0; "
                                                "send the header A2A-Version: 1.0")


async def _json_body(edge: Edge, request: Request) -> Any:
    """The request's JSON body (bounded in bytes; None when empty), or ``PARSE_ERROR``."""
    body = await bounded_body(request, limits.FRAME_BYTES, timeout_s=edge.settings.body_timeout_s,
                              what="A2A request")
    if not body:
        return None
    try:
        return msgspec.json.decode(body)
    except msgspec.DecodeError:
        raise A2AFault("PARSE_ERROR", "the body is not JSON") from None


class A2ACall:
    """One request: its edge, caller, agent (requests channel) and framing."""

    def __init__(self, edge: Edge, request: Request, framing: Framing) -> None:
        self.edge = edge
        self.request = request
        self.framing = framing
        agent = request.path_params.get("agent", "default")
        if not 0 < len(agent) <= limits.ID_CHARS:
            raise A2AFault("INVALID_PARAMS", "bad agent name")
        self.agent: str = agent
        self.principal: Principal | None = edge.gate.principal(request.headers, request.query_params)
        self.extension = methods.requested(request.headers, RESUME_EXTENSION)

    async def unary(self, method: str, params: Mapping[str, Any]) -> Any:
        edge, principal = self.edge, self.principal
        if method == "GetTask":
            return await methods.get_task(edge, principal, params)
        if method == "ListTasks":
            return await methods.list_tasks(edge, principal, params)
        if method == "CancelTask":
            return await methods.cancel_task(edge, principal, params)
        if method == "SendMessage":
            return await self.send_blocking(params)
        if method in push.METHODS:
            return await push.METHODS[method](edge, principal, params)
        if method == "GetExtendedAgentCard":
            raise A2AFault("EXTENDED_AGENT_CARD_NOT_CONFIGURED", "this agent has no extended card")
        raise A2AFault("METHOD_NOT_FOUND", f"unknown method {method[:64]!r}")

    async def send_blocking(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``SendMessage``: the task once it ends or needs input (or at once with ``returnImmediately``;
        after ``long_poll_s`` as it then stands). Waiting holds one of the token's streams, as a
        stream of the task would."""
        configuration = methods.object_of(params, "configuration")
        length = methods.history_length(configuration)
        with self.edge.quotas.stream(self.principal.token_id if self.principal else ""):
            sent = await self.send(params)
            if methods.flag_of(configuration, "returnImmediately"):
                return {"task": empty_task(sent.run_id, sent.context_id)}
            task = await settled_task(self.edge, sent.run_id, sent.context_id, sent.after, length,
                                      self.edge.settings.long_poll_s)
            return {"task": task}

    async def send(self, params: Mapping[str, Any]) -> methods.Sent:
        """``SendMessage``'s common part; a push config in its ``configuration`` is made for the task
        before the message goes out (its first notice cannot come before it)."""
        configuration = methods.object_of(params, "configuration")
        config = methods.object_of(configuration, "taskPushNotificationConfig")
        prepare: methods.Prepare | None = None
        if config:
            async def prepare(task_id: str) -> None:
                await push.create(self.edge, self.principal, {**config, "taskId": task_id})
        return await methods.send_message(self.edge, self.principal, self.agent, params, prepare)

    async def stream(self, method: str, params: Mapping[str, Any], receive: Receive, send: Send) -> None:
        edge = self.edge
        hold = edge.quotas.stream(self.principal.token_id if self.principal else "")
        with hold:
            cursor = self.request.headers.get(methods.CURSOR_HEADER.lower())
            after, skip, live = 0, None, False
            finished: Callable[[], Awaitable[dict[str, Any]]] | None = None
            if method == "SendStreamingMessage":
                sent = await self.send(params)
                run_id, context_id, after = sent.run_id, sent.context_id, sent.after
            else:
                run_id = methods.task_id_of(params)
                await edge.gate.check_run(self.principal, run_id, "read")
                context_id = await methods.context_of(edge, run_id)
                if self.extension and cursor is not None:
                    after, skip = methods.parse_cursor(cursor)
                    finished = functools.partial(methods.task_now, edge, run_id)
                else:
                    live = not self.extension  # the specification's subscription: the task now, then live
            stream = StreamRequest(run_id=run_id, view=methods.view_of(edge), format="a2a", after=after,
                                   live=live, holder=self.principal.token_id if self.principal else "")
            await serve_task_stream(edge, stream, self.request.scope, receive, send, framing=self.framing,
                                    context_id=context_id, extension=self.extension, skip=skip,
                                    finished_task=finished)


STREAMING = frozenset({"SendStreamingMessage", "SubscribeToTask"})


class JsonRpcEndpoint:
    """``POST /a2a/{agent}``: one JSON-RPC 2.0 request (streaming methods answer with SSE)."""

    def __init__(self, edge: Edge) -> None:
        self.edge = edge

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        request_id: Any = None
        try:
            _check_version(request)
            rpc = await _json_body(self.edge, request)
            if not isinstance(rpc, dict):
                raise A2AFault("INVALID_REQUEST", "a JSON-RPC request is an object")
            request_id = rpc.get("id")
            method, params = rpc.get("method"), rpc.get("params") or {}
            if rpc.get("jsonrpc") != "2.0" or not isinstance(method, str) or not isinstance(params, dict):
                raise A2AFault("INVALID_REQUEST", "not a JSON-RPC 2.0 request")
            check_depth(params, "A2A params")
            call = A2ACall(self.edge, request, Framing(jsonrpc_id=request_id, jsonrpc=True))
            if method in STREAMING:
                await _guarded(call.stream(method, params, receive, send), method)
                return
            result = await _guarded(call.unary(method, params), method)
            response = _answer({"jsonrpc": "2.0", "id": request_id, "result": result})
        except A2AFault as fault:
            response = _answer(fault.jsonrpc(request_id))
        await response(scope, receive, send)


async def _guarded(call: Any, method: str) -> Any:
    """Run a method; a runwire error A2A names becomes its :class:`A2AFault` (the bus or the replay log
    failing: the internal error, with the app's status), any other goes to the app's one handler (401,
    403, 413, 429)."""
    try:
        return await call
    except RunwireError as exc:
        fault = as_fault(exc, http_status(exc),
                         finished="TASK_NOT_CANCELABLE" if method == "CancelTask" else "UNSUPPORTED_OPERATION")
        if fault is None:
            raise
        raise fault from None


class RestEndpoint:
    """``/a2a/{agent}/rest/…``: the HTTP+JSON binding."""

    def __init__(self, edge: Edge, action: str) -> None:
        self.edge = edge
        self.action = action

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            _check_version(request)
            method, params = await self.parse(request)
            call = A2ACall(self.edge, request, Framing())
            if method in STREAMING:
                await _guarded(call.stream(method, params, receive, send), method)
                return
            result = await _guarded(call.unary(method, params), method)
            response = _answer(result)
        except A2AFault as fault:
            response = _answer(fault.rest(), status=fault.http_status)
        await response(scope, receive, send)

    async def parse(self, request: Request) -> tuple[str, dict[str, Any]]:
        params: dict[str, Any] = dict(request.query_params)
        for name in ("historyLength", "pageSize"):
            if name in params:
                params[name] = _int(params[name], name)
        if "includeArtifacts" in params:
            params["includeArtifacts"] = params["includeArtifacts"].lower() == "true"
        params.pop("access_token", None)
        params.pop("A2A-Version", None)
        if request.method == "POST":
            decoded = await _json_body(self.edge, request)
            if decoded is not None:
                if not isinstance(decoded, dict):
                    raise A2AFault("INVALID_REQUEST", "the body must be a JSON object")
                check_depth(decoded, "A2A request")
                params.update(decoded)
        return self.route(request, params)

    def route(self, request: Request, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The method a request names (by path and HTTP method), with its path's ids in ``params``."""
        task = request.path_params.get("task")
        if self.action == "task":
            if request.method == "GET" and not (task or "").endswith(":subscribe"):
                return "GetTask", {**params, "id": task}
            task_id, _, verb = (task or "").rpartition(":")
            verbs = {"cancel": "CancelTask", "subscribe": "SubscribeToTask"}
            if verb not in verbs:
                raise A2AFault("METHOD_NOT_FOUND", f"unknown task method {verb[:32]!r}")
            return verbs[verb], {**params, "id": task_id}
        if self.action == "push":
            params.update(taskId=task, id=request.path_params.get("config"))
            if request.method == "POST":
                return "CreateTaskPushNotificationConfig", params
            if request.method == "DELETE":
                return "DeleteTaskPushNotificationConfig", params
            if params["id"] is None:
                return "ListTaskPushNotificationConfigs", params
            return "GetTaskPushNotificationConfig", params
        return self.action, params


def _int(raw: str, name: str) -> int:
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 9):
        raise A2AFault("INVALID_PARAMS", f"{name} must be a non-negative integer")
    return int(raw)


def card_endpoint(edge: Edge) -> Any:
    async def endpoint(request: Request) -> Response:
        agent = request.path_params.get("agent", "default")
        base = str(request.base_url).rstrip("/")
        return _answer(agent_card(base, agent, secured=edge.gate.enabled))

    return endpoint


def a2a_routes(edge: Edge) -> list[BaseRoute]:
    """Every A2A route: the cards, JSON-RPC and HTTP+JSON (``create_app`` adds them with one call)."""
    rest = "/a2a/{agent}/rest"
    return [
        Route("/.well-known/agent-card.json", card_endpoint(edge), methods=["GET"]),
        Route("/a2a/{agent}/.well-known/agent-card.json", card_endpoint(edge), methods=["GET"]),
        Route("/a2a/{agent}", JsonRpcEndpoint(edge), methods=["POST"]),
        Route(f"{rest}/message:send", RestEndpoint(edge, "SendMessage"), methods=["POST"]),
        Route(f"{rest}/message:stream", RestEndpoint(edge, "SendStreamingMessage"), methods=["POST"]),
        Route(f"{rest}/tasks", RestEndpoint(edge, "ListTasks"), methods=["GET"]),
        Route(f"{rest}/extendedAgentCard", RestEndpoint(edge, "GetExtendedAgentCard"), methods=["GET"]),
        Route(f"{rest}/tasks/{{task}}/pushNotificationConfigs", RestEndpoint(edge, "push"),
              methods=["GET", "POST"]),
        Route(f"{rest}/tasks/{{task}}/pushNotificationConfigs/{{config}}", RestEndpoint(edge, "push"),
              methods=["GET", "DELETE"]),
        Route(f"{rest}/tasks/{{task}}", RestEndpoint(edge, "task"), methods=["GET", "POST"]),
    ]
