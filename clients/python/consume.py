#!/usr/bin/env python3
"""Reads OrderAccepted events from Kafka with confluent-kafka and prints one JSON line per event.

    consume.py --brokers 127.0.0.1:9092 [--topic idempost.order-accepted.v1] [--group-id G]
               [--max-events N] [--timeout SECONDS] [-X librdkafka.option=value ...]

Each record's value is an idempost.v1.OrderAccepted in protobuf binary encoding; its `event_id`
header (`ce_id` alone from a relay run with --legacy-headers false) repeats the payload's event id.
Delivery is at least once: the same event id can arrive more than once, and a real consumer
deduplicates by it (the Rust consumer keeps a consumed_event row per event). Offsets are committed
only after a record was handled (here: its line printed and flushed), so a crash before that
re-reads the record instead of losing it. A record that cannot be decoded is reported as an
"undecodable" line and committed: it never blocks its partition and is never skipped silently.

With --ca-file the brokers are reached over TLS; with a token (--token-file, else the
IDEMPOST_KAFKA_TOKEN environment variable) the consumer authenticates with SASL/OAUTHBEARER. A
token is sent in the clear only to loopback brokers: with a token, no TLS (no --ca-file, no -X
security.protocol=SASL_SSL) and a broker that is not a loopback address, consume.py refuses to
start (exit status 2) before it connects, as submit.py does for a plaintext --target. Any other
librdkafka security option (SASL/SCRAM, client certificates) goes through -X KEY=VALUE.

Stops after N events (--max-events), after --timeout seconds, or on SIGINT/SIGTERM. Exit status:
0, 1 when --max-events was given and fewer events arrived before the timeout, 2 when the
arguments are refused (a token over plaintext to a broker that is not on this host, among them).
"""

import argparse
import base64
import json
import os
import signal
import sys
import time
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException

import stubs
from submit import is_loopback

stubs.add_to_path()
from idempost.v1 import order_events_pb2  # noqa: E402

DEFAULT_TOPIC = "idempost.order-accepted.v1"


def headers_of(message) -> dict:
    """The record's headers as text; a repeated header keeps its last value."""
    return {
        key: (value.decode("utf-8", "replace") if value is not None else None)
        for key, value in (message.headers() or [])
    }


def header_event_id(headers: dict):
    """The event id the record's headers state: `event_id`, else `ce_id` (a relay run with
    --legacy-headers false writes the CloudEvents headers alone)."""
    return headers.get("event_id", headers.get("ce_id"))


def event_line(message, event: order_events_pb2.OrderAccepted, headers: dict) -> dict:
    return {
        "type": "event",
        "topic": message.topic(),
        "partition": message.partition(),
        "offset": message.offset(),
        "key": message.key().decode("utf-8", "replace") if message.key() is not None else None,
        "header_event_id": header_event_id(headers),
        "event_type": headers.get("event_type", headers.get("ce_type")),
        "event_id": event.event_id,
        "event_version": event.event_version,
        "order_id": event.order_id,
        "tenant_id": event.tenant_id,
        "request_id": event.request_id,
        "customer_id": event.customer_id,
        "currency": event.currency,
        "line_items": [
            {"sku": line.sku, "quantity": line.quantity, "unit_price_minor": line.unit_price_minor}
            for line in event.line_items
        ],
        "total_minor": event.total_minor,
        "accepted_at": event.accepted_at.ToJsonString() if event.HasField("accepted_at") else None,
    }


def decode(message) -> dict:
    """One output line for a record: the decoded event, or why it could not be decoded."""
    headers = headers_of(message)
    try:
        event = order_events_pb2.OrderAccepted.FromString(message.value() or b"")
        if not event.event_id:
            raise ValueError("the payload has no event_id")
    except Exception as error:  # noqa: BLE001 - any decoding failure is reported, not raised
        return {
            "type": "undecodable",
            "topic": message.topic(),
            "partition": message.partition(),
            "offset": message.offset(),
            "header_event_id": header_event_id(headers),
            "error": f"{type(error).__name__}: {error}",
        }
    return event_line(message, event, headers)


def read_token(token_file):
    """The bearer token from `token_file`, else from IDEMPOST_KAFKA_TOKEN; None when neither is set."""
    if token_file is not None:
        with open(token_file, encoding="ascii") as file:
            return file.read().strip()
    return os.environ.get("IDEMPOST_KAFKA_TOKEN", "").strip() or None


def token_expiry(token: str) -> float:
    """The JWT's `exp` (seconds since the epoch), or five minutes from now if it has none."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return float(claims["exp"])
    except (IndexError, KeyError, TypeError, ValueError):
        return time.time() + 300


def plaintext_token_refusal(config: dict, has_token: bool):
    """Why `config` must not be used, when it would send a token unencrypted off this host; else None.

    Judged on the final configuration (after -X), so `-X security.protocol=SASL_SSL` with a CA
    passes and `-X security.protocol=SASL_PLAINTEXT` with --ca-file does not slip through.
    """
    if not has_token or config.get("security.protocol", "").upper() != "SASL_PLAINTEXT":
        return None
    remote = [b for b in config["bootstrap.servers"].split(",") if b.strip() and not is_loopback(b.strip())]
    if not remote:
        return None
    return (
        f"refusing to send the token over plaintext to {', '.join(remote)}, which is not a loopback "
        "address: give --ca-file (SASL_SSL), or drop the token."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description="Print OrderAccepted events from Kafka as JSON lines.")
    parser.add_argument("--brokers", default="127.0.0.1:9092", help="bootstrap servers")
    parser.add_argument("--topic", default=DEFAULT_TOPIC)
    parser.add_argument("--group-id", default="idempost-python-consumer", help="consumer group")
    parser.add_argument("--max-events", type=int, help="stop after this many events")
    parser.add_argument("--timeout", type=float, help="stop after this many seconds")
    parser.add_argument("--ca-file", help="PEM CA of the brokers' certificates: use TLS")
    parser.add_argument(
        "--token-file",
        help="file holding an OAuth bearer token for SASL/OAUTHBEARER (else IDEMPOST_KAFKA_TOKEN)",
    )
    parser.add_argument(
        "-X", dest="options", action="append", default=[], metavar="KEY=VALUE", help="librdkafka option"
    )
    args = parser.parse_args()

    config = {
        "bootstrap.servers": args.brokers,
        "group.id": args.group_id,
        # A new group starts at the beginning of the topic, so no event published before it is missed.
        "auto.offset.reset": "earliest",
        # Offsets are committed by hand, after handling, never in the background.
        "enable.auto.commit": False,
        "client.id": f"idempost-python-{uuid.uuid4().hex[:8]}",
    }
    if args.ca_file:
        config["security.protocol"] = "SSL"
        config["ssl.ca.location"] = args.ca_file
    token = read_token(args.token_file)
    if token:
        config["security.protocol"] = "SASL_SSL" if args.ca_file else "SASL_PLAINTEXT"
        config["sasl.mechanisms"] = "OAUTHBEARER"
        config["oauth_cb"] = lambda _config: (token, token_expiry(token))
    # -X options come last: they override the above.
    for option in args.options:
        key, sep, value = option.partition("=")
        if not sep:
            parser.error(f"-X {option}: expected KEY=VALUE")
        config[key] = value
    refused = plaintext_token_refusal(config, bool(token))
    if refused:
        parser.error(refused)

    stopping = False

    def stop(_signum, _frame):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    consumer = Consumer(config)
    consumer.subscribe([args.topic])
    deadline = time.monotonic() + args.timeout if args.timeout is not None else None
    events = 0
    try:
        while not stopping:
            if args.max_events is not None and events >= args.max_events:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error():
                error = message.error()
                if error.fatal():
                    raise KafkaException(error)
                # Transient (a topic not created yet, a broker restarting): librdkafka retries.
                if error.code() != KafkaError._PARTITION_EOF:
                    print(f"kafka: {error}", file=sys.stderr, flush=True)
                continue
            line = decode(message)
            print(json.dumps(line, sort_keys=True), flush=True)
            if line["type"] == "event":
                events += 1
            # Handled: only now is the record's offset committed (synchronously, so that a stop
            # right after it cannot lose the commit).
            consumer.commit(message=message, asynchronous=False)
    finally:
        consumer.close()
    if args.max_events is not None and events < args.max_events:
        print(f"only {events} of {args.max_events} events arrived before the timeout", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
