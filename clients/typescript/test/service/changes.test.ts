// AmendOrder and CancelOrder through the safe caller protocol: an amendment that commits version
// 2, a stale expected_version refused with VERSION_CONFLICT (and the current version), a
// cancellation, and an amendment after it refused with ORDER_CANCELLED. The tests run in order
// on one order, as its versions grow.

import assert from "node:assert/strict";
import { test } from "node:test";

import { create } from "@bufbuild/protobuf";

import { OrderIsCancelled, VersionConflict } from "../../src/index.js";
import { CancelReason, OrderStatus } from "../../src/gen/idempost/v1/order_pb.js";
import {
  AmendOrderRequestSchema,
  CancelOrderRequestSchema,
  OrderOperation,
  type AmendOrderRequest,
} from "../../src/gen/idempost/v1/order_service_pb.js";
import { env, orderUnderTest, rejection, submitter } from "./env.js";

const { safe, made } = submitter(env("IDEMPOST_TS_TOKEN_FILE"));
let orderId = 0n;

/** An amendment of the order under test at `expectedVersion` to three blue mugs (total 3000). */
function amendment(requestId: string, expectedVersion: bigint, eventId = ""): AmendOrderRequest {
  return create(AmendOrderRequestSchema, {
    tenantId: 0n,
    requestId,
    orderId,
    expectedVersion,
    lineItems: [{ sku: "SKU-BLUE-MUG", quantity: 3, unitPriceMinor: 1000n }],
    eventId,
  });
}

test("an amendment of version 1 commits version 2 under the caller's event id, once", async () => {
  orderId = (await safe.submit(orderUnderTest())).orderId;
  const eventId = env("IDEMPOST_TS_AMEND_EVENT_ID");

  const amended = await safe.amend(amendment("amend-ts-1", 1n, eventId));
  const replayed = await safe.amend(amendment("amend-ts-1", 1n));

  assert.deepEqual(
    { confirmation: amended.confirmation, orderId: amended.orderId, version: amended.version, eventId: amended.eventId },
    { confirmation: "committed", orderId, version: 2n, eventId },
  );
  assert.deepEqual([replayed.confirmation, replayed.version, replayed.eventId], ["replayed", 2n, eventId]);
  const found = await safe.reconcile(0n, "amend-ts-1");
  assert.deepEqual([found?.operation, found?.version, found?.totalMinor], [OrderOperation.AMEND, 2n, 3000n]);
});

test("an amendment of a stale version is refused with VERSION_CONFLICT and the current version, never retried", async () => {
  const calls = made().length;

  const error = await rejection(safe.amend(amendment("amend-ts-stale", 1n)));

  assert.ok(error instanceof VersionConflict, String(error));
  assert.deepEqual([error.failure.codeName, error.reason, error.currentVersion], ["FAILED_PRECONDITION", "VERSION_CONFLICT", 2n]);
  assert.deepEqual(made().slice(calls), ["amend FAILED_PRECONDITION VERSION_CONFLICT"]);
  assert.equal(await safe.reconcile(0n, "amend-ts-stale"), undefined, "nothing was written");
});

test("a cancellation of version 2 commits version 3 and the order is cancelled", async () => {
  const cancellation = create(CancelOrderRequestSchema, {
    tenantId: 0n,
    requestId: "cancel-ts-1",
    orderId,
    expectedVersion: 2n,
    reason: CancelReason.CUSTOMER_REQUEST,
    note: "changed their mind",
  });

  const cancelled = await safe.cancel(cancellation);

  assert.deepEqual([cancelled.confirmation, cancelled.orderId, cancelled.version], ["committed", orderId, 3n]);
  const found = await safe.reconcile(0n, "cancel-ts-1");
  assert.deepEqual([found?.operation, found?.status, found?.currentVersion], [OrderOperation.CANCEL, OrderStatus.CANCELLED, 3n]);
});

test("an amendment after the cancellation is refused with ORDER_CANCELLED", async () => {
  const calls = made().length;

  const error = await rejection(safe.amend(amendment("amend-ts-after-cancel", 3n)));

  assert.ok(error instanceof OrderIsCancelled, String(error));
  assert.deepEqual([error.failure.codeName, error.reason, error.currentVersion], ["FAILED_PRECONDITION", "ORDER_CANCELLED", 3n]);
  assert.deepEqual(made().slice(calls), ["amend FAILED_PRECONDITION ORDER_CANCELLED"]);
});
