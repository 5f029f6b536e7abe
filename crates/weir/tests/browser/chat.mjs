// Two pages of the chat example in headless Chromium exchange messages.
// Usage: node chat.mjs BASE_URL SCREENSHOT_PATH (playwright-core on
// NODE_PATH, Chromium at $CHROMIUM or /usr/bin/chromium). Prints one JSON
// line: what each page's log and presence line say.
import { createRequire } from "node:module";
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
  console.log(JSON.stringify({ ada: await read(ada), bob: await read(bob) }));
} finally {
  await browser.close();
}
