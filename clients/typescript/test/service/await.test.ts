// awaitPublished and awaitConsumed against real services, as a user's own test calls them: the
// Rust test (tests/api/awaiting.rs) started an order service with JWT, a relay and a consumer,
// submitted an event that flows through, one the relay gave up on (FAILED), and put a dead
// letter in the consumer's table.

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  AwaitDeadLetteredError,
  AwaitFailedError,
  AwaitTimedOutError,
  IdempostError,
  awaitConsumed,
  awaitPublished,
  connect,
} from "../../src/index.js";
import { env, rejection } from "./env.js";

const CONSUMER = env("IDEMPOST_TS_CONSUMER_NAME");
const LONG = { timeoutMs: 60_000 };
const SHORT = { timeoutMs: 1_000 };

/** A transport to `target` with the token in the file named by the variable `tokenVar`. */
function endpoint(targetVar: string, tokenVar: string) {
  return connect({ target: env(targetVar), tokenFile: env(tokenVar), tokenEnv: "IDEMPOST_TS_NO_TOKEN" });
}

const admin = endpoint("IDEMPOST_TS_ADMIN_TARGET", "IDEMPOST_TS_TOKEN_FILE");
const otherTenant = endpoint("IDEMPOST_TS_ADMIN_TARGET", "IDEMPOST_TS_OTHER_TENANT_TOKEN_FILE");
const consumerAsOperator = endpoint("IDEMPOST_TS_CONSUMER_TARGET", "IDEMPOST_TS_OPERATOR_TOKEN_FILE");
const consumerAsTenant = endpoint("IDEMPOST_TS_CONSUMER_TARGET", "IDEMPOST_TS_TOKEN_FILE");

test("an event is awaited until published, then until consumed by the named consumer", async () => {
  const eventId = env("IDEMPOST_TS_EVENT_ID");

  const published = await awaitPublished(admin, eventId, LONG);
  const consumed = await awaitConsumed(consumerAsOperator, eventId, CONSUMER, LONG);

  assert.deepEqual(published, { eventId, outboxStatus: "PUBLISHED" });
  assert.deepEqual(consumed, { eventId, consumerName: CONSUMER });
});

test("a FAILED event ends the wait with AwaitFailedError", async () => {
  const eventId = env("IDEMPOST_TS_FAILED_EVENT_ID");

  const error = await rejection(awaitPublished(admin, eventId, LONG));

  assert.ok(error instanceof AwaitFailedError, String(error));
  assert.equal(error.eventId, eventId);
});

test("a dead-lettered event ends the wait with AwaitDeadLetteredError and the consumer's error", async () => {
  const error = await rejection(awaitConsumed(consumerAsOperator, env("IDEMPOST_TS_DEAD_EVENT_ID"), CONSUMER, LONG));

  assert.ok(error instanceof AwaitDeadLetteredError, String(error));
  assert.deepEqual([error.consumerName, error.error], [CONSUMER, "cannot decode"]);
});

test("another tenant's event times out exactly like an unknown one", async () => {
  const hidden = await rejection(awaitPublished(otherTenant, env("IDEMPOST_TS_EVENT_ID"), SHORT));
  const unknown = await rejection(awaitPublished(admin, "0193a1c2-0000-7000-8000-000000000000", SHORT));

  for (const error of [hidden, unknown]) {
    assert.ok(error instanceof AwaitTimedOutError, String(error));
    assert.deepEqual([error.lastState, error.timeoutMs], ["UNKNOWN", 1_000]);
  }
});

test("the consumer side refuses a tenant's token: its tables do not know tenants", async () => {
  const error = await rejection(awaitConsumed(consumerAsTenant, env("IDEMPOST_TS_EVENT_ID"), CONSUMER, SHORT));

  assert.ok(error instanceof IdempostError, String(error));
  assert.deepEqual([error.codeName, error.reason], ["PERMISSION_DENIED", "SCOPE_MISSING"]);
});
