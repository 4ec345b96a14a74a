// The retention purge of both sides: always a dry run first, then the same purge for real after a
// confirmation. PENDING, PUBLISHING and FAILED rows and dedup rows inside the consumer's
// redelivery horizon are never deleted (the services refuse).
import type { Duration } from "@bufbuild/protobuf/wkt";
import { describe, failure } from "./api.js";
import { h, replace, table } from "./dom.js";
import { age, seconds, when } from "./format.js";
import type { Context } from "./context.js";

/** "90s", "15m", "24h" or "7d" as a Duration; empty means the service's own window. */
export function parseDuration(text: string): Duration | undefined | "invalid" {
  const t = text.trim();
  if (t === "") return undefined;
  const m = /^(\d+)\s*(s|m|h|d)$/.exec(t);
  if (!m) return "invalid";
  const unit = { s: 1, m: 60, h: 3600, d: 86400 }[m[2] as "s" | "m" | "h" | "d"];
  return { seconds: BigInt(Number(m[1]) * unit), nanos: 0 } as Duration;
}

export function mount(root: HTMLElement, context: Context): void {
  const outbox = h("input", { placeholder: "service's window", size: "14", "data-testid": "outbox-older-than" });
  const consumed = h("input", { placeholder: "service's window", size: "14", "data-testid": "consumed-older-than" });
  const reason = h("input", { placeholder: "why these rows may go", size: "40", "data-testid": "purge-reason" });
  const dry = h("button", { type: "button", "data-testid": "dry-run" }, "Dry run");
  const real = h("button", { type: "button", class: "danger", disabled: true, "data-testid": "purge" }, "Purge…");
  const result = h("div", { "data-testid": "purge-result" });
  replace(
    root,
    h("h2", {}, "Purge"),
    h("p", {}, "Deletes PUBLISHED outbox rows (order side) and consumed_event rows (consumer side) past their retention. A dry run comes first and counts what would go."),
    h("p", {}, h("label", {}, "outbox rows published more than ", outbox, " ago (such as 7d)")),
    h("p", {}, h("label", {}, "dedup rows consumed more than ", consumed, " ago (never inside the redelivery horizon)")),
    h("p", {}, h("label", {}, "reason (required, recorded in the audit) ", reason)),
    h("p", {}, dry, " ", real),
    result,
  );
  let counted = "";
  const settings = () => `${outbox.value.trim()}|${consumed.value.trim()}|${reason.value.trim()}`;
  for (const input of [outbox, consumed, reason]) {
    input.addEventListener("input", () => {
      real.disabled = settings() !== counted;
    });
  }
  const run = async (dryRun: boolean) => {
    const outboxOlderThan = parseDuration(outbox.value);
    const consumedOlderThan = parseDuration(consumed.value);
    if (outboxOlderThan === "invalid" || consumedOlderThan === "invalid") {
      replace(result, h("p", { class: "error" }, "Durations are a number and s, m, h or d, such as 7d."));
      return;
    }
    const why = reason.value.trim();
    if (why === "") {
      replace(result, h("p", { class: "error" }, "Say why these rows may go: a purge is audited with its reason."));
      return;
    }
    replace(result, h("p", { class: "quiet" }, dryRun ? "Counting…" : "Purging…"));
    const verb = dryRun ? "would delete" : "deleted";
    const rows: (string | number | bigint)[][] = [];
    try {
      const o = await context.api.admin.purge({ outboxOlderThan, dryRun, reason: why });
      rows.push(["outbox_event (PUBLISHED)", o.outboxRows, when(o.outboxCutoff), "-"]);
    } catch (error) {
      replace(result, h("p", { class: "error" }, `The order side refused: ${describe(failure(error))}`));
      return;
    }
    try {
      const c = await context.api.consumer.purgeConsumed({ consumedOlderThan, dryRun, reason: why });
      rows.push(["consumed_event", c.consumedRows, when(c.consumedCutoff), age(seconds(c.redeliveryHorizon))]);
    } catch (error) {
      rows.push(["consumed_event", "-", "-", `the consumer side refused: ${describe(failure(error))}`]);
    }
    replace(
      result,
      h("p", { "data-testid": dryRun ? "dry-run-done" : "purge-done" }, dryRun ? "Dry run: nothing was deleted." : "Purged."),
      table(["table", verb, "older than (database clock)", "redelivery horizon"], rows),
    );
    counted = dryRun ? settings() : "";
    real.disabled = !dryRun;
  };
  dry.addEventListener("click", () => void run(true));
  real.addEventListener("click", () => {
    const yes = h("button", { type: "button", class: "danger", "data-testid": "confirm-purge" }, "Delete them");
    const no = h("button", { type: "button" }, "Cancel");
    const panel = h("div", { class: "confirm", role: "dialog" }, h("p", {}, "Delete the rows the dry run counted (and any that aged past the cut-off since)?"), yes, no);
    result.prepend(panel);
    no.addEventListener("click", () => panel.remove());
    yes.addEventListener("click", () => void run(false));
  });
}
