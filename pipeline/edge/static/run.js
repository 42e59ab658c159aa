// Renders one run live from the edge's stream (stream.js: NDJSON, resumed with
// ?after=<last seq> after any break, an edge restart too, so the view continues
// exactly where it was; events at or below the last seq are ignored by
// RunModel.apply). One stream per open run: the root's, with its sub-runs'
// events flattened in. Events update the model as they come; the DOM is updated
// at most once per animation frame.
import { count, el, stateBadge, withToken } from "./common.js";
import { Controls } from "./controls.js";
import { Detail } from "./detail.js";
import { RunModel } from "./model.js";
import { SpanFeed, Timeline } from "./timeline.js";
import { RunTree } from "./tree.js";
import { RunStream } from "./stream.js";

const params = new URLSearchParams(location.search);
const runId = decodeURIComponent(location.pathname.split("/").pop());
const detail = params.get("detail") === "full" ? "full" : "shaped";
document.title = `runwire — ${runId}`;
document.getElementById("title").textContent = runId;
document.getElementById("home").href = withToken("/");
const toggle = document.getElementById("detail-toggle");
toggle.href = withToken(location.pathname, detail === "full" ? {} : { detail: "full" });
toggle.textContent = detail === "full" ? "shaped view" : "raw events";
toggle.title = detail === "full" ? "coalesced text (the default)" : "every delta as it was published";

const model = new RunModel(runId);
const controls = new Controls();
const details = new Detail(document.getElementById("detail"), model, (node, place) => controls.render(node, place));
const timeline = new Timeline(document.getElementById("timeline"), model, (id) => tree.select(id, true), (tool) => {
  tree.select(tool.run.id);
  details.reveal(tool);
});
const tree = new RunTree(document.getElementById("tree"), model, (id) => {
  details.show(id);
  timeline.highlight(id);
});
const spans = new SpanFeed(runId, (tree) => {
  timeline.update(tree);
  stats.spansSeq = tree.last_seq;
  schedule();
});
const connection = document.getElementById("connection");
const stats = { events: 0, renders: 0, renderedSeq: 0, spansSeq: 0, ended: false, firstEventAt: null, lastRenderAt: null, longestRenderMs: 0, handlingMs: 0, batches: 0, largestBatch: 0 };
window.runView = { model, stats };
let ended = false;
let frame = 0;
let ticker = null;

function schedule() {
  if (!frame) frame = requestAnimationFrame(render);
}

function render() {
  frame = 0;
  const began = performance.now();
  const now = Date.now();
  const live = !ended && !model.root.terminal;
  tree.render();
  if (!details.node) tree.select(model.root.id);
  details.render(live ? now : null);
  timeline.render(now, live);
  header();
  for (const node of model.nodes.values()) node.changed = false;
  stats.renders++;
  stats.renderedSeq = model.lastSeq;
  stats.renderedSpansSeq = stats.spansSeq;
  stats.lastRenderAt = performance.now();
  stats.longestRenderMs = Math.max(stats.longestRenderMs, stats.lastRenderAt - began);
}

function header() {
  const root = model.root;
  const parent = document.getElementById("parent-link");
  if (model.parentId && parent.hidden) {
    parent.hidden = false;
    parent.href = withToken(`/runs/${encodeURIComponent(model.parentId)}`);
    parent.title = model.parentId;
  }
  stateBadge(root.state, document.getElementById("state")).id = "state";
  const usage = root.treeUsage();
  const totals = document.getElementById("totals");
  totals.textContent = `${count(model.count)} events · ${count(usage.input)} in / ${count(usage.output)} out tokens`;
  totals.dataset.input = String(usage.input);
  totals.dataset.output = String(usage.output);
  const outcome = document.getElementById("outcome");
  if (root.terminal) {
    const dropped = root.dropped ?? 0;
    outcome.hidden = false;
    outcome.className = `outcome outcome-${root.state}`;
    outcome.replaceChildren(
      stateBadge(root.state),
      el("strong", null, ` Run ${root.state}`),
      el("span", null, root.reason ? ` — ${root.reason}` : ""),
      el("span", dropped ? "dropped warn" : "dropped", dropped ? ` · ⚠ ${count(dropped)} events dropped for this page (R4)` : " · 0 events dropped"),
    );
    outcome.dataset.dropped = String(dropped);
  }
}

function banner(text) {
  document.getElementById("errors").append(el("div", "error-banner", text));
}

function end(label) {
  if (!ended) spans.want(true);
  ended = true;
  stats.ended = true;
  stream.stop();
  connection.textContent = label;
  connection.className = "badge";
  clearInterval(ticker);
  schedule();
}

function receive(events) {
  const began = performance.now();
  if (stats.firstEventAt == null) stats.firstEventAt = began;
  stats.events += events.length;
  stats.batches++;
  stats.largestBatch = Math.max(stats.largestBatch, events.length);
  for (const event of events) {
    model.apply(event);
    if (event.type === "error") banner(`${event.code}: ${event.message}`);
  }
  stats.handlingMs += performance.now() - began;
  spans.want(model.root.terminal);
  if (model.root.terminal) end("ended");
  else schedule();
}

const stream = new RunStream(`/v1/runs/${encodeURIComponent(runId)}/stream`, { detail }, {
  events: receive,
  lastSeq: () => model.lastSeq,
  terminal: () => model.root.terminal,
  state(name, why) {
    if (name === "live") {
      connection.textContent = "● live";
      connection.className = "badge live";
    } else if (name === "reconnecting") {
      connection.textContent = "reconnecting";
      connection.className = "badge offline";
      connection.title = why || "";
    } else if (name === "refused") {
      banner(`the stream was refused: ${why}`);
      end("refused");
    } else if (!ended) {
      end("ended");
    }
  },
});
stream.run();
// Bars of what is still running grow with the clock.
ticker = setInterval(() => { if (!document.hidden) schedule(); }, 250);
tree.render();
tree.select(runId);
