// Records the relay published, read from the real broker with kafkajs and parsed with the official
// CloudEvents SDK's Kafka binding (`Kafka.toEvent`), as a consumer in a Node stack would. The Rust
// test (tests/api/cloudevents.rs) publishes them, one topic per content mode, and hands over what
// each topic must hold.

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { fromBinary, type DescMessage } from "@bufbuild/protobuf";
import { Kafka, type CloudEventV1, type KafkaMessage as CloudEventsKafkaMessage } from "cloudevents";
import { Kafka as KafkaClient, logLevel, type IHeaders, type KafkaMessage } from "kafkajs";

import {
  OrderAcceptedSchema,
  OrderAmendedSchema,
  OrderCancelledSchema,
} from "../../src/gen/idempost/v1/order_events_pb.js";
import { env } from "./env.js";

/** One event as the Rust test published it. */
interface Expected {
  id: string;
  type: string;
  orderId: string;
  version: string;
}

const topics: Record<"binary" | "structured", { topic: string; events: Expected[] }> = JSON.parse(
  env("IDEMPOST_CE_TOPICS"),
);

/** The message each CloudEvents `type` names. */
const messages: Record<string, DescMessage> = {
  "idempost.v1.OrderAccepted": OrderAcceptedSchema,
  "idempost.v1.OrderAmended": OrderAmendedSchema,
  "idempost.v1.OrderCancelled": OrderCancelledSchema,
};

/** kafkajs hands header values as Buffers; the SDK's binding reads them as text. */
function textHeaders(headers: IHeaders | undefined): Record<string, string> {
  const text: Record<string, string> = {};
  for (const [key, value] of Object.entries(headers ?? {})) {
    const last = Array.isArray(value) ? value[value.length - 1] : value;
    if (last !== undefined) text[key] = last.toString();
  }
  return text;
}

/** The first `count` records of `topic`, read from the beginning in a fresh consumer group. */
async function readRecords(topic: string, count: number): Promise<KafkaMessage[]> {
  const client = new KafkaClient({
    clientId: "idempost-ts-cloudevents",
    brokers: [env("IDEMPOST_CE_BROKERS")],
    logLevel: logLevel.ERROR,
  });
  const consumer = client.consumer({ groupId: `idempost-ts-ce-${process.pid}-${topic}`, sessionTimeout: 6000 });
  const records: KafkaMessage[] = [];
  await consumer.connect();
  try {
    await consumer.subscribe({ topics: [topic], fromBeginning: true });
    const all = new Promise<void>((resolve) => {
      void consumer.run({
        eachMessage: async ({ message }) => {
          records.push(message);
          if (records.length >= count) resolve();
        },
      });
    });
    const timeout = new Promise<never>((_, reject) =>
      setTimeout(() => reject(new Error(`only ${records.length} of ${count} records of ${topic} arrived`)), 60_000).unref(),
    );
    await Promise.race([all, timeout]);
  } finally {
    await consumer.disconnect();
  }
  return records;
}

for (const mode of ["binary", "structured"] as const) {
  describe(`a ${mode}-mode topic`, () => {
    test("every record is a CloudEvent whose id, type, source, subject and data are the event's", async () => {
      const { topic, events } = topics[mode];
      const records = await readRecords(topic, events.length);
      const parsed = records.map((record) => {
        // The envelope is JSON text; a binary-mode value stays the payload's bytes.
        const value = mode === "structured" ? record.value?.toString() : record.value;
        const message: CloudEventsKafkaMessage = {
          headers: textHeaders(record.headers),
          key: record.key?.toString() ?? "",
          value,
          body: value,
        };
        assert.ok(Kafka.isEvent(message), `${mode}: the SDK sees a CloudEvent`);
        const contentType = String(message.headers["content-type"] ?? "");
        assert.equal(contentType.startsWith("application/cloudevents+json"), mode === "structured", contentType);
        return Kafka.toEvent(message) as CloudEventV1<Uint8Array>;
      });
      for (const want of events) {
        const event = parsed.find((e) => e.id === want.id);
        assert.ok(event, `${mode}: no CloudEvent with id ${want.id}`);
        assert.equal(event.specversion, "1.0");
        assert.equal(event.type, want.type);
        assert.equal(event.source, "/idempost/orders");
        assert.equal(event.subject, want.orderId);
        assert.equal(event.datacontenttype, "application/x-protobuf");
        assert.equal(event.partitionkey, want.orderId, "the record key stays the order id");
        assert.ok(event.time && !Number.isNaN(Date.parse(event.time)), `time ${event.time}`);
        const schema = messages[event.type];
        assert.ok(schema, `a message for ${event.type}`);
        assert.ok(event.data instanceof Uint8Array, `${mode}: the data is the protobuf payload's bytes`);
        const payload = fromBinary(schema, event.data) as unknown as { eventId: string; orderId: bigint; eventVersion: bigint };
        assert.equal(payload.eventId, want.id);
        assert.equal(payload.orderId.toString(), want.orderId);
        assert.equal(payload.eventVersion.toString(), want.version);
      }
    });
  });
}
