// An order's versions on one table, the latest first and older ones a page at a time: each
// event's outbox status (the order side's answer lists them) and what the consumer side did with it: applied to its read model, parked behind a
// missing earlier version, dead-lettered, or not consumed yet (one GetConsumerTimeline per event
// and one ListParkedEvents of the order).
import { describe, failure } from "./api.js";
import { h, replace, table } from "./dom.js";
import { when } from "./format.js";
import type { Context } from "./context.js";
import type { ConsumerTimeline, EventTimeline, OrderEventRecord, ParkedEventRecord } from "./stubs.js";

/**
 * The latest versions of `order`'s order (those the timeline carries), with a button for the
 * older ones a page at a time (ListOrderEvents); null when the answer lists none.
 */
export async function versions(context: Context, order: EventTimeline | undefined, open: (eventId: string) => void): Promise<Node | null> {
  const events = order?.orderEvents ?? [];
  if (!order?.order || events.length === 0) return null;
  const section = h("section", {});
  const older = order.orderEventsTotal > BigInt(events.length) ? events[0].version : 0n;
  await page(context, section, order, { events, total: order.orderEventsTotal, older }, open);
  return section;
}

/** One page of an order's versions: oldest first, how many the order has, and where older ones start (0: none). */
interface Page {
  events: OrderEventRecord[];
  total: bigint;
  older: bigint;
}

async function page(context: Context, section: HTMLElement, order: EventTimeline, shown: Page, open: (eventId: string) => void): Promise<void> {
  const { events } = shown;
  let states: string[];
  try {
    const parked = (await context.api.consumer.listParkedEvents({ orderId: order.order!.orderId, limit: 1000 })).parkedEvents;
    const consumed = await Promise.all(events.map(async (e) => (await context.api.consumer.getConsumerTimeline({ eventId: e.eventId })).timeline));
    states = consumed.map((c, i) => consumerState(events[i].eventId, c, parked));
  } catch (error) {
    states = events.map(() => `unknown: ${describe(failure(error))}`);
  }
  const rows = events.map((event, i) => {
    const link = h("a", { href: "#", "data-testid": `version-event-${event.version}` }, event.eventId);
    link.addEventListener("click", (click) => {
      click.preventDefault();
      open(event.eventId);
    });
    const outbox = event.outboxStatus || "purged";
    return [
      `v${event.version}`,
      when(event.committedAt),
      event.operation,
      event.requestId,
      event.eventId === order.eventId ? h("span", {}, link, " (this event)") : link,
      h("span", { class: `status ${outbox}` }, outbox),
      states[i],
    ];
  });
  const header = ["version", "committed", "operation", "request id", "event id", "outbox", "consumer"];
  const title = `${events.length} of the order's ${shown.total} versions`;
  const note = h("p", { class: "error" });
  let more: HTMLElement | null = null;
  if (shown.older > 0n) {
    more = h("button", { type: "button", "data-testid": "older-versions" }, "Older versions");
    more.addEventListener("click", async () => {
      try {
        const reply = await context.api.admin.listOrderEvents({ orderId: order.order!.orderId, beforeVersion: shown.older, limit: 0 });
        await page(context, section, order, { events: reply.orderEvents, total: reply.total, older: reply.nextBeforeVersion }, open);
      } catch (error) {
        note.textContent = describe(failure(error));
      }
    });
  }
  replace(section, h("h3", { "data-testid": "timeline-versions-title" }, title), table(header, rows, "timeline-versions"), more, note);
}

/** Per consumer name: dead-lettered, parked (with why) or applied; as `idempostctl timeline` says it. */
function consumerState(eventId: string, c: ConsumerTimeline | undefined, parked: ParkedEventRecord[]): string {
  const states = (c?.deadLetters ?? []).map((d) => `dead-lettered by ${d.consumerName}`);
  for (const record of c?.consumers ?? []) {
    const waiting = parked.find((p) => p.eventId === eventId && p.consumerName === record.consumerName);
    states.push(waiting ? `parked by ${record.consumerName}: ${waiting.reason}` : `applied by ${record.consumerName}`);
  }
  return states.length ? states.join("; ") : "not consumed yet";
}
