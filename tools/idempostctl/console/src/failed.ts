// FAILED events (the order side's outbox rows no relay will retry) with their audited redrive,
// and the consumer side's dead letters; both filtered, each payload decoded.
import { describe, failure } from "./api.js";
import { h, replace, table } from "./dom.js";
import { EVENT_TYPES, decoded, when } from "./format.js";
import type { Context } from "./context.js";
import type { BacklogEntry, DeadLetterRecord, OutboxRecord } from "./stubs.js";

/** The redrives made from this page since it was opened: who (as the service recorded it) and what. */
const redriven: { eventId: string; outbox: OutboxRecord }[] = [];

export function mount(root: HTMLElement, context: Context): void {
  const filter = h("input", { placeholder: "filter: event id, order, consumer or error", size: "48", "data-testid": "filter" });
  const failedList = h("div", {});
  const log = h("div", { "data-testid": "redrive-log" });
  const letters = h("div", {});
  replace(
    root,
    h("h2", {}, "Dead letters & FAILED events"),
    h("p", {}, filter),
    h("h3", {}, "FAILED events (order side)"),
    failedList,
    h("h3", {}, "Redriven from this console"),
    log,
    h("h3", {}, "Dead letters (consumer side)"),
    letters,
  );
  let rows: BacklogEntry[] = [];
  let dead: DeadLetterRecord[] = [];
  // Whether more rows follow those listed: `idempostctl backlog` / `dead-letters` page through them.
  let moreFailed = false;
  let moreDead = false;
  const more = (shown: boolean, command: string) =>
    shown ? h("p", { class: "quiet", "data-testid": "more-rows" }, `More follow than this page holds: \`idempostctl ${command} --page-token\` lists them.`) : null;
  const matches = (...texts: string[]) => {
    const needle = filter.value.trim().toLowerCase();
    return needle === "" || texts.some((t) => t.toLowerCase().includes(needle));
  };
  const render = () => {
    const shown = rows.filter((e) => matches(e.eventId, e.aggregateId, e.outbox?.lastError ?? ""));
    replace(
      failedList,
      shown.length === 0
        ? h("p", { class: "quiet", "data-testid": "no-failed" }, "No FAILED event.")
        : table(["event id", "order", "attempts", "created", "last error", ""], shown.map((e) => failedRow(context, e, done)), "failed-rows"),
      more(moreFailed, "backlog --status FAILED"),
    );
    replace(
      log,
      redriven.length === 0
        ? h("p", { class: "quiet" }, "None yet.")
        : table(
            ["event id", "by", "reason", "when", "status after"],
            redriven.map(({ eventId, outbox }) => [eventId, outbox.lastRedrivenBy, outbox.lastRedriveReason, when(outbox.lastRedrivenAt), outbox.status]),
            "redrive-rows",
          ),
    );
    const shownLetters = dead.filter((d) => matches(d.eventId, d.consumerName, d.error));
    replace(
      letters,
      shownLetters.length === 0
        ? h("p", { class: "quiet" }, "No dead letter.")
        : table(["when", "consumer", "event id", "at", "error", "payload"], shownLetters.map(letterRow), "dead-letter-rows"),
      more(moreDead, "dead-letters"),
    );
  };
  const refresh = async () => {
    try {
      // Payloads are shown here, so asked for; an answer stops at 1 MiB, and a note says so.
      const reply = await context.api.admin.listBacklog({ status: "FAILED", limit: 200, includePayloads: true });
      rows = reply.entries;
      moreFailed = reply.nextPageToken !== "";
    } catch (error) {
      replace(failedList, h("p", { class: "error" }, describe(failure(error))));
      return;
    }
    try {
      const reply = await context.api.consumer.listDeadLetters({ limit: 200, includePayloads: true });
      dead = reply.deadLetters;
      moreDead = reply.nextPageToken !== "";
    } catch (error) {
      replace(letters, h("p", { class: "error" }, `The consumer side did not answer: ${describe(failure(error))}`));
      dead = [];
    }
    render();
  };
  const done = (eventId: string, outbox: OutboxRecord) => {
    redriven.unshift({ eventId, outbox });
    void refresh();
  };
  filter.addEventListener("input", render);
  void refresh();
}

/** One FAILED event: its payload on demand and the redrive: a reason, then a confirmation. */
type Done = (eventId: string, outbox: OutboxRecord) => void;

function failedRow(context: Context, e: BacklogEntry, done: Done): (Node | string | number)[] {
  const box = e.outbox;
  const actions = h("div", { class: "actions" });
  const payload = h("details", {}, h("summary", {}, "payload"), h("pre", {}, decoded(box?.eventType ?? "", box?.payload ?? new Uint8Array())));
  const start = h("button", { type: "button", "data-testid": `redrive-${e.eventId}` }, "Redrive…");
  start.addEventListener("click", () => askReason(context, e.eventId, actions, done));
  replace(actions, payload, start);
  return [e.eventId, e.aggregateId, box?.attempts ?? 0, when(box?.createdAt), box?.lastError || "-", actions];
}
function askReason(context: Context, eventId: string, actions: HTMLElement, done: Done): void {
  const reason = h("input", { placeholder: "why it may be published now (required)", size: "40", "data-testid": "redrive-reason" });
  const next = h("button", { type: "submit" }, "Redrive");
  const cancel = h("button", { type: "button" }, "Cancel");
  const note = h("span", { class: "error" });
  const form = h("form", { class: "redrive" }, reason, next, cancel, note);
  cancel.addEventListener("click", () => form.remove());
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (reason.value.trim() === "") {
      note.textContent = "A reason is required: it is recorded on the event.";
      return;
    }
    confirmRedrive(context, eventId, reason.value.trim(), form, done);
  });
  actions.appendChild(form);
  reason.focus();
}

function confirmRedrive(context: Context, eventId: string, reason: string, form: HTMLFormElement, done: Done): void {
  const yes = h("button", { type: "button", class: "danger", "data-testid": "confirm-redrive" }, "Confirm redrive");
  const no = h("button", { type: "button" }, "Cancel");
  const panel = h("div", { class: "confirm", role: "dialog" }, h("p", {}, `Return event ${eventId} from FAILED to PENDING, so a relay publishes it again, with the reason “${reason}”?`), yes, no);
  form.replaceWith(panel);
  no.addEventListener("click", () => panel.remove());
  yes.addEventListener("click", async () => {
    yes.disabled = true;
    try {
      const reply = await context.api.admin.redrive({ eventId, reason, requestedBy: "" });
      if (reply.outbox) done(eventId, reply.outbox);
      panel.remove();
    } catch (error) {
      replace(panel, h("p", { class: "error", "data-testid": "redrive-error" }, describe(failure(error))));
    }
  });
}

function letterRow(d: DeadLetterRecord): (Node | string)[] {
  const at = d.coordinates ? `${d.coordinates.topic}/${d.coordinates.partition}/${d.coordinates.offset}` : "-";
  const pre = h("pre", {});
  const type = h("select", {}, ...Object.keys(EVENT_TYPES).map((t) => h("option", { value: t }, t)));
  const show = () => {
    pre.textContent = decoded(type.value, d.payload);
  };
  type.addEventListener("change", show);
  show();
  return [when(d.createdAt), d.consumerName, d.eventId || "-", at, d.error, h("details", {}, h("summary", {}, "payload as "), type, pre)];
}
