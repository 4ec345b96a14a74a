#!/usr/bin/env python3
"""Waits, in your own integration tests, until an event was published or consumed.

The same semantics as the Rust client's `await_published` / `await_consumed` and
`idempostctl wait`: each call to the admin service waits on the server for at most 10 s
(AdminService.AwaitPublished, ConsumerAdminService.AwaitConsumed are bounded long polls), and
these functions call again until their own timeout. An event whose order is not committed yet
is waited for, not refused.

As a library, over a channel made by `submit.open_channel` (the order service's admin
listener for `await_published`, the consumer's listener for `await_consumed`):

    published = await_published(channel, event_id, timeout=30.0)            # Published
    consumed = await_consumed(channel, event_id, "notification-planner", 30.0)  # Consumed

A wait that does not reach its goal raises an AwaitError: AwaitTimedOut (the timeout passed
first; `last_state` is UNKNOWN, PENDING or PUBLISHING on the order side, NOT_CONSUMED on the
consumer side), AwaitFailed (the relay gave up: FAILED), AwaitDeadLettered or AwaitParked (the
consumer set it aside). A failed call raises grpc.RpcError as it came. Without the operator
scope another tenant's event reads as UNKNOWN; the consumer side needs the operator scope.

As a command (one JSON line on stdout; exit status 0 reached, 3 timed out, 4 set aside, 1 a
failed call, 2 bad usage, as `idempostctl wait`):

    await_event.py --target 127.0.0.1:50054 published EVENT_ID --timeout 30
    await_event.py --target 127.0.0.1:50053 consumed EVENT_ID --consumer NAME --timeout 30
"""

import argparse
import dataclasses
import json
import sys
import time
from typing import Optional

import grpc
from google.protobuf import duration_pb2

import stubs
import submit

stubs.add_to_path()
from idempost.v1 import admin_service_pb2 as admin_pb  # noqa: E402
from idempost.v1 import admin_service_pb2_grpc as admin_grpc  # noqa: E402
from idempost.v1 import consumer_admin_service_pb2 as consumer_pb  # noqa: E402
from idempost.v1 import consumer_admin_service_pb2_grpc as consumer_grpc  # noqa: E402

# The longest one call asks the server to wait (the servers' own maximum).
CALL_WAIT = 10.0
# How much longer than its wait a call may take: the server's last read, and the network.
CALL_GRACE = 5.0


@dataclasses.dataclass(frozen=True)
class Published:
    event_id: str
    # PUBLISHED, or empty when retention already purged the row after publication.
    outbox_status: str


@dataclasses.dataclass(frozen=True)
class Consumed:
    event_id: str
    consumer_name: str


class AwaitError(Exception):
    """A wait that did not reach its goal."""


class AwaitTimedOut(AwaitError):
    def __init__(self, event_id: str, timeout: float, last_state: str):
        super().__init__(f"event {event_id} was still {last_state} after {timeout}s")
        self.event_id, self.timeout, self.last_state = event_id, timeout, last_state


class AwaitFailed(AwaitError):
    def __init__(self, event_id: str):
        super().__init__(f"event {event_id} is FAILED: the relay gave up; an operator may redrive it")
        self.event_id = event_id


class AwaitDeadLettered(AwaitError):
    def __init__(self, event_id: str, consumer_name: str, error: str):
        super().__init__(f"event {event_id} was dead-lettered by {consumer_name}: {error}")
        self.event_id, self.consumer_name, self.error = event_id, consumer_name, error


class AwaitParked(AwaitError):
    def __init__(self, event_id: str, consumer_name: str, reason: str):
        super().__init__(f"event {event_id} is parked by {consumer_name}: {reason}")
        self.event_id, self.consumer_name, self.reason = event_id, consumer_name, reason


class _Waiting:
    """One wait's clock: how long the next call may wait, and whether to call again."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.until = time.monotonic() + timeout

    def next_wait(self) -> float:
        # Never zero, which would ask for the server's maximum.
        return min(max(self.until - time.monotonic(), 0.001), CALL_WAIT)

    def again(self, event_id: str, last_state: str, retry_after: Optional[duration_pb2.Duration]) -> None:
        left = self.until - time.monotonic()
        if left <= 0:
            raise AwaitTimedOut(event_id, self.timeout, last_state)
        if retry_after is not None:
            time.sleep(min(retry_after.ToTimedelta().total_seconds(), left))


def _duration(seconds: float) -> duration_pb2.Duration:
    wait = duration_pb2.Duration()
    wait.FromNanoseconds(int(seconds * 1e9))
    return wait


def await_published(channel: grpc.Channel, event_id: str, timeout: float) -> Published:
    """Waits up to `timeout` seconds until the relay published `event_id`."""
    admin = admin_grpc.AdminServiceStub(channel)
    waiting = _Waiting(timeout)
    while True:
        wait = waiting.next_wait()
        ask = admin_pb.AwaitPublishedRequest(event_id=event_id, wait=_duration(wait))
        reply = admin.AwaitPublished(ask, timeout=wait + CALL_GRACE)
        if reply.state == admin_pb.PUBLISH_STATE_PUBLISHED:
            return Published(event_id, reply.outbox_status)
        if reply.state == admin_pb.PUBLISH_STATE_FAILED:
            raise AwaitFailed(event_id)
        last_state = reply.outbox_status if reply.known else "UNKNOWN"
        waiting.again(event_id, last_state, reply.retry_after if reply.HasField("retry_after") else None)


def await_consumed(channel: grpc.Channel, event_id: str, consumer_name: str, timeout: float) -> Consumed:
    """Waits up to `timeout` seconds until the consumer named `consumer_name` (empty: the one
    serving `channel`) consumed `event_id` and applied it."""
    consumer = consumer_grpc.ConsumerAdminServiceStub(channel)
    waiting = _Waiting(timeout)
    while True:
        wait = waiting.next_wait()
        ask = consumer_pb.AwaitConsumedRequest(event_id=event_id, consumer_name=consumer_name, wait=_duration(wait))
        reply = consumer.AwaitConsumed(ask, timeout=wait + CALL_GRACE)
        if reply.state == consumer_pb.CONSUME_STATE_CONSUMED:
            return Consumed(event_id, reply.consumer_name)
        if reply.state == consumer_pb.CONSUME_STATE_DEAD_LETTERED:
            raise AwaitDeadLettered(event_id, reply.consumer_name, reply.detail)
        if reply.state == consumer_pb.CONSUME_STATE_PARKED:
            raise AwaitParked(event_id, reply.consumer_name, reply.detail)
        waiting.again(event_id, "NOT_CONSUMED", reply.retry_after if reply.HasField("retry_after") else None)


# Exit statuses of the command, as `idempostctl wait`'s.
TIMED_OUT, SET_ASIDE = 3, 4


def _ended(error: AwaitError) -> dict:
    kinds = {AwaitTimedOut: "timed_out", AwaitFailed: "failed", AwaitDeadLettered: "dead_lettered", AwaitParked: "parked"}
    line = {"type": "result", "outcome": kinds[type(error)], "message": str(error)}
    line.update({k: v for k, v in vars(error).items() if isinstance(v, (str, float, int))})
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description="Wait until an event was published or consumed; one JSON line out.")
    parser.add_argument("--target", required=True, help="admin listener host:port (order service or consumer)")
    parser.add_argument("--ca-file", help="PEM CA of the listener's certificate: use TLS (else loopback only)")
    parser.add_argument("--token-file", help="file holding the bearer token (else IDEMPOST_TOKEN)")
    commands = parser.add_subparsers(dest="command", required=True)
    published = commands.add_parser("published", help="until the relay published the event")
    published.add_argument("event_id")
    published.add_argument("--timeout", type=float, default=30.0, help="seconds in all")
    consumed = commands.add_parser("consumed", help="until a named consumer consumed and applied the event")
    consumed.add_argument("event_id")
    consumed.add_argument("--consumer", required=True, help="the consumer name")
    consumed.add_argument("--timeout", type=float, default=30.0, help="seconds in all")
    args = parser.parse_args()
    try:
        channel = submit.open_channel(args.target, args.ca_file, submit.read_token(args.token_file))
    except submit.PlaintextRefused as refused:
        print(f"await_event.py: {refused}", file=sys.stderr)
        return 2
    try:
        if args.command == "published":
            reached = await_published(channel, args.event_id, args.timeout)
            line = {"type": "result", "outcome": "published", "event_id": reached.event_id}
        else:
            reached = await_consumed(channel, args.event_id, args.consumer, args.timeout)
            line = {"type": "result", "outcome": "consumed", "event_id": reached.event_id,
                    "consumer_name": reached.consumer_name}
        print(json.dumps(line))
        return 0
    except AwaitError as error:
        print(json.dumps(_ended(error)))
        return TIMED_OUT if isinstance(error, AwaitTimedOut) else SET_ASIDE
    except grpc.RpcError as error:
        print(json.dumps({"type": "result", "outcome": "call_failed", "code": error.code().name,
                          "message": error.details()}))
        return 1


if __name__ == "__main__":
    sys.exit(main())
