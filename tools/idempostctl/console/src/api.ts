// The two services as the page sees them: gRPC-Web calls to the console process (same origin),
// which makes each call again to the real service with the operator's token. The page holds only
// the console key, in memory, taken from the URL's fragment and removed from the address bar.
import { Code, ConnectError, createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";
import { AdminService, ConsumerAdminService, ErrorInfoSchema } from "./stubs.js";

export interface Api {
  admin: Client<typeof AdminService>;
  consumer: Client<typeof ConsumerAdminService>;
}

/** The key from `#key=...`, read once; the fragment is then dropped from the address bar. */
export function takeConsoleKey(): string {
  const key = new URLSearchParams(location.hash.slice(1)).get("key") ?? "";
  if (location.hash) history.replaceState(null, "", location.pathname);
  return key;
}

export function connect(key: string): Api {
  const withKey: Interceptor = (next) => async (request) => {
    request.header.set("x-idempost-console-key", key);
    return next(request);
  };
  const transport = createGrpcWebTransport({ baseUrl: location.origin, interceptors: [withKey] });
  return { admin: createClient(AdminService, transport), consumer: createClient(ConsumerAdminService, transport) };
}

/** A refusal for people: its code, its ErrorInfo reason, its message, and what to do. */
export interface Failure {
  code: string;
  reason: string;
  message: string;
  hint: string;
}

export function failure(error: unknown): Failure {
  const e = ConnectError.from(error);
  const reason = e.findDetails(ErrorInfoSchema)[0]?.reason ?? "";
  const code = Code[e.code] ?? String(e.code);
  let hint = "";
  if (reason === "CONSOLE_KEY_MISSING") {
    hint = "Open the URL that `idempostctl console` printed (it carries the console key).";
  } else if (e.code === Code.Unauthenticated) {
    hint = "The service refused the console's token: start `idempostctl console` with a valid operator token (--token-file or IDEMPOST_TOKEN).";
  } else if (e.code === Code.PermissionDenied) {
    hint = "The token lacks the operator scope these calls need.";
  } else if (e.code === Code.Unavailable) {
    hint = "The service is unreachable or not serving; the console keeps trying.";
  }
  return { code, reason, message: e.rawMessage, hint };
}

export function describe(f: Failure): string {
  return `${f.code}${f.reason ? ` ${f.reason}` : ""}: ${f.message}`;
}
