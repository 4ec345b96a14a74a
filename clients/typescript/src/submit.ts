// The safe caller protocol for SubmitOrder, AmendOrder and CancelOrder alike, as the Rust
// `idempost::client::SafeSubmitter` and clients/python/submit.py implement it:
//
// 1. Fix the event id before the first attempt; every retry reuses it and the request id.
// 2. Send. OK: done (`replayed` says an identical earlier call committed it).
// 3. ABORTED ROLLED_BACK, UNAVAILABLE DATABASE_UNAVAILABLE or RESOURCE_EXHAUSTED OVERLOADED:
//    nothing was written; send again (after the backoff) with the same ids.
// 4. A refusal retrying cannot fix (INVALID_ARGUMENT, ALREADY_EXISTS, FAILED_PRECONDITION such as
//    VERSION_CONFLICT or ORDER_CANCELLED, NOT_FOUND such as ORDER_NOT_FOUND, ...): stop
//    (Rejected, or its VersionConflict / OrderIsCancelled kinds).
// 5. Anything else (UNKNOWN, UNAVAILABLE without that reason, DEADLINE_EXCEEDED, a transport
//    error): the write may have committed. Reconcile by (tenant_id, request_id): found, done
//    (unless another operation holds the key: REQUEST_ID_REUSED); NOT_FOUND, send again with the
//    same ids; any other error, reconcile again.
// 6. A bounded number of calls with exponential backoff; giving up (GaveUp) reports the event
//    id, so a later attempt can reconcile or send again with the same ids.

import { clone, create } from "@bufbuild/protobuf";
import { Code, createClient, type Client, type Transport } from "@connectrpc/connect";
import { setTimeout as sleep } from "node:timers/promises";

import { GaveUp, IdempostError, refusal } from "./errors.js";
import { newEventId } from "./event-id.js";
import {
  AmendOrderRequestSchema,
  CancelOrderRequestSchema,
  OrderOperation,
  OrderService,
  ReconcileRequestSchema,
  SubmitOrderRequestSchema,
  type AmendOrderRequest,
  type CancelOrderRequest,
  type ReconcileResponse,
  type SubmitOrderRequest,
} from "./gen/idempost/v1/order_service_pb.js";

/** How hard the submitter tries. */
export interface RetryPolicy {
  /** Most calls, writes and reconciles together. */
  maxCalls: number;
  /** Wait before the second call in milliseconds; doubled after each further failure. */
  initialBackoffMs: number;
  /** Longest wait between calls in milliseconds. */
  maxBackoffMs: number;
  /** Deadline of each call in milliseconds. */
  callTimeoutMs: number;
}

export const DEFAULT_POLICY: Readonly<RetryPolicy> = {
  maxCalls: 8,
  initialBackoffMs: 50,
  maxBackoffMs: 2000,
  callTimeoutMs: 10_000,
};

/** A committed write (submission, amendment or cancellation), however its commit was learned. */
export interface Confirmed {
  orderId: bigint;
  /** The write's event id (OrderAccepted, OrderAmended, OrderCancelled): the one fixed before the first attempt. */
  eventId: string;
  /** committed; replayed (an identical earlier call committed it); reconciled. */
  confirmation: "committed" | "replayed" | "reconciled";
  /** Calls made, writes and reconciles together. */
  calls: number;
  /** The order's version this write produced: 1 for a submission. */
  version: bigint;
}

/** The three writes of OrderService. */
export type Write = "submit" | "amend" | "cancel";

/** One call the submitter made, for a caller that wants to see them. */
export interface CallReport {
  call: Write | "reconcile";
  attempt: number;
  /** The event id a write sent; every write of one request sends the same. */
  sentEventId?: string;
  /** undefined when the call succeeded. */
  failure?: IdempostError;
}

/** Refusals that retrying with the same request cannot fix: nothing was written by it. */
const FINAL_CODES: ReadonlySet<Code> = new Set([
  Code.InvalidArgument,
  Code.AlreadyExists,
  Code.FailedPrecondition,
  // ORDER_NOT_FOUND of an amendment or cancellation: the tenant has no such order.
  Code.NotFound,
  Code.OutOfRange,
  Code.PermissionDenied,
  Code.Unauthenticated,
  Code.Unimplemented,
]);

/**
 * What to do after a failed SubmitOrder, AmendOrder or CancelOrder. Anything not known to be
 * safe is treated as unknown.
 */
export function nextAfterWrite(failure: IdempostError): "resubmit" | "reconcile" | "stop" {
  const nothingWritten =
    (failure.code === Code.Aborted && failure.reason === "ROLLED_BACK") ||
    (failure.code === Code.Unavailable && failure.reason === "DATABASE_UNAVAILABLE") ||
    (failure.code === Code.ResourceExhausted && failure.reason === "OVERLOADED");
  if (nothingWritten) return "resubmit";
  return FINAL_CODES.has(failure.code) ? "stop" : "reconcile";
}

/** What a write needs: its request as sent on every attempt, how to send it, what it is. */
interface Sending {
  write: Write;
  /** The operation Reconcile must report for the key to be this write's. */
  operation: OrderOperation;
  tenantId: bigint;
  requestId: string;
  eventId: string;
  /** Sends the request once; resolves with the committed answer. */
  send: (options: { timeoutMs: number }) => Promise<{ orderId: bigint; eventId: string; replayed: boolean; version: bigint }>;
}

/** Submits, amends and cancels orders with the safe caller protocol over one transport. */
export class SafeSubmitter {
  private readonly client: Client<typeof OrderService>;
  private readonly policy: RetryPolicy;

  constructor(
    transport: Transport,
    policy: Partial<RetryPolicy> = {},
    private readonly onCall: (report: CallReport) => void = () => {},
  ) {
    this.client = createClient(OrderService, transport);
    this.policy = { ...DEFAULT_POLICY, ...policy };
  }

  /**
   * Submits `order` until its outcome is known or the policy's calls run out. An empty
   * eventId is filled in once, before the first attempt, and reused by every retry.
   * Throws Rejected or GaveUp.
   */
  async submit(order: SubmitOrderRequest): Promise<Confirmed> {
    const request = clone(SubmitOrderRequestSchema, order);
    request.eventId ||= newEventId();
    const send = (options: { timeoutMs: number }) => this.client.submitOrder(request, options);
    const { tenantId, requestId, eventId } = request;
    return this.run({ write: "submit", operation: OrderOperation.SUBMIT, tenantId, requestId, eventId, send });
  }

  /**
   * Amends an order with the same protocol as `submit`. A refusal throws Rejected:
   * VersionConflict (with the order's current version) or OrderIsCancelled among them; read the
   * order, decide, and send a new change with a new request id. Throws GaveUp when the calls run out.
   */
  async amend(change: AmendOrderRequest): Promise<Confirmed> {
    const request = clone(AmendOrderRequestSchema, change);
    request.eventId ||= newEventId();
    const send = (options: { timeoutMs: number }) => this.client.amendOrder(request, options);
    const { tenantId, requestId, eventId } = request;
    return this.run({ write: "amend", operation: OrderOperation.AMEND, tenantId, requestId, eventId, send });
  }

  /** Cancels an order with the same protocol as `amend`. */
  async cancel(cancellation: CancelOrderRequest): Promise<Confirmed> {
    const request = clone(CancelOrderRequestSchema, cancellation);
    request.eventId ||= newEventId();
    const send = (options: { timeoutMs: number }) => this.client.cancelOrder(request, options);
    const { tenantId, requestId, eventId } = request;
    return this.run({ write: "cancel", operation: OrderOperation.CANCEL, tenantId, requestId, eventId, send });
  }

  /** The safe caller protocol for one write, until its outcome is known or the calls run out. */
  private async run(sending: Sending): Promise<Confirmed> {
    const { write, eventId } = sending;
    let reconcileFirst = false;
    let failures = 0;
    for (let calls = 1; ; calls++) {
      let failure: IdempostError;
      if (reconcileFirst) {
        const settled = await this.settle(sending, calls);
        if ("confirmed" in settled) return settled.confirmed;
        failure = settled.failure;
        if (failure.code === Code.NotFound) {
          // Not committed: the same ids may be sent again, at once.
          reconcileFirst = false;
          failures = 0;
          if (calls < this.policy.maxCalls) continue;
        }
      } else {
        try {
          const answer = await sending.send({ timeoutMs: this.policy.callTimeoutMs });
          this.onCall({ call: write, attempt: calls, sentEventId: eventId });
          const confirmation = answer.replayed ? "replayed" : "committed";
          const { orderId, version } = answer;
          return { orderId, eventId: answer.eventId, confirmation, calls, version };
        } catch (error) {
          failure = IdempostError.from(error);
          this.onCall({ call: write, attempt: calls, sentEventId: eventId, failure });
          const next = nextAfterWrite(failure);
          if (next === "stop") throw refusal(failure, calls);
          reconcileFirst = next === "reconcile";
        }
      }
      if (calls >= this.policy.maxCalls) throw new GaveUp(failure, calls, eventId);
      failures += 1;
      await sleep(this.backoff(failures));
    }
  }

  /**
   * One Reconcile of the write's key: its confirmation when the write committed, else the
   * failure (NOT_FOUND: it did not). Throws Rejected when another operation holds the key.
   */
  private async settle(sending: Sending, calls: number): Promise<{ confirmed: Confirmed } | { failure: IdempostError }> {
    const key = create(ReconcileRequestSchema, { tenantId: sending.tenantId, requestId: sending.requestId });
    let found: ReconcileResponse;
    try {
      found = await this.client.reconcile(key, { timeoutMs: this.policy.callTimeoutMs });
    } catch (error) {
      const failure = IdempostError.from(error);
      this.onCall({ call: "reconcile", attempt: calls, failure });
      return { failure };
    }
    this.onCall({ call: "reconcile", attempt: calls });
    // A server older than the operation field had submissions only.
    const usedBy = found.operation === OrderOperation.UNSPECIFIED ? OrderOperation.SUBMIT : found.operation;
    if (usedBy !== sending.operation) {
      // Another operation holds the key: this write never committed under it.
      const message = `the request id was used by ${OrderOperation[usedBy]}`;
      throw refusal(new IdempostError(Code.AlreadyExists, "REQUEST_ID_REUSED", {}, message), calls);
    }
    const { orderId, eventId, version } = found;
    return { confirmed: { orderId, eventId, confirmation: "reconciled", calls, version } };
  }

  /** The committed operation with that key, or undefined when none committed with it. */
  async reconcile(tenantId: bigint, requestId: string): Promise<ReconcileResponse | undefined> {
    try {
      const key = create(ReconcileRequestSchema, { tenantId, requestId });
      return await this.client.reconcile(key, { timeoutMs: this.policy.callTimeoutMs });
    } catch (error) {
      const failure = IdempostError.from(error);
      if (failure.code === Code.NotFound) return undefined;
      throw failure;
    }
  }

  /** The wait before retry `failures` (1-based): initial, doubled each time, capped. */
  private backoff(failures: number): number {
    const { initialBackoffMs, maxBackoffMs } = this.policy;
    return Math.min(initialBackoffMs * 2 ** Math.min(failures - 1, 30), maxBackoffMs);
  }
}
