// One event's timeline, joined from the order side (AdminService) and the consumer side
// (ConsumerAdminService), found by event id or by tenant and request id, followed by every
// version of its order with each event's state on both sides.
import { Code, ConnectError } from "@connectrpc/connect";
import { describe, failure } from "./api.js";
import { h, replace, table } from "./dom.js";
import { decoded, millis, when } from "./format.js";
import type { Context } from "./context.js";
import type { ConsumerTimeline, EventTimeline } from "./stubs.js";
import { versions } from "./versions.js";

export function mount(root: HTMLElement, context: Context, eventId?: string): void {
  const byId = h("input", { name: "event-id", placeholder: "event id (UUID)", size: "40", "data-testid": "search-event-id" });
  const tenant = h("input", { name: "tenant-id", placeholder: "tenant id", size: "8", "data-testid": "search-tenant" });
  const request = h("input", { name: "request-id", placeholder: "request id", size: "24", "data-testid": "search-request" });
  const idForm = h("form", { class: "search" }, byId, h("button", { type: "submit" }, "Find event"));
  const keyForm = h("form", { class: "search" }, tenant, request, h("button", { type: "submit" }, "Find order"));
  const result = h("div", { "data-testid": "timeline-result" });
  replace(root, h("h2", {}, "Event timeline"), idForm, keyForm, result);
  idForm.addEventListener("submit", (e) => {
    e.preventDefault();
    void show(context, result, { eventId: byId.value.trim() });
  });
  keyForm.addEventListener("submit", (e) => {
    e.preventDefault();
    void show(context, result, { tenantId: tenant.value.trim(), requestId: request.value.trim() });
  });
  if (eventId) {
    byId.value = eventId;
    void show(context, result, { eventId });
  }
}

type Query = { eventId: string } | { tenantId: string; requestId: string };

async function show(context: Context, result: HTMLElement, query: Query): Promise<void> {
  replace(result, h("p", { class: "quiet" }, "Asking…"));
  let order: EventTimeline | undefined;
  try {
    if ("eventId" in query) {
      order = (await context.api.admin.getEventTimeline({ eventId: query.eventId })).timeline;
    } else {
      const tenantId = /^\d+$/.test(query.tenantId) ? BigInt(query.tenantId) : 0n;
      order = (await context.api.admin.findByBusinessKey({ tenantId, requestId: query.requestId })).timeline;
    }
  } catch (error) {
    // Not found on the order side: the consumer side may still know the event id.
    if (!("eventId" in query) || ConnectError.from(error).code !== Code.NotFound) {
      replace(result, h("p", { class: "error", "data-testid": "timeline-error" }, describe(failure(error))));
      return;
    }
  }
  const eventId = order?.eventId ?? ("eventId" in query ? query.eventId : "");
  let consumer: ConsumerTimeline | undefined;
  let consumerProblem = "";
  try {
    consumer = (await context.api.consumer.getConsumerTimeline({ eventId })).timeline;
  } catch (error) {
    consumerProblem = describe(failure(error));
  }
  const consumerKnows = consumer && (consumer.consumers.length + consumer.notificationJobs.length + consumer.deadLetters.length) > 0;
  if (!order && !consumerKnows) {
    replace(result, h("p", { class: "error", "data-testid": "timeline-error" }, consumerProblem || `Neither side knows event ${eventId} (EVENT_NOT_FOUND).`));
    return;
  }
  const open = (other: string) => void show(context, result, { eventId: other });
  const versionTable = await versions(context, order, open);
  replace(result, ...render(context, eventId, order, consumer, consumerProblem), versionTable);
}

type Row = [number | undefined, string, string, string];

function render(
  context: Context,
  eventId: string,
  order: EventTimeline | undefined,
  consumer: ConsumerTimeline | undefined,
  consumerProblem: string,
): Node[] {
  const rows: Row[] = [];
  const o = order?.order;
  if (o) {
    rows.push([millis(o.createdAt), when(o.createdAt), "order", `order ${o.orderId} of tenant ${o.tenantId}, request ${o.requestId}: v${o.version} ${o.status}, total ${o.totalMinor} ${o.currency}`]);
  }
  const box = order?.outbox;
  if (box) {
    rows.push([millis(box.createdAt), when(box.createdAt), "outbox", "written PENDING in the order's transaction"]);
    if (box.lastRedrivenAt) {
      rows.push([millis(box.lastRedrivenAt), when(box.lastRedrivenAt), "redrive", `#${box.redriveCount} by ${box.lastRedrivenBy}: ${box.lastRedriveReason}`]);
    }
    const at = box.publishedTo ? ` to ${box.publishedTo.topic}/${box.publishedTo.partition}/${box.publishedTo.offset}` : "";
    const lease = box.leaseOwner ? `, leased by ${box.leaseOwner} until ${when(box.leaseUntil)}` : "";
    const error = box.lastError ? `, last error: ${box.lastError}` : "";
    rows.push([millis(box.publishedAt) ?? Number.MAX_SAFE_INTEGER, when(box.publishedAt), "outbox", `${box.status}${at} after ${box.attempts} attempt(s)${lease}${error}`]);
  } else if (order) {
    rows.push([undefined, "-", "outbox", "no row (purged after publication, or never written)"]);
  }
  for (const c of consumer?.consumers ?? []) rows.push([millis(c.consumedAt), when(c.consumedAt), "consumed", `by ${c.consumerName}`]);
  for (const j of consumer?.notificationJobs ?? []) {
    rows.push([millis(j.createdAt), when(j.createdAt), "effect", `notification job ${j.status} for order ${j.orderId} v${j.sourceVersion} by ${j.consumerName}`]);
  }
  for (const d of consumer?.deadLetters ?? []) {
    const at = d.coordinates ? `${d.coordinates.topic}/${d.coordinates.partition}/${d.coordinates.offset}` : "-";
    rows.push([millis(d.createdAt), when(d.createdAt), "dead letter", `${d.consumerName} at ${at}: ${d.error}`]);
  }
  if (consumerProblem) rows.push([undefined, "-", "consumer side", `not shown: ${consumerProblem}`]);
  rows.sort((a, b) => (a[0] ?? Number.MAX_SAFE_INTEGER) - (b[0] ?? Number.MAX_SAFE_INTEGER));
  const status = box ? h("span", { class: `status ${box.status}`, "data-testid": "timeline-status" }, box.status) : null;
  const nodes: Node[] = [
    h("h3", {}, "Event ", h("code", { "data-testid": "timeline-event-id" }, eventId), " ", status),
    trace(context, box?.traceId ?? ""),
    table(["when", "what", "details"], rows.map(([, at, what, details]) => [at, what, details]), "timeline-rows"),
  ];
  if (box && box.payload.length > 0) {
    nodes.push(h("details", {}, h("summary", {}, `Payload (${box.eventType})`), h("pre", { "data-testid": "timeline-payload" }, decoded(box.eventType, box.payload))));
  }
  return nodes;
}

function trace(context: Context, traceId: string): Node {
  if (!traceId) return h("p", { class: "quiet" }, "Not traced (the submitting call carried no trace).");
  const base = context.config.jaegerUrl;
  const id = h("code", { "data-testid": "trace-id" }, traceId);
  if (!base) return h("p", {}, "Trace ", id, h("span", { class: "quiet" }, " (start the console with --jaeger-url to link it)"));
  const link = h("a", { href: `${base}/trace/${traceId}`, target: "_blank", rel: "noopener noreferrer", "data-testid": "trace-link" }, "open in Jaeger");
  return h("p", {}, "Trace ", id, " ", link);
}
