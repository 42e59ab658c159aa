// A run and its sub-runs as data, built from the events of the root's stream
// (children flattened in, each with child_id). Pure: no DOM. Work per event is
// constant, whatever the run's length.
import { TERMINAL, tsMs } from "./common.js";

export class RunNode {
  constructor(id, parent) {
    this.id = id;
    this.parent = parent; // RunNode or null
    this.children = [];
    this.prompt = null;
    this.state = null;
    this.reason = null;
    this.dropped = null;
    this.start = null; // ms of its first event (or its spawn)
    this.end = null; // ms of its terminal event
    this.last = null; // ms of its latest event
    this.events = 0;
    this.usage = { input: 0, output: 0, total: 0, reports: 0 };
    this.tools = []; // in start order
    this.steps = []; // step.boundary, in order
    this.plans = [];
    this.items = []; // the transcript: text, reasoning, tool, step, spawn, plan, note
    this.dirty = new Set(); // transcript items changed since the last render of this node
    this.changed = true; // state, usage or times changed since the last render
  }

  get terminal() {
    return TERMINAL.has(this.state);
  }

  /** Usage of this run and every sub-run below it. */
  treeUsage() {
    const sum = { input: this.usage.input, output: this.usage.output, total: this.usage.total };
    for (const child of this.children) {
      const c = child.treeUsage();
      sum.input += c.input; sum.output += c.output; sum.total += c.total;
    }
    return sum;
  }

  depth() {
    let d = 0;
    for (let n = this.parent; n; n = n.parent) d++;
    return d;
  }
}

export class RunModel {
  constructor(rootId) {
    this.root = new RunNode(rootId, null);
    this.nodes = new Map([[rootId, this.root]]);
    this.tools = new Map(); // "run call_id" → tool
    this.lastSeq = 0;
    this.count = 0;
    this.t0 = null; // ms of the first event: the timeline's origin
    this.tMax = null; // latest moment anything is known to reach
    this.structure = 0; // bumps when runs, tools or steps are added
    this.errors = [];
    this.parentId = null; // the run this one is a sub-run of, when it is one
  }

  node(id, parentId = null) {
    let node = this.nodes.get(id);
    if (!node) {
      const parent = parentId ? this.node(parentId) : this.root;
      node = new RunNode(id, parent);
      parent.children.push(node);
      this.nodes.set(id, node);
      this.structure++;
    } else if (parentId && node.parent !== this.nodes.get(parentId) && node !== this.root) {
      // learned a deeper parent than the root (a grandchild seen before its parent's spawn)
      const parent = this.node(parentId);
      node.parent.children.splice(node.parent.children.indexOf(node), 1);
      node.parent = parent;
      parent.children.push(node);
      this.structure++;
    }
    return node;
  }

  /** Apply one event; false when it was already seen (a resume repeats nothing, but be safe). */
  apply(event) {
    if (event.type === "error") {
      this.errors.push(event);
      return true;
    }
    if (typeof event.seq === "number") {
      if (event.seq <= this.lastSeq) return false;
      // Koder agent stream §7 T2: each event starts right after the one before it (span[0] for a
      // shaped delta, whose spans tile the seq space); a later start means events were missed.
      const first = Array.isArray(event.span) ? event.span[0] : event.seq;
      if (this.lastSeq > 0 && first > this.lastSeq + 1) {
        this.push(this.root, { kind: "missed", first: this.lastSeq + 1, last: first - 1, at: tsMs(event.ts) });
      }
      this.lastSeq = event.seq;
    }
    this.count++;
    if (!event.child_id && event.parent_id && !this.parentId) this.parentId = event.parent_id;
    const id = event.child_id || this.root.id;
    const parentId = event.child_id ? (event.parent_id && event.parent_id !== id ? event.parent_id : null) : null;
    const node = this.node(id, parentId);
    const at = tsMs(event.ts);
    if (at != null) {
      if (this.t0 == null) this.t0 = at; // fixed once set: bars are placed relative to it
      if (this.tMax == null || at > this.tMax) this.tMax = at;
      if (node.start == null) node.start = at;
      node.last = at;
    }
    node.events++;
    node.changed = true;
    const p = event.payload || {};
    switch (event.type) {
      case "reasoning.delta":
      case "text.delta":
        return this.delta(node, event.type === "text.delta" ? "text" : "reasoning", p.text || "", event);
      case "tool.start": return this.toolStart(node, p, at, event);
      case "tool.end": return this.toolEnd(node, p, at);
      case "step.boundary":
        node.steps.push({ index: p.step_index, kind: p.step_kind, at, seq: event.seq });
        this.structure++;
        return this.push(node, { kind: "step", index: p.step_index, step: p.step_kind, at });
      case "child.spawn": {
        const child = this.node(p.child_id, id);
        child.prompt = p.prompt || null;
        if (child.start == null) child.start = at;
        child.changed = true;
        return this.push(node, { kind: "spawn", child: p.child_id, prompt: p.prompt || null, at });
      }
      case "plan.proposal":
        node.plans.push(p.plan);
        return this.push(node, { kind: "plan", plan: p.plan, at });
      case "run.lifecycle":
        node.state = p.state;
        node.reason = p.reason || null;
        if (p.dropped_count != null) node.dropped = p.dropped_count;
        if (TERMINAL.has(p.state)) node.end = at;
        return this.push(node, { kind: "note", state: p.state, reason: p.reason || null, at });
      case "x.usage":
        node.usage.input += p.input_tokens || 0;
        node.usage.output += p.output_tokens || 0;
        node.usage.total += p.total_tokens || (p.input_tokens || 0) + (p.output_tokens || 0);
        node.usage.reports++;
        node.usage.model = p.model || node.usage.model;
        return true;
      default:
        return this.push(node, { kind: "other", type: event.type, payload: p, at });
    }
  }

  push(node, item) {
    node.items.push(item);
    node.dirty.add(item);
    return true;
  }

  delta(node, kind, text, event) {
    const last = node.items[node.items.length - 1];
    if (last && last.kind === kind) {
      last.parts.push(text);
      last.chars += text.length;
      node.dirty.add(last);
      return true;
    }
    return this.push(node, { kind, parts: [text], chars: text.length, at: tsMs(event.ts) });
  }

  toolStart(node, p, at, event) {
    const tool = {
      key: `${node.id} ${p.call_id}`, callId: p.call_id, name: p.tool, input: p.input, run: node,
      start: at, end: null, ok: null, durationMs: null, output: undefined, error: undefined, seq: event.seq,
    };
    this.tools.set(tool.key, tool);
    node.tools.push(tool);
    this.structure++;
    tool.item = { kind: "tool", tool };
    return this.push(node, tool.item);
  }

  toolEnd(node, p, at) {
    let tool = this.tools.get(`${node.id} ${p.call_id}`);
    if (!tool) { // its start was never seen (joined late): show the end alone
      this.toolStart(node, { call_id: p.call_id, tool: "(tool)" }, at, {});
      tool = this.tools.get(`${node.id} ${p.call_id}`);
    }
    tool.end = at;
    tool.ok = Boolean(p.ok);
    tool.durationMs = p.duration_ms ?? (at != null && tool.start != null ? at - tool.start : null);
    tool.output = p.output;
    tool.error = p.error;
    if (tool.start != null && tool.durationMs != null && tool.start + tool.durationMs > (this.tMax ?? 0)) {
      this.tMax = tool.start + tool.durationMs;
    }
    node.dirty.add(tool.item);
    return true;
  }

  /** Nodes depth first, siblings in start order. */
  ordered() {
    const out = [];
    const walk = (node) => {
      out.push(node);
      [...node.children].sort((a, b) => (a.start ?? Infinity) - (b.start ?? Infinity)).forEach(walk);
    };
    walk(this.root);
    return out;
  }
}
