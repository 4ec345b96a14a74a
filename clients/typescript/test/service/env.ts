// What the Rust test (tests/api/typescript.rs) hands these tests: the order service it started
// (TLS + JWT), its CA, token files, and the ids of the order under test.

import assert from "node:assert/strict";

import { create, type MessageInitShape } from "@bufbuild/protobuf";

import { SafeSubmitter, connect, type CallReport, type RetryPolicy } from "../../src/index.js";
import { SubmitOrderRequestSchema, type SubmitOrderRequest } from "../../src/gen/idempost/v1/order_service_pb.js";

/** The variable `name`, which the Rust test must have set. */
export function env(name: string): string {
  const value = process.env[name];
  assert.ok(value, `${name} is not set: these tests are run by tests/api/typescript.rs`);
  return value;
}

/** A valid two-line order (total 3299): the same content as the Rust and Python tests use. */
export function order(requestId: string, fields: Omit<MessageInitShape<typeof SubmitOrderRequestSchema>, "$typeName"> = {}): SubmitOrderRequest {
  return create(SubmitOrderRequestSchema, {
    tenantId: 0n,
    requestId,
    customerId: "customer-42",
    currency: "EUR",
    lineItems: [
      { sku: "SKU-RED-MUG", quantity: 2, unitPriceMinor: 1250n },
      { sku: "SKU-TEA", quantity: 1, unitPriceMinor: 799n },
    ],
    ...fields,
  });
}

/** A submitter over TLS to the service with the token in `tokenFile` (none: no token). */
export function submitter(tokenFile: string | undefined, policy: Partial<RetryPolicy> = {}) {
  const calls: CallReport[] = [];
  const transport = connect({
    target: env("IDEMPOST_TS_TARGET"),
    caFile: env("IDEMPOST_TS_CA_FILE"),
    tokenFile,
    // Never the environment's token: a test without a token file sends none.
    tokenEnv: "IDEMPOST_TS_NO_TOKEN",
  });
  // A generous deadline: these tests follow the protocol's paths, and on a loaded machine a
  // call that outlived a short deadline would take another path (Reconcile) than the one named.
  const safe = new SafeSubmitter(transport, { initialBackoffMs: 5, callTimeoutMs: 60_000, ...policy }, (call) =>
    calls.push(call),
  );
  /** `call CODE [REASON]` of every call made so far. */
  const made = () =>
    calls.map((call) =>
      call.failure === undefined
        ? `${call.call} OK`
        : [call.call, call.failure.codeName, call.failure.reason].filter(Boolean).join(" "),
    );
  const sentEventIds = () => new Set(calls.filter((call) => call.call !== "reconcile").map((c) => c.sentEventId));
  return { safe, calls, made, sentEventIds };
}

/** The order under test: its request id and the event id the Rust test fixed. */
export function orderUnderTest(): SubmitOrderRequest {
  return order(env("IDEMPOST_TS_REQUEST_ID"), { eventId: env("IDEMPOST_TS_EVENT_ID") });
}

/** The error `promise` rejected with; fails when it resolved. */
export async function rejection(promise: Promise<unknown>): Promise<unknown> {
  return promise.then(
    (value) => assert.fail(`expected a failure, got ${String(value)}`),
    (error: unknown) => error,
  );
}
