//! Named failpoints at the commit windows, compiled in only with the `failpoints` feature.
//!
//! Without the feature every [`hit`] is `Ok(())` and costs nothing. With it, a test or the
//! verifier arms a point by name through the `fail` crate: `return` makes the point fail as the
//! real fault would, `return(abort)` crashes the process on the spot, and `sleep(ms)` delays.

/// Just before the order transaction's `commit()`: the transaction must roll back.
pub const BEFORE_ORDER_TRANSACTION_COMMIT: &str = "BEFORE_ORDER_TRANSACTION_COMMIT";
/// The commit succeeded but its acknowledgement is lost: the outcome must be UNKNOWN.
pub const COMMIT_SUCCEEDS_BUT_CLIENT_RECEIVES_EXCEPTION: &str =
    "COMMIT_SUCCEEDS_BUT_CLIENT_RECEIVES_EXCEPTION";
/// `commit()` fails without the database ever committing: the outcome must still be UNKNOWN,
/// because the server cannot tell this case from the one above.
pub const COMMIT_FAILS_WITHOUT_COMMITTING: &str = "COMMIT_FAILS_WITHOUT_COMMITTING";

/// In the relay, just before it claims: the committed event waits, unclaimed.
pub const AFTER_COMMIT_BEFORE_RELAY_CLAIM: &str = "AFTER_COMMIT_BEFORE_RELAY_CLAIM";
/// In the relay, after the claim and before publishing: a delay here lets the lease expire while
/// its owner still works, so another relay claims the event and the old owner confirms late.
pub const DURING_CONCURRENT_CLAIM: &str = "DURING_CONCURRENT_CLAIM";
/// In the relay's MariaDB/MySQL claim, with its rows locked and leased, before the commit: a
/// hold here shows what a claim in progress keeps locked; `return` fails the claim (rolled back).
pub const INSIDE_RELAY_CLAIM_BEFORE_COMMIT: &str = "INSIDE_RELAY_CLAIM_BEFORE_COMMIT";
/// In the relay, after the broker confirmed and before the mark: the event is published again.
pub const AFTER_BROKER_CONFIRM_BEFORE_MARK_PUBLISHED: &str = "AFTER_BROKER_CONFIRM_BEFORE_MARK_PUBLISHED";

/// In the relay's publisher, before a send: the producer in use turns fatal, as librdkafka's
/// idempotent producer does after a fatal error, and fails every later send; a new producer
/// is unaffected.
pub const RELAY_PRODUCER_FATAL: &str = "RELAY_PRODUCER_FATAL";

/// In the consumer, after its transaction committed and before the offset is stored.
pub const AFTER_CONSUMER_COMMIT_BEFORE_MESSAGE_ACK: &str = "AFTER_CONSUMER_COMMIT_BEFORE_MESSAGE_ACK";
/// In the consumer's transaction, after the dedup row: a failure that is not a violation of
/// `uq_consumed_event_identity` must roll back and leave the message unacknowledged.
pub const NON_TARGET_INTEGRITY_OR_DATA_ERROR_WHILE_CLAIMING: &str =
    "NON_TARGET_INTEGRITY_OR_DATA_ERROR_WHILE_CLAIMING";

/// Test-only switch: the consumer takes any integrity error for "already consumed".
pub const BREAK_CLASSIFIER_ANY_INTEGRITY_ERROR_IS_DUPLICATE: &str =
    "BREAK_CLASSIFIER_ANY_INTEGRITY_ERROR_IS_DUPLICATE";
/// Test-only switch: the relay marks PUBLISHED without the owner and status condition.
pub const BREAK_MARK_WITHOUT_OWNER_CONDITION: &str = "BREAK_MARK_WITHOUT_OWNER_CONDITION";
/// Test-only switch: the consumer commits the offset before its local transaction.
pub const BREAK_OFFSET_COMMIT_BEFORE_LOCAL_COMMIT: &str = "BREAK_OFFSET_COMMIT_BEFORE_LOCAL_COMMIT";
/// In the relay's publisher, armed `return(<aggregate id>)`: every publish of that aggregate's
/// events fails as a record the broker refused, so each spends an attempt and backs off (and is
/// FAILED once its attempts are used up); other aggregates publish normally.
pub const RELAY_PUBLISH_REJECTED_FOR_AGGREGATE: &str = "RELAY_PUBLISH_REJECTED_FOR_AGGREGATE";

/// Whether a test armed a `BREAK_*` switch. The switches exist so that the verifier can be shown
/// to catch the guarantee each one breaks; without the `failpoints` feature they are always off.
pub fn broken(switch: &'static str) -> bool {
    hit(switch).is_err()
}

/// A failure injected at a named failpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("failure injected at {0}")]
pub struct Injected(pub &'static str);

/// The environment variable a binary with failpoints compiled in needs before it starts
/// (`IDEMPOST_ALLOW_FAILPOINTS=1`): such a binary obeys `FAILPOINTS`, whose switches can break the
/// guarantees (remove the relay's claim fence, for one), so it must never run by mistake. The
/// test kit and the verifier set it.
pub const ALLOW_FAILPOINTS: &str = "IDEMPOST_ALLOW_FAILPOINTS";

/// A binary built with the `failpoints` feature was started without [`ALLOW_FAILPOINTS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "this binary was built with the test-only `failpoints` feature (cargo --all-features): it obeys FAILPOINTS, which can break its guarantees, so it refuses to start. Build without the feature for any real use, or set {ALLOW_FAILPOINTS}=1 in a test"
)]
pub struct FailpointsNotAllowed;

/// Whether this binary was built with the `failpoints` feature.
pub const COMPILED_IN: bool = cfg!(feature = "failpoints");

/// Arms failpoints from the `FAILPOINTS` environment variable (`NAME=ACTION;NAME=ACTION`), so
/// that tests and the verifier can inject faults into real service processes; call it once
/// telemetry is up. With the `failpoints` feature it refuses unless [`ALLOW_FAILPOINTS`] is `1`,
/// and says at WARN that failpoints are live; `idempost.failpoints.compiled_in` reads 1 in such a
/// binary, 0 in any other. Without the feature it only records that gauge.
pub fn arm_from_env() -> Result<(), FailpointsNotAllowed> {
    crate::telemetry::metrics().failpoints_compiled_in.record(u64::from(COMPILED_IN), &[]);
    #[cfg(feature = "failpoints")]
    {
        if std::env::var(ALLOW_FAILPOINTS).as_deref() != Ok("1") {
            return Err(FailpointsNotAllowed);
        }
        tracing::warn!(
            "failpoints are compiled in and FAILPOINTS is obeyed: a test build, never for real use"
        );
        // The scenario's guard would disarm everything when dropped; a service keeps its
        // failpoints for its whole life.
        std::mem::forget(fail::FailScenario::setup());
    }
    Ok(())
}

/// The argument a test armed `point` with (`return(<argument>)`), if it armed it.
pub fn argument(point: &'static str) -> Option<String> {
    #[cfg(feature = "failpoints")]
    if let Some(argument) = fail::eval(point, |argument| argument) {
        return argument;
    }
    let _ = point;
    None
}

/// Passes through `point`: `Err` when a test armed it to fail.
#[allow(clippy::unnecessary_wraps)] // fallible only with the `failpoints` feature
pub fn hit(point: &'static str) -> Result<(), Injected> {
    #[cfg(feature = "failpoints")]
    if let Some(action) = fail::eval(point, |arg| arg) {
        if action.as_deref() == Some("abort") {
            // A real crash, not a panic a runtime could catch: the window must be seen from
            // outside exactly as a killed process leaves it.
            std::process::abort();
        }
        return Err(Injected(point));
    }
    let _ = point;
    Ok(())
}
