// Drives the console in Debian's Chromium (playwright-core, no browser download) the way an
// operator would, for tests/api/console.rs, which starts the services and `idempostctl console`
// and checks the databases. Usage: node browser.mjs '<JSON settings>' with
//   url        the URL the console printed (with its one-time key)
//   refusedUrl the URL of a console whose token the services refuse
//   outDir     where the screenshots go
//   published  {eventId, tenantId, requestId} of an event that was consumed (its order was then
//              amended and cancelled: the timeline lists three versions)
//   failed     the id of a FAILED event to redrive
//   reason     the redrive's reason
//   waiting    how many events wait for a relay when the page opens
//   replay     {orderId, reason} of a published order to replay (its three versions)
// Prints one JSON line per step ({"step": ..., ...}); exits 1 after printing {"step": "error"}.
// After the step "backlog" it waits for a line on its standard input: the test starts a relay
// then, and the backlog drains while the operator works.
import { chromium } from "playwright-core";
import { createInterface } from "node:readline";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const settings = JSON.parse(process.argv[2]);
const WAIT = 60_000;
mkdirSync(settings.outDir, { recursive: true });
const profile = mkdtempSync(join(tmpdir(), "idempost-console-chromium-"));
const report = (step, fields = {}) => console.log(JSON.stringify({ step, ...fields }));
const lines = createInterface({ input: process.stdin });
const input = lines[Symbol.asyncIterator]();

const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.IDEMPOST_CHROMIUM ?? "/usr/bin/chromium",
  headless: true,
  viewport: { width: 1280, height: 860 },
  args: [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
  ],
});
const problems = [];
const page = await context.newPage();
watch(page);

function watch(p) {
  p.on("pageerror", (error) => problems.push(`page error: ${error.message}`));
  p.on("console", (message) => {
    if (message.type() === "error") problems.push(`console error: ${message.text()}`);
  });
  p.on("request", (request) => {
    const origins = [settings.url, settings.refusedUrl].map((u) => new URL(u).origin);
    if (!origins.includes(new URL(request.url()).origin)) problems.push(`request elsewhere: ${request.url()}`);
  });
}

async function shot(p, name) {
  const path = join(settings.outDir, `${name}.png`);
  await p.screenshot({ path, fullPage: true });
  return path;
}

/** The table of every version of the order: [version, operation, event id, outbox, consumer] per row. */
async function versionRows(p) {
  const rows = await p.getByTestId("timeline-versions").locator("tbody tr").all();
  return Promise.all(
    rows.map(async (row) => {
      const cells = (await row.locator("td").allInnerTexts()).map((t) => t.trim());
      return [cells[0], cells[2], cells[4].replace(" (this event)", ""), cells[5], cells[6]];
    }),
  );
}

async function nav(p, title) {
  await p.locator("nav button", { hasText: title }).click();
}

try {
  // Backlog: the counts arrive and the chart is drawn from samples.
  const response = await page.goto(settings.url);
  const csp = response.headers()["content-security-policy"];
  const samples = (n) =>
    page.waitForFunction(
      (n) => document.querySelectorAll('[data-testid="backlog-chart"] polyline')[0]?.getAttribute("points")?.split(" ").length >= n,
      n,
      { timeout: WAIT },
    );
  await page.getByTestId("count-pending").locator(".value").filter({ hasText: String(settings.waiting) }).waitFor({ timeout: WAIT });
  await samples(3);
  const count = async (id) => (await page.getByTestId(`count-${id}`).locator(".value").textContent()).trim();
  report("backlog", {
    csp,
    address: page.url(),
    pending: await count("pending"),
    failed: await count("failed"),
    oldest: await count("oldest"),
    screenshot: await shot(page, "backlog"),
  });
  await input.next();
  lines.close();

  // Timeline by event id, then by tenant and request id.
  await nav(page, "Event timeline");
  await page.getByTestId("search-event-id").fill(settings.published.eventId);
  await page.getByTestId("search-event-id").press("Enter");
  await page.getByTestId("timeline-status").waitFor({ timeout: WAIT });
  const rows = await page.getByTestId("timeline-rows").locator("tbody tr").allInnerTexts();
  const traceLink = page.getByTestId("trace-link");
  report("timeline", {
    status: await page.getByTestId("timeline-status").textContent(),
    rows,
    traceId: (await page.getByTestId("trace-id").count()) ? await page.getByTestId("trace-id").textContent() : null,
    traceHref: (await traceLink.count()) ? await traceLink.getAttribute("href") : null,
    versions: await versionRows(page),
    screenshot: await shot(page, "timeline"),
  });
  await page.getByTestId("search-tenant").fill(String(settings.published.tenantId));
  await page.getByTestId("search-request").fill(settings.published.requestId);
  await page.getByTestId("search-request").press("Enter");
  await page
    .getByTestId("timeline-event-id")
    .filter({ hasText: settings.published.eventId })
    .waitFor({ timeout: WAIT });
  report("find", { eventId: await page.getByTestId("timeline-event-id").textContent(), versions: await versionRows(page) });

  // The FAILED event, its payload, and its redrive with a reason, confirmed.
  await nav(page, "Dead letters & FAILED");
  const redrive = page.getByTestId(`redrive-${settings.failed}`);
  await redrive.waitFor({ timeout: WAIT });
  const letter = page.getByTestId("dead-letter-rows").locator("tbody > tr").first();
  await letter.waitFor({ timeout: WAIT });
  const screenshot = await shot(page, "failed");
  const deadLetters = await letter.locator("td").allInnerTexts();
  await letter.locator("summary").click();
  const letterPayload = await letter.locator("pre").textContent();
  await page.getByTestId("filter").fill(settings.failed.slice(-12));
  const failedRows = await page.getByTestId("failed-rows").locator("tbody > tr").count();
  const failedRow = page.getByTestId("failed-rows").locator("tbody > tr").first();
  await failedRow.locator("summary", { hasText: "payload" }).click();
  const payload = await failedRow.locator("pre").textContent();
  await failedRow.locator("summary", { hasText: "payload" }).click();
  report("failed", { failedRows, payload, deadLetters, letterPayload, screenshot });
  await redrive.click();
  await page.getByTestId("redrive-reason").press("Enter");
  const refusedEmpty = await page.locator("form.redrive .error").textContent();
  await page.getByTestId("redrive-reason").fill(settings.reason);
  await page.getByTestId("redrive-reason").press("Enter");
  await shot(page, "redrive-confirm");
  await page.getByTestId("confirm-redrive").click();
  const logged = page.getByTestId("redrive-rows").locator("tbody tr", { hasText: settings.failed });
  await logged.waitFor({ timeout: WAIT });
  report("redriven", {
    refusedEmpty,
    logged: (await logged.locator("td").allInnerTexts()).map((t) => t.trim()),
    screenshot: await shot(page, "redriven"),
  });

  // The redriven event's timeline, asked again until a relay published it.
  await nav(page, "Event timeline");
  const deadline = Date.now() + WAIT;
  let status = "";
  while (Date.now() < deadline) {
    await page.getByTestId("search-event-id").fill(settings.failed);
    await page.getByTestId("search-event-id").press("Enter");
    await page.getByTestId("timeline-event-id").filter({ hasText: settings.failed }).waitFor({ timeout: WAIT });
    await page.getByTestId("timeline-status").waitFor({ timeout: WAIT });
    status = (await page.getByTestId("timeline-status").textContent()).trim();
    if (status === "PUBLISHED") break;
    await page.waitForTimeout(500);
  }
  report("republished", {
    status,
    rows: await page.getByTestId("timeline-rows").locator("tbody tr").allInnerTexts(),
    screenshot: await shot(page, "timeline-redriven"),
  });

  // Purge: a dry run first; only then may the purge itself be asked for.
  await nav(page, "Purge");
  const purgeDisabledFirst = await page.getByTestId("purge").isDisabled();
  await page.getByTestId("purge-reason").fill(settings.reason);
  await page.getByTestId("dry-run").click();
  await page.getByTestId("dry-run-done").waitFor({ timeout: WAIT });
  report("purge", {
    purgeDisabledFirst,
    purgeEnabledAfter: await page.getByTestId("purge").isEnabled(),
    rows: await page.getByTestId("purge-result").locator("tbody tr").allInnerTexts(),
    screenshot: await shot(page, "purge"),
  });

  // Replay: a dry run first, which counts and lists; only then the replay, confirmed.
  await nav(page, "Replay");
  const replayDisabledFirst = await page.getByTestId("replay").isDisabled();
  await page.getByTestId("replay-order").fill(String(settings.replay.orderId));
  await page.getByTestId("replay-reason").fill(settings.replay.reason);
  await page.getByTestId("replay-dry-run").click();
  await page.getByTestId("replay-dry-run-done").waitFor({ timeout: WAIT });
  const dryCounts = await page.getByTestId("replay-counts").locator("tbody tr").allInnerTexts();
  const dryListed = await page.getByTestId("replay-events").locator("tbody tr").count();
  const replayEnabledAfter = await page.getByTestId("replay").isEnabled();
  await page.getByTestId("replay").click();
  await shot(page, "replay-confirm");
  await page.getByTestId("confirm-replay").click();
  await page.getByTestId("replay-done").waitFor({ timeout: WAIT });
  report("replay", {
    replayDisabledFirst,
    replayEnabledAfter,
    dryCounts,
    dryListed,
    done: await page.getByTestId("replay-done").textContent(),
    screenshot: await shot(page, "replay"),
  });

  // Back on the backlog: the relay drained it, and the chart shows it.
  await nav(page, "Backlog");
  await page.getByTestId("count-pending").locator(".value").filter({ hasText: /^0$/ }).waitFor({ timeout: WAIT });
  await page.getByTestId("count-failed").locator(".value").filter({ hasText: /^0$/ }).waitFor({ timeout: WAIT });
  report("drained", { screenshot: await shot(page, "backlog-drained") });

  // A console whose token the services refuse says so.
  const refused = await context.newPage();
  watch(refused);
  await refused.goto(settings.refusedUrl);
  await refused.getByTestId("banner").waitFor({ state: "visible", timeout: WAIT });
  report("refused", { banner: await refused.getByTestId("banner").innerText(), screenshot: await shot(refused, "refused") });

  // A reload keeps the session: the key is gone from the address bar, the cookie is not.
  await page.reload();
  await page.getByTestId("count-pending").locator(".value").filter({ hasText: /^0$/ }).waitFor({ timeout: WAIT });
  report("reloaded", { address: page.url(), banner: await page.getByTestId("banner").isVisible() });

  // Another browser (no cookie) given the same URL: its key was spent by the first.
  await context.clearCookies();
  const spent = await context.newPage();
  await spent.goto(settings.url);
  await spent.getByTestId("banner").waitFor({ state: "visible", timeout: WAIT });
  report("spent", { banner: await spent.getByTestId("banner").innerText() });

  // The page without a key or a session (the address typed by hand) says what to do.
  const keyless = await context.newPage();
  await keyless.goto(new URL(settings.url).origin + "/");
  await keyless.getByTestId("banner").waitFor({ state: "visible", timeout: WAIT });
  report("keyless", { banner: await keyless.getByTestId("banner").innerText() });

  report("done", { problems });
  await context.close();
} catch (error) {
  await shot(page, "error").catch(() => {});
  report("error", { error: String(error?.stack ?? error), problems });
  await context.close().catch(() => {});
  process.exitCode = 1;
} finally {
  rmSync(profile, { recursive: true, force: true });
}
