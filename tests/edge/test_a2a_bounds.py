"""A2A at the edge, where a client can ask too much or the wrong thing: the version, bad parameter
types, bounded answers and pages, quotas, the replay log failing, and the agent's inbox."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
)
from google.protobuf.json_format import MessageToDict

from runwire.bus.base import Bus
from runwire.bus.requests import consumer_alive
from runwire.core import limits
from runwire.edge import EdgeSettings
from runwire.protocols.a2a import RESUME_EXTENSION
from runwire.sdk.tasks import PENDING_ANSWERS, A2ATask, TaskCancelled
from runwire.store.base import ReplayLog
from tests.e2e_harness import Pipeline, pipeline, unique
from tests.waiting import until

from .harness import SECRET, event, publish, serve_edge, token

V1 = {"A2A-Version": "1.0"}


def rpc(method: str, params: dict[str, Any], request_id: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


async def running(bus: Bus, store: ReplayLog, run_id: str, *more: Any) -> None:
    await publish(bus, store, [event(run_id, 1, "run.lifecycle", {"state": "running"}, thread_id="t-1"), *more])


# ---- the version ------------------------------------------------------------------------------
async def test_a_request_without_a2a_version_is_a_0_3_request_and_refused(memory_bus: Bus, store: ReplayLog) -> None:
    """The specification: an empty A2A-Version is 0.3, which this edge does not speak (its methods
    and objects are named otherwise); the version may also come as a query parameter."""
    run_id = unique("a2a-version")
    await running(memory_bus, store, run_id)
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient() as http:
        bare = await http.post(f"{edge.url}/a2a/default", json=rpc("GetTask", {"id": run_id}))
        rest = await http.get(f"{edge.url}/a2a/default/rest/tasks/{run_id}")
        query = await http.post(f"{edge.url}/a2a/default", params={"A2A-Version": "1.0"},
                                json=rpc("GetTask", {"id": run_id}))
        header = await http.get(f"{edge.url}/a2a/default/rest/tasks/{run_id}", headers=V1)
    assert bare.json()["error"]["code"] == -32009 and "0.3" in bare.json()["error"]["message"]
    assert rest.status_code == 400 and rest.json()["error"]["details"][0]["reason"] == "VERSION_NOT_SUPPORTED"
    assert query.json()["result"]["id"] == run_id
    assert header.json()["id"] == run_id


# ---- bad parameters -----------------------------------------------------------------------------
@pytest.mark.parametrize(("method", "params"), [
    ("SendMessage", {"message": {"role": "ROLE_USER", "parts": [{"text": "x"}], "contextId": 5}}),
    ("SendMessage", {"message": {"role": "ROLE_USER", "parts": [{"text": "x"}], "taskId": ["t"]}}),
    ("SendMessage", {"message": {"role": "ROLE_USER", "parts": "x"}}),
    ("SendMessage", {"message": {"role": "ROLE_USER", "parts": [{"text": "x"}]}, "configuration": []}),
    ("SendMessage", {"message": {"role": "ROLE_USER", "parts": [{"text": "x"}]}, "metadata": "m"}),
    ("ListTasks", {"status": ["TASK_STATE_WORKING"]}),
    ("ListTasks", {"status": 3}),
    ("ListTasks", {"contextId": 5}),
    ("ListTasks", {"pageToken": 5}),
    ("ListTasks", {"statusTimestampAfter": 5}),
    ("ListTasks", {"includeArtifacts": "yes"}),
    ("ListTasks", {"pageSize": True}),
    ("GetTask", {"id": "x", "historyLength": "3"}),
])
async def test_a_parameter_of_the_wrong_type_is_invalid_params_never_a_500(
    memory_bus: Bus, store: ReplayLog, method: str, params: dict[str, Any]
) -> None:
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(headers=V1) as http:
        answer = await http.post(f"{edge.url}/a2a/default", json=rpc(method, params))
    assert answer.status_code == 200
    assert answer.json()["error"]["code"] == -32602, answer.json()


# ---- bounds -------------------------------------------------------------------------------------
async def test_get_task_cuts_a_task_past_the_task_bound_and_says_so(memory_bus: Bus, store: ReplayLog) -> None:
    run_id = unique("a2a-big")
    chunk = "x" * (limits.TASK_BYTES // 2)
    await running(memory_bus, store, run_id, *(event(run_id, seq, text=chunk) for seq in range(2, 6)))
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient() as http:
        card = await A2ACardResolver(http, edge.url).get_agent_card()
        client = ClientFactory(ClientConfig(httpx_client=http)).create(card)
        task = MessageToDict(await client.get_task(GetTaskRequest(id=run_id)))
    assert len(json.dumps(task)) <= limits.TASK_BYTES + 4096
    assert task["metadata"]["runwire"]["truncated"]["artifacts"] == 1
    assert task["artifacts"][0]["parts"][0]["text"].startswith("x" * 1000)


async def test_the_first_task_of_a_subscription_is_bounded_as_get_tasks(memory_bus: Bus, store: ReplayLog) -> None:
    """``SubscribeToTask`` without the extension starts with the task so far: within the task
    bound, what was cut counted in its metadata, and its cursor where the updates go on."""
    run_id = unique("a2a-bigsub")
    chunk = "s" * (limits.TASK_BYTES // 2)
    await running(memory_bus, store, run_id, *(event(run_id, seq, text=chunk) for seq in range(2, 6)))
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(timeout=60) as http:
        card = await A2ACardResolver(http, edge.url).get_agent_card()
        client = ClientFactory(ClientConfig(httpx_client=http)).create(card)
        stream = client.subscribe(SubscribeToTaskRequest(id=run_id))
        first = MessageToDict(await anext(stream))
        await stream.aclose()
    task = first["task"]
    assert len(json.dumps(task)) <= limits.TASK_BYTES + 4096
    assert task["metadata"]["runwire"]["truncated"]["artifacts"] == 1
    assert task["artifacts"][0]["parts"][0]["text"].startswith("s" * 1000)
    assert task["metadata"][RESUME_EXTENSION]["cursor"] == "5"


class CountedReads:
    """The events the edge reads of one run from the hot tier (``bus.read``) and the replay log
    (``store.read``), and from which seq."""

    def __init__(self, bus: Bus, run_id: str, monkeypatch: pytest.MonkeyPatch, store: ReplayLog | None = None) -> None:
        self.events = 0
        self.starts: list[int] = []
        read = bus.read

        async def counted(key: Any, after: int, limit: int = 1000) -> list[Any]:
            found = await read(key, after, limit)
            if key[0] == run_id:
                self.events += len(found)
                self.starts.append(after)
            return found

        monkeypatch.setattr(bus, "read", counted)
        if store is not None:
            read_log = store.read

            async def counted_log(run: str, after: int = 0, limit: int | None = None) -> list[Any]:
                found = await read_log(run, after, limit)
                if run == run_id:
                    self.events += len(found)
                return found

            monkeypatch.setattr(store, "read", counted_log)


@pytest.mark.parametrize("hot", [True, False], ids=["hot-tier", "replay-log"])
async def test_get_task_and_list_tasks_stop_reading_a_run_at_the_task_bound(
    memory_bus: Bus, store: ReplayLog, monkeypatch: pytest.MonkeyPatch, hot: bool
) -> None:
    """A run far past the task bound is read only until the answer is full — from the hot tier, or
    from the replay log when the hot tier kept only the run's end (the shaped view recomputed as
    far as needed): the task says how many events it left unread after its cursor, and its status
    is where the run stands (its end)."""
    monkeypatch.setattr(limits, "TASK_BYTES", 20_000)
    run_id = unique("a2a-long")
    last = 800
    events = [event(run_id, 1, "run.lifecycle", {"state": "running"}, thread_id="t-1"),
              *(event(run_id, seq, text="r" * 1000) for seq in range(2, last)),
              event(run_id, last, "run.lifecycle", {"state": "done"})]
    if hot:
        await publish(memory_bus, store, events)
    else:  # the hot tier trimmed to the run's last events
        await store.append(events)
        await publish(memory_bus, store, events[-3:])
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(timeout=60) as http:
        card = await A2ACardResolver(http, edge.url).get_agent_card()
        client = ClientFactory(ClientConfig(httpx_client=http)).create(card)
        reads = CountedReads(memory_bus, run_id, monkeypatch, store)
        task = MessageToDict(await client.get_task(GetTaskRequest(id=run_id)))
        read_for_get, reads.events = reads.events, 0
        listed = MessageToDict(await client.list_tasks(ListTasksRequest(include_artifacts=True)))
    runwire = task["metadata"]["runwire"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert runwire["seq"] + runwire["truncated"]["events"] == last
    assert len(json.dumps(task)) <= 20_000 + 4096
    assert read_for_get < last // 2 and reads.events < last // 2, (read_for_get, reads.events)
    [mine] = [t for t in listed["tasks"] if t["id"] == run_id]
    assert mine["status"]["state"] == "TASK_STATE_COMPLETED" and mine["metadata"]["runwire"]["truncated"]["events"]


async def test_a_blocking_message_waits_on_the_runs_feed_without_reading_the_run_again(
    memory_bus: Bus, store: ReplayLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A blocking ``SendMessage`` (an answer on a task that asked) is a client of the run's feed in
    the hub while it waits: it returns when the task asks again, and reads nothing of the run
    from its start meanwhile."""
    run_id = unique("a2a-wait")
    await running(memory_bus, store, run_id, event(run_id, 2, text="thinking"),
                  event(run_id, 3, "run.lifecycle", {"state": "awaiting_approval", "reason": "which city?"}))
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(headers=V1, timeout=60) as http:
        answer = asyncio.create_task(http.post(f"{edge.url}/a2a/default", json=rpc("SendMessage", {
            "message": {"messageId": "m1", "role": "ROLE_USER", "taskId": run_id, "parts": [{"text": "Oslo"}]}})))
        await until(lambda: edge.live_clients(run_id) > 0, within=30, what="the blocking call on the run's feed")
        reads = CountedReads(memory_bus, run_id, monkeypatch)
        await publish(memory_bus, store, [event(run_id, 4, "run.lifecycle", {"state": "running"}),
                                          event(run_id, 5, text="booked "),
                                          event(run_id, 6, "run.lifecycle", {"state": "awaiting_approval",
                                                                             "reason": "which hotel?"})])
        task = (await answer).json()["result"]["task"]
        await until(lambda: edge.live_clients(run_id) == 0, within=30, what="the call off the feed")
    assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert task["status"]["message"]["parts"][0]["text"] == "which hotel?"
    assert 0 not in reads.starts, "the run was read again from its start while the call waited"


async def test_a_blocking_message_outlives_a_burst_past_its_queue(memory_bus: Bus, store: ReplayLog) -> None:
    """A burst of events past the waiting call's queue on the feed (which it does not need: it looks
    at the feed's task) leaves it a fresh queue that waits, and it answers when the task asks again."""
    run_id = unique("a2a-burst")
    await running(memory_bus, store, run_id,
                  event(run_id, 2, "run.lifecycle", {"state": "awaiting_approval", "reason": "which city?"}))
    settings = EdgeSettings(client_queue_events=2)
    async with serve_edge(memory_bus, store, settings) as edge, httpx.AsyncClient(headers=V1, timeout=60) as http:
        answer = asyncio.create_task(http.post(f"{edge.url}/a2a/default", json=rpc("SendMessage", {
            "message": {"messageId": "m1", "role": "ROLE_USER", "taskId": run_id, "parts": [{"text": "Oslo"}]}})))
        await until(lambda: edge.live_clients(run_id) > 0, within=30, what="the blocking call on the run's feed")
        await publish(memory_bus, store, [event(run_id, 3, "run.lifecycle", {"state": "running"}),
                                          *(event(run_id, seq, "tool.start", {"call_id": f"c{seq}", "tool": "t"}) for seq in range(4, 20))])

        def waiting_fresh() -> bool:
            """The burst reached the feed, and the call waits on a queue that has not overflowed."""
            feeds = [feed for (run, _), stream in edge.edge.hub.streams.items() if run == run_id
                     for feed in stream.feeds.values()]
            clients = [client for feed in feeds for client in feed.clients]
            return (any(feed.position >= 19 for feed in feeds) and bool(clients)
                    and not any(client.overflowed for client in clients))

        await until(waiting_fresh, within=30, what="the call waiting on a queue that did not overflow")
        await publish(memory_bus, store, [event(run_id, 20, "run.lifecycle", {"state": "awaiting_approval",
                                                                              "reason": "which hotel?"})])
        task = (await answer).json()["result"]["task"]
    assert task["status"]["message"]["parts"][0]["text"] == "which hotel?"


async def test_list_tasks_total_size_counts_every_task_the_filters_match(memory_bus: Bus, store: ReplayLog) -> None:
    """``totalSize`` is how many tasks match the request's filters (every page alike), not the page's."""
    thread = unique("ctx")
    done = [unique(f"a2a-tdone{n}") for n in range(5)]
    for run_id in done:
        await publish(memory_bus, store, [event(run_id, 1, "run.lifecycle", {"state": "running"}, thread_id=thread),
                                          event(run_id, 2, "run.lifecycle", {"state": "done"}, thread_id=thread)])
    for n in range(2):
        await publish(memory_bus, store, [event(unique(f"a2a-twork{n}"), 1, "run.lifecycle", {"state": "running"},
                                                thread_id=thread)])
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(headers=V1) as http:

        async def pages(params: dict[str, Any]) -> list[dict[str, Any]]:
            found, token_ = [], ""
            while True:
                page = (await http.post(f"{edge.url}/a2a/default", json=rpc("ListTasks", {
                    **params, "contextId": thread, "pageSize": 2, "pageToken": token_}))).json()["result"]
                found.append(page)
                token_ = page["nextPageToken"]
                if not token_:
                    return found

        every = await pages({})
        completed = await pages({"status": "TASK_STATE_COMPLETED"})
        working = await pages({"status": "TASK_STATE_WORKING"})
    assert [page["totalSize"] for page in every] == [7] * 4
    assert [page["totalSize"] for page in completed] == [5] * 3
    assert {page["totalSize"] for page in working} == {2}
    assert sum(len(page["tasks"]) for page in every) == 7


async def test_list_tasks_pages_end_before_the_page_bound_and_go_on_with_their_token(
    memory_bus: Bus, store: ReplayLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "TASK_PAGE_BYTES", 100_000)
    run_ids = [unique(f"a2a-page{n}") for n in range(5)]
    for run_id in run_ids:
        await running(memory_bus, store, run_id, event(run_id, 2, text="y" * 40_000))
    seen: list[str] = []
    pages = 0
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(headers=V1) as http:
        token_ = ""
        while True:
            page = (await http.post(f"{edge.url}/a2a/default", json=rpc("ListTasks", {
                "includeArtifacts": True, "pageSize": 100, "pageToken": token_}))).json()["result"]
            pages += 1
            assert len(json.dumps(page)) <= 100_000 + 50_000  # one task may pass what is left, never more
            seen += [task["id"] for task in page["tasks"]]
            token_ = page["nextPageToken"]
            if not token_:
                break
    assert sorted(seen) == sorted(run_ids) and pages >= 2


async def test_list_tasks_with_a_status_filter_pages_through_every_task_once(memory_bus: Bus, store: ReplayLog) -> None:
    """Pages follow the list's own order (last update, then id) with any filter: a run updated after
    newer runs were made is neither lost nor given twice."""
    done = [unique(f"a2a-done{n}") for n in range(4)]
    working = [unique(f"a2a-work{n}") for n in range(3)]
    for n, run_id in enumerate(done):
        await publish(memory_bus, store, [event(run_id, 1, "run.lifecycle", {"state": "running"}),
                                          event(run_id, 2, "run.lifecycle", {"state": "done"})])
        if n < len(working):
            await running(memory_bus, store, working[n])
    other = unique("a2a-other")
    await running(memory_bus, store, other)
    await publish(memory_bus, store, [event(working[0], 2, "text.delta", text="later")])  # the oldest, updated last
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(headers=V1) as http:

        async def every(status: str) -> list[str]:
            found: list[str] = []
            token_ = ""
            while True:
                page = (await http.post(f"{edge.url}/a2a/default", json=rpc("ListTasks", {
                    "status": status, "pageSize": 2, "pageToken": token_}))).json()["result"]
                found += [task["id"] for task in page["tasks"]]
                token_ = page["nextPageToken"]
                if not token_:
                    return found

        completed = await every("TASK_STATE_COMPLETED")
        busy = await every("TASK_STATE_WORKING")
    assert sorted(completed) == sorted(done)
    assert sorted(busy) == sorted([*working, other]), "every working task once"


async def test_an_answer_is_bounded_by_the_control_limit(memory_bus: Bus, store: ReplayLog) -> None:
    run_id = unique("a2a-answer")
    await running(memory_bus, store, run_id)

    def answer(size: int) -> dict[str, Any]:
        return rpc("SendMessage", {"message": {"messageId": "m1", "role": "ROLE_USER", "taskId": run_id,
                                               "parts": [{"text": "z" * size}]},
                                   "configuration": {"returnImmediately": True}})

    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(headers=V1) as http:
        big = await http.post(f"{edge.url}/a2a/default", json=answer(limits.CONTROL_BYTES + 1))
        small = await http.post(f"{edge.url}/a2a/default", json=answer(1000))
    assert big.status_code == 413
    assert small.json()["result"]["task"]["id"] == run_id


async def test_the_replay_log_failing_is_the_internal_error_and_503(memory_bus: Bus, store: ReplayLog) -> None:
    async with serve_edge(memory_bus, store) as edge, httpx.AsyncClient(headers=V1) as http:
        await store.close()
        rpc_answer = await http.post(f"{edge.url}/a2a/default", json=rpc("ListTasks", {}))
        rest_answer = await http.get(f"{edge.url}/a2a/default/rest/tasks")
    assert rpc_answer.json()["error"]["code"] == -32603
    assert rest_answer.status_code == 503 and rest_answer.json()["error"]["status"] == "UNAVAILABLE"


# ---- sending, with an agent in this process -------------------------------------------------------
@pytest.fixture
async def secured(redis_url: str, tmp_path: Path) -> AsyncIterator[Pipeline]:
    settings = EdgeSettings(secret=SECRET, streams_per_token=1, long_poll_s=60.0, webhooks_allow_private=False)
    async with pipeline(redis_url, f"sqlite:///{tmp_path / 'replay.db'}", settings) as running_:
        yield running_


async def inbox(p: Pipeline, agent: str, tasks: list[A2ATask], outcomes: list[str],
                ready: asyncio.Event | None = None) -> None:
    """An agent: each task asks once (once ``ready`` is set); a cancel while it asks ends the task ``aborted``."""

    async def handle(task: A2ATask) -> None:
        try:
            if ready is not None:
                await ready.wait()
            outcomes.append(await task.ask("Which city?"))
            await task.finish()
        except TaskCancelled:
            outcomes.append("cancelled")
            await task.finish("aborted", "cancelled while asking")

    handlers: set[asyncio.Task[None]] = set()
    async for task in p.publisher.tasks(agent, ttl_s=3.0):
        tasks.append(task)
        handler = asyncio.create_task(handle(task))
        handlers.add(handler)
        handler.add_done_callback(handlers.discard)


def user(text: str) -> SendMessageRequest:
    return SendMessageRequest(message=Message(message_id=unique("m"), role=Role.ROLE_USER, parts=[Part(text=text)]))


async def test_a_blocking_message_holds_a_stream_and_an_ask_is_woken_by_a_cancel(secured: Pipeline) -> None:
    """A blocking ``SendMessage`` waits holding one of the token's streams (a second stream of the
    token is refused, 429); the agent's ``ask`` is woken by ``CancelTask``; the task's history
    starts with the client's message."""
    p = secured
    tasks: list[A2ATask] = []
    outcomes: list[str] = []
    checked = asyncio.Event()
    agent = asyncio.create_task(inbox(p, "asker", tasks, outcomes, checked))
    bearer = token("A", "read", "write", "control")
    try:
        await until(lambda: consumer_alive(p.bus, "asker"), within=30, what="the agent announced")
        async with httpx.AsyncClient(headers={"authorization": f"Bearer {bearer}", **V1}, timeout=90) as http:
            card = await A2ACardResolver(http, f"{p.edge.url}/a2a/asker").get_agent_card()
            client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
            blocking = asyncio.create_task(anext(client.send_message(user("book it"))))
            await until(lambda: bool(tasks), within=30, what="the task at the agent")
            task_id = tasks[0].task_id
            async with http.stream("GET", f"{p.edge.url}/v1/runs/{task_id}/stream") as other:
                assert other.status_code == 429, "the blocking call holds the token's one stream"
            checked.set()
            answered = MessageToDict((await blocking).task)  # it returns once the task asks
            assert answered["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
            assert answered["history"][0]["role"] == "ROLE_USER"
            assert answered["history"][0]["parts"][0]["text"] == "book it"
            await client.cancel_task(CancelTaskRequest(id=task_id))
            await until(lambda: outcomes == ["cancelled"], within=30, what="the ask woken by the cancel")
            await until(lambda: _state(client, task_id, "TASK_STATE_CANCELED"), within=30, what="the task ended")
            done = MessageToDict(await client.get_task(GetTaskRequest(id=task_id)))
        assert [m["role"] for m in done["history"]][:2] == ["ROLE_USER", "ROLE_AGENT"]
    finally:
        agent.cancel()


async def _state(client: Any, task_id: str, state: str) -> bool:
    task = MessageToDict(await client.get_task(GetTaskRequest(id=task_id)))
    return bool(task["status"]["state"] == state)


async def test_a_push_config_that_is_refused_sends_no_task(secured: Pipeline) -> None:
    """The push config of a ``SendMessage`` is made before the message goes out: one that is refused
    (a loopback URL) leaves the agent without the task, so no first notice can precede a config."""
    p = secured
    tasks: list[A2ATask] = []
    agent = asyncio.create_task(inbox(p, "pushy", tasks, []))
    bearer = token("A", "read", "write", "control")
    try:
        await until(lambda: consumer_alive(p.bus, "pushy"), within=30, what="the agent announced")
        async with httpx.AsyncClient(headers={"authorization": f"Bearer {bearer}", **V1}) as http:
            refused = await http.post(f"{p.edge.url}/a2a/pushy", json=rpc("SendMessage", {
                "message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "first"}]},
                "configuration": {"returnImmediately": True, "taskPushNotificationConfig": {
                    "url": "http://127.0.0.1:9/hook"}}}))
            sent = await http.post(f"{p.edge.url}/a2a/pushy", json=rpc("SendMessage", {
                "message": {"messageId": "m2", "role": "ROLE_USER", "parts": [{"text": "second"}]},
                "configuration": {"returnImmediately": True}}))
            await until(lambda: bool(tasks), within=30, what="the second task at the agent")
        assert "error" in refused.json() or refused.status_code >= 400
        assert sent.json()["result"]["task"]["id"]
        assert [task.text for task in tasks] == ["second"], "the refused message never reached the agent"
    finally:
        agent.cancel()


async def test_answers_nobody_asked_for_are_kept_up_to_a_bound(secured: Pipeline) -> None:
    """A task that does not ask keeps the latest ``PENDING_ANSWERS`` answers a client sends (the
    oldest go); its next ``ask`` gets the oldest kept, and that answer is the task's history."""
    p = secured
    tasks: list[A2ATask] = []
    asked = asyncio.Event()
    outcomes: list[str] = []

    async def agent() -> None:
        async for task in p.publisher.tasks("patient", ttl_s=3.0):
            tasks.append(task)
            await asked.wait()
            outcomes.append(await task.ask("which?"))
            await task.finish()

    running_agent = asyncio.create_task(agent())
    bearer = token("A", "read", "write", "control")
    try:
        await until(lambda: consumer_alive(p.bus, "patient"), within=30, what="the agent announced")
        async with httpx.AsyncClient(headers={"authorization": f"Bearer {bearer}", **V1}, timeout=60) as http:

            async def send(text: str, task_id: str | None = None) -> dict[str, Any]:
                message = {"messageId": unique("m"), "role": "ROLE_USER", "parts": [{"text": text}]}
                if task_id:
                    message["taskId"] = task_id
                answer = await http.post(f"{p.edge.url}/a2a/patient", json=rpc(
                    "SendMessage", {"message": message, "configuration": {"returnImmediately": True}}))
                return dict(answer.json()["result"]["task"])

            task_id = (await send("book it"))["id"]
            await until(lambda: bool(tasks), within=30, what="the task at the agent")
            sent = PENDING_ANSWERS + 4
            for n in range(sent):
                await send(f"a{n}", task_id)
            await until(lambda: tasks[0].answers_received == sent, within=30, what="every answer at the task")
            asked.set()
            await until(lambda: bool(outcomes), within=30, what="the ask answered")
            card = await A2ACardResolver(http, f"{p.edge.url}/a2a/patient").get_agent_card()
            client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
            await until(lambda: _state(client, task_id, "TASK_STATE_COMPLETED"), within=30, what="the task ended")
            done = MessageToDict(await client.get_task(GetTaskRequest(id=task_id)))
        assert outcomes == ["a4"], "the oldest four went; the oldest kept is the first taken"
        users = [m["parts"][0]["text"] for m in done["history"] if m["role"] == "ROLE_USER"]
        assert users == ["book it", "a4"]
    finally:
        running_agent.cancel()
