#!/usr/bin/env python3
"""Submits, amends and cancels orders on Idempost's OrderService with the safe caller protocol.

The protocol (the same as the Rust `idempost::client::SafeSubmitter`), for SubmitOrder,
AmendOrder and CancelOrder alike:

1. Fix the event id before the first attempt; every retry reuses it and the request id.
2. Send. OK: done (`replayed` says an identical earlier call committed it).
3. ABORTED with reason ROLLED_BACK, or RESOURCE_EXHAUSTED with reason OVERLOADED: nothing was
   written; send again (after the backoff) with the same ids.
4. A refusal retrying cannot fix (INVALID_ARGUMENT, ALREADY_EXISTS, FAILED_PRECONDITION such as
   VERSION_CONFLICT or ORDER_CANCELLED, NOT_FOUND such as ORDER_NOT_FOUND, ...): stop. After a
   VERSION_CONFLICT, read the order, decide, and send a new change with a new request id.
5. Anything else (UNKNOWN, UNAVAILABLE, DEADLINE_EXCEEDED, a transport error): the write may have
   committed. Reconcile by (tenant_id, request_id): found, done; NOT_FOUND, send again with the
   same ids; any other error, reconcile again.
6. A bounded number of calls with exponential backoff; giving up reports the event id, so a
   later attempt can reconcile or send again with the same ids.

As a library: `SafeSubmitter(open_channel(target, ca_file, token)).submit(request)` (or `.amend`,
`.cancel`). As a command (one JSON line per call made and one per write on stdout):

    submit.py --target 127.0.0.1:50051 submit --order '{"tenant_id": 7, "request_id": "r-1", ...}'
    submit.py --target 127.0.0.1:50051 submit < orders.jsonl     # one order (proto JSON) a line
    submit.py --target 127.0.0.1:50051 amend --change '{"tenant_id": 7, "request_id": "a-1",
        "order_id": "12", "expected_version": "1", "line_items": [...]}'
    submit.py --target 127.0.0.1:50051 cancel --change '{"tenant_id": 7, "request_id": "c-1",
        "order_id": "12", "expected_version": "2", "reason": "CANCEL_REASON_OUT_OF_STOCK"}'
    submit.py --target 127.0.0.1:50051 reconcile --tenant-id 7 --request-id r-1
    submit.py --target localhost:50051 --ca-file ca.pem --token-file token.jwt submit < orders.jsonl

With `--ca-file` the channel is TLS and the server's certificate must chain to that CA; without
it the channel is plaintext and `--target` must be a loopback address (anything else is refused
before connecting, exit status 2). The token (`--token-file`, else the IDEMPOST_TOKEN environment
variable) is sent as `authorization: Bearer` on every call, and the server takes the tenant from
it (tenant_id 0 in a request means "mine").

Exit status: 0 when every write is confirmed (or the reconciled operation was found), 1
otherwise, 2 for bad usage.
"""

import argparse
import dataclasses
import ipaddress
import json
import os
import sys
import time
import uuid
from typing import Callable, Optional

import grpc
from google.protobuf import json_format
from google.rpc import error_details_pb2
from grpc_status import rpc_status

import stubs

stubs.add_to_path()
from idempost.v1 import order_pb2  # noqa: E402
from idempost.v1 import order_service_pb2 as pb  # noqa: E402
from idempost.v1 import order_service_pb2_grpc as pb_grpc  # noqa: E402

# The ErrorInfo domain of Idempost's own errors; a reason from any other domain is not ours.
ERROR_DOMAIN = "idempost.v1"

# Refusals that retrying with the same request cannot fix: nothing was written by it.
FINAL_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


@dataclasses.dataclass
class RetryPolicy:
    """How hard the submitter tries."""

    # Most calls, submits and reconciles together.
    max_calls: int = 8
    # Wait before the second call in seconds; doubled after each further failure.
    initial_backoff: float = 0.05
    # Longest wait between calls in seconds.
    max_backoff: float = 2.0
    # Deadline of each call in seconds.
    call_timeout: float = 10.0


@dataclasses.dataclass
class Confirmed:
    """A committed write (an order, or a change of one), however its commit was learned."""

    order_id: int
    # The id of the event committed with the write: the one fixed before the first attempt.
    event_id: str
    # "committed", "replayed" (an identical earlier call committed it) or "reconciled".
    confirmation: str
    calls: int
    # The order's version the write made (1 for a submission).
    version: int = 1


# Each write: the RPC that sends it, its request message, and the operation Reconcile reports for
# a key it used.
WRITES = {
    "submit": ("SubmitOrder", pb.SubmitOrderRequest, pb.ORDER_OPERATION_SUBMIT),
    "amend": ("AmendOrder", pb.AmendOrderRequest, pb.ORDER_OPERATION_AMEND),
    "cancel": ("CancelOrder", pb.CancelOrderRequest, pb.ORDER_OPERATION_CANCEL),
}


@dataclasses.dataclass
class Failure:
    """A failed call: its gRPC code, Idempost's ErrorInfo reason (if any) and the message."""

    code: grpc.StatusCode
    reason: Optional[str]
    message: str

    @classmethod
    def of(cls, error: grpc.RpcError) -> "Failure":
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        message = error.details() if hasattr(error, "details") else str(error)
        return cls(code=code, reason=error_reason(error), message=message or "")

    def as_json(self) -> dict:
        return {"code": self.code.name, "reason": self.reason, "message": self.message}


class Rejected(Exception):
    """The server refused the write for a reason retrying cannot fix; nothing was written."""

    def __init__(self, failure: Failure, calls: int):
        super().__init__(f"rejected: {failure.code.name} {failure.reason}: {failure.message}")
        self.failure = failure
        self.calls = calls


class GaveUp(Exception):
    """Every allowed call failed. The order may exist: reconcile later with the same ids."""

    def __init__(self, failure: Failure, calls: int, event_id: str):
        super().__init__(f"gave up after {calls} calls; last error: {failure.code.name}: {failure.message}")
        self.failure = failure
        self.calls = calls
        self.event_id = event_id


def error_reason(error: grpc.RpcError) -> Optional[str]:
    """The reason of the google.rpc.ErrorInfo in the status details, if it is Idempost's."""
    try:
        status = rpc_status.from_call(error)
    except (ValueError, AttributeError):
        return None  # no call (a transport error) or details that contradict the status
    if status is None:
        return None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            if info.domain == ERROR_DOMAIN:
                return info.reason
    return None


def new_event_id() -> str:
    """A UUIDv7 (time-ordered, as the server makes them) in canonical lower-case form."""
    millis = time.time_ns() // 1_000_000
    random = int.from_bytes(os.urandom(10), "big")
    value = (millis & (2**48 - 1)) << 80
    value |= 0x7 << 76 | (random >> 68 & 0xFFF) << 64
    value |= 0b10 << 62 | random & (2**62 - 1)
    return str(uuid.UUID(int=value))


class SafeSubmitter:
    """Submits orders with the safe caller protocol over one channel."""

    def __init__(
        self,
        channel: grpc.Channel,
        policy: Optional[RetryPolicy] = None,
        on_call: Optional[Callable[[dict], None]] = None,
    ):
        # The token, if any, is part of the channel (open_channel): gRPC sends it only over TLS
        # or to a loopback address, and it is never printed.
        self._stub = pb_grpc.OrderServiceStub(channel)
        self._policy = policy or RetryPolicy()
        # Told about every call made: {"call", "attempt", "tenant_id", "request_id", "event_id", "code", ...}.
        self._on_call = on_call or (lambda _: None)

    def submit(self, request: pb.SubmitOrderRequest) -> Confirmed:
        """Submits `request` until its outcome is known or the policy's calls run out.

        An empty event_id is filled in once, before the first attempt, and reused by every retry.
        Raises Rejected or GaveUp.
        """
        return self._run("submit", request)

    def amend(self, request: pb.AmendOrderRequest) -> Confirmed:
        """Amends an order with the same protocol as `submit`. A refusal (VERSION_CONFLICT,
        ORDER_CANCELLED, ORDER_NOT_FOUND) raises Rejected: read the order, decide, and send a new
        change with a new request id."""
        return self._run("amend", request)

    def cancel(self, request: pb.CancelOrderRequest) -> Confirmed:
        """Cancels an order with the same protocol as `amend`."""
        return self._run("cancel", request)

    def _run(self, write: str, request) -> Confirmed:
        """The safe caller protocol for one write ("submit", "amend" or "cancel")."""
        method, message, operation = WRITES[write]
        send = getattr(self._stub, method)
        request = message.FromString(request.SerializeToString())
        if not request.event_id:
            request.event_id = new_event_id()
        key = pb.ReconcileRequest(tenant_id=request.tenant_id, request_id=request.request_id)
        policy = self._policy
        calls = 0
        reconcile_first = False
        backoff = policy.initial_backoff
        while True:
            calls += 1
            if reconcile_first:
                try:
                    found = self._stub.Reconcile(key, timeout=policy.call_timeout)
                except grpc.RpcError as error:
                    failure = Failure.of(error)
                    self._report("reconcile", calls, request, failure=failure)
                    if failure.code == grpc.StatusCode.NOT_FOUND:
                        # Not committed: the same ids may be sent again.
                        reconcile_first = False
                        backoff = policy.initial_backoff
                        continue
                else:
                    self._report("reconcile", calls, request, event_id=found.event_id)
                    # A server older than the operation field had submissions only.
                    used_by = found.operation or pb.ORDER_OPERATION_SUBMIT
                    if used_by != operation:
                        # Another operation holds the key: this write never committed under it.
                        message_text = f"the request id was used by {pb.OrderOperation.Name(used_by)}"
                        failure = Failure(grpc.StatusCode.ALREADY_EXISTS, "REQUEST_ID_REUSED", message_text)
                        raise Rejected(failure, calls)
                    return Confirmed(found.order_id, found.event_id, "reconciled", calls, found.version)
            else:
                try:
                    answer = send(request, timeout=policy.call_timeout)
                except grpc.RpcError as error:
                    failure = Failure.of(error)
                    self._report(write, calls, request, failure=failure)
                    if failure.code == grpc.StatusCode.ABORTED and failure.reason == "ROLLED_BACK":
                        pass  # rolled back before commit: send again with the same ids
                    elif failure.code == grpc.StatusCode.RESOURCE_EXHAUSTED and failure.reason == "OVERLOADED":
                        pass  # refused at the door before anything ran: send again after the backoff
                    elif failure.code in FINAL_CODES:
                        raise Rejected(failure, calls) from error
                    else:
                        reconcile_first = True
                else:
                    self._report(write, calls, request, event_id=answer.event_id)
                    confirmation = "replayed" if answer.replayed else "committed"
                    return Confirmed(answer.order_id, answer.event_id, confirmation, calls, answer.version)
            if calls >= policy.max_calls:
                raise GaveUp(failure, calls, request.event_id)
            time.sleep(backoff)
            backoff = min(backoff * 2, policy.max_backoff)

    def reconcile(self, tenant_id: int, request_id: str) -> Optional[pb.ReconcileResponse]:
        """The committed order with that key, or None when no order with it committed."""
        key = pb.ReconcileRequest(tenant_id=tenant_id, request_id=request_id)
        try:
            return self._stub.Reconcile(key, timeout=self._policy.call_timeout)
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    def _report(self, call, attempt, request, failure=None, event_id=None):
        line = {
            "type": "call",
            "call": call,
            "attempt": attempt,
            "tenant_id": request.tenant_id,
            "request_id": request.request_id,
            # What the call sent (a write) or asked about (reconcile): never changes between calls.
            "sent_event_id": request.event_id if call != "reconcile" else None,
        }
        if failure is None:
            line.update(code="OK", event_id=event_id)
        else:
            line.update(failure.as_json())
        self._on_call(line)


def emit(line: dict) -> None:
    print(json.dumps(line, sort_keys=True), flush=True)


def write_command(submitter: SafeSubmitter, write: str, requests: list) -> int:
    """Sends each request (proto JSON) of one write ("submit", "amend", "cancel")."""
    _, message, _ = WRITES[write]
    run = getattr(submitter, write)
    all_confirmed = True
    for text in requests:
        request = message()
        try:
            json_format.Parse(text, request)
        except json_format.ParseError as error:
            print(f"not a {message.DESCRIPTOR.name} in proto JSON: {error}", file=sys.stderr)
            return 2
        result = {"type": "result", "tenant_id": request.tenant_id, "request_id": request.request_id}
        try:
            confirmed = run(request)
        except Rejected as rejected:
            all_confirmed = False
            result.update(status="rejected", calls=rejected.calls, **rejected.failure.as_json())
        except GaveUp as gave_up:
            all_confirmed = False
            result.update(
                status="gave_up", calls=gave_up.calls, event_id=gave_up.event_id, **gave_up.failure.as_json()
            )
        else:
            result.update(status="confirmed", **dataclasses.asdict(confirmed))
        emit(result)
    return 0 if all_confirmed else 1


def reconcile_command(submitter: SafeSubmitter, tenant_id: int, request_id: str) -> int:
    result = {"type": "result", "tenant_id": tenant_id, "request_id": request_id}
    try:
        found = submitter.reconcile(tenant_id, request_id)
    except grpc.RpcError as error:
        result.update(status="error", **Failure.of(error).as_json())
        emit(result)
        return 1
    if found is None:
        result.update(status="not_found")
        emit(result)
        return 1
    result.update(
        status="found",
        order_id=found.order_id,
        event_id=found.event_id,
        version=found.version,
        current_version=found.current_version,
        # UNSPECIFIED from a server older than the field, which had submissions only.
        operation=(
            pb.OrderOperation.Name(found.operation or pb.ORDER_OPERATION_SUBMIT)
            if (found.operation or pb.ORDER_OPERATION_SUBMIT) in pb.OrderOperation.values()
            else found.operation
        ),
        committed_at=found.committed_at.ToJsonString() if found.HasField("committed_at") else None,
        # A newer server may send a status this client's stubs do not name yet.
        order_status=(
            order_pb2.OrderStatus.Name(found.status)
            if found.status in order_pb2.OrderStatus.values()
            else found.status
        ),
        total_minor=found.total_minor,
        accepted_at=found.accepted_at.ToJsonString() if found.HasField("accepted_at") else None,
    )
    emit(result)
    return 0


class PlaintextRefused(Exception):
    """A plaintext channel to a host other than this one was asked for."""


def is_loopback(target: str) -> bool:
    """Whether `target` (host:port, [v6]:port, or a gRPC name such as ipv4:host:port) is this host."""
    host = target.split("://", 1)[-1]
    for scheme in ("ipv4:", "ipv6:", "dns:"):
        if host.startswith(scheme):
            host = host[len(scheme) :]
    host = host.lstrip("/")
    if host.startswith("["):
        host = host[1 : host.find("]")]
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class BearerToken(grpc.UnaryUnaryClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call of the channel it is bound to."""

    def __init__(self, token: str):
        self._metadata = (("authorization", f"Bearer {token.strip()}"),)

    def intercept_unary_unary(self, continuation, client_call_details, request):
        metadata = tuple(client_call_details.metadata or ()) + self._metadata
        return continuation(client_call_details._replace(metadata=metadata), request)


def open_channel(target: str, ca_file: Optional[str], token: Optional[str] = None) -> grpc.Channel:
    """A channel to `target` that sends `token` (if any) as `authorization: Bearer` on every call.

    With `ca_file`: TLS, and the server's certificate must chain to that CA. Without it:
    plaintext, to a loopback address only. Anything else raises PlaintextRefused (naming
    --ca-file) before a connection is made, and gRPC's local credentials check the peer address
    again at connect time. The token is bound to the channel here rather than passed to each
    call, so it can only travel on a channel made by these rules. (gRPC's own token credentials
    are not used: gRPC rates a local TCP channel below what they require and would drop them.)
    """
    if ca_file is not None:
        with open(ca_file, "rb") as ca:
            credentials = grpc.ssl_channel_credentials(root_certificates=ca.read())
    elif is_loopback(target):
        credentials = grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP)
    else:
        raise PlaintextRefused(
            f"refusing plaintext to {target}, which is not a loopback address: the token and the "
            "orders would cross the network unencrypted. Give --ca-file (TLS) or a loopback --target."
        )
    channel = grpc.secure_channel(target, credentials)
    return grpc.intercept_channel(channel, BearerToken(token)) if token else channel


def read_token(token_file: Optional[str]) -> Optional[str]:
    """The bearer token from `token_file`, else from IDEMPOST_TOKEN; None when neither is set."""
    if token_file is not None:
        with open(token_file, encoding="ascii") as file:
            return file.read().strip()
    return os.environ.get("IDEMPOST_TOKEN", "").strip() or None


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Submit, amend or cancel orders with the safe caller protocol, or reconcile one; "
        "JSON lines out."
    )
    parser.add_argument("--target", default="127.0.0.1:50051", help="order service host:port")
    parser.add_argument(
        "--ca-file", help="PEM CA of the service's certificate: use TLS (without it, only a loopback --target)"
    )
    parser.add_argument("--token-file", help="file holding the bearer token (else IDEMPOST_TOKEN)")
    parser.add_argument("--max-calls", type=int, default=RetryPolicy.max_calls)
    parser.add_argument("--initial-backoff", type=float, default=RetryPolicy.initial_backoff, help="seconds")
    parser.add_argument("--max-backoff", type=float, default=RetryPolicy.max_backoff, help="seconds")
    parser.add_argument("--call-timeout", type=float, default=RetryPolicy.call_timeout, help="seconds")
    commands = parser.add_subparsers(dest="command", required=True)
    submit = commands.add_parser("submit", help="submit orders (proto JSON SubmitOrderRequest)")
    submit.add_argument(
        "--order", action="append", help="one order; repeatable. Without it, one order a line on stdin"
    )
    amend = commands.add_parser("amend", help="amend orders (proto JSON AmendOrderRequest)")
    amend.add_argument(
        "--change", action="append", help="one amendment; repeatable. Without it, one a line on stdin"
    )
    cancel = commands.add_parser("cancel", help="cancel orders (proto JSON CancelOrderRequest)")
    cancel.add_argument(
        "--change", action="append", help="one cancellation; repeatable. Without it, one a line on stdin"
    )
    reconcile = commands.add_parser("reconcile", help="look an operation up by its idempotency key")
    reconcile.add_argument("--tenant-id", type=int, required=True)
    reconcile.add_argument("--request-id", required=True)
    args = parser.parse_args()

    policy = RetryPolicy(args.max_calls, args.initial_backoff, args.max_backoff, args.call_timeout)
    try:
        channel = open_channel(args.target, args.ca_file, read_token(args.token_file))
    except PlaintextRefused as refused:
        print(f"submit.py: --target: {refused}", file=sys.stderr)
        return 2
    with channel:
        submitter = SafeSubmitter(channel, policy, on_call=emit)
        if args.command == "reconcile":
            return reconcile_command(submitter, args.tenant_id, args.request_id)
        given = args.order if args.command == "submit" else args.change
        requests = given if given else [line for line in sys.stdin if line.strip()]
        return write_command(submitter, args.command, requests)


if __name__ == "__main__":
    sys.exit(main())
