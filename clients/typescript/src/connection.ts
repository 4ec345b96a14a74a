// A gRPC (HTTP/2) transport to an Idempost service: TLS trusting a CA file, or plaintext on
// loopback only; a bearer token from a file or an environment variable, sent on every call and
// never over plaintext to another host.

import { readFileSync } from "node:fs";
import { isIP } from "node:net";

import type { Interceptor, Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

/** The environment variable a token is read from when no token file is named. */
export const TOKEN_ENV = "IDEMPOST_TOKEN";

/** How to reach a service. */
export interface ConnectionOptions {
  /** `host:port` of the service's gRPC listener. */
  target: string;
  /** PEM CA bundle that signed the service's certificate: use TLS. Without it, plaintext. */
  caFile?: string;
  /** File holding the bearer token (a JWT). Without it, the token comes from `tokenEnv`. */
  tokenFile?: string;
  /** Environment variable holding the token when no file is named; IDEMPOST_TOKEN by default. */
  tokenEnv?: string;
}

/** A connection that was refused before anything was sent. */
export class ConnectionRefused extends Error {
  override readonly name = "ConnectionRefused";
}

/** The bearer token from `tokenFile`, else from the environment; undefined when neither is set. */
export function readToken(tokenFile?: string, tokenEnv: string = TOKEN_ENV): string | undefined {
  const token = tokenFile !== undefined ? readFileSync(tokenFile, "ascii") : process.env[tokenEnv];
  return token?.trim() || undefined;
}

/** Whether `host` (a name or an address, IPv6 with or without brackets) is this machine. */
export function isLoopback(host: string): boolean {
  const bare = host.replace(/^\[(.*)\]$/, "$1").toLowerCase();
  if (bare === "localhost") return true;
  if (isIP(bare) === 4) return bare.startsWith("127.");
  return bare === "::1" || bare === "0:0:0:0:0:0:0:1";
}

/** The host part of `host:port` (an IPv6 address in brackets keeps them). */
export function hostOf(target: string): string {
  const url = new URL(`http://${target}`);
  return url.hostname;
}

/**
 * A transport to `options.target`. Refuses (throws ConnectionRefused) to send a token over
 * plaintext to a host that is not loopback: the token would cross the network in the clear.
 */
export function connect(options: ConnectionOptions): Transport {
  const token = readToken(options.tokenFile, options.tokenEnv);
  const tls = options.caFile !== undefined;
  if (!tls && token !== undefined && !isLoopback(hostOf(options.target))) {
    throw new ConnectionRefused(
      `refusing to send a bearer token over plaintext to ${hostOf(options.target)}: name a CA file to use TLS`,
    );
  }
  const interceptors: Interceptor[] = token === undefined ? [] : [bearer(token)];
  return createGrpcTransport({
    baseUrl: `${tls ? "https" : "http"}://${options.target}`,
    nodeOptions: tls ? { ca: readFileSync(options.caFile as string) } : {},
    interceptors,
  });
}

/** Sends `authorization: Bearer <token>` with every call. */
function bearer(token: string): Interceptor {
  const value = `Bearer ${token}`;
  return (next) => (request) => {
    request.header.set("authorization", value);
    return next(request);
  };
}
