// Waiting, in a user's own integration tests, until an event was published
// (AdminService.AwaitPublished) or consumed and applied by a named consumer
// (ConsumerAdminService.AwaitConsumed), with a timeout: the same outcomes as the Rust client's
// await_published / await_consumed, Python's await_event.py and `idempostctl wait`. Each call
// waits on the server for at most CALL_WAIT_MS; longer timeouts call again.

import { create } from "@bufbuild/protobuf";
import { DurationSchema, type Duration } from "@bufbuild/protobuf/wkt";
import { createClient, type Transport } from "@connectrpc/connect";
import { setTimeout as sleep } from "node:timers/promises";

import { IdempostError } from "./errors.js";
import { AdminService, PublishState } from "./gen/idempost/v1/admin_service_pb.js";
import { ConsumeState, ConsumerAdminService } from "./gen/idempost/v1/consumer_admin_service_pb.js";

/** The longest one call asks the server to wait (the servers' own maximum). */
export const CALL_WAIT_MS = 10_000;
/** How much longer than its wait a call may take: the server's last read, and the network. */
const CALL_GRACE_MS = 5_000;

/** How long to wait in all. */
export interface AwaitOptions {
  /** Milliseconds; 30 s by default. */
  timeoutMs?: number;
}

/** The event reached the broker. */
export interface Published {
  eventId: string;
  /** PUBLISHED, or empty when retention already purged the row after publication. */
  outboxStatus: string;
}

/** The consumer committed the event's effect and applied it. */
export interface Consumed {
  eventId: string;
  consumerName: string;
}

/** A wait that did not reach its goal. */
export class AwaitError extends Error {
  override readonly name: string = "AwaitError";
}

/** The timeout passed first. `lastState`: UNKNOWN, PENDING, PUBLISHING or NOT_CONSUMED. */
export class AwaitTimedOutError extends AwaitError {
  override readonly name = "AwaitTimedOutError";
  constructor(readonly eventId: string, readonly timeoutMs: number, readonly lastState: string) {
    super(`event ${eventId} was still ${lastState} after ${timeoutMs} ms`);
  }
}

/** The relay gave up on the event (FAILED): it waits for an operator's redrive. */
export class AwaitFailedError extends AwaitError {
  override readonly name = "AwaitFailedError";
  constructor(readonly eventId: string) {
    super(`event ${eventId} is FAILED: the relay gave up; an operator may redrive it`);
  }
}

/** The consumer set a record of the event aside as undecodable. */
export class AwaitDeadLetteredError extends AwaitError {
  override readonly name = "AwaitDeadLetteredError";
  constructor(readonly eventId: string, readonly consumerName: string, readonly error: string) {
    super(`event ${eventId} was dead-lettered by ${consumerName}: ${error}`);
  }
}

/** The consumer recorded the event but parked it; it may still be applied later. */
export class AwaitParkedError extends AwaitError {
  override readonly name = "AwaitParkedError";
  constructor(readonly eventId: string, readonly consumerName: string, readonly reason: string) {
    super(`event ${eventId} is parked by ${consumerName}: ${reason}`);
  }
}

/** One wait's clock: how long the next call may wait, and whether to call again. */
class Waiting {
  private readonly until: number;

  constructor(readonly timeoutMs: number) {
    this.until = Date.now() + timeoutMs;
  }

  /** What is left, up to CALL_WAIT_MS; never zero, which would ask for the server's maximum. */
  nextWaitMs(): number {
    return Math.min(Math.max(this.until - Date.now(), 1), CALL_WAIT_MS);
  }

  /** After a call that ended still waiting: time out, or pause when the server asked to. */
  async again(eventId: string, lastState: string, retryAfter: Duration | undefined): Promise<void> {
    const left = this.until - Date.now();
    if (left <= 0) throw new AwaitTimedOutError(eventId, this.timeoutMs, lastState);
    if (retryAfter !== undefined) await sleep(Math.min(millis(retryAfter), left));
  }
}

function millis(duration: Duration): number {
  return Number(duration.seconds) * 1000 + Math.floor(duration.nanos / 1e6);
}

function duration(ms: number): Duration {
  return create(DurationSchema, { seconds: BigInt(Math.floor(ms / 1000)), nanos: (ms % 1000) * 1e6 });
}

/** A call's failure as an IdempostError (its code and ErrorInfo reason). */
async function call<T>(promise: Promise<T>): Promise<T> {
  try {
    return await promise;
  } catch (error) {
    throw IdempostError.from(error);
  }
}

/**
 * Waits until the relay published `eventId`, over a transport to the order service's admin
 * listener. Rejects with AwaitFailedError when the relay gave up, AwaitTimedOutError when the
 * timeout passed first, IdempostError when a call failed. An event not committed yet is waited
 * for; without the operator scope another tenant's event reads as UNKNOWN.
 */
export async function awaitPublished(transport: Transport, eventId: string, options: AwaitOptions = {}): Promise<Published> {
  const admin = createClient(AdminService, transport);
  const waiting = new Waiting(options.timeoutMs ?? 30_000);
  for (;;) {
    const wait = waiting.nextWaitMs();
    const reply = await call(admin.awaitPublished({ eventId, wait: duration(wait) }, { timeoutMs: wait + CALL_GRACE_MS }));
    if (reply.state === PublishState.PUBLISHED) return { eventId, outboxStatus: reply.outboxStatus };
    if (reply.state === PublishState.FAILED) throw new AwaitFailedError(eventId);
    await waiting.again(eventId, reply.known ? reply.outboxStatus : "UNKNOWN", reply.retryAfter);
  }
}

/**
 * Waits until the consumer named `consumerName` (empty: the one serving `transport`) consumed
 * `eventId` and applied it, over a transport to the consumer's listener. Rejects with
 * AwaitDeadLetteredError or AwaitParkedError when it set the event aside, AwaitTimedOutError when
 * the timeout passed first, IdempostError when a call failed (the operator scope is needed).
 */
export async function awaitConsumed(
  transport: Transport,
  eventId: string,
  consumerName: string,
  options: AwaitOptions = {},
): Promise<Consumed> {
  const consumer = createClient(ConsumerAdminService, transport);
  const waiting = new Waiting(options.timeoutMs ?? 30_000);
  for (;;) {
    const wait = waiting.nextWaitMs();
    const ask = { eventId, consumerName, wait: duration(wait) };
    const reply = await call(consumer.awaitConsumed(ask, { timeoutMs: wait + CALL_GRACE_MS }));
    const name = reply.consumerName;
    if (reply.state === ConsumeState.CONSUMED) return { eventId, consumerName: name };
    if (reply.state === ConsumeState.DEAD_LETTERED) throw new AwaitDeadLetteredError(eventId, name, reply.detail);
    if (reply.state === ConsumeState.PARKED) throw new AwaitParkedError(eventId, name, reply.detail);
    await waiting.again(eventId, "NOT_CONSUMED", reply.retryAfter);
  }
}
