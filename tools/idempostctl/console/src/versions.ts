// Every version of an order on one table: each event's outbox status (the order side's answer
// lists them) and what the consumer side did with it: applied to its read model, parked behind a
// missing earlier version, dead-lettered, or not consumed yet (one GetConsumerTimeline per event
// and one ListParkedEvents of the order).
import { describe, failure } from "./api.js";
import { h, table } from "./dom.js";
import { when } from "./format.js";
import type { Context } from "./context.js";
import type { ConsumerTimeline, EventTimeline, ParkedEventRecord } from "./stubs.js";

/** The table of every version of `order`'s order; null when the answer lists none. */
export async function versions(context: Context, order: EventTimeline | undefined, open: (eventId: string) => void): Promise<Node | null> {
  const events = order?.orderEvents ?? [];
  if (!order?.order || events.length === 0) return null;
  let states: string[];
  try {
    const parked = (await context.api.consumer.listParkedEvents({ orderId: order.order.orderId, limit: 1000 })).parkedEvents;
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
  return h("section", {}, h("h3", {}, "Every version of the order"), table(header, rows, "timeline-versions"));
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
