// Two pages of the chat example in headless Chromium exchange messages.
// Usage: node chat.mjs BASE_URL SCREENSHOT_PATH (playwright-core on
// NODE_PATH, Chromium at $CHROMIUM or /usr/bin/chromium). Prints a JSON
// line once the pages chatted ({"exchanged": …}: what each page's log and
// presence line say), then waits for a line on stdin: the room's code was
// replaced meanwhile. It then waits for both pages to reconnect by
// themselves, has them chat once more, and prints a last JSON line
// ({"after": …}).
import { createRequire } from "node:module";
import { createInterface } from "node:readline";
const require = createRequire(import.meta.url);
const { chromium } = require("playwright-core");

const [base, screenshot] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
  ],
});
try {
  const context = await browser.newContext();
  const ada = await context.newPage();
  const bob = await context.newPage();
  await ada.goto(`${base}/?room=browser&user=ada`);
  await ada.waitForFunction(() => document.getElementById("status").textContent.startsWith("in browser"));
  await bob.goto(`${base}/?room=browser&user=bob`);
  await bob.waitForFunction(() => document.getElementById("status").textContent.startsWith("in browser"));
  await ada.waitForFunction(() => document.getElementById("presence").textContent === "here: ada, bob");

  await ada.fill("#text", "hello from ada");
  await ada.click("#say button");
  await bob.waitForFunction(() => document.getElementById("log").textContent.includes("ada: hello from ada"));
  await bob.fill("#text", "hi ada");
  await bob.click("#say button");
  await ada.waitForFunction(() => document.getElementById("log").textContent.includes("bob: hi ada"));

  await bob.screenshot({ path: screenshot });
  const read = (page) => page.evaluate(() => ({
    log: document.getElementById("log").innerText,
    presence: document.getElementById("presence").textContent,
    status: document.getElementById("status").textContent,
  }));
  console.log(JSON.stringify({ exchanged: { ada: await read(ada), bob: await read(bob) } }));

  // The room's code is replaced: each page sees its socket closed with
  // 1012 and comes back by itself.
  // What each page said while it waited to reconnect.
  const reconnecting = (page) => page.waitForFunction(() => {
    const status = document.getElementById("status").textContent;
    return status.startsWith("reconnecting") && status;
  }, null, { polling: 10 }).then((said) => said.jsonValue());
  const waiting = [reconnecting(ada), reconnecting(bob)];
  const lines = createInterface({ input: process.stdin });
  for await (const _ of lines) break;
  const [adaSaw, bobSaw] = await Promise.all(waiting);
  const seen = { ada: adaSaw, bob: bobSaw };
  for (const page of [ada, bob]) {
    await page.waitForFunction(() => document.getElementById("status").textContent.startsWith("in browser"));
  }
  await ada.waitForFunction(() => document.getElementById("presence").textContent === "here: ada, bob");
  await ada.fill("#text", "back again");
  await ada.click("#say button");
  for (const page of [ada, bob]) {
    await page.waitForFunction(() => document.getElementById("log").textContent.includes("ada: back again"));
  }
  console.log(JSON.stringify({ after: { ada: await read(ada), bob: await read(bob) }, closed: seen }));
} finally {
  await browser.close();
}
