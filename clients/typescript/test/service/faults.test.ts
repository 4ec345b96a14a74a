// One order through a fault the Rust test armed (a failpoint in the order service, or its
// database stopped): OUTPOST_TS_EXPECT names the calls the safe caller protocol must make.

import assert from "node:assert/strict";
import { test } from "node:test";

import { GaveUp } from "../../src/index.js";
import { env, orderUnderTest, rejection, submitter } from "./env.js";

const expected = JSON.parse(env("OUTPOST_TS_EXPECT")) as {
  /** `call CODE [REASON]` of every call, in order. */
  calls: string[];
  /** How the order ended: committed, reconciled, or gave_up. */
  outcome: "committed" | "reconciled" | "gave_up";
  maxCalls?: number;
};

test(`through the fault the submitter makes the expected calls with one event id and ends ${expected.outcome}`, async () => {
  const { safe, calls, made, sentEventIds } = submitter(env("OUTPOST_TS_TOKEN_FILE"), {
    maxCalls: expected.maxCalls ?? 8,
  });
  const eventId = env("OUTPOST_TS_EVENT_ID");

  if (expected.outcome === "gave_up") {
    const error = await rejection(safe.submit(orderUnderTest()));
    assert.ok(error instanceof GaveUp, String(error));
    assert.equal(error.eventId, eventId, "the event id to reuse later");
  } else {
    const confirmed = await safe.submit(orderUnderTest());
    assert.equal(confirmed.confirmation, expected.outcome);
    assert.equal(confirmed.eventId, eventId);
  }

  assert.deepEqual(made(), expected.calls);
  assert.deepEqual(sentEventIds(), new Set([eventId]), "every submit sent the same event id");
  // Every refused submit's ErrorInfo names the order: its key as sent (tenant 0: the token's),
  // and the event id it was sent with.
  for (const { call, failure } of calls) {
    if (call !== "submit" || failure === undefined) continue;
    assert.deepEqual(
      { tenant: failure.metadata.tenant_id, request: failure.metadata.request_id, event: failure.metadata.event_id },
      { tenant: "0", request: env("OUTPOST_TS_REQUEST_ID"), event: eventId },
      failure.message,
    );
  }
});
