// Renders one run live from the edge's SSE stream. EventSource resends
// Last-Event-ID on every reconnect, so the view resumes exactly where it was
// (after an edge restart too); events at or below the last seq are ignored, and a
// gap before an event (T2) is shown where it happened.
"use strict";

const params = new URLSearchParams(location.search);
const runId = decodeURIComponent(location.pathname.split("/").pop());
const token = params.get("access_token");
const query = new URLSearchParams({ detail: params.get("detail") || "shaped" });
if (token) query.set("access_token", token);
document.getElementById("title").textContent = runId;
document.getElementById("home").href = token ? `/?access_token=${encodeURIComponent(token)}` : "/";

const tabs = new Map(); // child id ("" for the run itself) → { panel, button, last }
const tools = new Map(); // call id → card
let lastSeq = 0;
let ended = false;

function tab(childId) {
  const key = childId || "";
  if (tabs.has(key)) return tabs.get(key);
  const button = document.createElement("button");
  button.textContent = key ? `child ${key}` : "run";
  button.dataset.child = key;
  const panel = document.createElement("section");
  panel.className = "panel";
  panel.dataset.child = key;
  button.onclick = () => select(key);
  document.getElementById("tabs").append(button);
  document.getElementById("panels").append(panel);
  const entry = { panel, button, last: null };
  tabs.set(key, entry);
  if (tabs.size === 1) select(key); else panel.hidden = true;
  return entry;
}

function select(key) {
  for (const [k, entry] of tabs) {
    entry.panel.hidden = k !== key;
    entry.button.classList.toggle("active", k === key);
  }
}

function append(entry, kind, build) {
  if (entry.last && entry.last.kind === kind && kind !== "tool") return entry.last.node;
  const node = build();
  entry.panel.append(node);
  entry.last = { kind, node };
  return node;
}

function reasoning(entry, text) {
  const node = append(entry, "reasoning", () => {
    const details = document.createElement("details");
    details.className = "reasoning";
    details.innerHTML = "<summary>reasoning</summary><pre></pre>";
    return details;
  });
  node.querySelector("pre").textContent += text;
}

function text(entry, value) {
  const node = append(entry, "text", () => {
    const p = document.createElement("p");
    p.className = "text";
    return p;
  });
  node.textContent += value;
}

function toolStart(entry, payload) {
  const card = document.createElement("div");
  card.className = "tool";
  card.dataset.call = payload.call_id;
  const name = document.createElement("span");
  name.className = "name";
  name.textContent = payload.tool;
  const meta = document.createElement("span");
  meta.className = "meta";
  meta.textContent = "running…";
  const input = document.createElement("pre");
  input.textContent = JSON.stringify(payload.input ?? null);
  card.append(name, meta, input);
  entry.panel.append(card);
  entry.last = { kind: "tool", node: card };
  tools.set(payload.call_id, card);
}

function toolEnd(entry, payload) {
  const card = tools.get(payload.call_id);
  if (!card) return;
  const meta = card.querySelector(".meta");
  const took = payload.duration_ms != null ? `${payload.duration_ms} ms` : "";
  meta.textContent = payload.ok ? `ok ${took}` : `failed ${took}`;
  if (!payload.ok) card.classList.add("failed");
  const out = document.createElement("pre");
  out.className = payload.ok ? "output" : "error";
  out.textContent = JSON.stringify(payload.ok ? payload.output ?? null : payload.error ?? null);
  card.append(out);
}

function note(entry, className, value) {
  const div = document.createElement("div");
  div.className = className;
  div.textContent = value;
  entry.panel.append(div);
  entry.last = null;
}

function lifecycle(event, entry) {
  const p = event.payload;
  note(entry, "lifecycle", `${p.state}${p.reason ? ` — ${p.reason}` : ""}`);
  if (event.child_id) return;
  const badge = document.getElementById("state");
  badge.textContent = p.state;
  badge.className = `badge ${p.state}`;
  if (p.dropped_count) {
    const dropped = document.getElementById("dropped");
    dropped.hidden = false;
    dropped.textContent = `${p.dropped_count} dropped`;
  }
}

function render(event) {
  if (event.type === "error") {
    const banner = document.createElement("div");
    banner.className = "error-banner";
    banner.textContent = `${event.code}: ${event.message}`;
    document.getElementById("errors").append(banner);
    return;
  }
  if (typeof event.seq === "number") {
    if (event.seq <= lastSeq) return;
    // Koder agent stream §7 T2: each event starts right after the one before it (span[0] for a
    // shaped delta, whose spans tile the seq space); a later start means events were missed.
    const first = Array.isArray(event.span) ? event.span[0] : event.seq;
    if (lastSeq > 0 && first > lastSeq + 1) {
      note(tab(""), "lifecycle", `missed seq ${lastSeq + 1}–${first - 1}`);
    }
    lastSeq = event.seq;
  }
  const entry = tab(event.child_id);
  switch (event.type) {
    case "reasoning.delta": return reasoning(entry, event.payload.text);
    case "text.delta": return text(entry, event.payload.text);
    case "tool.start": return toolStart(entry, event.payload);
    case "tool.end": return toolEnd(entry, event.payload);
    case "step.boundary": {
      const hr = document.createElement("hr");
      hr.className = "step";
      entry.panel.append(hr);
      entry.last = null;
      return;
    }
    case "child.spawn": tab(event.payload.child_id); return note(entry, "lifecycle", `spawned ${event.payload.child_id}`);
    case "run.lifecycle": return lifecycle(event, entry);
    case "x.usage": return note(entry, "lifecycle", `tokens: ${event.payload.total_tokens}`);
    default: return note(entry, "lifecycle", event.type);
  }
}

tab("");
const source = new EventSource(`/v1/runs/${encodeURIComponent(runId)}/stream?${query}`);
const connection = document.getElementById("connection");
source.onopen = () => { connection.textContent = "live"; connection.className = "badge live"; };
source.onerror = () => {
  if (ended) return;
  if (source.readyState === EventSource.CLOSED) {
    // 204 (the run ended before this reconnect) or a refusal (404, 401): EventSource gave up.
    ended = true;
    connection.textContent = "ended";
    connection.className = "badge";
    return;
  }
  connection.textContent = "reconnecting";
  connection.className = "badge offline";
};
source.onmessage = (message) => {
  const event = JSON.parse(message.data);
  render(event);
  const terminal = event.type === "run.lifecycle" && !event.child_id &&
    ["done", "aborted", "error"].includes(event.payload.state);
  if (terminal || event.type === "error") {
    ended = true;
    source.close();
    connection.textContent = "ended";
    connection.className = "badge";
  }
};
