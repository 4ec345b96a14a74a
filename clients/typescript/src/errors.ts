// Idempost's errors as typed values: the gRPC code and the ErrorInfo reason the server put in
// the google.rpc.Status of the `grpc-status-details-bin` trailer (connect-node decodes the
// trailer into ConnectError.details; findDetails unpacks the ErrorInfo from its Any).

import { Code, ConnectError } from "@connectrpc/connect";

import { ErrorInfoSchema } from "./gen/google/rpc/error_details_pb.js";

/** The ErrorInfo domain of Idempost's own errors; a reason from any other domain is not ours. */
export const ERROR_DOMAIN = "idempost.v1";

/** A failed call: its gRPC code, Idempost's ErrorInfo reason and metadata, and the message. */
export class IdempostError extends Error {
  override readonly name = "IdempostError";

  constructor(
    /** The gRPC status code; a transport error (nothing answered) is UNAVAILABLE. */
    readonly code: Code,
    /** ErrorInfo.reason when the server sent one in Idempost's domain, such as OUTCOME_UNKNOWN. */
    readonly reason: string | undefined,
    /** ErrorInfo.metadata: tenant_id, request_id and, where one exists, event_id. */
    readonly metadata: Readonly<Record<string, string>>,
    /** The server's message, without the code. */
    readonly rawMessage: string,
    options?: { cause?: unknown },
  ) {
    super(`${codeName(code)}${reason ? ` ${reason}` : ""}: ${rawMessage}`, options);
  }

  /** The gRPC name of the code, as in the proto's tables: UNKNOWN, ABORTED, NOT_FOUND, ... */
  get codeName(): string {
    return codeName(this.code);
  }

  /** Any error a call threw, as an IdempostError (a non-gRPC error becomes UNKNOWN). */
  static from(error: unknown): IdempostError {
    if (error instanceof IdempostError) return error;
    const connect = ConnectError.from(error);
    const info = connect.findDetails(ErrorInfoSchema).find((detail) => detail.domain === ERROR_DOMAIN);
    return new IdempostError(connect.code, info?.reason, { ...info?.metadata }, connect.rawMessage, {
      cause: error,
    });
  }
}

/** `Code.DeadlineExceeded` as `DEADLINE_EXCEEDED`; OK for 0. */
export function codeName(code: Code): string {
  if (code === Code.Canceled) return "CANCELLED";
  const name = Code[code] as string | undefined;
  return name === undefined ? `CODE_${code}` : name.replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
}

/** The server refused the write for a reason retrying cannot fix; nothing was written by it. */
export class Rejected extends Error {
  override readonly name: string = "Rejected";

  constructor(
    readonly failure: IdempostError,
    /** Calls made, submits and reconciles together. */
    readonly calls: number,
  ) {
    super(`rejected: ${failure.message}`, { cause: failure });
  }

  /** ErrorInfo.reason of the refusal, such as TENANT_MISMATCH or VERSION_CONFLICT. */
  get reason(): string | undefined {
    return this.failure.reason;
  }
}

/**
 * The order was at another version than the change's expected_version; nothing was written.
 * Read the order, decide, and send a new change with a new request id.
 */
export class VersionConflict extends Rejected {
  override readonly name = "VersionConflict";

  /** The order's version when the change was refused, when the server said (metadata current_version). */
  get currentVersion(): bigint | undefined {
    return versionIn(this.failure);
  }
}

/** The order is cancelled: no change is accepted after a cancellation; nothing was written. */
export class OrderIsCancelled extends Rejected {
  override readonly name = "OrderIsCancelled";

  /** The cancelled order's version, when the server said (metadata current_version). */
  get currentVersion(): bigint | undefined {
    return versionIn(this.failure);
  }
}

/** The final refusal `failure` as its typed error: VersionConflict, OrderIsCancelled or Rejected. */
export function refusal(failure: IdempostError, calls: number): Rejected {
  if (failure.code === Code.FailedPrecondition && failure.reason === "VERSION_CONFLICT") {
    return new VersionConflict(failure, calls);
  }
  if (failure.code === Code.FailedPrecondition && failure.reason === "ORDER_CANCELLED") {
    return new OrderIsCancelled(failure, calls);
  }
  return new Rejected(failure, calls);
}

/** ErrorInfo.metadata current_version as a number; undefined when absent or not an integer. */
function versionIn(failure: IdempostError): bigint | undefined {
  const text = failure.metadata.current_version;
  return text !== undefined && /^[0-9]+$/.test(text) ? BigInt(text) : undefined;
}

/** Every allowed call failed. The write may have committed: reconcile later, or send again with the same ids. */
export class GaveUp extends Error {
  override readonly name = "GaveUp";

  constructor(
    readonly failure: IdempostError,
    readonly calls: number,
    /** The event id every attempt sent: reuse it when trying again. */
    readonly eventId: string,
  ) {
    super(`gave up after ${calls} calls; last error: ${failure.message}`, { cause: failure });
  }
}
