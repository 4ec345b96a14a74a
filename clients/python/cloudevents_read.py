#!/usr/bin/env python3
"""Reads Idempost's records from Kafka as CloudEvents, with the official CloudEvents SDK, and
prints one JSON line per record.

    cloudevents_read.py --brokers 127.0.0.1:9092 [--topic idempost.order-accepted.v1]
                        [--max-records N] [--timeout SECONDS] [-X librdkafka.option=value ...]

The relay writes every record in the CloudEvents 1.0 Kafka protocol binding: binary content mode
by default (the value is the protobuf payload, the attributes are `ce_*` headers, the data content
type is the `content-type` header), structured mode with `--cloudevents-mode structured` (the value
is the JSON envelope, the payload in `data_base64`). The mode is told by the `content-type` header,
as the binding says; the SDK's `cloudevents.core.bindings.kafka` parses each record, and the data is
decoded with the generated stubs as the message its `type` names (idempost.v1.OrderAccepted,
OrderAmended, OrderCancelled).

Reads the topic from the beginning in a fresh consumer group and commits nothing: this is a reader
for looking at records, not a consumer (consume.py is one). Exit status: 0, or 1 when
--max-records was given and fewer records arrived before the timeout.
"""

import argparse
import json
import sys
import time
import uuid

from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat
from confluent_kafka import Consumer, KafkaError, KafkaException

import stubs

stubs.add_to_path()
from idempost.v1 import order_events_pb2  # noqa: E402

DEFAULT_TOPIC = "idempost.order-accepted.v1"
# The event types the payload may be, by the CloudEvents `type`.
MESSAGES = {
    "idempost.v1.OrderAccepted": order_events_pb2.OrderAccepted,
    "idempost.v1.OrderAmended": order_events_pb2.OrderAmended,
    "idempost.v1.OrderCancelled": order_events_pb2.OrderCancelled,
}


def structured(headers: dict) -> bool:
    """Whether the record is in structured content mode: its content-type is a CloudEvents format."""
    content_type = headers.get("content-type", b"").decode("utf-8", "replace")
    return content_type.split(";")[0].strip().lower().startswith("application/cloudevents")


def payload_bytes(data) -> bytes:
    """The event's data as bytes: the SDK hands binary data that happens to be valid UTF-8 back as
    text, which encodes back to the same bytes."""
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, bytes):
        return data
    raise ValueError(f"the event's data is {type(data).__name__}, not the protobuf payload")


def record_line(message) -> dict:
    """One output line: the CloudEvent's attributes and its data decoded, or why it could not be."""
    headers = {key: value or b"" for key, value in (message.headers() or [])}
    mode = "structured" if structured(headers) else "binary"
    record = ce_kafka.KafkaMessage(headers=headers, key=message.key(), value=message.value() or b"")
    where = {"partition": message.partition(), "offset": message.offset(), "mode": mode}
    try:
        parse = ce_kafka.from_structured if mode == "structured" else ce_kafka.from_binary
        event = parse(record, JSONFormat())
        kind = MESSAGES.get(event.get_type())
        if kind is None:
            raise ValueError(f"no message for CloudEvents type {event.get_type()}")
        payload = kind.FromString(payload_bytes(event.get_data()))
    except Exception as error:  # noqa: BLE001 - any failure is reported on its line, not raised
        return {"type": "unreadable", **where, "error": f"{type(error).__name__}: {error}"}
    time_ = event.get_time()
    return {
        "type": "cloudevent",
        **where,
        "key": message.key().decode("utf-8", "replace") if message.key() is not None else None,
        "specversion": event.get_specversion(),
        "id": event.get_id(),
        "source": event.get_source(),
        "ce_type": event.get_type(),
        "subject": event.get_subject(),
        "time": time_.isoformat() if time_ is not None else None,
        "datacontenttype": event.get_datacontenttype(),
        "traceparent": event.get_extension("traceparent"),
        "data": {
            "message": type(payload).DESCRIPTOR.full_name,
            "event_id": payload.event_id,
            "event_version": payload.event_version,
            "order_id": payload.order_id,
            "tenant_id": payload.tenant_id,
            "total_minor": payload.total_minor,
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description="Print Idempost's records as CloudEvents, one JSON line each.")
    parser.add_argument("--brokers", default="127.0.0.1:9092", help="bootstrap servers")
    parser.add_argument("--topic", default=DEFAULT_TOPIC)
    parser.add_argument("--max-records", type=int, help="stop after this many records")
    parser.add_argument("--timeout", type=float, default=60.0, help="stop after this many seconds")
    parser.add_argument(
        "-X", dest="options", action="append", default=[], metavar="KEY=VALUE", help="librdkafka option"
    )
    args = parser.parse_args()
    config = {
        "bootstrap.servers": args.brokers,
        "group.id": f"idempost-cloudevents-reader-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    for option in args.options:
        key, sep, value = option.partition("=")
        if not sep:
            parser.error(f"-X {option}: expected KEY=VALUE")
        config[key] = value

    consumer = Consumer(config)
    consumer.subscribe([args.topic])
    deadline = time.monotonic() + args.timeout
    records = 0
    try:
        while time.monotonic() < deadline and (args.max_records is None or records < args.max_records):
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error():
                if message.error().fatal():
                    raise KafkaException(message.error())
                if message.error().code() != KafkaError._PARTITION_EOF:
                    print(f"kafka: {message.error()}", file=sys.stderr, flush=True)
                continue
            print(json.dumps(record_line(message), sort_keys=True), flush=True)
            records += 1
    finally:
        consumer.close()
    if args.max_records is not None and records < args.max_records:
        print(f"only {records} of {args.max_records} records arrived before the timeout", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
