// Times, ages and payloads for people.
import { fromBinary, toJson, type DescMessage } from "@bufbuild/protobuf";
import { timestampDate, type Duration, type Timestamp } from "@bufbuild/protobuf/wkt";
import { OrderAcceptedSchema, OrderAmendedSchema, OrderCancelledSchema } from "./stubs.js";

export function when(t: Timestamp | undefined): string {
  return t ? timestampDate(t).toISOString().replace("T", " ").replace("Z", " UTC") : "-";
}

export function millis(t: Timestamp | undefined): number | undefined {
  return t ? timestampDate(t).getTime() : undefined;
}

export function seconds(d: Duration | undefined): number | undefined {
  return d ? Number(d.seconds) + d.nanos / 1e9 : undefined;
}

export function age(s: number | undefined): string {
  if (s === undefined) return "-";
  if (s < 60) return `${s.toFixed(1)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
}

/** The event messages a payload can hold, by the type named in the `event_type` header. */
export const EVENT_TYPES: Record<string, DescMessage> = {
  "idempost.v1.OrderAccepted": OrderAcceptedSchema,
  "idempost.v1.OrderAmended": OrderAmendedSchema,
  "idempost.v1.OrderCancelled": OrderCancelledSchema,
};

/** The payload decoded as `eventType`, as the proto's JSON; the bytes in hex when it is not one. */
export function decoded(eventType: string, payload: Uint8Array): string {
  const schema = EVENT_TYPES[eventType];
  if (schema) {
    try {
      return JSON.stringify(toJson(schema, fromBinary(schema, payload)), null, 2);
    } catch (e) {
      return `not a valid ${eventType} (${String(e)}):\n${hex(payload)}`;
    }
  }
  return `${payload.length} bytes of unknown type ${JSON.stringify(eventType)}:\n${hex(payload)}`;
}

function hex(bytes: Uint8Array): string {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join(" ");
}
