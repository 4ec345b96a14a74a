//! Since when each partition of a group's topic has stood still while this member did not hold
//! it: how a member of a Tansu 0.6 group finds partitions stranded on a member that is gone (see
//! docs/design/tansu.md, "Dead group members"), whatever value its live holder moves.
//!
//! Pure bookkeeping, shared by the consumer (whose live holders commit offsets) and the relay
//! fleet (whose live owners tick into the control topic): each looks at its partitions now and
//! then and hands the looks here.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

/// Added to a group's session timeout before a partition that stood still counts as stranded: a
/// member that died while it served a partition last moved it up to a few seconds (its commit or
/// tick interval) and last heartbeat up to three (librdkafka's heartbeat interval) before its
/// death, so its session may end a few seconds after its partition stood still; only once every
/// member dead before the stall began has expired does a rejoin re-form the group over live
/// members alone.
pub const STRANDED_MARGIN: Duration = Duration::from_secs(10);

/// One partition at one look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Look {
    /// The partition.
    pub partition: i32,
    /// What a live holder of the partition moves: the group's committed offset, the
    /// partition's end, ...
    pub progress: i64,
    /// Whether a live holder would move it now: a consumer's partition without lag has nothing
    /// to commit, so standing still says nothing about its holder.
    pub expected: bool,
}

/// Since when each partition has stood still: expected to move, its progress the same, and not
/// held by this member.
#[derive(Debug)]
pub struct Stalls {
    after: Duration,
    since: HashMap<i32, (i64, Instant)>,
}

impl Stalls {
    /// Partitions count as stalled once they stood still for `after`.
    pub fn new(after: Duration) -> Self {
        Self { after, since: HashMap::new() }
    }

    /// Takes one look at `looks` at `now`, this member holding `held`; answers the partitions
    /// that stood still for `after` or longer, in the looks' order. A partition left out of a
    /// look is forgotten: its stretch starts again at the next look that has it.
    pub fn observe(&mut self, now: Instant, held: &HashSet<i32>, looks: &[Look]) -> Vec<i32> {
        self.since.retain(|partition, _| looks.iter().any(|look| look.partition == *partition));
        let mut stalled = Vec::new();
        for look in looks {
            if held.contains(&look.partition) || !look.expected {
                self.since.remove(&look.partition);
                continue;
            }
            let (progress, since) = self.since.entry(look.partition).or_insert((look.progress, now));
            if *progress != look.progress {
                (*progress, *since) = (look.progress, now);
            }
            if now.duration_since(*since) >= self.after {
                stalled.push(look.partition);
            }
        }
        stalled
    }

    /// Starts every partition's stretch again at the next look: after acting on a stall, the
    /// same stall counts again only once it has lasted `after` once more.
    pub fn restart(&mut self) {
        self.since.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(partition: i32, progress: i64, expected: bool) -> Look {
        Look { partition, progress, expected }
    }

    #[test]
    fn a_partition_nobody_moves_for_the_whole_stretch_has_stalled() {
        let start = Instant::now();
        let mut stalls = Stalls::new(Duration::from_secs(55));
        let held = HashSet::from([2]);
        let looks = [at(0, 10, true), at(1, 7, false), at(2, 3, true)];
        assert!(stalls.observe(start, &held, &looks).is_empty());
        assert!(stalls.observe(start + Duration::from_secs(54), &held, &looks).is_empty());
        assert_eq!(
            stalls.observe(start + Duration::from_secs(55), &held, &looks),
            vec![0],
            "partition 1 is not expected to move and partition 2 is this member's"
        );
    }

    #[test]
    fn progress_nothing_expected_or_holding_it_starts_the_stretch_again() {
        let start = Instant::now();
        let later = |seconds| start + Duration::from_secs(seconds);
        let mut stalls = Stalls::new(Duration::from_secs(55));
        let none = HashSet::new();
        stalls.observe(start, &none, &[at(0, 10, true)]);
        stalls.observe(later(30), &none, &[at(0, 11, true)]);
        assert!(stalls.observe(later(80), &none, &[at(0, 11, true)]).is_empty(), "it moved at 30 s");
        stalls.observe(later(81), &none, &[at(0, 11, false)]);
        stalls.observe(later(82), &none, &[at(0, 11, true)]);
        assert!(stalls.observe(later(130), &none, &[at(0, 11, true)]).is_empty(), "expected from 82 s");
        stalls.observe(later(131), &HashSet::from([0]), &[at(0, 11, true)]);
        stalls.observe(later(132), &none, &[at(0, 11, true)]);
        assert!(stalls.observe(later(186), &none, &[at(0, 11, true)]).is_empty(), "it was held at 131 s");
        assert_eq!(stalls.observe(later(187), &none, &[at(0, 11, true)]), vec![0]);
    }

    #[test]
    fn a_partition_left_out_of_a_look_or_a_restart_starts_its_stretch_again() {
        let start = Instant::now();
        let later = |seconds| start + Duration::from_secs(seconds);
        let mut stalls = Stalls::new(Duration::from_secs(10));
        let none = HashSet::new();
        stalls.observe(start, &none, &[at(0, 5, true), at(1, 5, true)]);
        stalls.observe(later(5), &none, &[at(1, 5, true)]);
        assert_eq!(stalls.observe(later(10), &none, &[at(0, 5, true), at(1, 5, true)]), vec![1]);
        stalls.restart();
        assert!(stalls.observe(later(11), &none, &[at(0, 5, true), at(1, 5, true)]).is_empty());
        assert_eq!(stalls.observe(later(21), &none, &[at(0, 5, true), at(1, 5, true)]), vec![0, 1]);
    }
}
