// The backlog: counts by status, the oldest waiting age, a chart of both over the last minutes
// (sampled every few seconds whatever page is shown), and the oldest rows still waiting.
import { failure } from "./api.js";
import { h, replace, table } from "./dom.js";
import { age, seconds, when } from "./format.js";
import type { Context } from "./context.js";
import type { BacklogEntry } from "./stubs.js";

const EVERY_MS = 2000;
const WINDOW_MS = 10 * 60 * 1000;

interface Sample {
  at: number;
  pending: number;
  publishing: number;
  failed: number;
  /** Seconds; absent when nothing waits. */
  oldest?: number;
}

const samples: Sample[] = [];
let oldestRows: BacklogEntry[] = [];
let listeners: (() => void)[] = [];

export function startSampling(context: Context): void {
  const sample = async () => {
    try {
      const reply = await context.api.admin.listBacklog({ status: "PENDING", limit: 20 });
      const stats = reply.stats;
      samples.push({
        at: Date.now(),
        pending: Number(stats?.pending ?? 0n),
        publishing: Number(stats?.publishing ?? 0n),
        failed: Number(stats?.failed ?? 0n),
        oldest: seconds(stats?.oldestPendingAge),
      });
      while (samples.length > 0 && samples[0].at < Date.now() - WINDOW_MS) samples.shift();
      oldestRows = reply.entries;
      context.report(null);
    } catch (error) {
      context.report(failure(error));
    }
    for (const listener of listeners) listener();
    setTimeout(sample, EVERY_MS);
  };
  void sample();
}

export function mount(root: HTMLElement, context: Context): void {
  const cards = h("div", { class: "cards" });
  const chart = h("div", { class: "chart" });
  const rows = h("div", {});
  replace(root, h("h2", {}, "Backlog"), cards, h("h3", {}, "Last minutes"), chart, h("h3", {}, "Oldest waiting"), rows);
  const render = () => {
    if (!root.isConnected) return;
    const last = samples[samples.length - 1];
    replace(
      cards,
      card("PENDING", last?.pending, "pending"),
      card("PUBLISHING", last?.publishing, "publishing"),
      card("FAILED", last?.failed, "failed"),
      card("oldest waiting", last ? age(last.oldest) : undefined, "oldest"),
    );
    replace(chart, drawChart(samples));
    const link = (id: string) => {
      const a = h("a", { href: "#" }, id);
      a.addEventListener("click", (e) => {
        e.preventDefault();
        context.show("timeline", id);
      });
      return a;
    };
    replace(
      rows,
      !last
        ? h("p", { class: "quiet" }, "No answer from the order service yet.")
        : oldestRows.length === 0
        ? h("p", { class: "quiet" }, "Nothing waits for a relay.")
        : table(
            ["event id", "order", "attempts", "created", "last error"],
            oldestRows.map((e) => [
              link(e.eventId),
              e.aggregateId,
              e.outbox?.attempts ?? 0,
              when(e.outbox?.createdAt),
              e.outbox?.lastError || "-",
            ]),
            "backlog-rows",
          ),
    );
  };
  listeners = [render];
  render();
}

function card(label: string, value: number | string | undefined, testId: string): HTMLElement {
  return h(
    "div",
    { class: "card", "data-testid": `count-${testId}` },
    h("div", { class: "value" }, value ?? "…"),
    h("div", { class: "label" }, label),
  );
}

const SVG = "http://www.w3.org/2000/svg";

function svg(tag: string, attributes: Record<string, string | number>, text?: string): SVGElement {
  const element = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) element.setAttribute(name, String(value));
  if (text !== undefined) element.textContent = text;
  return element;
}

/** Backlog (PENDING + PUBLISHING, left axis) and oldest waiting age (right axis) over time. */
function drawChart(points: Sample[]): SVGElement {
  const [width, height, left, right, top, bottom] = [760, 220, 56, 64, 16, 28];
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "data-testid": "backlog-chart" });
  root.appendChild(svg("title", {}, "Backlog and oldest waiting age over the last minutes"));
  // The last 10 minutes, or since the first sample (at least a minute) while the page is young.
  const now = Date.now();
  const span = Math.min(WINDOW_MS, Math.max(60_000, now - (points[0]?.at ?? now)));
  const x = (at: number) => left + ((at - (now - span)) / span) * (width - left - right);
  const maxCount = Math.max(1, ...points.map((p) => p.pending + p.publishing));
  const maxAge = Math.max(1, ...points.map((p) => p.oldest ?? 0));
  const yCount = (v: number) => top + (1 - v / maxCount) * (height - top - bottom);
  const yAge = (v: number) => top + (1 - v / maxAge) * (height - top - bottom);
  root.appendChild(svg("rect", { x: left, y: top, width: width - left - right, height: height - top - bottom, class: "plot" }));
  for (const fraction of [1, 0.5, 0]) {
    const ago = (span * fraction) / 1000;
    const label = ago === 0 ? "now" : ago >= 60 ? `-${+(ago / 60).toFixed(1)} min` : `-${ago} s`;
    root.appendChild(svg("text", { x: x(now - ago * 1000), y: height - 8, class: "axis", "text-anchor": "middle" }, label));
  }
  root.appendChild(svg("text", { x: left - 6, y: top + 10, class: "axis count", "text-anchor": "end" }, String(maxCount)));
  root.appendChild(svg("text", { x: left - 6, y: height - bottom, class: "axis count", "text-anchor": "end" }, "0"));
  root.appendChild(svg("text", { x: width - right + 6, y: top + 10, class: "axis age" }, age(maxAge)));
  root.appendChild(svg("text", { x: width - right + 6, y: height - bottom, class: "axis age" }, "0 s"));
  const line = (values: [number, number][], cls: string) =>
    svg("polyline", { points: values.map(([a, b]) => `${a.toFixed(1)},${b.toFixed(1)}`).join(" "), class: cls });
  root.appendChild(line(points.map((p) => [x(p.at), yCount(p.pending + p.publishing)]), "series count"));
  root.appendChild(line(points.map((p) => [x(p.at), yAge(p.oldest ?? 0)]), "series age"));
  const legend = svg("g", { class: "legend" });
  legend.appendChild(svg("text", { x: left + 8, y: top + 14, class: "count" }, "■ waiting (PENDING + PUBLISHING)"));
  legend.appendChild(svg("text", { x: left + 260, y: top + 14, class: "age" }, "■ oldest waiting age"));
  root.appendChild(legend);
  return root;
}
