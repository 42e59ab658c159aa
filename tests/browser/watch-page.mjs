// Drives runwire's live page in headless Chromium for tests/browser/test_page.py.
//
//   node watch-page.mjs URL
//
// Speaks a line protocol with the test: it prints "loaded" once the page is
// live; then for every line "expect <text>" it reads on stdin it waits until
// the page shows that text and prints "seen <text>" (or "timeout <text>" and
// exits 1). "state <s>" waits for the run's state badge. "dump" prints the
// page's text. "pending" waits up to 3 s for every stream request to finish
// and prints "pending <n>" (n still open). EOF closes the browser.
import { chromium } from "playwright-core";
import { createInterface } from "node:readline";

const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
const browser = await chromium.launch({
  executablePath,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],
});
const page = await browser.newPage();
const open = new Set();
page.on("request", (r) => { if (r.url().includes("/stream")) open.add(r); });
page.on("requestfinished", (r) => open.delete(r));
page.on("requestfailed", (r) => open.delete(r));
page.on("console", (msg) => process.stderr.write(`console: ${msg.text()}\n`));
await page.goto(process.argv[2]);
await page.waitForSelector("#connection:text('live')", { timeout: 15000 });
console.log("loaded");

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  const [command, ...rest] = line.split(" ");
  const arg = rest.join(" ");
  try {
    if (command === "expect") {
      await page.waitForFunction((t) => document.body.innerText.includes(t), arg, { timeout: 15000 });
      console.log(`seen ${arg}`);
    } else if (command === "state") {
      await page.waitForFunction((s) => document.getElementById("state").dataset.state === s, arg, { timeout: 15000 });
      console.log(`state ${arg}`);
    } else if (command === "pending") {
      for (let i = 0; i < 60 && open.size; i++) await new Promise((r) => setTimeout(r, 50));
      console.log(`pending ${open.size}`);
    } else if (command === "dump") {
      const text = await page.evaluate(() => document.body.innerText);
      console.log(`dump ${JSON.stringify(text)}`);
    }
  } catch (err) {
    console.log(`timeout ${arg}`);
    await browser.close();
    process.exit(1);
  }
}
await browser.close();
