// One write through a fault the Rust test armed (a failpoint in the order service, or its
// database stopped): IDEMPOST_TS_EXPECT names the write (the order under test's submission, or an
// amendment of it to version 2 after a submission the fault lets through) and the calls the safe
// caller protocol must make.

import assert from "node:assert/strict";
import { test } from "node:test";

import { create } from "@bufbuild/protobuf";

import { GaveUp, type Confirmed } from "../../src/index.js";
import { AmendOrderRequestSchema } from "../../src/gen/idempost/v1/order_service_pb.js";
import { env, orderUnderTest, rejection, submitter } from "./env.js";

const expected = JSON.parse(env("IDEMPOST_TS_EXPECT")) as {
  /** Which write goes through the fault; submit by default. */
  write?: "submit" | "amend";
  /** `call CODE [REASON]` of every call, in order. */
  calls: string[];
  /** How the write ended: committed, reconciled, or gave_up. */
  outcome: "committed" | "reconciled" | "gave_up";
  maxCalls?: number;
};
const write = expected.write ?? "submit";

/** The request id and event id of the write under test. */
const [requestId, eventId] =
  write === "submit"
    ? [env("IDEMPOST_TS_REQUEST_ID"), env("IDEMPOST_TS_EVENT_ID")]
    : ["amend-ts-1", env("IDEMPOST_TS_AMEND_EVENT_ID")];

/** Sends the write under test with `safe`; an amendment first submits the order it changes. */
async function send(safe: ReturnType<typeof submitter>["safe"]): Promise<Confirmed> {
  if (write === "submit") return safe.submit(orderUnderTest());
  const { orderId } = await submitter(env("IDEMPOST_TS_TOKEN_FILE")).safe.submit(orderUnderTest());
  const lineItems = [{ sku: "SKU-BLUE-MUG", quantity: 3, unitPriceMinor: 1000n }];
  return safe.amend(create(AmendOrderRequestSchema, { requestId, orderId, expectedVersion: 1n, lineItems, eventId }));
}

test(`through the fault the ${write} makes the expected calls with one event id and ends ${expected.outcome}`, async () => {
  const { safe, calls, made, sentEventIds } = submitter(env("IDEMPOST_TS_TOKEN_FILE"), {
    maxCalls: expected.maxCalls ?? 8,
  });

  if (expected.outcome === "gave_up") {
    const error = await rejection(send(safe));
    assert.ok(error instanceof GaveUp, String(error));
    assert.equal(error.eventId, eventId, "the event id to reuse later");
  } else {
    const confirmed = await send(safe);
    assert.equal(confirmed.confirmation, expected.outcome);
    assert.equal(confirmed.eventId, eventId);
    assert.equal(confirmed.version, write === "submit" ? 1n : 2n);
  }

  assert.deepEqual(made(), expected.calls);
  assert.deepEqual(sentEventIds(), new Set([eventId]), `every ${write} sent the same event id`);
  // Every refused write's ErrorInfo names it: its key as sent (tenant 0: the token's), and the
  // event id it was sent with.
  for (const { call, failure } of calls) {
    if (call !== write || failure === undefined) continue;
    assert.deepEqual(
      { tenant: failure.metadata.tenant_id, request: failure.metadata.request_id, event: failure.metadata.event_id },
      { tenant: "0", request: requestId, event: eventId },
      failure.message,
    );
  }
});
