//! Owner-fenced releases after a failed publish: back to PENDING after a backoff, or FAILED.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{DbErr, Value};

use super::event::{ClaimedEvent, Fenced};
use super::fenced_update::{FENCE_COLUMNS, FencedUpdate, in_call_order, in_lock_order};
use super::table::{Outbox, lease_end};
use idempost::db::{self, ValueColumn};
use idempost::domain::OutboxStatus;
use idempost_client::Backoff;

/// What a release did to the event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// Back to PENDING; claimable again from this database time.
    RetryAt(DateTime<Utc>),
    /// Out of attempts: FAILED until an operator redrives it.
    Failed,
}

/// Whom a failed publish is blamed on, which decides whether it spends an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blame {
    /// The event itself (the broker refused this record): the attempt counts, and the event is
    /// FAILED once its attempts are used up.
    Event,
    /// The broker as a whole was unavailable: the attempt is given back, so an outage of any
    /// length moves no event to FAILED; the backoff still applies.
    Broker,
}

/// Retry timing for failed publishes.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Attempts (claims) after which a failure is final.
    pub max_attempts: i32,
    /// Backoff after the first failure; doubled for each further one.
    pub backoff_base: Duration,
    /// Longest backoff.
    pub backoff_max: Duration,
}

impl RetryPolicy {
    /// Exponential backoff with jitter for the given attempt count: a random point in the upper
    /// half of the capped exponential, so released events spread out instead of returning in step.
    pub(crate) fn backoff(&self, attempts: i32) -> Duration {
        // Capped from the first wait on (start-up refuses a base above the max anyway).
        let first = Ord::min(self.backoff_base, self.backoff_max);
        Backoff::new(first, self.backoff_max).jittered().delay(u32::try_from(attempts).unwrap_or(0))
    }
}

/// The most characters of an error kept in `last_error`.
const LAST_ERROR_CHARS: usize = 1000;

impl Outbox {
    /// Gives the event back after a failed publish, only if its claim (`event.lease_token`)
    /// still holds the lease: PENDING with a backoff in database time, or FAILED once its
    /// attempts are used up.
    pub async fn release(
        &self,
        event: &ClaimedEvent,
        error: &str,
        policy: &RetryPolicy,
    ) -> Result<Fenced<Released>, DbErr> {
        let mut released = self.release_all(&[(event, error, Blame::Event)], policy).await?;
        Ok(released.pop().unwrap_or(Fenced::LeaseLost))
    }

    /// [`Outbox::release`] for a batch, in one statement: each row gets its own status, retry
    /// time and error, and changes only while it is still PUBLISHING under its own claim's token.
    /// A failure blamed on the broker gives the claim's attempt back and never ends FAILED.
    pub async fn release_all(
        &self,
        failures: &[(&ClaimedEvent, &str, Blame)],
        policy: &RetryPolicy,
    ) -> Result<Vec<Fenced<Released>>, DbErr> {
        if failures.is_empty() {
            return Ok(Vec::new());
        }
        const COLUMNS: [ValueColumn; 6] = [
            FENCE_COLUMNS[0],
            FENCE_COLUMNS[1],
            ValueColumn { name: "v_status", pg_type: "text" },
            ValueColumn { name: "v_retry_at", pg_type: "timestamptz" },
            ValueColumn { name: "v_error", pg_type: "text" },
            ValueColumn { name: "v_refund", pg_type: "integer" },
        ];
        let now = db::now(&self.db).await?;
        let mut outcomes = Vec::with_capacity(failures.len());
        let mut rows: Vec<(usize, Vec<Value>)> = Vec::with_capacity(failures.len());
        for (i, (event, error, blame)) in failures.iter().enumerate() {
            let last_error: String = error.chars().take(LAST_ERROR_CHARS).collect();
            let refund = i32::from(*blame == Blame::Broker);
            let (status, retry_at, released) =
                if *blame == Blame::Event && event.attempts >= policy.max_attempts {
                    (OutboxStatus::Failed, None, Released::Failed)
                } else {
                    let at = lease_end(now, policy.backoff(event.attempts))?;
                    (OutboxStatus::Pending, Some(at), Released::RetryAt(at))
                };
            outcomes.push(released);
            let row = vec![
                event.event_id.as_str().into(),
                event.lease_token.as_str().into(),
                status.as_str().into(),
                retry_at.into(),
                last_error.into(),
                refund.into(),
            ];
            rows.push((i, row));
        }
        let assignments = "status = v.v_status, lease_owner = NULL, lease_until = v.v_retry_at, last_error = v.v_error, \
             attempts = attempts - v.v_refund";
        let update =
            FencedUpdate { columns: &COLUMNS, rows: in_lock_order(&mut rows), assignments, fenced: true };
        let changed = update.run(&self.db, self.isolation).await?;
        Ok(in_call_order(
            &rows,
            &changed,
            |changed| {
                if changed { Fenced::Done(()) } else { Fenced::LeaseLost }
            },
        )
        .into_iter()
        .zip(outcomes)
        .map(|(fenced, released)| match fenced {
            Fenced::Done(()) => Fenced::Done(released),
            Fenced::LeaseLost => Fenced::LeaseLost,
        })
        .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_publish_waits_a_jittered_doubling_time_from_the_base_up_to_the_max() {
        let ms = Duration::from_millis;
        let policy = RetryPolicy { max_attempts: 10, backoff_base: ms(500), backoff_max: ms(300_000) };
        for (attempts, ceiling) in
            [(0, ms(500)), (1, ms(500)), (2, ms(1_000)), (3, ms(2_000)), (10, ms(256_000)), (11, ms(300_000))]
        {
            // Enough draws that a wrong ceiling cannot pass by luck.
            for _ in 0..200 {
                let wait = policy.backoff(attempts);
                assert!(
                    wait >= ceiling / 2 && wait <= ceiling,
                    "attempt {attempts}: {wait:?} of {ceiling:?}"
                );
            }
        }
        for attempts in [12, 40, i32::MAX, -1] {
            assert!(policy.backoff(attempts) <= ms(300_000), "attempt {attempts}");
        }
        // A base above the max is capped from the first wait on.
        let inverted = RetryPolicy { max_attempts: 10, backoff_base: ms(900), backoff_max: ms(100) };
        assert!(inverted.backoff(1) <= ms(100));
    }
}
