// The selected run: its usage, plan and transcript (reasoning folded, text as it
// streams, tool calls with input and output on expand). Only the selected run is
// in the DOM; items are appended or updated as they change.
import { count, duration, el, stateBadge } from "./common.js";

function json(value) {
  if (value === undefined) return "—";
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

export class Detail {
  constructor(container, model, controls) {
    this.container = container;
    this.model = model;
    this.controls = controls; // (node, place) → fills place with the run's control buttons
    this.node = null;
    this.views = new Map(); // item → DOM node
  }

  show(id) {
    const node = this.model.nodes.get(id);
    if (!node || node === this.node) return;
    this.node = node;
    this.views = new Map();
    node.dirty.clear();
    const head = el("div", "detail-head");
    this.title = el("h2", null, node === this.model.root ? "run" : node.id);
    this.title.title = node.id;
    this.badge = stateBadge(node.state);
    this.summary = el("p", "detail-summary");
    this.prompt = el("p", "detail-prompt");
    this.controlPlace = el("div", "controls");
    head.append(this.title, this.badge, this.controlPlace);
    this.usage = el("dl", "usage");
    this.plans = el("div", "plans");
    this.transcript = el("div", "transcript");
    this.transcript.setAttribute("aria-label", "transcript");
    this.container.replaceChildren(head, this.prompt, this.summary, this.usage, this.plans, this.transcript);
    for (const item of node.items) this.transcript.append(this.view(item));
    this.head(true);
  }

  /** Open a tool call's card and bring it into view. */
  reveal(tool) {
    const card = this.views.get(tool.item);
    if (!card) return;
    card.open = true;
    card.scrollIntoView({ block: "center", behavior: "smooth" });
    card.classList.add("flash");
    setTimeout(() => card.classList.remove("flash"), 1200);
  }

  render(now = null) {
    const node = this.node;
    if (!node) return;
    this.now = now;
    for (const item of node.dirty) {
      const existing = this.views.get(item);
      if (existing) this.refresh(item, existing);
      else this.transcript.append(this.view(item));
    }
    node.dirty.clear();
    this.head(node.changed || (node.end == null && now != null));
  }

  head(changed) {
    const node = this.node;
    if (!changed) return;
    stateBadge(node.state, this.badge);
    this.prompt.textContent = node.prompt ? `“${node.prompt}”` : "";
    this.prompt.hidden = !node.prompt;
    const until = node.end ?? (this.now != null ? Math.max(this.now, node.last) : node.last);
    const took = node.start != null ? duration(until - node.start) : "—";
    const parts = [`${count(node.events)} events`, `${took}${node.end == null ? " so far" : ""}`];
    if (node.tools.length) {
      const failed = node.tools.filter((t) => t.ok === false).length;
      parts.push(`${node.tools.length} tool call${node.tools.length === 1 ? "" : "s"}${failed ? ` (${failed} failed)` : ""}`);
    }
    if (node.children.length) parts.push(`${node.children.length} sub-run${node.children.length === 1 ? "" : "s"}`);
    if (node.reason) parts.push(`reason: ${node.reason}`);
    this.summary.textContent = parts.join(" · ");
    const own = node.usage;
    const tree = node.treeUsage();
    const rows = [["this run", own]];
    if (node.children.length) rows.push(["with sub-runs", tree]);
    this.usage.replaceChildren(...rows.flatMap(([label, u]) => {
      const dt = el("dt", null, `tokens, ${label}`);
      const dd = el("dd", null, `${count(u.input)} in · ${count(u.output)} out · ${count(u.total)} total`);
      dd.dataset.usage = label === "this run" ? "own" : "tree";
      dd.dataset.input = String(u.input);
      dd.dataset.output = String(u.output);
      dd.dataset.total = String(u.total);
      return [dt, dd];
    }));
    this.controls(node, this.controlPlace);
    if (node.plans.length !== this.planCount) {
      this.planCount = node.plans.length;
      this.plans.replaceChildren(...node.plans.map((plan) => this.plan(plan)));
    }
  }

  plan(plan) {
    const box = el("section", "plan");
    box.dataset.plan = plan.id;
    const title = el("h3", null, "Plan");
    if (plan.est_total_cost_usd != null) title.append(el("span", "muted", ` · est. $${plan.est_total_cost_usd.toFixed(2)}`));
    const list = el("ol", "plan-steps");
    for (const step of plan.steps || []) {
      const li = el("li");
      li.dataset.step = step.id;
      li.append(el("span", `intent intent-${step.intent || "other"}`, step.intent || "other"), el("span", "step-title", step.title));
      const extra = [];
      if (step.est_tools?.length) extra.push(`tools: ${step.est_tools.join(", ")}`);
      if (step.est_cost_usd != null) extra.push(`est. $${step.est_cost_usd.toFixed(3)}`);
      if (extra.length) li.append(el("span", "muted small", ` ${extra.join(" · ")}`));
      list.append(li);
    }
    box.append(title, list);
    return box;
  }

  view(item) {
    let node;
    switch (item.kind) {
      case "text": node = el("p", "text"); break;
      case "reasoning": {
        node = el("details", "reasoning");
        node.append(el("summary"), el("pre"));
        break;
      }
      case "tool": node = this.toolCard(item.tool); break;
      case "step": node = el("div", "step-mark", `step ${item.index} · ${item.step}`); break;
      case "spawn": node = el("div", "note", `→ started sub-run ${item.child}${item.prompt ? `: “${item.prompt}”` : ""}`); break;
      case "plan": node = el("div", "note", `proposed a plan of ${item.plan.steps?.length ?? 0} steps`); break;
      case "note": node = el("div", `note note-${item.state}`, `state → ${item.state.replace("_", " ")}${item.reason ? ` — ${item.reason}` : ""}`); break;
      case "missed": node = el("div", "note gap", `⚠ missed seq ${item.first}–${item.last} (§7 T2)`); break;
      case "other":
        if (item.type === "x.gap") {
          const p = item.payload;
          node = el("div", "note gap", `⚠ gap: events ${p.first}–${p.last} of ${p.run_id} never arrived (§7 T2)`);
          break;
        }
        node = el("div", "note", `${item.type} ${json(item.payload)}`);
        break;
      default: node = el("div", "note", item.kind);
    }
    this.views.set(item, node);
    this.refresh(item, node);
    return node;
  }

  refresh(item, node) {
    if (item.kind === "text") {
      node.textContent = item.parts.join("");
      if (item.parts.length > 1) item.parts = [node.textContent]; // keep joins cheap as it grows
    } else if (item.kind === "reasoning") {
      const text = item.parts.join("");
      if (item.parts.length > 1) item.parts = [text];
      node.querySelector("summary").textContent = `reasoning · ${count(text.split(/\s+/).filter(Boolean).length)} words`;
      node.querySelector("pre").textContent = text;
    } else if (item.kind === "tool") {
      this.refreshTool(item.tool, node);
    }
  }

  toolCard(tool) {
    const card = el("details", "tool");
    card.dataset.call = tool.callId;
    const summary = el("summary");
    summary.append(el("span", "tool-status"), el("span", "tool-name", tool.name), el("span", "tool-meta"));
    const input = el("div", "io");
    input.append(el("h4", null, "input"), el("pre", null, json(tool.input)));
    card.append(summary, input);
    return card;
  }

  refreshTool(tool, card) {
    const status = card.querySelector(".tool-status");
    const meta = card.querySelector(".tool-meta");
    if (tool.end == null) {
      status.textContent = "⋯";
      meta.textContent = "running…";
      return;
    }
    card.classList.toggle("failed", !tool.ok);
    status.textContent = tool.ok ? "✓" : "✕";
    meta.textContent = `${tool.ok ? "ok" : "failed"} ${tool.durationMs != null ? `${tool.durationMs} ms` : ""}`.trim();
    if (!card.querySelector(".io-out")) {
      const out = el("div", "io io-out");
      out.append(el("h4", null, tool.ok ? "output" : "error"), el("pre", tool.ok ? "output" : "error", json(tool.ok ? tool.output : tool.error)));
      card.append(out);
    }
  }
}
