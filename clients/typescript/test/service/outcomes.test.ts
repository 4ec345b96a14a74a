// COMMITTED, a replay, Reconcile found and not found, and the refusals that write nothing:
// another tenant (TENANT_MISMATCH), no token, an invalid order, a request id reused.

import assert from "node:assert/strict";
import { test } from "node:test";

import { Rejected } from "../../src/index.js";
import { OrderStatus } from "../../src/gen/idempost/v1/order_pb.js";
import { env, order, orderUnderTest, rejection, submitter } from "./env.js";

const eventId = env("IDEMPOST_TS_EVENT_ID");
const requestId = env("IDEMPOST_TS_REQUEST_ID");

test("an order commits once under the caller's event id and its replay answers with the same order", async () => {
  const { safe, made } = submitter(env("IDEMPOST_TS_TOKEN_FILE"));

  const committed = await safe.submit(orderUnderTest());
  const replayed = await safe.submit(order(requestId));

  assert.deepEqual(
    { confirmation: committed.confirmation, eventId: committed.eventId, calls: committed.calls },
    { confirmation: "committed", eventId, calls: 1 },
  );
  assert.equal(replayed.confirmation, "replayed");
  assert.equal(replayed.eventId, eventId, "a replay answers with the original event id");
  assert.equal(replayed.orderId, committed.orderId);
  assert.deepEqual(made(), ["submit OK", "submit OK"]);
});

test("Reconcile finds the committed order by its key and says when a key never committed", async () => {
  const { safe } = submitter(env("IDEMPOST_TS_TOKEN_FILE"));

  const found = await safe.reconcile(0n, requestId);
  const missing = await safe.reconcile(0n, "req-ts-never-sent");

  assert.ok(found !== undefined, "the order committed by the first test");
  assert.equal(found.eventId, eventId);
  assert.equal(found.totalMinor, 2n * 1250n + 799n);
  assert.equal(found.status, OrderStatus.ACCEPTED);
  assert.ok(found.acceptedAt !== undefined);
  assert.equal(missing, undefined);
});

/** The refusal `promise` ended with, as `CODE REASON` after how many calls. */
async function refusal(promise: Promise<unknown>): Promise<string> {
  const error = await rejection(promise);
  assert.ok(error instanceof Rejected, String(error));
  return `${error.failure.codeName} ${error.failure.reason} after ${error.calls} call(s)`;
}

test("a token of another tenant is refused with TENANT_MISMATCH, at once and without a retry", async () => {
  const { safe } = submitter(env("IDEMPOST_TS_OTHER_TENANT_TOKEN_FILE"));
  const other = order("req-ts-other-tenant", { tenantId: 7n });

  assert.equal(await refusal(safe.submit(other)), "PERMISSION_DENIED TENANT_MISMATCH after 1 call(s)");
  await assert.rejects(safe.reconcile(7n, requestId), /PERMISSION_DENIED TENANT_MISMATCH/);
});

test("a call without a token is refused with TOKEN_MISSING", async () => {
  const { safe } = submitter(undefined);

  assert.equal(await refusal(safe.submit(order("req-ts-no-token"))), "UNAUTHENTICATED TOKEN_MISSING after 1 call(s)");
});

test("an invalid order and a request id reused for other content are refused and never retried", async () => {
  const { safe, made } = submitter(env("IDEMPOST_TS_TOKEN_FILE"));

  const invalid = await refusal(safe.submit(order("req-ts-invalid", { currency: "eur" })));
  const reused = await refusal(safe.submit(order(requestId, { currency: "USD" })));

  assert.equal(invalid, "INVALID_ARGUMENT INVALID_ORDER after 1 call(s)");
  assert.equal(reused, "ALREADY_EXISTS REQUEST_ID_REUSED after 1 call(s)");
  assert.equal(made().length, 2);
});
