// Event ids as the server makes them: UUIDv7 (time-ordered), canonical lower-case form.

import { randomBytes } from "node:crypto";

/** A new UUIDv7: 48 bits of Unix milliseconds, the version, 74 random bits and the variant. */
export function newEventId(now: number = Date.now()): string {
  const bytes = randomBytes(16);
  let millis = BigInt(now);
  for (let i = 5; i >= 0; i--) {
    bytes[i] = Number(millis & 0xffn);
    millis >>= 8n;
  }
  bytes[6] = 0x70 | (bytes[6]! & 0x0f);
  bytes[8] = 0x80 | (bytes[8]! & 0x3f);
  const hex = bytes.toString("hex");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}
