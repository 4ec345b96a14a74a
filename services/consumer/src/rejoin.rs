//! A dynamic member's way out of partitions stranded on a member that is gone.
//!
//! Tansu 0.6 can leave a formed group assigning partitions to a member that died (see
//! docs/design/tansu.md, "Dead group members"): its coordinator drops an expired member from
//! the member list on a dynamic heartbeat, yet the group stays formed, and a formed group's
//! `SyncGroup` answers the assignment stored when it formed, ignoring the leader's new one. So
//! the survivors rejoin, are handed their old shares again, and the dead member's partitions
//! never move. What does re-form it: a `LeaveGroup` from a member of the formed group (the
//! group starts forming again, without a leader when the leaver led it), followed by a
//! `JoinGroup` from a new dynamic member, which drops every member whose session has expired
//! and, with no leader left, leads and assigns over the live members only.
//!
//! So a dynamic consumer watches the partitions it does not hold. One that lags, whose committed
//! offset does not move, and that this consumer did not hold, all for a session timeout and a
//! margin, is held by no live member (a live holder commits every second while it consumes), and
//! every member dead before that stretch began has expired by then. The consumer then closes its
//! client, which leaves the group (an old client left open is a member that no longer polls, and
//! the group waits behind it), and only once that is answered joins with a new client: by the
//! coordinator's code, a `LeaveGroup` that reaches a forming group keeps its leader even when the
//! leader left, and such a group never forms again.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use idempost::kafka::{Look, STRANDED_MARGIN, Stalls};
use rdkafka::consumer::{Consumer as _, StreamConsumer};
use tokio::time::Instant;

use super::gauges::{PartitionPosition, partition_positions};
use super::worker::CommitOnRevoke;

/// How often the partitions are looked at: each look asks the broker for every partition's end
/// and the group's committed offsets.
const EVERY: Duration = Duration::from_secs(5);

/// How long one broker query may take.
const BROKER_TIMEOUT: Duration = Duration::from_secs(2);

/// Added to the session timeout (see [`STRANDED_MARGIN`]): a member that died while it consumed
/// last committed up to a second (the auto-commit interval) before its death.
pub(crate) const MARGIN: Duration = STRANDED_MARGIN;

/// How long the old client may still be in use elsewhere (a health or gauge probe, each bounded
/// by its own timeouts) before it is closed anyway.
const CLOSE_WAIT: Duration = Duration::from_secs(15);

/// One look at each partition of the topic: a live holder moves its committed offset while it
/// lags.
fn looks(positions: &[PartitionPosition]) -> Vec<Look> {
    positions
        .iter()
        .map(|p| Look { partition: p.partition, progress: p.committed, expected: p.lag() > 0 })
        .collect()
}

/// Returns the partitions of `topic` stranded on members that are gone (see the module's
/// comment), once `consumer` holds a settled assignment; looks every [`EVERY`]. A look that fails
/// counts as no look: the broker health check reports it.
pub(crate) async fn stranded(
    consumer: Arc<StreamConsumer<CommitOnRevoke>>,
    topic: String,
    session_timeout: Duration,
) -> Vec<i32> {
    let mut stalls = Stalls::new(session_timeout + MARGIN);
    loop {
        let (probe, name) = (Arc::clone(&consumer), topic.clone());
        let looked = tokio::task::spawn_blocking(move || {
            let held = probe.assignment().map(|list| {
                list.elements_for_topic(&name).iter().map(|e| e.partition()).collect::<HashSet<_>>()
            })?;
            Ok::<_, rdkafka::error::KafkaError>((held, partition_positions(&probe, &name, BROKER_TIMEOUT)?))
        })
        .await;
        match looked {
            Ok(Ok((held, positions))) => {
                let stranded = stalls.observe(Instant::now(), &held, &looks(&positions));
                // Only from a formed group: leaving one that is forming again (a new member
                // joined, a rebalance is under way) while leading it would leave it leaderless
                // for good.
                if !stranded.is_empty() && consumer.context().assigned() {
                    return stranded;
                }
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "partitions not looked at"),
            Err(e) => tracing::debug!(error = %e, "partitions not looked at"),
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// Closes `old` once nothing else holds it, or after [`CLOSE_WAIT`] anyway; answers whether it
/// was closed here. Closing a dynamic member sends `LeaveGroup` and waits for its answer.
pub(crate) async fn close_alone(mut old: Arc<StreamConsumer<CommitOnRevoke>>) -> bool {
    let deadline = Instant::now() + CLOSE_WAIT;
    loop {
        match Arc::try_unwrap(old) {
            Ok(alone) => {
                // librdkafka's close blocks: off the runtime's workers.
                return tokio::task::spawn_blocking(move || drop(alone)).await.is_ok();
            }
            Err(shared) if Instant::now() < deadline => {
                old = shared;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(shared) => {
                tokio::task::spawn_blocking(move || drop(shared));
                return false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(partition: i32, committed: i64, end: i64) -> PartitionPosition {
        PartitionPosition { partition, committed, end }
    }

    #[test]
    fn a_lagging_partition_whose_committed_offset_stands_still_is_stranded() {
        let start = Instant::now();
        let mut stalls = Stalls::new(Duration::from_secs(55));
        let held = HashSet::from([2]);
        let topic = looks(&[at(0, 10, 50), at(1, 7, 7), at(2, 3, 90)]);
        assert!(stalls.observe(start, &held, &topic).is_empty());
        assert_eq!(
            stalls.observe(start + Duration::from_secs(55), &held, &topic),
            vec![0],
            "partition 1 does not lag and partition 2 is this consumer's"
        );
    }

    #[test]
    fn a_commit_or_catching_up_starts_the_stretch_again() {
        let start = Instant::now();
        let later = |seconds| start + Duration::from_secs(seconds);
        let mut stalls = Stalls::new(Duration::from_secs(55));
        let none = HashSet::new();
        stalls.observe(start, &none, &looks(&[at(0, 10, 50)]));
        stalls.observe(later(30), &none, &looks(&[at(0, 11, 60)]));
        assert!(stalls.observe(later(80), &none, &looks(&[at(0, 11, 60)])).is_empty(), "committed at 30 s");
        stalls.observe(later(81), &none, &looks(&[at(0, 60, 60)]));
        stalls.observe(later(82), &none, &looks(&[at(0, 60, 61)]));
        assert!(
            stalls.observe(later(136), &none, &looks(&[at(0, 60, 61)])).is_empty(),
            "it lagged from 82 s"
        );
        assert_eq!(stalls.observe(later(137), &none, &looks(&[at(0, 60, 61)])), vec![0]);
    }
}
