// The runs list: roots with their sub-runs nested, polled while the tab is visible.
import { TERMINAL, ago, api, count, el, stateBadge, tsMs, withToken } from "./common.js";

const POLL_MS = 2000;
const LIMIT = 500;
const collapsed = new Set(); // run ids whose sub-runs are folded
let runs = [];
let timer = null;

const body = document.getElementById("runs");
const status = document.getElementById("poll");
const stateFilter = document.getElementById("state-filter");
const search = document.getElementById("search");

/** Runs as a forest: a run whose parent is not in the list is shown as a root. */
function forest(list) {
  const byId = new Map(list.map((r) => [r.run_id, { run: r, children: [] }]));
  const roots = [];
  for (const entry of byId.values()) {
    const parent = entry.run.parent_id && byId.get(entry.run.parent_id);
    (parent ? parent.children : roots).push(entry);
  }
  const started = (e) => tsMs(e.run.first_ts) ?? 0;
  for (const entry of byId.values()) entry.children.sort((a, b) => started(a) - started(b));
  roots.sort((a, b) => (tsMs(b.run.last_ts) ?? 0) - (tsMs(a.run.last_ts) ?? 0));
  return roots;
}

function matches(run) {
  const state = stateFilter.value;
  if (state === "active" && (run.terminal || TERMINAL.has(run.state))) return false;
  if (state && state !== "active" && run.state !== state) return false;
  const needle = search.value.trim().toLowerCase();
  if (!needle) return true;
  return run.run_id.toLowerCase().includes(needle) || (run.thread_id || "").toLowerCase().includes(needle);
}

/** Rows to show: matching runs and, for context, their ancestors. */
function visibleRows(roots) {
  const rows = [];
  const walk = (entry, depth) => {
    const start = rows.length;
    rows.push({ entry, depth, match: matches(entry.run) });
    let any = rows[start].match;
    const folded = collapsed.has(entry.run.run_id);
    for (const child of entry.children) {
      const before = rows.length;
      if (walk(child, depth + 1)) any = true;
      if (folded && !filtering()) rows.length = before;
    }
    if (!any) rows.length = start;
    return any;
  };
  for (const root of roots) walk(root, 0);
  return rows;
}

function filtering() {
  return Boolean(stateFilter.value || search.value.trim());
}

function descendants(entry) {
  return entry.children.reduce((n, c) => n + 1 + descendants(c), 0);
}

function row({ entry, depth, match }) {
  const run = entry.run;
  const below = descendants(entry);
  const tr = el("tr");
  tr.dataset.run = run.run_id;
  tr.dataset.depth = String(depth);
  if (!match) tr.className = "context";
  const name = el("td", "name");
  name.style.setProperty("--depth", depth);
  if (entry.children.length) {
    const open = !collapsed.has(run.run_id) || filtering();
    const toggle = el("button", "fold", open ? "▾" : "▸");
    toggle.setAttribute("aria-expanded", String(open));
    toggle.setAttribute("aria-label", `${open ? "hide" : "show"} ${below} sub-runs of ${run.run_id}`);
    toggle.onclick = () => {
      if (collapsed.has(run.run_id)) collapsed.delete(run.run_id); else collapsed.add(run.run_id);
      render();
      body.querySelector(`tr[data-run="${CSS.escape(run.run_id)}"] button.fold`)?.focus();
    };
    name.append(toggle);
  } else {
    name.append(el("span", "fold-space"));
  }
  const link = el("a", null, run.run_id);
  link.href = withToken(`/runs/${encodeURIComponent(run.run_id)}`);
  name.append(link);
  if (below) name.append(el("span", "muted small", ` ${below} sub-run${below === 1 ? "" : "s"}`));
  const state = el("td");
  state.append(stateBadge(run.state));
  const started = el("td", "time", ago(tsMs(run.first_ts)));
  started.title = run.first_ts || "";
  const last = el("td", "time", ago(tsMs(run.last_ts)));
  last.title = run.last_ts || "";
  const dropped = el("td", run.dropped ? "num warn" : "num", run.dropped ? `⚠ ${count(run.dropped)}` : "0");
  tr.append(
    name, state, started, last,
    el("td", "num", count(run.events)),
    el("td", "num tokens", `${count(run.input_tokens)} / ${count(run.output_tokens)}`),
    dropped,
    el("td", null, run.tenant || "—"),
    el("td", "thread", run.thread_id || "—"),
  );
  return tr;
}

function render() {
  const rows = visibleRows(forest(runs));
  const focused = document.activeElement?.closest?.("tr")?.dataset.run;
  body.replaceChildren(...rows.map(row));
  if (!rows.length) {
    const tr = el("tr");
    const td = el("td", "empty", runs.length ? "no run matches" : "no runs yet");
    td.colSpan = 9;
    tr.append(td);
    body.append(tr);
  }
  document.getElementById("shown").textContent = `${rows.filter((r) => r.match).length} of ${runs.length} runs`;
  if (focused) body.querySelector(`tr[data-run="${CSS.escape(focused)}"] button.fold`)?.focus();
}

let loading = false;

async function load() {
  clearTimeout(timer);
  timer = null;
  if (loading) return;
  loading = true;
  try {
    const response = await api(`/v1/runs?limit=${LIMIT}`);
    if (!response.ok) {
      const text = await response.text();
      status.textContent = `error ${response.status}`;
      status.className = "badge state-error";
      status.title = text;
      if (response.status === 401 || response.status === 403) return; // no point polling on
    } else {
      runs = (await response.json()).runs;
      status.textContent = "● live";
      status.className = "badge live";
      render();
    }
  } catch (err) {
    status.textContent = "offline, retrying";
    status.className = "badge offline";
  } finally {
    loading = false;
  }
  if (!document.hidden) timer = setTimeout(load, POLL_MS);
}

stateFilter.onchange = render;
search.oninput = render;
document.addEventListener("visibilitychange", () => {
  if (!document.hidden && timer === null) load();
});
load();
