// The two services as the page sees them: gRPC-Web calls to the console process (same origin),
// which makes each call again to the real service with the operator's token. The page never holds
// a secret: the console key, taken from the URL's fragment and removed from the address bar, is
// sent once to /session, and the console answers with an HttpOnly session cookie that the browser
// sends with every call by itself.
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
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

/**
 * Exchanges the key for a session; null when done or when there is no key (a reload, whose
 * session cookie the browser still holds), the console's refusal otherwise.
 */
export async function openSession(key: string): Promise<Failure | null> {
  if (!key) return null;
  const answer = await fetch("/session", { method: "POST", headers: { "x-idempost-console-key": key } });
  if (answer.ok) return null;
  // The console answers "REASON: what happened and what to do".
  const text = await answer.text();
  const [reason, message] = text.includes(": ") ? text.split(/: (.*)/s, 2) : ["", text];
  return { code: "Unauthenticated", reason, message, hint: "" };
}

export function connect(): Api {
  const transport = createGrpcWebTransport({ baseUrl: location.origin });
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
  if (reason === "CONSOLE_SESSION_MISSING") {
    hint = "This page has no console session (or it ended): press Enter in the terminal running `idempostctl console` and open the new URL it prints.";
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
