// A bare browser EventSource on a run's stream, in headless Chromium, for
// tests/browser/test_eventsource.py.
//
//   node eventsource-end.mjs ORIGIN STREAM_PATH
//
// Opens ORIGIN/healthz (so the EventSource is same-origin), then
// `new EventSource(STREAM_PATH)` and nothing else: no close() on the last
// event, exactly what a page that forgets to close does. It waits until the
// browser gives up by itself (readyState CLOSED), watches 2 s more for any
// further request, and prints one JSON line: the ids received, the final
// readyState, the status of every stream request and how many are still open.
import { chromium } from "playwright-core";

const [origin, path] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],
});
const page = await browser.newPage();
const open = new Set();
const statuses = [];
const isStream = (request) => request.url().includes("/stream");
page.on("request", (r) => { if (isStream(r)) open.add(r); });
page.on("requestfinished", async (r) => {
  if (!isStream(r)) return;
  open.delete(r);
  const response = await r.response();
  statuses.push(response ? response.status() : 0);
});
page.on("requestfailed", (r) => { if (isStream(r)) { open.delete(r); statuses.push(-1); } });
await page.goto(`${origin}/healthz`);
const result = await page.evaluate(async (url) => {
  const ids = [];
  const source = new EventSource(url);
  source.onmessage = (message) => ids.push(message.lastEventId);
  const deadline = Date.now() + 15000;
  while (source.readyState !== EventSource.CLOSED && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return { ids, readyState: source.readyState };
}, path);
await new Promise((resolve) => setTimeout(resolve, 2000));
console.log(JSON.stringify({ ...result, statuses, pending: open.size }));
await browser.close();
