"""Run trees across services (Koder agent stream §3.6: child events appear in the parent stream
with ``child_id`` set — for every ancestor up to the root).

A grandchild named by its parent's *id* — as a sub-agent in another service knows it — must still
reach the root's stream: the publisher infers the root of runs it started, and a context token
(``run.context()``, or the ``Runwire-Run-Context`` header on HTTP ingest) carries the tree to
another service.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx
import msgspec
import pytest

from runwire.bus import Bus, open_bus
from runwire.core import envelope
from runwire.core.errors import RequestError
from runwire.sdk.publisher import Publisher
from runwire.sdk.runcontext import RunContext
from runwire.store import ReplayLog, open_store
from runwire.workers.runtime import run_worker
from tests.edge.harness import decoded, read_sse, serve_edge
from tests.workers.checks import read_all
from tests.workers.events import RunScript


def ids() -> tuple[str, str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"root-{tag}", f"child-{tag}", f"grand-{tag}"


async def origins(bus: Bus, run_id: str) -> list[str]:
    """Which run each event of a stream came from."""
    return [e.child_id or e.run_id for e in await read_all(bus, run_id)]


async def test_a_grandchild_named_by_its_parents_id_reaches_the_root(
    redis_bus: Bus, store: ReplayLog
) -> None:
    root_id, child_id, grand_id = ids()
    async with Publisher(redis_bus) as pub:
        root = pub.run(root_id, tenant="acme")
        child = pub.run(child_id, parent=root)
        grand = pub.run(grand_id, parent=child_id)  # a plain id, no root given
        for run in (root, child, grand):
            await run.emit("text.delta", {"text": run.run_id})
        for run in (grand, child, root):
            await run.finish()
    assert (grand.root_id, grand.tenant) == (root_id, "acme")
    await run_worker(redis_bus, store, group="g", name="w", burst=True)
    assert (await origins(redis_bus, root_id)).count(grand_id) == 2
    assert (await origins(redis_bus, child_id)).count(grand_id) == 2


async def test_a_context_token_carries_the_tree_to_another_service(
    redis_bus: Bus, store: ReplayLog
) -> None:
    root_id, child_id, grand_id = ids()
    async with Publisher(redis_bus) as service_a, Publisher(redis_bus) as service_b:
        root = service_a.run(root_id, tenant="acme")
        child = service_a.run(child_id, parent=root)
        token = child.context()
        grand = service_b.run(grand_id, context=token)  # knows nothing but the token
        for run in (root, child, grand):
            await run.emit("text.delta", {"text": run.run_id})
        await grand.finish()
        await child.finish()
        await root.finish()
    assert (grand.parent_id, grand.root_id, grand.tenant) == (child_id, root_id, "acme")
    await run_worker(redis_bus, store, group="g", name="w", burst=True)
    assert (await origins(redis_bus, root_id)).count(grand_id) == 2
    assert (await origins(redis_bus, child_id)).count(grand_id) == 2
    assert (await origins(redis_bus, grand_id)) == [grand_id, grand_id]


async def test_http_ingest_takes_the_tree_from_the_run_context_header(
    redis_bus: Bus, store: ReplayLog
) -> None:
    root_id, child_id, grand_id = ids()
    root = RunScript(root_id)
    child = RunScript(child_id, parent=root_id)
    await redis_bus.publish([root.lifecycle("running"), child.lifecycle("running")])
    token = RunContext(run=child_id, root=root_id).token()
    grand = RunScript(grand_id)  # what an agent in another service posts: no parent, no root
    body = b"\n".join(envelope.encode(e) for e in [grand.text("hello"), grand.lifecycle("done")])
    async with serve_edge(redis_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        url = f"{edge.url}/v1/runs/{grand_id}/events"
        response = await http.post(url, content=body, headers={"Runwire-Run-Context": token})
        refused = await http.post(url, content=body, headers={"Runwire-Run-Context": "rw1.????"})
    assert response.status_code == 200, response.text
    assert refused.status_code == 400 and refused.json()["code"] == "KAI-STREAM-REQ-0001"
    await run_worker(redis_bus, store, group="g", name="w", burst=True)
    assert (await origins(redis_bus, root_id)).count(grand_id) == 2
    assert (await origins(redis_bus, child_id)).count(grand_id) == 2


@pytest.mark.parametrize("token", ["", "rw1.", "rw2.eyJydW4iOiJjIn0", "rw1.eyJydW4iOjF9",
                                   "rw1.eyJydW4iOiJjIiwiZXZpbCI6MX0", "rw1." + "A" * 5000])
def test_a_malformed_context_token_is_a_request_error(token: str) -> None:
    with pytest.raises(RequestError) as refused:
        RunContext.parse(token)
    assert refused.value.code == "KAI-STREAM-REQ-0001"


def test_a_context_token_round_trips() -> None:
    context = RunContext(run="c", root="r", tenant="acme")
    assert RunContext.parse(context.token()) == context
    assert RunContext.parse(RunContext(run="r").token()).root_id == "r"


async def test_replay_play_replays_the_whole_tree_event_for_event(
    redis_bus: Bus, store: ReplayLog, tmp_path: Path
) -> None:
    """A played run matches the original: children re-published as children of the played root,
    their ids derived from ``--as``."""
    from runwire.jobs.replay import play_run
    from tests.workers.checks import run_tree

    prefix = f"t{uuid.uuid4().hex[:8]}"
    events, _ancestry = run_tree(prefix)
    await redis_bus.publish(events)
    await run_worker(redis_bus, store, group="g", name="w", burst=True)
    root = f"{prefix}_root"
    original = await store.read(root, limit=100_000)
    assert len(original) == len(events)  # the root's stream holds the whole tree
    async with open_bus("memory://") as target, open_store(f"sqlite:///{tmp_path / 'p.db'}") as played_log:
        sent = await play_run(store, target, root, as_run="copy", speed=0)
        assert sent == len(original)
        await run_worker(target, played_log, group="g", name="w", burst=True)
        played = await played_log.read("copy", limit=100_000)
        grand = await played_log.read(f"copy.{prefix}_g", limit=100_000)

    def shape(event: object, rename: dict[str, str]) -> tuple[object, ...]:
        payload = event.payload_dict()  # type: ignore[attr-defined]
        if "child_id" in payload:
            payload = {**payload, "child_id": rename.get(payload["child_id"], payload["child_id"])}
        child = event.child_id  # type: ignore[attr-defined]
        return (event.type, rename.get(child, child), payload)  # type: ignore[attr-defined]

    # ids under the root's own (``<root>-x``) would become ``copy-x``; these are not, so ``copy.<id>``
    rename = {run: "copy" if run == root else f"copy.{run}" for run in {e.run_id for e in events}}
    assert [shape(e, rename) for e in played] == [shape(e, rename) for e in original]
    assert grand and all(e.parent_id == f"copy.{prefix}_c0" and e.root_id == "copy" for e in grand)


async def test_an_event_naming_a_child_as_its_root_is_rerouted_to_the_true_root(
    redis_bus: Bus, store: ReplayLog
) -> None:
    """An older or foreign publisher claims the parent as root: the worker knows (from the parent's
    checkpoint) that the parent is a child, and re-publishes the events to the true root's shard —
    the tree is repaired, not split, and every stream gets them exactly once."""
    root_id, child_id, grand_id = ids()
    root, child = RunScript(root_id), RunScript(child_id, parent=root_id)
    await redis_bus.publish([root.lifecycle("running"), root.spawn(child_id), child.lifecycle("running")])
    await run_worker(redis_bus, store, group="g", name="w", burst=True)
    grand = RunScript(grand_id, parent=child_id)  # root_id = the parent: the claim of the bug
    assert grand.text("x").root_id == child_id
    grand.seq = 0
    await redis_bus.publish([grand.text("one"), grand.text("two"), grand.lifecycle("done")])
    stats = await run_worker(redis_bus, store, group="g", name="w", burst=True)
    assert stats.rerouted == 3 and stats.dead_lettered == 0
    assert (await origins(redis_bus, root_id)).count(grand_id) == 3
    assert (await origins(redis_bus, child_id)).count(grand_id) == 3
    assert (await origins(redis_bus, grand_id)) == [grand_id] * 3
    assert [e.root_id for e in await read_all(redis_bus, grand_id)] == [root_id] * 3


def frames_with_nulls(run_id: str) -> list[dict[str, object]]:
    """A run as an agent sends it: explicit nulls (``child_id`` as in the envelope example of the
    Koder agent stream §2, optional payload fields) next to fields left out."""
    base = {"ts": "2026-01-01T00:00:00.000Z", "run_id": run_id}
    payloads: list[tuple[str, dict[str, object], dict[str, object]]] = [
        ("run.lifecycle", {"state": "running", "reason": None}, {"child_id": None}),
        ("tool.start", {"call_id": "c1", "tool": "search", "input": None, "skill_id": None}, {"child_id": None}),
        ("tool.end", {"call_id": "c1", "ok": False, "output": None, "error": None, "duration_ms": None,
                      "blob_ref": None}, {}),
        ("step.boundary", {"step_index": 1, "step_kind": "tool-roundtrip", "checkpoint_id": None}, {}),
        ("text.delta", {"text": "done"}, {}),
        ("run.lifecycle", {"state": "done", "reason": None, "dropped_count": None}, {"child_id": None}),
    ]
    return [{"id": f"{run_id}-{seq}", **base, "type": kind, "seq": seq, **extra, "payload": payload}
            for seq, (kind, payload, extra) in enumerate(payloads, 1)]


@pytest.mark.parametrize("detail", ["full", "shaped"])
async def test_explicit_nulls_reach_koder_clients_as_sent(
    redis_bus: Bus, store: ReplayLog, detail: str
) -> None:
    """Payloads reach clients as agents sent them, nulls included, in the canonical format:
    a ``"child_id": null`` or ``"reason": null`` comes out as null, a field left out stays out
    (publish over HTTP ingest → worker → edge SSE, Redis between them)."""
    run_id = ids()[0]
    sent = frames_with_nulls(run_id)
    body = b"\n".join(msgspec.json.encode(frame) for frame in sent)
    async with serve_edge(redis_bus, store) as edge, httpx.AsyncClient(timeout=10) as http:
        posted = await http.post(f"{edge.url}/v1/runs/{run_id}/events", content=body)
        assert posted.status_code == 200, posted.text
        await run_worker(redis_bus, store, group="g", name="w", burst=True)
        url = f"{edge.url}/v1/runs/{run_id}/stream?format=koder&detail={detail}"
        async with http.stream("GET", url) as response:
            got = decoded((await asyncio.wait_for(read_sse(response), 10))[0])
    if detail == "shaped":  # a shaped delta names the raw seqs it covers (§4 R1), nothing else changes
        sent[4]["span"] = [5, 5]
    assert got == sent
