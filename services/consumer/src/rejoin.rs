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

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{Consumer as _, StreamConsumer};
use tokio::time::Instant;

use super::gauges::{PartitionPosition, partition_positions};
use super::worker::CommitOnRevoke;

/// How often the partitions are looked at: each look asks the broker for every partition's end
/// and the group's committed offsets.
const EVERY: Duration = Duration::from_secs(5);

/// How long one broker query may take.
const BROKER_TIMEOUT: Duration = Duration::from_secs(2);

/// Added to the session timeout: a member that died while it consumed last committed up to a
/// second (the auto-commit interval) and last heartbeat up to three (librdkafka's heartbeat
/// interval) before its death, so its session may end a few seconds after its partitions stood
/// still.
pub(crate) const MARGIN: Duration = Duration::from_secs(10);

/// How long the old client may still be in use elsewhere (a health or gauge probe, each bounded
/// by its own timeouts) before it is closed anyway.
const CLOSE_WAIT: Duration = Duration::from_secs(15);

/// Since when each partition has been stalled: lagging, its committed offset the same, and not
/// held by this consumer.
#[derive(Debug)]
pub(crate) struct Stalls {
    after: Duration,
    since: HashMap<i32, (i64, Instant)>,
}

impl Stalls {
    /// Partitions count as stranded once stalled for `after`.
    pub(crate) fn new(after: Duration) -> Self {
        Self { after, since: HashMap::new() }
    }

    /// Takes one look at the topic at `now`, this consumer holding `held`; answers the
    /// partitions stalled for `after` or longer.
    pub(crate) fn observe(
        &mut self,
        now: Instant,
        held: &HashSet<i32>,
        positions: &[PartitionPosition],
    ) -> Vec<i32> {
        let mut stranded = Vec::new();
        for position in positions {
            if held.contains(&position.partition) || position.lag() == 0 {
                self.since.remove(&position.partition);
                continue;
            }
            let (committed, since) =
                self.since.entry(position.partition).or_insert((position.committed, now));
            if *committed != position.committed {
                (*committed, *since) = (position.committed, now);
            }
            if now.duration_since(*since) >= self.after {
                stranded.push(position.partition);
            }
        }
        stranded
    }
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
                let stranded = stalls.observe(Instant::now(), &held, &positions);
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
    fn a_partition_nobody_moves_for_the_whole_stretch_is_stranded() {
        let start = Instant::now();
        let mut stalls = Stalls::new(Duration::from_secs(55));
        let held = HashSet::from([2]);
        let topic = [at(0, 10, 50), at(1, 7, 7), at(2, 3, 90)];
        assert!(stalls.observe(start, &held, &topic).is_empty());
        assert!(stalls.observe(start + Duration::from_secs(54), &held, &topic).is_empty());
        assert_eq!(
            stalls.observe(start + Duration::from_secs(55), &held, &topic),
            vec![0],
            "partition 1 does not lag and partition 2 is this consumer's"
        );
    }

    #[test]
    fn progress_no_lag_or_holding_it_starts_the_stretch_again() {
        let start = Instant::now();
        let later = |seconds| start + Duration::from_secs(seconds);
        let mut stalls = Stalls::new(Duration::from_secs(55));
        let none = HashSet::new();
        stalls.observe(start, &none, &[at(0, 10, 50)]);
        stalls.observe(later(30), &none, &[at(0, 11, 60)]);
        assert!(stalls.observe(later(80), &none, &[at(0, 11, 60)]).is_empty(), "it moved at 30 s");
        stalls.observe(later(81), &none, &[at(0, 60, 60)]);
        stalls.observe(later(82), &none, &[at(0, 60, 61)]);
        assert!(stalls.observe(later(130), &none, &[at(0, 60, 61)]).is_empty(), "it lagged from 82 s");
        stalls.observe(later(131), &HashSet::from([0]), &[at(0, 60, 61)]);
        stalls.observe(later(132), &none, &[at(0, 60, 61)]);
        assert!(stalls.observe(later(186), &none, &[at(0, 60, 61)]).is_empty(), "it was held at 131 s");
        assert_eq!(stalls.observe(later(187), &none, &[at(0, 60, 61)]), vec![0]);
    }
}
