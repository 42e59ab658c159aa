// What both pages share: the access token, authed requests, states, times, numbers.

const params = new URLSearchParams(location.search);
export const token = params.get("access_token");

/** `?access_token=…` (or "") to carry the token on links and EventSource URLs. */
export function withToken(path, extra = {}) {
  const query = new URLSearchParams(extra);
  if (token) query.set("access_token", token);
  const text = query.toString();
  return text ? `${path}?${text}` : path;
}

/** fetch() with the token as a Bearer header (the edge takes either). */
export function api(path, options = {}) {
  const headers = new Headers(options.headers || {});
  if (token) headers.set("authorization", `Bearer ${token}`);
  return fetch(path, { ...options, headers });
}

/** The scopes a token claims (read from its payload, not verified: the edge decides). */
export function tokenScopes() {
  if (!token) return null; // auth may be off: the edge answers for itself
  try {
    const part = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    const claims = JSON.parse(atob(part.padEnd(part.length + ((4 - (part.length % 4)) % 4), "=")));
    return new Set(Array.isArray(claims.scopes) ? claims.scopes : []);
  } catch {
    return new Set();
  }
}

export const TERMINAL = new Set(["done", "aborted", "error"]);

/** Every state has a symbol and a word, so no state is told by colour alone. */
const STATES = {
  planning: "◔", awaiting_approval: "⏸", running: "▶", paused: "⏸", redirecting: "↻",
  done: "✓", aborted: "■", error: "✕",
};

export function stateBadge(state, node = document.createElement("span")) {
  const name = state || "waiting";
  node.className = `badge state-${name}`;
  node.textContent = `${STATES[name] || "…"} ${name.replace("_", " ")}`;
  node.dataset.state = name;
  return node;
}

export function tsMs(ts) {
  const ms = Date.parse(ts);
  return Number.isFinite(ms) ? ms : null;
}

/** "12 s ago", "3 min ago" … from a timestamp in ms. */
export function ago(ms, now = Date.now()) {
  if (ms == null) return "—";
  const s = Math.max(0, Math.round((now - ms) / 1000));
  if (s < 5) return "just now";
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

/** A duration in ms as "420 ms", "3.4 s", "2 min 5 s". */
export function duration(ms) {
  if (ms == null || !Number.isFinite(ms)) return "—";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 1 : 0)} s`;
  return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
}

const numbers = new Intl.NumberFormat("en");
export function count(n) {
  return numbers.format(n || 0);
}

export function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text != null) node.textContent = text;
  return node;
}
