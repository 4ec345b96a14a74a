//! Where a relay process's claims start reading (MariaDB/MySQL and PostgreSQL), so that they
//! never walk the dead index entries that a held snapshot keeps behind them.
//!
//! Every claim and mark leaves a dead entry at the front of the due range of `idx_outbox_ready`
//! and of the expired range of `idx_outbox_claim`; while a snapshot is held (a report, a
//! `pg_dump`, InnoDB's purge stalled) none of them can be removed, and a read from the head of
//! the range passes all of them, each time. So the due read starts `lookback` before the newest
//! `created_at` this process claimed (its frontier), and the expired read at `lookback` before
//! the database's now. What falls behind either start (a retry whose backoff ended, a row whose
//! transaction committed after the lookback, a late release of a held-back version, a redrive, a
//! lease that expired while no claim ran) is found by a plain read over the whole ranges, the
//! sweep, off the claim path, which lowers the start to it. The starts only bound how soon an
//! event is claimed, never whether: see `docs/design/relay-lease.md`, "Claims under a held
//! snapshot".

use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};

/// How far behind its frontier the relay's claims read, and how often the sweep looks behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimWindow {
    /// How far before the newest claimed `created_at` the due read starts, and before the
    /// database's now the expired read does.
    pub lookback: Duration,
    /// How often the sweep looks for claimable rows behind the starts.
    pub sweep_interval: Duration,
}

impl Default for ClaimWindow {
    fn default() -> Self {
        Self { lookback: Duration::from_secs(5), sweep_interval: Duration::from_secs(10) }
    }
}

/// Where the expired read starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExpiredFrom {
    /// At the head of the range: at start-up, and while the last claims were cut by their limit.
    Head,
    /// At `lookback` before the database's now.
    Window,
    /// At this `lease_until`, where the sweep found an expired lease behind the window.
    From(DateTime<Utc>),
}

/// The starts one claim read with: handed back with what it claimed, so that a start the sweep
/// lowered meanwhile is not raised past the row it found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Starts {
    /// The due read takes rows with `created_at` at or after this; `None`: from the head.
    pub(crate) due_from: Option<DateTime<Utc>>,
    pub(crate) expired_from: ExpiredFrom,
    lowered: u64,
}

/// What a claim took, as far as its starts care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Took {
    /// The newest `created_at` among the due events it leased.
    pub(crate) newest_due: Option<DateTime<Utc>>,
    /// Whether the expired read found as many leases as the claim's limit (more may wait).
    pub(crate) expired_cut: bool,
}

/// One relay process's claim starts, shared by its loops (and every clone of its outbox).
#[derive(Debug)]
pub(crate) struct ClaimPosition {
    window: ClaimWindow,
    starts: Mutex<Starts>,
}

impl ClaimPosition {
    /// Both reads from the head: nothing is known of what was claimed before this process.
    pub(crate) fn new(window: ClaimWindow) -> Self {
        let head = Starts { due_from: None, expired_from: ExpiredFrom::Head, lowered: 0 };
        Self { window, starts: Mutex::new(head) }
    }

    pub(crate) fn window(&self) -> ClaimWindow {
        self.window
    }

    /// Where the next claim reads from.
    pub(crate) fn starts(&self) -> Starts {
        *self.lock()
    }

    /// Moves the starts after a claim that read from `read` and took `took`: the due start to
    /// `lookback` before the newest due event taken (never back), the expired start to the
    /// window unless the expired read was cut by its limit. Nothing moves when the sweep lowered
    /// a start since the claim read it: the claim did not look behind it.
    pub(crate) fn claimed(&self, read: Starts, took: Took) {
        let mut starts = self.lock();
        if starts.lowered != read.lowered {
            return;
        }
        if let Some(newest) = took.newest_due {
            // A lookback beyond the calendar keeps reading from wherever the start is.
            let from = chrono::Duration::from_std(self.window.lookback)
                .ok()
                .and_then(|lookback| newest.checked_sub_signed(lookback));
            starts.due_from = starts.due_from.max(from);
        }
        if !took.expired_cut {
            starts.expired_from = ExpiredFrom::Window;
        }
    }

    /// A due event with this `created_at` may be behind the due start (the sweep found one, or
    /// this process's marks released the next versions of events this old): claims read from it
    /// again until they have taken what follows. Returns whether the start moved.
    pub(crate) fn due_behind(&self, created_at: DateTime<Utc>) -> bool {
        let mut starts = self.lock();
        if starts.due_from.is_none_or(|from| created_at >= from) {
            return false;
        }
        starts.due_from = Some(created_at);
        starts.lowered += 1;
        true
    }

    /// The sweep found a lease expired at `lease_until` behind the expired start: claims read
    /// from it again until an expired read is no longer cut by its limit. Returns whether the
    /// start moved.
    pub(crate) fn expired_behind(&self, lease_until: DateTime<Utc>) -> bool {
        let mut starts = self.lock();
        match starts.expired_from {
            ExpiredFrom::Head => return false,
            ExpiredFrom::From(from) if from <= lease_until => return false,
            ExpiredFrom::Window | ExpiredFrom::From(_) => {}
        }
        starts.expired_from = ExpiredFrom::From(lease_until);
        starts.lowered += 1;
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Starts> {
        // The starts are plain values, each update whole: a panic elsewhere cannot leave them torn.
        self.starts.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(1_800_000_000 + seconds, 0).unwrap_or_default()
    }

    fn position() -> ClaimPosition {
        ClaimPosition::new(ClaimWindow {
            lookback: Duration::from_secs(5),
            sweep_interval: Duration::from_secs(10),
        })
    }

    fn took(newest_due: Option<i64>, expired_cut: bool) -> Took {
        Took { newest_due: newest_due.map(at), expired_cut }
    }

    #[test]
    fn a_new_process_reads_both_ranges_from_their_head() {
        let starts = position().starts();
        assert_eq!(starts.due_from, None);
        assert_eq!(starts.expired_from, ExpiredFrom::Head);
    }

    #[test]
    fn a_claim_moves_the_due_start_to_the_lookback_before_its_newest_event_and_never_back() {
        let position = position();
        position.claimed(position.starts(), took(Some(100), false));
        assert_eq!(position.starts().due_from, Some(at(95)));
        assert_eq!(position.starts().expired_from, ExpiredFrom::Window);
        // A loop whose claim took older events (it read before the other's) moves nothing back.
        position.claimed(position.starts(), took(Some(50), false));
        assert_eq!(position.starts().due_from, Some(at(95)));
        // A claim without due events leaves the due start where it was.
        position.claimed(position.starts(), took(None, false));
        assert_eq!(position.starts().due_from, Some(at(95)));
    }

    #[test]
    fn an_expired_read_cut_by_its_limit_keeps_its_start_so_the_rest_is_read_next() {
        let position = position();
        position.claimed(position.starts(), took(None, true));
        assert_eq!(position.starts().expired_from, ExpiredFrom::Head);
        position.claimed(position.starts(), took(None, false));
        assert_eq!(position.starts().expired_from, ExpiredFrom::Window);
        assert!(position.expired_behind(at(10)));
        position.claimed(position.starts(), took(None, true));
        assert_eq!(position.starts().expired_from, ExpiredFrom::From(at(10)));
    }

    #[test]
    fn the_sweep_lowers_a_start_only_to_a_row_behind_it() {
        let position = position();
        // From the head, nothing is behind.
        assert!(!position.due_behind(at(0)));
        assert!(!position.expired_behind(at(0)));
        position.claimed(position.starts(), took(Some(100), false));
        assert!(!position.due_behind(at(95)), "at the start is not behind it");
        assert!(position.due_behind(at(20)));
        assert_eq!(position.starts().due_from, Some(at(20)));
        assert!(!position.due_behind(at(30)), "a later row is read from the lowered start anyway");
        assert!(position.due_behind(at(10)));
        assert!(position.expired_behind(at(40)));
        assert!(!position.expired_behind(at(41)));
        assert!(position.expired_behind(at(39)));
        assert_eq!(position.starts().expired_from, ExpiredFrom::From(at(39)));
    }

    #[test]
    fn a_claim_that_read_before_the_sweep_lowered_a_start_does_not_raise_it_again() {
        let position = position();
        position.claimed(position.starts(), took(Some(100), false));
        let read_before = position.starts();
        assert!(position.due_behind(at(20)));
        assert!(position.expired_behind(at(30)));
        position.claimed(read_before, took(Some(200), false));
        assert_eq!(position.starts().due_from, Some(at(20)));
        assert_eq!(position.starts().expired_from, ExpiredFrom::From(at(30)));
        // The next claim reads from the lowered starts, takes the row and moves them on.
        position.claimed(position.starts(), took(Some(210), false));
        assert_eq!(position.starts().due_from, Some(at(205)));
        assert_eq!(position.starts().expired_from, ExpiredFrom::Window);
    }
}
