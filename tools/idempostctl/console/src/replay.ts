// Replay: PUBLISHED events published again for a consumer that must see them again (AdminService
// Replay). Always a dry run first, which counts and lists; only then is Replay… enabled, for the
// same filter, behind a confirmation. The service records the token's subject and the reason.
import { timestampFromDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import { describe, failure } from "./api.js";
import { h, replace, table } from "./dom.js";
import { when } from "./format.js";
import { parseDuration } from "./purge.js";
import type { Context } from "./context.js";
import type { ReplayResponse } from "./stubs.js";

const TYPES = ["", "idempost.v1.OrderAccepted", "idempost.v1.OrderAmended", "idempost.v1.OrderCancelled"];

/** An RFC 3339 time, or an age such as "2h" (that long ago); empty means no bound. */
function parseInstant(text: string): Timestamp | undefined | "invalid" {
  const t = text.trim();
  if (t === "") return undefined;
  const age = parseDuration(t);
  if (age !== undefined && age !== "invalid") return timestampFromDate(new Date(Date.now() - Number(age.seconds) * 1000));
  const at = new Date(t);
  return Number.isNaN(at.getTime()) || !/^\d{4}-\d{2}-\d{2}T/.test(t) ? "invalid" : timestampFromDate(at);
}

export function mount(root: HTMLElement, context: Context): void {
  const order = h("input", { placeholder: "any", size: "10", "data-testid": "replay-order" });
  const from = h("input", { placeholder: "2h or 2026-12-06T09:00:00Z", size: "26", "data-testid": "replay-from" });
  const to = h("input", { placeholder: "now", size: "26", "data-testid": "replay-to" });
  const type = h("select", { "data-testid": "replay-type" }, ...TYPES.map((t) => h("option", { value: t }, t || "every type")));
  const reason = h("input", { size: "50", "data-testid": "replay-reason" });
  const dry = h("button", { type: "button", "data-testid": "replay-dry-run" }, "Dry run");
  const real = h("button", { type: "button", class: "danger", disabled: true, "data-testid": "replay" }, "Replay…");
  const result = h("div", { "data-testid": "replay-result" });
  replace(
    root,
    h("h2", {}, "Replay"),
    h("p", {}, "Publishes PUBLISHED events again with their own event ids: a consumer that applied them absorbs the copies as duplicates, a new consumer name applies them, one order's versions in order. Rows not published yet, and rows retention deleted, are counted, not replayed. At most 1000 events per replay: narrow the range for more."),
    h("p", {}, h("label", {}, "order ", order), " ", h("label", {}, "created from ", from), " ", h("label", {}, "to ", to)),
    h("p", {}, h("label", {}, "event type ", type)),
    h("p", {}, h("label", {}, "reason (required, audited) ", reason)),
    h("p", {}, dry, " ", real),
    result,
  );
  let counted = "";
  const settings = () => [order.value, from.value, to.value, type.value, reason.value].map((v) => v.trim()).join("|");
  for (const input of [order, from, to, type, reason]) {
    input.addEventListener("input", () => {
      real.disabled = settings() !== counted;
    });
  }
  const run = async (dryRun: boolean) => {
    const createdFrom = parseInstant(from.value);
    const createdTo = parseInstant(to.value);
    const orderId = order.value.trim() === "" ? 0n : /^\d+$/.test(order.value.trim()) ? BigInt(order.value.trim()) : -1n;
    if (createdFrom === "invalid" || createdTo === "invalid" || orderId < 0n) {
      replace(result, h("p", { class: "error" }, "The order is a number; times are RFC 3339 (2026-12-06T09:00:00Z) or an age such as 2h."));
      return;
    }
    replace(result, h("p", { class: "quiet" }, dryRun ? "Counting…" : "Replaying…"));
    try {
      const answer = await context.api.admin.replay({ orderId, createdFrom, createdTo, eventType: type.value, dryRun, reason: reason.value, listLimit: 50 });
      replace(result, ...shown(answer, context));
      counted = dryRun && answer.replayed > 0n ? settings() : "";
      real.disabled = counted === "";
    } catch (error) {
      replace(result, h("p", { class: "error", "data-testid": "replay-error" }, `Refused: ${describe(failure(error))}`));
      counted = "";
      real.disabled = true;
    }
  };
  dry.addEventListener("click", () => void run(true));
  real.addEventListener("click", () => {
    const yes = h("button", { type: "button", class: "danger", "data-testid": "confirm-replay" }, "Publish them again");
    const no = h("button", { type: "button" }, "Cancel");
    const panel = h("div", { class: "confirm", role: "dialog" }, h("p", {}, "Publish again the events the dry run counted (and any that match now)?"), yes, no);
    result.prepend(panel);
    no.addEventListener("click", () => panel.remove());
    yes.addEventListener("click", () => void run(false));
  });
}

function shown(answer: ReplayResponse, context: Context): (HTMLElement | null)[] {
  const headline = answer.dryRun
    ? `Dry run: ${answer.replayed} events would be replayed; nothing was changed.`
    : `Replayed ${answer.replayed} events (audit row ${answer.auditId}).`;
  const rows = answer.events.map((e) => {
    const link = h("a", { href: "#" }, e.eventId);
    link.addEventListener("click", (click) => {
      click.preventDefault();
      context.show("timeline", e.eventId);
    });
    return [link, e.orderId, e.version, e.eventType, when(e.createdAt)];
  });
  return [
    h("p", { "data-testid": answer.dryRun ? "replay-dry-run-done" : "replay-done" }, headline),
    table(["", "events"], [
      [answer.dryRun ? "would replay" : "replayed", answer.replayed],
      ["not published yet (left alone)", answer.notPublished],
      ["purged by retention (cannot be replayed)", answer.purged],
    ], "replay-counts"),
    rows.length ? table(["event id", "order", "version", "type", "created at"], rows, "replay-events") : null,
  ];
}
