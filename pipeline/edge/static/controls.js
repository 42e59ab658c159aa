// Commands from the page: stop a run or sub-run, approve or deny a pending
// approval; the same POST /v1/runs/{id}/control the API takes, result shown.
import { api, el, tokenScopes } from "./common.js";

const scopes = tokenScopes();
const allowed = scopes === null || scopes.has("control");

export class Controls {
  constructor() {
    this.boxes = new Map(); // run id → { box, stop, approve, deny, result }
  }

  /** Fill `place` with the buttons for `node` (kept per run, so a result stays shown). */
  render(node, place) {
    let box = this.boxes.get(node.id);
    if (!box) {
      box = this.build(node);
      this.boxes.set(node.id, box);
    }
    if (box.root.parentNode !== place) place.replaceChildren(box.root);
    const ended = node.terminal;
    box.stop.hidden = ended;
    const pending = node.state === "awaiting_approval";
    box.approve.hidden = !pending;
    box.deny.hidden = !pending;
  }

  build(node) {
    const root = el("div", "control-box");
    const button = (label, command, args, className) => {
      const b = el("button", `control ${className}`, label);
      b.type = "button";
      b.dataset.command = command;
      if (!allowed) {
        b.disabled = true;
        b.title = "this page's token has no control scope";
      }
      b.onclick = () => this.send(node, command, args(node), b, result);
      return b;
    };
    const stop = button("■ Stop", "cancel", () => ({ reason: "stopped from the page" }), "danger");
    stop.setAttribute("aria-label", `stop ${node.id}`);
    const approve = button("✓ Approve", "approve", (n) => planArgs(n), "ok");
    const deny = button("✕ Deny", "deny", (n) => planArgs(n), "danger");
    const result = el("span", "control-result");
    result.setAttribute("role", "status");
    result.setAttribute("aria-live", "polite");
    root.append(approve, deny, stop, result);
    if (!allowed) root.append(el("span", "muted small", "read-only token"));
    return { root, stop, approve, deny, result };
  }

  async send(node, command, args, button, result) {
    button.disabled = true;
    result.textContent = `sending ${command}…`;
    result.className = "control-result";
    try {
      const response = await api(`/v1/runs/${encodeURIComponent(node.id)}/control`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ command, args }),
      });
      const body = await response.json().catch(() => ({}));
      if (response.ok) {
        result.textContent = `✓ ${command} sent`;
        result.className = "control-result sent";
      } else {
        result.textContent = `✕ ${command} refused (${response.status}): ${body.error || response.statusText}`;
        result.className = "control-result refused";
      }
    } catch (err) {
      result.textContent = `✕ ${command} not sent: ${err}`;
      result.className = "control-result refused";
    } finally {
      button.disabled = false;
    }
  }
}

function planArgs(node) {
  const plan = node.plans[node.plans.length - 1];
  return plan ? { plan_id: plan.id } : {};
}
