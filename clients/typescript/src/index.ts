// Idempost's TypeScript/Node client: the safe caller protocol (submit, amend, cancel) over the
// generated stubs, and waiting for an event in a user's own tests (awaitPublished, awaitConsumed).
// The stubs themselves are importable as `@idempost/client/gen/idempost/v1/<file>_pb`.

export {
  AwaitDeadLetteredError,
  AwaitError,
  AwaitFailedError,
  AwaitParkedError,
  AwaitTimedOutError,
  CALL_WAIT_MS,
  awaitConsumed,
  awaitPublished,
} from "./awaiting.js";
export type { AwaitOptions, Consumed, Published } from "./awaiting.js";
export { ConnectionRefused, TOKEN_ENV, connect, hostOf, isLoopback, readToken } from "./connection.js";
export type { ConnectionOptions } from "./connection.js";
export { ERROR_DOMAIN, GaveUp, OrderIsCancelled, IdempostError, Rejected, VersionConflict, codeName, refusal } from "./errors.js";
export { newEventId } from "./event-id.js";
export { DEFAULT_POLICY, SafeSubmitter, nextAfterWrite } from "./submit.js";
export type { CallReport, Confirmed, RetryPolicy, Write } from "./submit.js";
