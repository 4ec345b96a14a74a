// The safe caller protocol for SubmitOrder, as the Rust `outpost::client::SafeSubmitter` and
// clients/python/submit.py implement it:
//
// 1. Fix the event id before the first attempt; every retry reuses it and the request id.
// 2. SubmitOrder. OK: done (`replayed` says an identical earlier submission committed it).
// 3. ABORTED ROLLED_BACK, UNAVAILABLE DATABASE_UNAVAILABLE or RESOURCE_EXHAUSTED OVERLOADED:
//    nothing was written; submit again (after the backoff) with the same ids.
// 4. A refusal retrying cannot fix (INVALID_ARGUMENT, ALREADY_EXISTS, ...): stop (Rejected).
// 5. Anything else (UNKNOWN, UNAVAILABLE without that reason, DEADLINE_EXCEEDED, a transport
//    error): the order may exist. Reconcile by (tenant_id, request_id): found, done; NOT_FOUND,
//    submit again with the same ids; any other error, reconcile again.
// 6. A bounded number of calls with exponential backoff; giving up (GaveUp) reports the event
//    id, so a later attempt can reconcile or resubmit with the same ids.

import { clone, create } from "@bufbuild/protobuf";
import { Code, createClient, type Client, type Transport } from "@connectrpc/connect";
import { setTimeout as sleep } from "node:timers/promises";

import { GaveUp, OutpostError, Rejected } from "./errors.js";
import { newEventId } from "./event-id.js";
import {
  OrderService,
  ReconcileRequestSchema,
  SubmitOrderRequestSchema,
  type ReconcileResponse,
  type SubmitOrderRequest,
} from "./gen/outpost/v1/order_service_pb.js";

/** How hard the submitter tries. */
export interface RetryPolicy {
  /** Most calls, submits and reconciles together. */
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

/** A committed order, however its commit was learned. */
export interface Confirmed {
  orderId: bigint;
  /** The acceptance event's id: the one fixed before the first attempt. */
  eventId: string;
  /** committed; replayed (an identical earlier submission committed it); reconciled. */
  confirmation: "committed" | "replayed" | "reconciled";
  /** Calls made, submits and reconciles together. */
  calls: number;
}

/** One call the submitter made, for a caller that wants to see them. */
export interface CallReport {
  call: "submit" | "reconcile";
  attempt: number;
  /** The event id a submit sent; every submit of one order sends the same. */
  sentEventId?: string;
  /** undefined when the call succeeded. */
  failure?: OutpostError;
}

/** Refusals that retrying with the same request cannot fix: nothing was written by it. */
const FINAL_CODES: ReadonlySet<Code> = new Set([
  Code.InvalidArgument,
  Code.AlreadyExists,
  Code.FailedPrecondition,
  Code.OutOfRange,
  Code.PermissionDenied,
  Code.Unauthenticated,
  Code.Unimplemented,
]);

/** What to do after a failed SubmitOrder. Anything not known to be safe is treated as unknown. */
export function nextAfterSubmit(failure: OutpostError): "resubmit" | "reconcile" | "stop" {
  const nothingWritten =
    (failure.code === Code.Aborted && failure.reason === "ROLLED_BACK") ||
    (failure.code === Code.Unavailable && failure.reason === "DATABASE_UNAVAILABLE") ||
    (failure.code === Code.ResourceExhausted && failure.reason === "OVERLOADED");
  if (nothingWritten) return "resubmit";
  return FINAL_CODES.has(failure.code) ? "stop" : "reconcile";
}

/** Submits orders with the safe caller protocol over one transport. */
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
   * Submits `request` until its outcome is known or the policy's calls run out. An empty
   * eventId is filled in once, before the first attempt, and reused by every retry.
   * Throws Rejected or GaveUp.
   */
  async submit(order: SubmitOrderRequest): Promise<Confirmed> {
    const request = clone(SubmitOrderRequestSchema, order);
    request.eventId ||= newEventId();
    const key = create(ReconcileRequestSchema, { tenantId: request.tenantId, requestId: request.requestId });
    const options = { timeoutMs: this.policy.callTimeoutMs };
    let reconcileFirst = false;
    let failures = 0;
    for (let calls = 1; ; calls++) {
      let failure: OutpostError;
      if (reconcileFirst) {
        try {
          const found = await this.client.reconcile(key, options);
          this.onCall({ call: "reconcile", attempt: calls });
          return { orderId: found.orderId, eventId: found.eventId, confirmation: "reconciled", calls };
        } catch (error) {
          failure = OutpostError.from(error);
          this.onCall({ call: "reconcile", attempt: calls, failure });
          if (failure.code === Code.NotFound) {
            // Not committed: the same ids may be submitted again, at once.
            reconcileFirst = false;
            failures = 0;
            if (calls < this.policy.maxCalls) continue;
          }
        }
      } else {
        try {
          const accepted = await this.client.submitOrder(request, options);
          this.onCall({ call: "submit", attempt: calls, sentEventId: request.eventId });
          const confirmation = accepted.replayed ? "replayed" : "committed";
          return { orderId: accepted.orderId, eventId: accepted.eventId, confirmation, calls };
        } catch (error) {
          failure = OutpostError.from(error);
          this.onCall({ call: "submit", attempt: calls, sentEventId: request.eventId, failure });
          const next = nextAfterSubmit(failure);
          if (next === "stop") throw new Rejected(failure, calls);
          reconcileFirst = next === "reconcile";
        }
      }
      if (calls >= this.policy.maxCalls) throw new GaveUp(failure, calls, request.eventId);
      failures += 1;
      await sleep(this.backoff(failures));
    }
  }

  /** The committed order with that key, or undefined when no order with it committed. */
  async reconcile(tenantId: bigint, requestId: string): Promise<ReconcileResponse | undefined> {
    try {
      const key = create(ReconcileRequestSchema, { tenantId, requestId });
      return await this.client.reconcile(key, { timeoutMs: this.policy.callTimeoutMs });
    } catch (error) {
      const failure = OutpostError.from(error);
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
