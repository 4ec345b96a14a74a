// The console's page: a header with the five pages, a banner for refusals, and the page shown.
import { connect, describe, failure, openSession, takeConsoleKey, type Failure } from "./api.js";
import { h, replace } from "./dom.js";
import * as backlog from "./backlog.js";
import * as timeline from "./timeline.js";
import * as failed from "./failed.js";
import * as purge from "./purge.js";
import * as replay from "./replay.js";
import type { Config, Context, PageName } from "./context.js";

interface Page {
  title: string;
  mount(root: HTMLElement, context: Context, argument?: string): void;
}

const pages: Record<PageName, Page> = {
  backlog: { title: "Backlog", mount: backlog.mount },
  timeline: { title: "Event timeline", mount: timeline.mount },
  failed: { title: "Dead letters & FAILED", mount: failed.mount },
  purge: { title: "Purge", mount: purge.mount },
  replay: { title: "Replay", mount: replay.mount },
};

async function start(): Promise<void> {
  const key = takeConsoleKey();
  const banner = h("div", { class: "banner", role: "alert", "data-testid": "banner", hidden: true });
  const main = h("main", {});
  const nav = h("nav", {});
  document.body.replaceChildren(
    h("header", {}, h("h1", {}, "Idempost console"), nav),
    banner,
    main,
  );
  const report = (problem: Failure | null) => {
    banner.hidden = problem === null;
    if (problem) {
      replace(banner, h("strong", {}, describe(problem)), problem.hint ? h("p", {}, problem.hint) : null);
    }
  };
  const refused = await openSession(key);
  if (refused) {
    // Every call would be refused too: the banner says why, and nothing else is shown.
    report(refused);
    return;
  }
  let config: Config = { jaegerUrl: null };
  try {
    config = (await (await fetch("/config.json")).json()) as Config;
  } catch {
    // The defaults: no Jaeger link.
  }
  const context: Context = { api: connect(), config, report, show: (page, argument) => show(page, argument) };
  const buttons = new Map<PageName, HTMLButtonElement>();
  for (const [name, page] of Object.entries(pages) as [PageName, Page][]) {
    const button = h("button", { type: "button", "data-page": name }, page.title);
    button.addEventListener("click", () => show(name));
    buttons.set(name, button);
    nav.appendChild(button);
  }
  const show = (name: PageName, argument?: string) => {
    for (const [other, button] of buttons) button.classList.toggle("current", other === name);
    const root = h("section", { "data-testid": `page-${name}` });
    main.replaceChildren(root);
    pages[name].mount(root, context, argument);
  };
  backlog.startSampling(context);
  show("backlog");
}

document.addEventListener("DOMContentLoaded", () => {
  start().catch((error: unknown) => {
    document.body.textContent = `The console could not start: ${String(error)}`;
  });
});
