// One run's stream over fetch + NDJSON (docs/edge.md § Streams): resumed with
// ?after=<last seq> after any break (an edge restart too), so nothing is lost or
// repeated; the token travels as a header, not in the URL. Each network chunk is
// parsed and handed over as one batch, so a long backlog costs one callback per
// chunk rather than one browser event per event.
import { token } from "./common.js";

const NDJSON = "application/x-ndjson";
const BEHIND = "KAI-STREAM-BUF-0001"; // cut off for being too slow: resume
// At most this many events are handed to the page in one task: a network read can hold a long
// run's whole history (a busy tab lets megabytes queue), and the page draws between slices.
const SLICE = 1000;

export class RunStream {
  /**
   * @param {string} path   the stream's path (/v1/runs/{id}/stream)
   * @param {object} query  its parameters (detail …)
   * @param {object} on     { events(list), state(name, detail), lastSeq() }
   */
  constructor(path, query, on) {
    this.path = path;
    this.query = query;
    this.on = on;
    this.stopped = false;
    this.controller = null;
    this.delay = 500;
  }

  stop() {
    this.stopped = true;
    this.controller?.abort();
  }

  url() {
    const query = new URLSearchParams(this.query);
    const after = this.on.lastSeq();
    if (after > 0) query.set("after", String(after));
    return `${this.path}?${query}`;
  }

  async run() {
    while (!this.stopped) {
      const outcome = await this.once().catch((err) => (this.stopped ? "stopped" : `retry ${err}`));
      if (outcome === "end" || outcome === "stopped") return;
      if (outcome.startsWith("refused")) {
        this.on.state("refused", outcome.slice("refused ".length));
        return;
      }
      this.on.state("reconnecting", outcome);
      await new Promise((resolve) => setTimeout(resolve, this.delay));
      this.delay = Math.min(this.delay * 2, 5000);
    }
  }

  /** One request: "end" when the run is over, "refused …" for a final refusal, else why to retry. */
  async once() {
    this.controller = new AbortController();
    const headers = { accept: NDJSON };
    if (token) headers.authorization = `Bearer ${token}`;
    const response = await fetch(this.url(), { headers, signal: this.controller.signal });
    if (response.status === 204) return this.finish();
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      const why = `${response.status} ${body.code || ""} ${body.error || response.statusText}`.trim();
      const retriable = response.status >= 500 || response.status === 429 || response.status === 408;
      return retriable ? `retry ${why}` : `refused ${why}`;
    }
    this.on.state("live");
    this.delay = 500;
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let rest = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      const lines = (rest + value).split("\n");
      rest = lines.pop();
      const batch = [];
      for (const line of lines) if (line) batch.push(JSON.parse(line));
      if (!batch.length) continue;
      const ended = batch.find((e) => e.type === "end");
      const error = batch.find((e) => e.type === "error");
      const events = batch.filter((e) => e.type !== "end");
      for (let at = 0; at === 0 || at < events.length; at += SLICE) {
        if (at) await new Promise((resolve) => setTimeout(resolve, 0)); // a task of its own
        this.on.events(events.slice(at, at + SLICE));
      }
      if (ended) return this.finish();
      if (error && error.code !== BEHIND) return `refused ${error.code}: ${error.message}`;
      if (this.on.terminal()) return this.finish();
    }
    return this.on.terminal() ? this.finish() : "retry: the response ended";
  }

  finish() {
    this.stopped = true;
    this.controller?.abort();
    this.on.state("ended");
    return "end";
  }
}
