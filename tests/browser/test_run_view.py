"""The page in headless Chromium on the whole pipeline: publisher SDK → real Redis → workers →
replay log → edge → the page. Runs of three levels (``agents.Agent``), auth on and off."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from runwire.edge import EdgeSettings
from runwire.edge.http import runlog
from runwire.edge.service.auth import issue_token
from tests.browser.agents import Agent, big_run, expected, publish_big
from tests.browser.browser import Browser, BrowserMissing, browser
from tests.e2e_harness import pipeline, unique, wait_for_terminal

pytestmark = pytest.mark.slow
SECRET = "a page test secret of at least thirty-two bytes"
RENDERED = ("window.runView && runView.stats.ended && runView.stats.renderedSeq === runView.model.lastSeq"
            " && runView.stats.renderedSpansSeq >= runView.model.lastSeq")
"""Everything the stream brought is drawn, the timeline too (from the run's spans)."""
LONG_RUN_WAIT_S = 120
"""How long the test waits for the 10,000-event run to be drawn before calling the page stuck; how fast it
is drawn, and the longest main-thread task, are measured by ``bench/page.py`` (docs/benchmarks.md)."""


@contextlib.asynccontextmanager
async def page() -> AsyncIterator[Browser]:
    try:
        async with browser() as opened:
            yield opened
    except BrowserMissing as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
async def agents() -> AsyncIterator[list[asyncio.Task[str]]]:
    """Agent runs started by a test; whatever is still going when it ends is cancelled."""
    started: list[asyncio.Task[str]] = []
    yield started
    for task in started:
        task.cancel()
    await asyncio.gather(*started, return_exceptions=True)


def start(agents: list[asyncio.Task[str]], agent: Agent) -> asyncio.Task[str]:
    task = asyncio.create_task(agent.run())
    agents.append(task)
    return task


def js(value: object) -> str:
    return json.dumps(value)


async def tree_of(page: Browser) -> dict[str, str]:
    """run id → the run id of the treeitem it is nested in ("" for the top)."""
    result: dict[str, str] = await page.eval(
        "Object.fromEntries([...document.querySelectorAll('#tree [role=treeitem]')].map((li) =>"
        " [li.dataset.run, li.parentElement.closest('[role=treeitem]')?.dataset.run ?? '']))"
    )
    return result


async def select(page: Browser, run_id: str) -> None:
    await page.click(f'#tree [data-run={js(run_id)}] > .tree-row')
    await page.wait(f"document.querySelector('#detail h2').title === {js(run_id)}")


async def test_the_run_view_shows_tree_timeline_plan_and_usage_live_with_auth_on(
    redis_url: str, tmp_path: Path, agents: list[asyncio.Task[str]]
) -> None:
    settings = EdgeSettings(secret=SECRET)
    token = issue_token(SECRET, tenant="acme", scopes=["read"])
    async with pipeline(redis_url, f"sqlite:///{tmp_path / 'r.db'}", settings) as pipe, page() as chromium:
        root = unique("research")
        want = expected(root)
        hold = asyncio.Event()
        agent = start(agents, Agent(pipe.publisher, root, hold=hold, tenant="acme", pace=1.0))
        await chromium.goto(f"{pipe.edge.url}/runs/{root}?access_token={token}")
        # the tree nests children and grandchildren as they appear, without a reload
        await chromium.wait(f"document.querySelectorAll('#tree [role=treeitem]').length === {len(want.runs)}")
        await chromium.eval("window.__sameDocument = true")
        assert await tree_of(chromium) == want.runs
        assert await chromium.eval(f"document.querySelector('#tree [data-run={js(root + '.logs.grep')}]')"
                                   ".getAttribute('aria-level')") == "3"
        # while held, the run is live: its bar is open and growing
        await chromium.wait(f"document.querySelectorAll('.lane-tool:not(.open) .bar').length === {len(want.tools)}"
                            " && document.querySelectorAll('.lane-tool .bar.open').length === 0")
        assert await chromium.eval("document.getElementById('state').dataset.state") == "running"
        grown = f"Number(document.querySelector('.lane-run[data-run={js(root)}] .bar').style.getPropertyValue('--d'))"
        before = await chromium.eval(grown)
        await chromium.wait(f"{grown} > {before} + 200")
        assert await chromium.open_streams() == 1  # one stream per open run, sub-runs included
        # a bar per tool call, in the order of their durations; the failing one marked in words too
        bars = await chromium.eval(
            "[...document.querySelectorAll('.lane-tool')].map((l) => ({run: l.dataset.run, tool: l.dataset.tool,"
            " ok: l.dataset.ok, width: l.querySelector('.bar').getBoundingClientRect().width,"
            " ms: Number(l.querySelector('.bar').dataset.ms), text: l.innerText}))"
        )
        assert sorted((b["run"], b["tool"]) for b in bars) == sorted((t[0], t[1]) for t in want.tools)
        # each bar is as long as the call took by its events' times (the agent took at least what it says)
        took = {t[1]: t[2] for t in want.tools}
        assert all(b["ms"] >= took[b["tool"]] for b in bars), [(b["tool"], b["ms"], took[b["tool"]]) for b in bars]
        assert [b["tool"] for b in sorted(bars, key=lambda b: b["width"])] == \
            [b["tool"] for b in sorted(bars, key=lambda b: b["ms"])]
        failed = [b for b in bars if b["ok"] == "false"]
        assert [b["tool"] for b in failed] == ["fetch_dashboard"]
        assert "failed" in failed[0]["text"]
        assert await chromium.eval("document.querySelector('details.tool.failed .tool-meta').textContent") == \
            "failed 160 ms"
        # the plan's steps
        steps = await chromium.eval("[...document.querySelectorAll('.plan-steps li')].map((li) =>"
                                    " [li.querySelector('.intent').textContent, li.querySelector('.step-title').textContent])")
        assert steps == [["research", "Measure p99 latency"], ["execute", "Ask sub-agents to inspect logs and deploys"],
                         ["report", "Write up the findings"]]
        # a read-only token: the page offers no control it would be refused
        assert await chromium.eval("document.querySelector('button[data-command=cancel]').disabled") is True
        # let the run finish: the page follows without a reload
        hold.set()
        assert await agent == "done"
        await chromium.wait(RENDERED)
        assert await chromium.eval("window.__sameDocument") is True
        assert await chromium.eval("document.getElementById('state').dataset.state") == "done"
        assert await chromium.eval("document.getElementById('outcome').dataset.dropped") == "0"
        assert "0 events dropped" in await chromium.eval("document.getElementById('outcome').innerText")
        # usage totals: the whole tree in the header, each run and subtree in its detail
        totals = await chromium.eval("({...document.getElementById('totals').dataset})")
        assert (int(totals["input"]), int(totals["output"])) == want.tree_usage()
        for run_id, (inp, out) in want.usage.items():
            await select(chromium, run_id)
            own = await chromium.eval("({...document.querySelector('dd[data-usage=own]').dataset})")
            assert (int(own["input"]), int(own["output"])) == (inp, out), run_id
        await select(chromium, root + ".logs")
        subtree = await chromium.eval("({...document.querySelector('dd[data-usage=tree]').dataset})")
        assert (int(subtree["input"]), int(subtree["output"])) == (800 + 300, 190 + 75)
        assert await chromium.open_streams() == 0  # the finished run holds no connection


async def test_the_tree_is_driven_by_keyboard_and_every_state_is_told_in_words(redis_url: str, tmp_path: Path) -> None:
    async with pipeline(redis_url, f"sqlite:///{tmp_path / 'r.db'}") as pipe, page() as chromium:
        root = unique("keys")
        assert await Agent(pipe.publisher, root).run() == "done"
        await wait_for_terminal(pipe.store, root)
        await chromium.goto(f"{pipe.edge.url}/runs/{root}")
        await chromium.wait(RENDERED)
        selected = "document.querySelector('#tree [aria-selected=true]').dataset.run"
        focused = "document.activeElement.dataset.run"
        await chromium.focus(f"#tree [data-run={js(root)}]")
        for key, want in (("ArrowDown", ".logs"), ("ArrowRight", ".logs.grep"), ("ArrowDown", ".deploys"),
                          ("ArrowUp", ".logs.grep"), ("ArrowLeft", ".logs"), ("ArrowLeft", ".logs"),
                          ("ArrowDown", ".deploys"), ("Home", ""), ("End", ".deploys")):
            await chromium.press(key)
            assert (await chromium.eval(selected), await chromium.eval(focused)) == (root + want, root + want), key
        # .logs was folded by the second ArrowLeft: its sub-run is hidden, and shown again by ArrowRight
        await chromium.press("ArrowUp")
        assert await chromium.eval(f"document.querySelector('#tree [data-run={js(root + '.logs')}]')"
                                   ".getAttribute('aria-expanded')") == "false"
        await chromium.press("ArrowRight")
        assert await chromium.eval(f"document.querySelector('#tree [data-run={js(root + '.logs')}]')"
                                   ".getAttribute('aria-expanded')") == "true"
        # a tool call's bar opens its card, in its run's detail
        await chromium.click(".lane-tool[data-tool=grep]")
        await chromium.wait(f"document.querySelector('#detail h2').title === {js(root + '.logs.grep')}")
        assert await chromium.eval("document.querySelector('#detail details.tool[data-call=call-grep-0]').open") is True
        # no information by colour alone: each badge says its state in words; text contrast ≥ 4.5:1
        badges = await chromium.eval("[...document.querySelectorAll('.badge[data-state]')].map((b) =>"
                                     " [b.dataset.state, b.textContent])")
        assert badges and all(state.replace("_", " ") in text for state, text in badges)
        lowest = await chromium.eval(CONTRAST)
        assert lowest >= 4.5, lowest


CONTRAST = """(() => {
  const rgb = (c) => c.match(/[\\d.]+/g).slice(0, 3).map(Number);
  const lum = (c) => { const v = rgb(c).map((x) => { x /= 255; return x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4; });
    return 0.2126 * v[0] + 0.7152 * v[1] + 0.0722 * v[2]; };
  const bg = (el) => { for (let e = el; e; e = e.parentElement) { const c = getComputedStyle(e).backgroundColor;
    if (!c.startsWith('rgba(0, 0, 0, 0)') && !c.endsWith(', 0)')) return c; } return 'rgb(255, 255, 255)'; };
  let lowest = 21;
  for (const el of document.querySelectorAll('body *')) {
    if (!el.offsetParent || ![...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim())) continue;
    const a = lum(getComputedStyle(el).color), b = lum(bg(el));
    lowest = Math.min(lowest, (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05));
  }
  return Math.round(lowest * 100) / 100;
})()"""


async def test_stop_from_the_page_ends_a_sub_run_then_the_run(
    redis_url: str, tmp_path: Path, agents: list[asyncio.Task[str]]
) -> None:
    """With auth on and a token that has the control scope (sent as a header, never in a URL)."""
    settings = EdgeSettings(secret=SECRET)
    token = issue_token(SECRET, tenant="acme", scopes=["read", "control"])
    async with pipeline(redis_url, f"sqlite:///{tmp_path / 'r.db'}", settings) as pipe, page() as chromium:
        root = unique("stop")
        never = asyncio.Event()
        agent = start(agents, Agent(pipe.publisher, root, hold=never, obey=True, tenant="acme"))
        await chromium.goto(f"{pipe.edge.url}/runs/{root}?access_token={token}")
        await chromium.wait("document.querySelectorAll('#tree [role=treeitem]').length === 4")
        state = "document.querySelector('#tree [data-run=%s] .badge').dataset.state"
        await chromium.wait(f"{state % js(root + '.deploys')} === 'running'")
        await select(chromium, root + ".deploys")
        await chromium.click("#detail button[data-command=cancel]")
        await chromium.wait("document.querySelector('#detail .control-result').textContent === '✓ cancel sent'")
        await chromium.wait(f"{state % js(root + '.deploys')} === 'aborted'")
        assert await chromium.eval(state % js(root)) == "running"
        assert await chromium.eval("document.querySelector('#detail button[data-command=cancel]').hidden") is True
        await select(chromium, root)
        await chromium.click("#detail button[data-command=cancel]")
        assert await asyncio.wait_for(agent, 30) == "aborted"
        await chromium.wait(RENDERED)
        assert await chromium.eval("document.getElementById('state').dataset.state") == "aborted"
        assert "cancelled from the page" in await chromium.eval("document.getElementById('outcome').innerText")
        assert await chromium.eval(state % js(root + ".logs.grep")) == "aborted"


async def test_approve_and_deny_from_the_page_reach_the_run(redis_url: str, tmp_path: Path) -> None:
    """A run awaiting approval offers Approve and Deny; each sends its command, with the plan's id."""
    async with pipeline(redis_url, f"sqlite:///{tmp_path / 'r.db'}") as pipe, page() as chromium:
        root = unique("gate")
        run = pipe.publisher.run(root)
        await run.emit("run.lifecycle", {"state": "planning"})
        await run.emit("plan.proposal", {"plan": {"id": "plan-1", "steps": [{"id": "s1", "title": "Delete old logs",
                                                                             "intent": "execute"}]}})
        await run.emit("run.lifecycle", {"state": "awaiting_approval"})
        await chromium.goto(f"{pipe.edge.url}/runs/{root}")
        await chromium.wait("document.getElementById('state').dataset.state === 'awaiting_approval'")
        assert await chromium.eval("document.querySelector('button[data-command=approve]').hidden") is False
        async with contextlib.aclosing(run.controls(after="0")) as commands:
            await chromium.click("button[data-command=deny]")
            command = await asyncio.wait_for(anext(commands), 15)
            assert (command.command, command.args) == ("deny", {"plan_id": "plan-1"})
            await chromium.click("button[data-command=approve]")
            command = await asyncio.wait_for(anext(commands), 15)
            assert (command.command, command.args) == ("approve", {"plan_id": "plan-1"})
        await chromium.wait("document.querySelector('#detail .control-result').textContent === '✓ approve sent'")
        await run.emit("run.lifecycle", {"state": "running"})
        await chromium.wait("document.querySelector('button[data-command=approve]').hidden")
        await run.finish("done")
        await chromium.wait(RENDERED)


async def test_the_runs_list_nests_filters_and_updates_live(
    redis_url: str, tmp_path: Path, agents: list[asyncio.Task[str]]
) -> None:
    async with pipeline(redis_url, f"sqlite:///{tmp_path / 'r.db'}") as pipe, page() as chromium:
        done = unique("listed")
        assert await Agent(pipe.publisher, done, thread="chat-aaa").run() == "done"
        await wait_for_terminal(pipe.store, done)
        await chromium.goto(f"{pipe.edge.url}/")
        await chromium.wait(f"document.querySelector('#runs tr[data-run={js(done + '.logs.grep')}]')")
        await chromium.eval("window.__sameDocument = true")
        depths = await chromium.eval("Object.fromEntries([...document.querySelectorAll('#runs tr[data-run]')]"
                                     ".map((tr) => [tr.dataset.run, tr.dataset.depth]))")
        assert depths == {done: "0", done + ".logs": "1", done + ".logs.grep": "2", done + ".deploys": "1"}
        row = await chromium.eval(f"document.querySelector('#runs tr[data-run={js(done)}]').innerText")
        assert "done" in row and "chat-aaa" in row and "2,400 / 610" in row
        # a new run appears and changes state without a reload
        live = unique("arriving")
        hold = asyncio.Event()
        agent = start(agents, Agent(pipe.publisher, live, hold=hold, thread="chat-bbb"))
        badge = f"document.querySelector('#runs tr[data-run={js(live)}] .badge')?.dataset.state"
        await chromium.wait(f"{badge} === 'running'")
        # filter by state and search by thread id
        await chromium.eval("(() => { const s = document.getElementById('state-filter'); s.value = 'done';"
                            " s.dispatchEvent(new Event('change')); })()")
        shown = "[...document.querySelectorAll('#runs tr[data-run]:not(.context)')].map((tr) => tr.dataset.run)"
        assert live not in await chromium.eval(shown) and done in await chromium.eval(shown)
        await chromium.eval("(() => { const s = document.getElementById('state-filter'); s.value = '';"
                            " s.dispatchEvent(new Event('change'));"
                            " const q = document.getElementById('search'); q.value = 'chat-bbb';"
                            " q.dispatchEvent(new Event('input')); })()")
        assert await chromium.eval(shown) == [live]
        assert await chromium.eval(CONTRAST) >= 4.5  # context rows (ancestors of a match) included
        hold.set()
        assert await agent == "done"
        await chromium.wait(f"{badge} === 'done'")
        assert await chromium.eval("window.__sameDocument") is True


async def test_with_auth_on_the_list_shows_the_tokens_tenant_and_a_bad_token_is_told(
    redis_url: str, tmp_path: Path
) -> None:
    settings = EdgeSettings(secret=SECRET)
    token = issue_token(SECRET, tenant="acme", scopes=["read"])
    async with pipeline(redis_url, f"sqlite:///{tmp_path / 'r.db'}", settings) as pipe, page() as chromium:
        ours, theirs = unique("ours"), unique("theirs")
        assert await Agent(pipe.publisher, ours, tenant="acme").run() == "done"
        assert await Agent(pipe.publisher, theirs, tenant="globex").run() == "done"
        await wait_for_terminal(pipe.store, ours)
        await wait_for_terminal(pipe.store, theirs)
        await chromium.goto(f"{pipe.edge.url}/?access_token={token}")
        await chromium.wait(f"document.querySelector('#runs tr[data-run={js(ours + '.logs.grep')}]')")
        runs = await chromium.eval("[...document.querySelectorAll('#runs tr[data-run]')].map((tr) => tr.dataset.run)")
        assert ours in runs and not any(r.startswith(theirs) for r in runs)
        href = await chromium.eval(f"document.querySelector('#runs tr[data-run={js(ours)}] a').href")
        assert href.endswith(f"/runs/{ours}?access_token={token}")
        await chromium.goto(href)
        await chromium.wait(RENDERED)
        assert await chromium.eval("document.getElementById('state').dataset.state") == "done"
        # another tenant's run is refused like one that does not exist, and the page says so
        await chromium.goto(f"{pipe.edge.url}/runs/{theirs}?access_token={token}")
        await chromium.wait("document.getElementById('connection').textContent === 'refused'")
        assert "404" in await chromium.eval("document.getElementById('errors').innerText")


async def test_a_10000_event_run_renders_without_freezing_the_tab(redis_url: str, tmp_path: Path) -> None:
    async with pipeline(redis_url, f"sqlite:///{tmp_path / 'r.db'}") as pipe, page() as chromium:
        root = unique("long")
        rows = big_run(root, 10_000)
        await publish_big(pipe.publisher, rows)
        await wait_for_terminal(pipe.store, root, within=120)
        await chromium.goto(f"{pipe.edge.url}/runs/{root}?detail=full")
        await chromium.wait(RENDERED, timeout_s=LONG_RUN_WAIT_S)
        figures = await chromium.eval("({events: runView.stats.events, batches: runView.stats.batches,"
                                      " largest: runView.stats.largestBatch})")
        assert figures["events"] == 10_000
        # no one task takes the whole run: events are applied a network chunk at a time (at most a
        # slice of 1,000 however much one read brings), drawn once per frame
        assert figures["batches"] >= 10 and figures["largest"] <= 1_000, figures
        assert await chromium.eval("document.querySelectorAll('#tree [role=treeitem]').length") == 9



async def test_a_timeline_the_edge_cut_short_says_so(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The edge bounds its work on a long run's spans (docs/edge.md): the page draws what came and
    says it is the run's first spans, not the whole run."""
    monkeypatch.setattr(runlog, "MAX_SPANS", 3)
    async with pipeline(redis_url, f"sqlite:///{tmp_path / 'r.db'}") as pipe, page() as chromium:
        root = unique("cut")
        await publish_big(pipe.publisher, big_run(root, 300))
        await wait_for_terminal(pipe.store, root, within=60)
        await chromium.goto(f"{pipe.edge.url}/runs/{root}")
        shown = "document.querySelector('.timeline-note') && !document.querySelector('.timeline-note').hidden"
        await chromium.wait(shown)
        assert "first 3 spans" in await chromium.eval("document.querySelector('.timeline-note').textContent")
        await chromium.wait("document.querySelectorAll('#timeline .lane-run').length >= 1")  # drawn at a frame
