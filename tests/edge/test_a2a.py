"""A2A 1.0 at the edge, driven by the unchanged ``a2a-sdk`` 1.x client: every run is a task.

A real pipeline (Redis, two workers, the SQLite replay log, uvicorn edges) and the SDK's own
card resolver, client factory and transports — JSON-RPC and HTTP+JSON — with its default 5 s
read timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, Client, ClientCallContext, ClientConfig, ClientFactory
from a2a.types import (
    AuthenticationInfo,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    TaskNotFoundError,
    TaskPushNotificationConfig,
    TaskState,
    UnsupportedOperationError,
)
from google.protobuf.json_format import MessageToDict, ParseDict

from runwire.bus.base import Bus
from runwire.bus.requests import consumer_alive
from runwire.edge import EdgeSettings
from runwire.protocols.a2a import RESUME_EXTENSION, A2AEgress
from runwire.sdk.publisher import Publisher, Run
from runwire.store.base import ReplayLog
from tests.e2e_harness import Pipeline, pipeline, unique, wait_for_terminal
from tests.waiting import until

from .harness import SECRET, EdgeServer, event, publish, serve_edge, token

CURSOR = "Runwire-A2A-Cursor"
BINDINGS = ["JSONRPC", "HTTP+JSON"]


@contextlib.asynccontextmanager
async def a2a_client(url: str, binding: str = "JSONRPC", *, bearer: str | None = None) -> AsyncIterator[Client]:
    """The SDK's client for the edge at ``url``: its card resolved, the binding chosen from it."""
    headers = {"authorization": f"Bearer {bearer}"} if bearer else {}
    async with httpx.AsyncClient(headers=headers) as http:  # httpx's default: a 5 s read timeout
        card = await A2ACardResolver(http, url).get_agent_card()
        client = ClientFactory(ClientConfig(httpx_client=http, supported_protocol_bindings=[binding])).create(card)
        yield client


def resume(cursor: str | None = None) -> ClientCallContext:
    """The exact-resume extension activated, with the cursor of the last response seen."""
    parameters = {"A2A-Extensions": RESUME_EXTENSION}
    if cursor is not None:
        parameters[CURSOR] = cursor
    return ClientCallContext(service_parameters=parameters)


def kind(response: StreamResponse) -> str:
    return str(response.WhichOneof("payload"))


def body(response: StreamResponse) -> dict[str, Any]:
    return MessageToDict(getattr(response, kind(response)))


def cursor_of(response: StreamResponse) -> str:
    return str(body(response)["metadata"][RESUME_EXTENSION]["cursor"])


def updates(responses: Sequence[StreamResponse]) -> list[dict[str, Any]]:
    """The status and artifact updates, as the client got them (ProtoJSON)."""
    return [body(r) for r in responses if kind(r) in ("status_update", "artifact_update")]


def state_of(update: dict[str, Any]) -> str | None:
    return update.get("status", {}).get("state")


async def expected_updates(p: Pipeline, run_id: str) -> list[dict[str, Any]]:
    """What the ``a2a`` mapping makes of the run as the replay log has it (the shaped view)."""
    from runwire.edge.fanout.resume import history

    encoder = A2AEgress()
    out: list[dict[str, Any]] = []
    found = await p.bus.bounds((run_id, "shaped"))  # type: ignore[arg-type]
    assert found is not None
    async for _source, events in history(p.bus, p.store, (run_id, "shaped"), 0, found[1]):
        for one in events:
            for obj in encoder.convert(one):
                out.append(next(iter(obj.values())))
    return out


def text_of(task: dict[str, Any]) -> str:
    """The run's own text in a task (its children's text artifacts left out)."""
    return "".join(part.get("text", "") for artifact in task.get("artifacts", [])
                   if artifact["name"] == "text" and "childId" not in artifact.get("metadata", {}).get("runwire", {})
                   for part in artifact.get("parts", []))


async def publish_family(publisher: Publisher, run_id: str, deltas: int, *, paced: float = 0.0) -> tuple[Run, Run]:
    """A parent run with one child run (tool call, text), then ``deltas`` text deltas of the parent."""
    parent = publisher.run(run_id, thread="chat-1")
    child = publisher.run(f"{run_id}-child", parent=parent)
    await parent.emit("run.lifecycle", {"state": "running"})
    await parent.emit("child.spawn", {"child_id": child.run_id, "prompt": "look it up"})
    await child.emit("run.lifecycle", {"state": "running"})
    await child.emit("tool.start", {"call_id": "c1", "tool": "search", "input": {"q": "a2a"}})
    await child.emit("tool.end", {"call_id": "c1", "ok": True, "output": {"hits": 3}})
    await child.emit("text.delta", {"text": "found 3"})
    await child.finish()
    for n in range(deltas):
        await parent.emit("text.delta", {"text": f"w{n} "})
        if paced:
            await asyncio.sleep(paced)
    return parent, child


@pytest.fixture
async def p(redis_url: str, tmp_path: Path) -> AsyncIterator[Pipeline]:
    async with pipeline(redis_url, f"sqlite:///{tmp_path / 'replay.db'}") as running:
        yield running


# ---- the card ------------------------------------------------------------------------------
async def test_the_card_is_a_1_0_card_with_both_bindings_streaming_and_the_resume_extension(p: Pipeline) -> None:
    async with httpx.AsyncClient() as http:
        card = await A2ACardResolver(http, p.edge.url).get_agent_card()
        raw = (await http.get(f"{p.edge.url}/.well-known/agent-card.json")).json()
    bindings = {i.protocol_binding: i for i in card.supported_interfaces}
    assert set(bindings) == {"JSONRPC", "HTTP+JSON"}
    assert all(i.protocol_version == "1.0" for i in card.supported_interfaces)
    assert bindings["JSONRPC"].url == f"{p.edge.url}/a2a/default"
    assert card.capabilities.streaming and card.capabilities.push_notifications
    assert [e.uri for e in card.capabilities.extensions] == [RESUME_EXTENSION]
    assert [s.id for s in card.skills] == ["default"]
    assert "url" not in raw and "protocolVersion" not in raw, "no 0.3 fields: a 1.x client would speak 0.3"


# ---- watching --------------------------------------------------------------------------------
@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_dropped_subscription_resumes_on_a_second_edge_with_the_cursor_exactly(
    p: Pipeline, binding: str
) -> None:
    """Subscribe to a live run with a child, drop mid-run, resubscribe on another edge with the
    extension's cursor: every update once, in order, to the terminal state."""
    run_id = unique("a2a-resume")
    parent, _child = await publish_family(p.publisher, run_id, 5)
    second = EdgeServer(p.bus, p.store, EdgeSettings())
    await second.start()
    try:
        first: list[StreamResponse] = []
        async with a2a_client(p.edge.url, binding) as client:
            async for response in client.subscribe(SubscribeToTaskRequest(id=run_id), context=resume()):
                first.append(response)
                if len(updates(first)) == 6:
                    break  # the connection is dropped mid-run
        for n in range(5, 40):
            await parent.emit("text.delta", {"text": f"w{n} "})
        await parent.finish()
        await wait_for_terminal(p.store, run_id)
        rest: list[StreamResponse] = []
        async with a2a_client(second.url, binding) as client:
            stream = client.subscribe(SubscribeToTaskRequest(id=run_id), context=resume(cursor_of(first[-1])))
            rest = [response async for response in stream]
    finally:
        await second.stop()
    assert kind(first[0]) == "task" and kind(rest[0]) == "task", "each subscription starts with the task"
    got = updates(first) + updates(rest)
    want = await expected_updates(p, run_id)
    assert [u["metadata"][RESUME_EXTENSION]["cursor"] for u in got] == [
        u["metadata"][RESUME_EXTENSION]["cursor"] for u in want]
    assert got == [MessageToDict(_parsed(u)) for u in want]
    assert state_of(got[-1]) == "TASK_STATE_COMPLETED"
    children = [u for u in got if u.get("artifact", {}).get("metadata", {}).get("runwire", {}).get("childId")]
    tools = {part["data"].get("tool") for u in children for part in u["artifact"].get("parts", []) if "data" in part}
    assert "search" in tools, "the child's tool call, as a data part in the child's lane"


def _parsed(update: dict[str, Any]) -> Any:
    """An update as the client's protobuf parse leaves it (the comparison's other side)."""
    from a2a.types import TaskArtifactUpdateEvent, TaskStatusUpdateEvent
    from google.protobuf.json_format import ParseDict

    target = TaskArtifactUpdateEvent() if "artifact" in update else TaskStatusUpdateEvent()
    return ParseDict(update, target)


async def test_without_the_extension_the_task_comes_first_with_its_artifacts_so_far(p: Pipeline) -> None:
    run_id = unique("a2a-spec")
    parent, _child = await publish_family(p.publisher, run_id, 3)
    got: list[StreamResponse] = []
    async with a2a_client(p.edge.url) as client:

        async def shown() -> bool:
            """The task has the child's text (the parent's last deltas may still be in a shaping window)."""
            try:
                task = MessageToDict(await client.get_task(GetTaskRequest(id=run_id)))
            except TaskNotFoundError:  # not yet written by a worker
                return False
            return "found 3" in [part.get("text") for a in task.get("artifacts", []) for part in a.get("parts", [])]

        await until(shown, within=30, what="the child's text in the task")
        stream = client.subscribe(SubscribeToTaskRequest(id=run_id))
        got.append(await anext(stream))
        for n in range(3, 6):
            await parent.emit("text.delta", {"text": f"w{n} "})
        await parent.finish()
        got.extend([response async for response in stream])
        snapshot = body(got[0])
        assert kind(got[0]) == "task" and snapshot["id"] == run_id and snapshot["contextId"] == "chat-1"
        assert "w0 w1 w2 w3 w4 w5 ".startswith(text_of(snapshot))
        assert state_of(updates(got)[-1]) == "TASK_STATE_COMPLETED"
        assert "found 3" in [part.get("text") for a in snapshot["artifacts"] for part in a.get("parts", [])]
        whole = text_of(snapshot) + streamed_text(got)
        assert whole == "".join(f"w{n} " for n in range(6)), "nothing missed or doubled at the seam"
        with pytest.raises(UnsupportedOperationError):
            async for _ in client.subscribe(SubscribeToTaskRequest(id=run_id)):
                pass
        task = await client.get_task(GetTaskRequest(id=run_id, history_length=0))
        assert task.status.state == TaskState.TASK_STATE_COMPLETED and text_of(MessageToDict(task)) == (
            "".join(f"w{n} " for n in range(6)))


async def _logged(p: Pipeline, run_id: str, events: int) -> bool:
    info = await p.store.run(run_id)
    return info is not None and info.events >= events


async def test_a_quiet_task_keeps_the_sdks_5_s_read_timeout_from_firing(p: Pipeline) -> None:
    run_id = unique("a2a-quiet")
    run = p.publisher.run(run_id)
    await run.emit("run.lifecycle", {"state": "running"})
    async with a2a_client(p.edge.url) as client:
        stream = client.subscribe(SubscribeToTaskRequest(id=run_id))
        assert kind(await anext(stream)) == "task"
        await asyncio.sleep(7)
        await run.finish()
        rest = [response async for response in stream]
    assert state_of(updates(rest)[-1]) == "TASK_STATE_COMPLETED"


async def test_cancel_task_reaches_the_publishing_agent(p: Pipeline) -> None:
    run_id = unique("a2a-cancel")
    run = p.publisher.run(run_id)
    await run.emit("run.lifecycle", {"state": "running"})
    seen: list[str] = []

    async def agent() -> None:
        async for command in run.controls(after="0"):
            seen.append(command.command)
            if command.command == "cancel":
                await run.finish("aborted", "cancelled")
                return

    listening = asyncio.create_task(agent())
    async with a2a_client(p.edge.url, "HTTP+JSON") as client:
        stream = client.subscribe(SubscribeToTaskRequest(id=run_id))
        assert kind(await anext(stream)) == "task"
        await client.cancel_task(CancelTaskRequest(id=run_id))
        rest = [response async for response in stream]
    await asyncio.wait_for(listening, 10)
    assert seen == ["cancel"]
    assert state_of(updates(rest)[-1]) == "TASK_STATE_CANCELED"


# ---- sending ---------------------------------------------------------------------------------
def spawn_agent(url: str, agent: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("w") as out:  # (the child has its own copy of the descriptor)
        return subprocess.Popen([sys.executable, "-m", "tests.edge.a2a_agent", url, agent],
                                stdout=subprocess.DEVNULL, stderr=out, cwd=Path(__file__).parents[2])


@contextlib.asynccontextmanager
async def agent_process(p: Pipeline, agent: str, tmp_path: Path) -> AsyncIterator[None]:
    """``tests/edge/a2a_agent.py`` in a process of its own, consuming ``agent``'s tasks."""
    proc = spawn_agent(p.url, agent, tmp_path / f"{agent}.log")
    try:
        await until(lambda: consumer_alive(p.bus, agent), within=30, what="the agent announced")
        yield
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 10)


def user(text: str, *, task_id: str = "", context_id: str = "") -> SendMessageRequest:
    return SendMessageRequest(message=Message(
        message_id=unique("m"), role=Role.ROLE_USER, parts=[Part(text=text)], task_id=task_id,
        context_id=context_id))


def streamed_text(responses: Sequence[StreamResponse]) -> str:
    """The run's own text as streamed (its children's left out)."""
    return "".join(part.get("text", "") for u in updates(responses) if u.get("artifact", {}).get("name") == "text"
                   and "childId" not in u["artifact"].get("metadata", {}).get("runwire", {})
                   for part in u["artifact"].get("parts", []))


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_streaming_message_is_answered_by_an_sdk_agent_in_another_process(
    p: Pipeline, tmp_path: Path, binding: str
) -> None:
    async with agent_process(p, "echo", tmp_path), httpx.AsyncClient() as http:
        card = await A2ACardResolver(http, f"{p.edge.url}/a2a/echo").get_agent_card()
        client = ClientFactory(ClientConfig(httpx_client=http, supported_protocol_bindings=[binding])).create(card)
        got = [response async for response in client.send_message(user("hello there"))]
    assert kind(got[0]) == "task"
    assert streamed_text(got) == "echo: hello there "
    assert state_of(updates(got)[-1]) == "TASK_STATE_COMPLETED"
    task_id = body(got[0])["id"]
    assert (await p.store.run(task_id)) is not None, "the task is a run in the replay log"


async def test_an_input_required_task_is_answered_by_a_second_message(p: Pipeline, tmp_path: Path) -> None:
    async with agent_process(p, "booker", tmp_path), httpx.AsyncClient() as http:
        card = await A2ACardResolver(http, f"{p.edge.url}/a2a/booker").get_agent_card()
        client = ClientFactory(ClientConfig(httpx_client=http)).create(card)
        first: list[StreamResponse] = []
        async for response in client.send_message(user("ask me")):
            first.append(response)
            if updates(first) and state_of(updates(first)[-1]) == "TASK_STATE_INPUT_REQUIRED":
                break
        question = updates(first)[-1]["status"]["message"]
        assert question["parts"][0]["text"] == "Which city?" and question["role"] == "ROLE_AGENT"
        task = body(first[0])
        second = [r async for r in client.send_message(user("Lisbon", task_id=task["id"],
                                                             context_id=task["contextId"]))]
        history = MessageToDict(await client.get_task(GetTaskRequest(id=task["id"])))["history"]
    assert streamed_text(second) == "echo: booked Lisbon "
    assert state_of(updates(second)[-1]) == "TASK_STATE_COMPLETED"
    assert [(m["role"], m["parts"][0]["text"]) for m in history] == [
        ("ROLE_USER", "ask me"), ("ROLE_AGENT", "Which city?"), ("ROLE_USER", "Lisbon")], "the client's turns too"


async def test_cancel_task_stops_an_sdk_agent_that_sees_cancel(p: Pipeline, tmp_path: Path) -> None:
    async with agent_process(p, "waiter", tmp_path), httpx.AsyncClient() as http:
        card = await A2ACardResolver(http, f"{p.edge.url}/a2a/waiter").get_agent_card()
        client = ClientFactory(ClientConfig(httpx_client=http)).create(card)
        stream = client.send_message(user("wait"))
        task = body(await anext(stream))
        await until(lambda: _logged(p, task["id"], 3), within=30, what="the agent working")
        await client.cancel_task(CancelTaskRequest(id=task["id"]))
        rest = [response async for response in stream]
    assert state_of(updates(rest)[-1]) == "TASK_STATE_CANCELED"
    assert updates(rest)[-1]["status"]["message"]["parts"][0]["text"] == "cancelled by the client"


# ---- tenants -----------------------------------------------------------------------------------
async def test_another_tenants_task_is_refused_like_one_that_does_not_exist(redis_url: str, tmp_path: Path) -> None:
    settings = EdgeSettings(secret=SECRET)
    async with pipeline(redis_url, f"sqlite:///{tmp_path / 'replay.db'}", settings) as p:
        run_id = unique("a2a-tenant")
        run = p.publisher.run(run_id, tenant="A")
        await run.emit("run.lifecycle", {"state": "running"})
        await run.finish()
        await wait_for_terminal(p.store, run_id)
        async with a2a_client(p.edge.url, bearer=token("A")) as mine:
            assert (await mine.get_task(GetTaskRequest(id=run_id))).id == run_id
            listed = await mine.list_tasks(ListTasksRequest())
            assert run_id in [t.id for t in listed.tasks]
        for binding in BINDINGS:
            async with a2a_client(p.edge.url, binding, bearer=token("B")) as theirs:
                with pytest.raises(TaskNotFoundError):
                    await theirs.get_task(GetTaskRequest(id=run_id))
                with pytest.raises(TaskNotFoundError):
                    async for _ in theirs.subscribe(SubscribeToTaskRequest(id=run_id), context=resume("0")):
                        pass
                assert run_id not in [t.id for t in (await theirs.list_tasks(ListTasksRequest())).tasks]
        async with httpx.AsyncClient() as http:
            card = (await http.get(f"{p.edge.url}/.well-known/agent-card.json")).json()
            refused = await http.post(f"{p.edge.url}/a2a/default", headers={"A2A-Version": "1.0"}, json={
                "jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": run_id}})
        assert card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "Bearer"
        assert refused.status_code == 401


# ---- every cursor ------------------------------------------------------------------------------
async def test_every_cursor_of_a_finished_task_resumes_with_exactly_what_follows_it(
    memory_bus: Bus, store: ReplayLog
) -> None:
    """Resuming at each cursor the stream gave — between two objects of one event included —
    gives exactly the objects after it; at the last one, the finished task and the end."""
    run_id = unique("a2a-cursors")
    events = [
        event(run_id, 1, "run.lifecycle", {"state": "running"}, thread_id="chat-9"),
        event(run_id, 2, "text.delta", text="Let me "),
        event(run_id, 3, "text.delta", text="look. "),
        event(run_id, 4, "tool.start", {"call_id": "c1", "tool": "search", "input": {"q": "x"}}),
        event(run_id, 5, "tool.end", {"call_id": "c1", "ok": False, "error": "timeout"}),
        event(run_id, 6, "reasoning.delta", text="hmm"),
        event(run_id, 7, "text.delta", text="Done."),
        event(run_id, 8, "run.lifecycle", {"state": "done"}),
    ]
    await publish(memory_bus, store, events)
    async with serve_edge(memory_bus, store) as edge, a2a_client(edge.url, "HTTP+JSON") as client:
        whole = [r async for r in client.subscribe(SubscribeToTaskRequest(id=run_id), context=resume())]
        cursors = [cursor_of(r) for r in whole[1:]]
        assert "4.0" in cursors and "4" in cursors, "an event of two objects (text closed, tool opened)"
        for index, cursor in enumerate(cursors):
            rest = [r async for r in client.subscribe(SubscribeToTaskRequest(id=run_id), context=resume(cursor))]
            assert kind(rest[0]) == "task"
            assert updates(rest) == updates(whole[index + 2:]), cursor
        assert body(rest[0])["status"]["state"] == "TASK_STATE_COMPLETED" and len(rest) == 1
    assert body(whole[0])["status"]["state"] == "TASK_STATE_SUBMITTED"


# ---- push notifications -------------------------------------------------------------------------
async def test_a_push_notification_config_gets_the_tasks_status_from_the_webhook_delivery_core(
    redis_url: str, tmp_path: Path
) -> None:
    """A config made with the SDK's client is a webhook of the one delivery core: the task's
    input-required and completed statuses arrive at the receiver as A2A ``StreamResponse``s."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from runwire.webhooks import notify
    from runwire.webhooks.deliverer import Deliverer
    from runwire.webhooks.sender import Sender

    from .harness import free_port, loopback_config, start_uvicorn, stop_uvicorn

    received: list[dict[str, Any]] = []
    headers: list[dict[str, str]] = []

    async def receive(request: Request) -> Response:
        received.append(json.loads(await request.body()))
        headers.append(dict(request.headers))
        return Response(status_code=204)

    port = free_port()
    receiver, serving = await start_uvicorn(loopback_config(Starlette(routes=[
        Route("/hook", receive, methods=["POST"])]), port))
    settings = EdgeSettings(webhooks_allow_private=True)
    stop = asyncio.Event()
    try:
        async with pipeline(redis_url, f"sqlite:///{tmp_path / 'replay.db'}", settings) as p:
            sender = Sender(allow_private=True)
            delivering = asyncio.create_task(
                Deliverer(p.store.outbox(), sender, build=notify.build, poll_s=0.1).run(stop))
            run_id = unique("a2a-push")
            run = p.publisher.run(run_id)
            await run.emit("run.lifecycle", {"state": "running"})
            await wait_for_logged(p, run_id)
            async with a2a_client(p.edge.url) as client:
                config = await client.create_task_push_notification_config(TaskPushNotificationConfig(
                    task_id=run_id, url=f"http://127.0.0.1:{port}/hook", token="task-token-1",
                    authentication=AuthenticationInfo(scheme="Bearer", credentials="receiver-secret")))
                assert config.id and config.task_id == run_id
                listed = await client.list_task_push_notification_configs(
                    ListTaskPushNotificationConfigsRequest(task_id=run_id))
                assert [c.id for c in listed.configs] == [config.id]
                shown = await client.get_task_push_notification_config(GetTaskPushNotificationConfigRequest(
                    task_id=run_id, id=config.id))
                for one in (config, listed.configs[0], shown):  # the token and the scheme, never the credentials
                    assert one.token == "task-token-1" and one.authentication.scheme == "Bearer"
                    assert one.authentication.credentials == ""
                await run.emit("run.lifecycle", {"state": "awaiting_approval", "reason": "ok?"})
                await run.finish()
                await until(lambda: len(received) >= 2, within=30, what="two push notifications")
                await client.delete_task_push_notification_config(DeleteTaskPushNotificationConfigRequest(
                    task_id=run_id, id=config.id))
                assert not (await client.list_task_push_notification_configs(
                    ListTaskPushNotificationConfigsRequest(task_id=run_id))).configs
            stop.set()
            await asyncio.wait_for(delivering, 10)
            await sender.aclose()
    finally:
        stop.set()
        await stop_uvicorn(receiver, serving)
    states = [ParseDict(body, StreamResponse()).status_update for body in received]
    assert [s.task_id for s in states] == [run_id, run_id]
    for sent in headers:  # the config's token and authentication, as A2A has them sent (§4.3.3)
        assert sent["x-a2a-notification-token"] == "task-token-1"
        assert sent["authorization"] == "Bearer receiver-secret"
        assert sent["content-type"] == "application/a2a+json"
    # deliveries are not ordered (sent at once, each retried on its own): a receiver orders by the status
    assert sorted(s.status.state for s in states) == sorted([TaskState.TASK_STATE_INPUT_REQUIRED,
                                                             TaskState.TASK_STATE_COMPLETED])


async def wait_for_logged(p: Pipeline, run_id: str) -> None:
    await until(lambda: _logged(p, run_id, 1), within=30, what="the run in the replay log")


async def test_a_blocking_message_returns_the_task_once_the_agent_finished_it(p: Pipeline, tmp_path: Path) -> None:
    async with agent_process(p, "blocking", tmp_path), httpx.AsyncClient() as http:
        card = await A2ACardResolver(http, f"{p.edge.url}/a2a/blocking").get_agent_card()
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
        got = [response async for response in client.send_message(user("hi"))]
    assert [kind(r) for r in got] == ["task"]
    task = body(got[0])
    assert task["status"]["state"] == "TASK_STATE_COMPLETED" and text_of(task) == "echo: hi "


async def test_the_http_json_binding_answers_get_on_subscribe_and_a2a_errors_in_its_shape(
    memory_bus: Bus, store: ReplayLog
) -> None:
    """What an independent client may do beside the SDK: ``GET …:subscribe``, and errors as
    ``google.rpc.Status`` with the ``ErrorInfo`` reason (HTTP+JSON) or JSON-RPC ``error``."""
    run_id = unique("a2a-raw")
    await publish(memory_bus, store, [event(run_id, 1, "run.lifecycle", {"state": "running"}),
                                      event(run_id, 2, "run.lifecycle", {"state": "done"})])
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(headers={"A2A-Version": "1.0"}) as http:
        rest = f"{edge.url}/a2a/default/rest"
        async with http.stream("GET", f"{rest}/tasks/{run_id}:subscribe",
                               headers={"A2A-Extensions": RESUME_EXTENSION}) as response:
            lines = [line async for line in response.aiter_lines() if line.startswith("data: ")]
        assert [next(iter(json.loads(line[6:]))) for line in lines] == ["task", "statusUpdate", "statusUpdate"]
        missing = await http.get(f"{rest}/tasks/no-such-task")
        assert missing.status_code == 404
        assert missing.json()["error"]["details"][0]["reason"] == "TASK_NOT_FOUND"
        rpc = await http.post(f"{edge.url}/a2a/default", json={
            "jsonrpc": "2.0", "id": 7, "method": "CancelTask", "params": {"id": run_id}})
        assert rpc.json()["id"] == 7 and rpc.json()["error"]["code"] == -32002
        old = await http.post(f"{edge.url}/a2a/default", headers={"A2A-Version": "0.3"}, json={
            "jsonrpc": "2.0", "id": 8, "method": "GetTask", "params": {"id": run_id}})
        assert old.json()["error"]["code"] == -32009
