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

/// A failure injected at a named failpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("failure injected at {0}")]
pub struct Injected(pub &'static str);

/// Passes through `point`: `Err` when a test armed it to fail.
#[allow(clippy::unnecessary_wraps)] // fallible only with the `failpoints` feature
pub(crate) fn hit(point: &'static str) -> Result<(), Injected> {
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
