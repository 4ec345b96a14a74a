// The client's pure logic, and its refusals before anything is sent. No server needed.

import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";

import { create } from "@bufbuild/protobuf";
import { Code } from "@connectrpc/connect";

import {
  ConnectionRefused,
  GaveUp,
  OrderIsCancelled,
  IdempostError,
  Rejected,
  SafeSubmitter,
  VersionConflict,
  codeName,
  connect,
  isLoopback,
  newEventId,
  nextAfterWrite,
  readToken,
  refusal,
  type CallReport,
} from "../src/index.js";
import { SubmitOrderRequestSchema } from "../src/gen/idempost/v1/order_service_pb.js";

describe("loopback", () => {
  test("names and addresses of this machine are loopback, others are not", () => {
    for (const host of ["localhost", "127.0.0.1", "127.1.2.3", "::1", "[::1]", "LOCALHOST"]) {
      assert.equal(isLoopback(host), true, host);
    }
    for (const host of ["example.com", "10.0.0.1", "128.0.0.1", "::2", "localhost.example.com"]) {
      assert.equal(isLoopback(host), false, host);
    }
  });
});

describe("tokens", () => {
  const dir = mkdtempSync(join(tmpdir(), "idempost-ts-"));
  const tokenFile = join(dir, "token.jwt");
  writeFileSync(tokenFile, "header.payload.signature\n");

  test("a token comes from its file, else from the environment variable, trimmed", () => {
    assert.equal(readToken(tokenFile, "IDEMPOST_TS_UNIT_UNSET"), "header.payload.signature");
    process.env.IDEMPOST_TS_UNIT_TOKEN = "  from.the.env ";
    assert.equal(readToken(undefined, "IDEMPOST_TS_UNIT_TOKEN"), "from.the.env");
    assert.equal(readToken(undefined, "IDEMPOST_TS_UNIT_UNSET"), undefined);
  });

  test("a token is never sent over plaintext to a host that is not loopback", () => {
    assert.throws(() => connect({ target: "orders.example.com:50051", tokenFile }), (error) => {
      assert.ok(error instanceof ConnectionRefused);
      assert.ok(!error.message.includes("header.payload.signature"), "the message holds the token");
      return true;
    });
    assert.doesNotThrow(() => connect({ target: "127.0.0.1:50051", tokenFile }));
    assert.doesNotThrow(() => connect({ target: "orders.example.com:50051" }), "no token: plaintext is allowed");
  });
});

describe("classification", () => {
  const failure = (code: Code, reason?: string) => new IdempostError(code, reason, {}, "refused");

  test("only refusals known to have written nothing are resubmitted at once", () => {
    assert.equal(nextAfterWrite(failure(Code.Aborted, "ROLLED_BACK")), "resubmit");
    assert.equal(nextAfterWrite(failure(Code.Unavailable, "DATABASE_UNAVAILABLE")), "resubmit");
    assert.equal(nextAfterWrite(failure(Code.ResourceExhausted, "OVERLOADED")), "resubmit");
    assert.equal(nextAfterWrite(failure(Code.Aborted)), "reconcile", "an ABORTED without our reason");
    assert.equal(nextAfterWrite(failure(Code.Unavailable)), "reconcile", "a transport error");
    assert.equal(nextAfterWrite(failure(Code.Unknown, "OUTCOME_UNKNOWN")), "reconcile");
    assert.equal(nextAfterWrite(failure(Code.DeadlineExceeded)), "reconcile");
    assert.equal(nextAfterWrite(failure(Code.PermissionDenied, "TENANT_MISMATCH")), "stop");
    assert.equal(nextAfterWrite(failure(Code.InvalidArgument, "INVALID_ORDER")), "stop");
    assert.equal(nextAfterWrite(failure(Code.FailedPrecondition, "VERSION_CONFLICT")), "stop");
    assert.equal(nextAfterWrite(failure(Code.FailedPrecondition, "ORDER_CANCELLED")), "stop");
    assert.equal(nextAfterWrite(failure(Code.NotFound, "ORDER_NOT_FOUND")), "stop", "a change of no order");
  });

  test("refusals of a change are typed and carry the order's current version when the server sent it", () => {
    const conflict = refusal(
      new IdempostError(Code.FailedPrecondition, "VERSION_CONFLICT", { current_version: "4" }, "stale"),
      1,
    );
    const cancelled = refusal(new IdempostError(Code.FailedPrecondition, "ORDER_CANCELLED", {}, "cancelled"), 1);
    const other = refusal(failure(Code.NotFound, "ORDER_NOT_FOUND"), 1);

    assert.ok(conflict instanceof VersionConflict && conflict instanceof Rejected);
    assert.deepEqual([conflict.reason, conflict.currentVersion], ["VERSION_CONFLICT", 4n]);
    assert.ok(cancelled instanceof OrderIsCancelled);
    assert.deepEqual([cancelled.reason, cancelled.currentVersion], ["ORDER_CANCELLED", undefined]);
    assert.ok(!(other instanceof VersionConflict) && !(other instanceof OrderIsCancelled));
    assert.equal(other.reason, "ORDER_NOT_FOUND");
  });

  test("codes carry their gRPC names", () => {
    assert.equal(codeName(Code.DeadlineExceeded), "DEADLINE_EXCEEDED");
    assert.equal(codeName(Code.Canceled), "CANCELLED");
    assert.equal(failure(Code.Unknown, "OUTCOME_UNKNOWN").message, "UNKNOWN OUTCOME_UNKNOWN: refused");
  });

  test("event ids are canonical lower-case UUIDv7s that sort in creation order", () => {
    const first = newEventId(1_700_000_000_000);
    const second = newEventId(1_700_000_000_001);
    assert.match(first, /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    assert.ok(first < second);
  });
});

/** A loopback port nothing listens on. */
async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  await new Promise((resolve) => server.close(resolve));
  assert.ok(address !== null && typeof address === "object");
  return address.port;
}

test("a submitter that cannot reach the service only reconciles after its first call and gives up with its event id", async () => {
  const calls: CallReport[] = [];
  const target = `127.0.0.1:${await freePort()}`;
  const submitter = new SafeSubmitter(connect({ target }), { maxCalls: 3, initialBackoffMs: 5 }, (call) =>
    calls.push(call),
  );
  const eventId = newEventId();
  const order = create(SubmitOrderRequestSchema, { tenantId: 7n, requestId: "req-ts-unreachable", eventId });

  const error = await submitter.submit(order).then(
    () => assert.fail("nothing listens there"),
    (error: unknown) => error,
  );

  assert.ok(error instanceof GaveUp, String(error));
  assert.equal(error.eventId, eventId, "the event id to reuse later");
  assert.equal(error.failure.codeName, "UNAVAILABLE");
  assert.deepEqual(
    calls.map((call) => `${call.call} ${call.failure?.codeName ?? "OK"}`),
    ["submit UNAVAILABLE", "reconcile UNAVAILABLE", "reconcile UNAVAILABLE"],
    "after a transport error the outcome is unknown: never resubmit before Reconcile says NOT_FOUND",
  );
});
