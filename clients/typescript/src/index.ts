// Outpost's TypeScript/Node client: the safe caller protocol over the generated stubs.
// The stubs themselves are importable as `@outpost/client/gen/outpost/v1/<file>_pb`.

export { ConnectionRefused, TOKEN_ENV, connect, hostOf, isLoopback, readToken } from "./connection.js";
export type { ConnectionOptions } from "./connection.js";
export { ERROR_DOMAIN, GaveUp, OutpostError, Rejected, codeName } from "./errors.js";
export { newEventId } from "./event-id.js";
export { DEFAULT_POLICY, SafeSubmitter, nextAfterSubmit } from "./submit.js";
export type { CallReport, Confirmed, RetryPolicy } from "./submit.js";
