// Drives a page in headless Chromium (Debian's /usr/bin/chromium) for Python:
// one JSON command per stdin line, one JSON answer per stdout line.
//
//   {"goto": url}                      load a page (answers once it has loaded)
//   {"eval": "expression"}             {"value": the expression's JSON value (awaited)}
//   {"wait": "expression", "timeout_ms": ms}   wait until the expression is truthy
//   {"click": selector} · {"focus": selector} · {"press": key}
//   {"screenshot": path, "full": bool} · {"viewport": [width, height]}
//   {"streams": true}                  {"value": stream requests still open}
//
// Every answer is {"ok": true, "value": …} or {"ok": false, "error": "…"}.
// The page's long tasks (main thread busy over 50 ms) are collected in
// window.__longTasks from its first script on. EOF closes the browser.
import { chromium } from "playwright-core";
import { createInterface } from "node:readline";

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--font-render-hinting=none"],
});
const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
await page.addInitScript(() => {
  window.__longTasks = [];
  try {
    new PerformanceObserver((list) => {
      for (const entry of list.getEntries()) window.__longTasks.push(entry.duration);
    }).observe({ type: "longtask", buffered: true });
  } catch {}
});
const open = new Set();
page.on("request", (r) => { if (r.url().includes("/stream")) open.add(r); });
page.on("requestfinished", (r) => open.delete(r));
page.on("requestfailed", (r) => open.delete(r));
page.on("console", (msg) => process.stderr.write(`console: ${msg.text()}\n`));
page.on("pageerror", (err) => process.stderr.write(`pageerror: ${err}\n`));

async function run(command) {
  if ("goto" in command) return void await page.goto(command.goto);
  if ("eval" in command) return await page.evaluate(`(async () => (${command.eval}))()`);
  if ("wait" in command) {
    await page.waitForFunction(command.wait, null, { timeout: command.timeout_ms ?? 15000, polling: 50 });
    return true;
  }
  if ("click" in command) return void await page.click(command.click);
  if ("focus" in command) return void await page.focus(command.focus);
  if ("press" in command) return void await page.keyboard.press(command.press);
  if ("screenshot" in command) return void await page.screenshot({ path: command.screenshot, fullPage: Boolean(command.full) });
  if ("viewport" in command) return void await page.setViewportSize({ width: command.viewport[0], height: command.viewport[1] });
  if ("streams" in command) {
    for (let i = 0; i < 60 && open.size; i++) await new Promise((r) => setTimeout(r, 50));
    return open.size;
  }
  throw new Error(`unknown command ${JSON.stringify(command)}`);
}

for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  try {
    const value = await run(JSON.parse(line));
    console.log(JSON.stringify({ ok: true, value: value ?? null }));
  } catch (err) {
    console.log(JSON.stringify({ ok: false, error: String(err && err.message || err) }));
  }
}
await browser.close();
