// The timeline draws the run's span tree as the edge derives it (GET /v1/runs/{id}/spans, the
// derivation the OTLP exporter sends too: docs/observability.md): a row per run (invoke_agent),
// its model calls (chat) as segments of one row, and a row per tool call (execute_tool, marked
// when it failed). Times are the events' own. Spans still open grow with the clock while the run
// is live. A long run's tree comes cut short ("truncated": the edge bounds its work), which a note
// above the lanes says. Bars are placed by CSS variables relative to the root's start, so a longer
// axis is one style change on the container, not one per bar.
import { api, duration, el } from "./common.js";

const NS_PER_MS = 1e6;
/** A span time in whole ms: the times come from the events' ts (ms), and ns past 2^53 arrive from
 * JSON rounded to 256 ns, so a division alone would make a 420 ms call 419.999744 ms. */
const msOf = (ns) => Math.round(ns / NS_PER_MS);

function niceStep(span) {
  const raw = span / 6;
  const pow = 10 ** Math.floor(Math.log10(Math.max(raw, 1)));
  for (const m of [1, 2, 5, 10]) if (m * pow >= raw) return m * pow;
  return 10 * pow;
}

/** The run's spans from the edge, fetched again (at most once a second) when asked to. */
export class SpanFeed {
  constructor(runId, onSpans) {
    this.path = `/v1/runs/${encodeURIComponent(runId)}/spans`;
    this.onSpans = onSpans;
    this.busy = false;
    this.again = false;
    this.last = 0;
    this.timer = 0;
  }

  /** Fetch soon; ``now`` skips the wait (the run just ended). */
  want(now = false) {
    if (this.busy) { this.again = true; return; }
    const wait = now ? 0 : Math.max(0, 1000 - (Date.now() - this.last));
    if (this.timer && !now) return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.fetch(), wait);
  }

  async fetch() {
    this.timer = 0;
    this.busy = true;
    this.last = Date.now();
    try {
      const response = await api(this.path);
      if (response.ok) this.onSpans(await response.json());
    } catch { /* the next event asks again */ }
    this.busy = false;
    if (this.again) { this.again = false; this.want(); }
  }
}

export class Timeline {
  constructor(container, model, onSelect, onTool) {
    this.container = container;
    this.model = model;
    this.onSelect = onSelect;
    this.onTool = onTool;
    this.rows = new Map(); // key → lane
    this.spans = []; // the latest span tree
    this.byId = new Map();
    this.shape = "";
    this.t0 = null; // ms of the root span's start: the axis origin
    this.span = 0;
    this.note = el("p", "timeline-note");
    this.note.setAttribute("role", "note");
    this.note.hidden = true;
    this.axis = el("div", "axis");
    this.axis.setAttribute("aria-hidden", "true");
    this.body = el("div", "lanes");
    this.body.setAttribute("role", "list");
    container.append(this.note, this.axis, this.body);
  }

  /** A new span tree from the edge. */
  update(tree) {
    this.spans = tree.spans || [];
    // the edge derives a long run's first spans only (a bound on its work): say so
    this.note.hidden = !tree.truncated;
    this.note.textContent = tree.truncated
      ? `The timeline shows this run's first ${this.spans.length} spans (up to event ${tree.last_seq}): the run is longer than it draws.`
      : "";
    this.byId = new Map(this.spans.map((s) => [s.span_id, s]));
    const root = this.spans.find((s) => !s.parent_span_id);
    if (root && this.t0 == null) this.t0 = msOf(root.start_ns);
    this.shape = ""; // every lane takes its span from this tree (a closed span is a new object)
    for (const lane of this.rows.values()) lane.done = false;
    this.shape = ""; // lay out again: the lanes must draw this tree's spans, not the last one's
  }

  row(key, build) {
    let entry = this.rows.get(key);
    if (!entry) {
      entry = build();
      this.rows.set(key, entry);
    }
    return entry;
  }

  lane(kind, depth, labelText, title) {
    const row = el("div", `lane lane-${kind}`);
    row.setAttribute("role", "listitem");
    row.style.setProperty("--depth", depth);
    const label = el("div", "lane-label");
    const name = el("span", "lane-name", labelText);
    name.title = title || labelText;
    const meta = el("span", "lane-meta");
    label.append(name, meta);
    const track = el("div", "track");
    row.append(label, track);
    return { row, label, name, meta, track };
  }

  bar(track, className) {
    const bar = el("div", `bar ${className}`);
    track.append(bar);
    return bar;
  }

  depth(span) {
    let d = 0;
    for (let p = this.byId.get(span.parent_span_id); p; p = this.byId.get(p.parent_span_id)) d++;
    return d;
  }

  runLane(span) {
    const id = span.run_id;
    return this.row(`run ${id}`, () => {
      const label = span.parent_span_id ? id.split(".").pop() : "run";
      const lane = this.lane("run", this.depth(span), label, span.name === "invoke_agent" ? id : `${id} (${span.name})`);
      lane.row.dataset.run = id;
      lane.bar = this.bar(lane.track, "bar-run");
      lane.row.addEventListener("click", () => this.onSelect(id));
      return lane;
    });
  }

  chatLane(span, chats) {
    return this.row(`chat ${span.run_id}`, () => {
      const lane = this.lane("steps", this.depth(span) + 1, "model");
      lane.row.dataset.run = span.run_id;
      lane.segments = [];
      return lane;
    });
  }

  toolLane(span, depth) {
    const run = span.run_id;
    const call = span.attributes["gen_ai.tool.call.id"];
    const name = span.attributes["gen_ai.tool.name"];
    return this.row(`tool ${run} ${call}`, () => {
      const lane = this.lane("tool", depth, name, `${name} (${call})`);
      lane.row.dataset.run = run;
      lane.row.dataset.call = call;
      lane.row.dataset.tool = name;
      lane.bar = this.bar(lane.track, "bar-tool");
      lane.row.addEventListener("click", () => {
        const tool = this.model.tools.get(`${run} ${call}`);
        if (tool) this.onTool(tool); else this.onSelect(run);
      });
      return lane;
    });
  }

  /** Rows in order: each run, its model calls, then its tools and sub-runs by start time. */
  layout() {
    const children = new Map();
    for (const s of this.spans) {
      if (!children.has(s.parent_span_id)) children.set(s.parent_span_id, []);
      children.get(s.parent_span_id).push(s);
    }
    const order = [];
    const walk = (agent) => {
      order.push([this.runLane(agent), agent]);
      const under = (children.get(agent.span_id) || []).slice().sort((a, b) => a.start_ns - b.start_ns);
      const chats = under.filter((s) => s.operation === "chat");
      if (chats.length) order.push([this.chatLane(agent), chats]);
      for (const s of under) {
        if (s.operation === "invoke_agent") walk(s);
        else if (s.operation === "execute_tool") order.push([this.toolLane(s, this.depth(s)), s]);
      }
    };
    for (const root of children.get(null) || children.get(undefined) || []) walk(root);
    order.forEach(([lane, what], i) => {
      lane.what = what;
      if (this.body.children[i] !== lane.row) this.body.insertBefore(lane.row, this.body.children[i] || null);
    });
    const used = new Set(order.map(([lane]) => lane));
    for (const [key, lane] of this.rows) {
      if (!used.has(lane)) { lane.row.remove(); this.rows.delete(key); }
    }
  }

  place(bar, start, length) {
    bar.style.setProperty("--s", String(Math.max(0, start - this.t0)));
    bar.style.setProperty("--d", String(Math.max(0, length)));
  }

  /** Where an open span stops for now: the clock while live, else the latest thing known. */
  stop(span, now, live, latest) {
    if (span.end_ns != null) return msOf(span.end_ns);
    return live ? now : latest;
  }

  render(now, live) {
    if (this.t0 == null || !this.spans.length) return;
    const shape = this.spans.map((s) => s.span_id).join(" ");
    if (shape !== this.shape) {
      this.shape = shape;
      this.layout();
    }
    const latest = Math.max(this.t0, ...this.spans.map((s) => msOf(s.end_ns ?? s.start_ns)));
    const end = Math.max(latest, live ? now : 0);
    const span = Math.max(end - this.t0, 1000);
    if (Math.abs(span - this.span) > this.span * 0.002) {
      this.span = span;
      this.container.style.setProperty("--span", String(span));
      this.ticks(span);
    }
    for (const lane of this.rows.values()) {
      if (Array.isArray(lane.what)) this.renderChats(lane, now, live, latest);
      else if (lane.what.operation === "execute_tool") this.renderTool(lane, now, live, latest);
      else this.renderRun(lane, now, live, latest);
    }
  }

  renderRun(lane, now, live, latest) {
    const span = lane.what;
    const open = span.end_ns == null && live;
    if (lane.done && !open) return;
    lane.done = span.end_ns != null;
    const start = msOf(span.start_ns);
    const stop = this.stop(span, now, live, latest);
    this.place(lane.bar, start, stop - start);
    const node = this.model.nodes.get(span.run_id);
    const state = span.attributes["runwire.run.state"] || node?.state || "waiting";
    lane.bar.classList.toggle("open", open);
    lane.bar.dataset.state = state;
    lane.row.dataset.state = state;
    const took = duration(stop - start);
    lane.meta.textContent = open ? `${took} · running` : `${took} · ${state}`;
    lane.bar.title = `${span.name} ${span.run_id}: ${state}, ${took}`;
  }

  renderChats(lane, now, live, latest) {
    const chats = lane.what;
    while (lane.segments.length < chats.length) lane.segments.push(this.bar(lane.track, "bar-step"));
    chats.forEach((chat, i) => {
      const bar = lane.segments[i];
      const start = msOf(chat.start_ns);
      const length = this.stop(chat, now, live, latest) - start;
      const tokens = chat.attributes["gen_ai.usage.output_tokens"];
      bar.textContent = chat.name;
      bar.title = `${chat.name}: ${duration(length)}${tokens != null ? `, ${tokens} tokens out` : ""}`;
      this.place(bar, start, length);
    });
    lane.meta.textContent = `${chats.length}`;
  }

  renderTool(lane, now, live, latest) {
    const span = lane.what;
    if (lane.done) return;
    const open = span.end_ns == null;
    const start = msOf(span.start_ns);
    const length = open ? (live ? now - start : 0) : msOf(span.end_ns) - msOf(span.start_ns);
    this.place(lane.bar, start, length);
    lane.bar.classList.toggle("open", open);
    lane.bar.dataset.ms = open ? "" : String(length);
    if (open) {
      lane.meta.textContent = "running…";
      return;
    }
    lane.done = true;
    const ok = span.status !== "error";
    lane.row.classList.toggle("failed", !ok);
    lane.bar.classList.toggle("failed", !ok);
    lane.row.dataset.ok = String(ok);
    const name = span.attributes["gen_ai.tool.name"];
    lane.meta.textContent = ok ? duration(length) : `✕ failed · ${duration(length)}`;
    lane.bar.title = `${name}: ${ok ? "ok" : `failed (${span.status_message || "error"})`} in ${duration(length)}`;
  }

  ticks(span) {
    const step = niceStep(span);
    const marks = [];
    for (let t = 0; t <= span; t += step) {
      const mark = el("span", "tick", duration(t));
      mark.style.setProperty("--s", String(t));
      marks.push(mark);
    }
    const label = el("span", "axis-label", "time since start");
    const track = el("div", "track");
    track.append(...marks);
    this.axis.replaceChildren(label, track);
  }

  highlight(id) {
    for (const entry of this.rows.values()) entry.row.classList.toggle("selected", entry.row.dataset.run === id);
  }
}
