// The timeline: a row per run (its bar from first event to end, growing while it
// runs), its steps as segments, and a row per tool call (start to end, marked
// when it failed). Bars are placed by CSS variables relative to the run's first
// event, so a longer axis is one style change on the container, not one per bar.
import { duration, el } from "./common.js";

function niceStep(span) {
  const raw = span / 6;
  const pow = 10 ** Math.floor(Math.log10(Math.max(raw, 1)));
  for (const m of [1, 2, 5, 10]) if (m * pow >= raw) return m * pow;
  return 10 * pow;
}

export class Timeline {
  constructor(container, model, onSelect, onTool) {
    this.container = container;
    this.model = model;
    this.onSelect = onSelect;
    this.onTool = onTool;
    this.rows = new Map(); // key → { row, bar, label, meta, ... }
    this.structure = -1;
    this.span = 0;
    this.axis = el("div", "axis");
    this.axis.setAttribute("aria-hidden", "true");
    this.body = el("div", "lanes");
    this.body.setAttribute("role", "list");
    container.append(this.axis, this.body);
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

  runLane(node) {
    return this.row(`run ${node.id}`, () => {
      const lane = this.lane("run", node.depth(), node === this.model.root ? "run" : node.id.split(".").pop(), node.id);
      lane.row.dataset.run = node.id;
      lane.bar = this.bar(lane.track, "bar-run");
      lane.row.addEventListener("click", () => this.onSelect(node.id));
      return lane;
    });
  }

  stepLane(node) {
    return this.row(`steps ${node.id}`, () => {
      const lane = this.lane("steps", node.depth() + 1, "steps");
      lane.row.dataset.run = node.id;
      lane.segments = [];
      return lane;
    });
  }

  toolLane(tool) {
    return this.row(`tool ${tool.key}`, () => {
      const lane = this.lane("tool", tool.run.depth() + 1, tool.name, `${tool.name} (${tool.callId})`);
      lane.row.dataset.run = tool.run.id;
      lane.row.dataset.call = tool.callId;
      lane.row.dataset.tool = tool.name;
      lane.bar = this.bar(lane.track, "bar-tool");
      lane.tool = tool;
      lane.row.addEventListener("click", () => this.onTool(tool));
      return lane;
    });
  }

  /** Rows in order: each run, its steps, then its tools and sub-runs by start time. */
  layout() {
    const order = [];
    const walk = (node) => {
      order.push(this.runLane(node));
      if (node.steps.length) order.push(this.stepLane(node));
      const entries = [
        ...node.tools.map((t) => ({ at: t.start ?? Infinity, tool: t })),
        ...node.children.map((c) => ({ at: c.start ?? Infinity, node: c })),
      ].sort((a, b) => a.at - b.at);
      for (const entry of entries) {
        if (entry.tool) order.push(this.toolLane(entry.tool)); else walk(entry.node);
      }
    };
    walk(this.model.root);
    order.forEach((lane, i) => {
      if (this.body.children[i] !== lane.row) this.body.insertBefore(lane.row, this.body.children[i] || null);
    });
  }

  place(bar, start, length) {
    bar.style.setProperty("--s", String(Math.max(0, start - this.model.t0)));
    bar.style.setProperty("--d", String(Math.max(0, length)));
  }

  render(now, live) {
    const model = this.model;
    if (model.t0 == null) return;
    if (this.structure !== model.structure) {
      this.structure = model.structure;
      this.layout();
    }
    const end = Math.max(model.tMax ?? model.t0, live ? now : 0);
    const span = Math.max(end - model.t0, 1000);
    if (Math.abs(span - this.span) > this.span * 0.002) {
      this.span = span;
      this.container.style.setProperty("--span", String(span));
      this.ticks(span);
    }
    for (const entry of this.rows.values()) {
      if (entry.tool) this.renderTool(entry, now, live);
      else if (entry.segments) this.renderSteps(entry, now, live);
      else this.renderRun(entry, now, live);
    }
  }

  renderRun(lane, now, live) {
    const node = this.model.nodes.get(lane.row.dataset.run);
    if (!node.changed && !lane.open && lane.done) return;
    const stop = node.end ?? (live ? now : node.last);
    lane.open = node.end == null && live;
    lane.done = true;
    this.place(lane.bar, node.start ?? this.model.t0, (stop ?? node.start) - (node.start ?? this.model.t0));
    lane.bar.classList.toggle("open", lane.open);
    lane.bar.dataset.state = node.state || "waiting";
    lane.row.dataset.state = node.state || "waiting";
    const took = node.start != null && stop != null ? duration(stop - node.start) : "";
    lane.meta.textContent = lane.open ? `${took} · running` : `${took} · ${node.state || "…"}`;
    lane.bar.title = `${node.id}: ${node.state || "waiting"}, ${took}`;
  }

  renderSteps(lane, now, live) {
    const node = this.model.nodes.get(lane.row.dataset.run);
    while (lane.segments.length < node.steps.length) {
      const step = node.steps[lane.segments.length];
      const bar = this.bar(lane.track, "bar-step");
      bar.textContent = `${step.index} ${step.kind}`;
      bar.title = `step ${step.index}: ${step.kind}`;
      lane.segments.push(bar);
    }
    if (!node.changed && node.end != null && lane.done) return;
    lane.done = true;
    node.steps.forEach((step, i) => {
      const next = node.steps[i + 1]?.at ?? node.end ?? (live ? now : node.last);
      this.place(lane.segments[i], step.at, (next ?? step.at) - step.at);
    });
    lane.meta.textContent = `${node.steps.length}`;
  }

  renderTool(lane, now, live) {
    const tool = lane.tool;
    if (lane.done) return;
    const open = tool.end == null;
    const length = open ? (live ? now - tool.start : 0) : tool.durationMs ?? tool.end - tool.start;
    this.place(lane.bar, tool.start, length);
    lane.bar.classList.toggle("open", open);
    lane.bar.dataset.ms = open ? "" : String(length);
    if (open) {
      lane.meta.textContent = "running…";
      return;
    }
    lane.done = true;
    lane.row.classList.toggle("failed", !tool.ok);
    lane.bar.classList.toggle("failed", !tool.ok);
    lane.row.dataset.ok = String(tool.ok);
    lane.meta.textContent = tool.ok ? duration(length) : `✕ failed · ${duration(length)}`;
    lane.bar.title = `${tool.name}: ${tool.ok ? "ok" : "failed"} in ${duration(length)}`;
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
