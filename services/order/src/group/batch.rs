//! The pure part of a batch: what an order's answer rests on, how a repeat inside one batch is
//! answered, and how big the batches were.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idempost_proto::EventId;

use crate::accepting::{Accepting, SubmitError, Submitted};

/// Where one order of a batch stands in the current run of its transaction.
#[derive(Debug)]
pub(super) enum Fate {
    /// Not written yet in this run.
    Open,
    /// Holds only if the transaction commits: the order was written in it, or its answer rests
    /// on a row written in it.
    IfCommitted(Result<Submitted, SubmitError>),
    /// Answered already, whatever becomes of the transaction.
    Answered,
}

/// The answer to `follower` when an earlier order of the same batch, `leader`, with the same
/// `(tenant_id, request_id)`, was written in this transaction as `written`: a replay of it when
/// the content is the same, REQUEST_ID_REUSED when it differs. Decided exactly as if the leader
/// had committed first; the answer holds only if the transaction commits.
#[allow(clippy::result_large_err)] // the answer every submission path returns, unboxed
pub(super) fn follow(
    leader: &Accepting,
    written: &Submitted,
    follower: &Accepting,
) -> Result<Submitted, SubmitError> {
    debug_assert!(
        leader.submit.tenant_id == follower.submit.tenant_id
            && leader.submit.request_id == follower.submit.request_id
    );
    if leader.submit.order != follower.submit.order {
        return Err(SubmitError::RequestIdReused { existing_event_id: written.order.event_id });
    }
    Ok(Submitted { order: written.order.clone(), replayed: true })
}

/// Which orders of a batch one set-based write can take: the open ones (`Some`), each the first
/// of its `(tenant_id, request_id)` and of its event id among them, in batch order. Every other
/// open order clashes with one taken, so it is left for the order-by-order path, which decides
/// it against the row written first exactly as if that row had been written alone.
pub(super) fn set_candidates<'a>(
    rows: impl IntoIterator<Item = Option<((i64, &'a str), EventId)>>,
) -> Vec<usize> {
    let mut keys = HashSet::new();
    let mut event_ids = HashSet::new();
    let mut taken = Vec::new();
    for (i, row) in rows.into_iter().enumerate() {
        let Some((key, event_id)) = row else {
            continue;
        };
        // Both checks first: an order left out must not claim its key or event id either, or
        // a later order sharing only the other one would be taken past it.
        let fresh_key = !keys.contains(&key);
        let fresh_event = !event_ids.contains(&event_id);
        keys.insert(key);
        event_ids.insert(event_id);
        if fresh_key && fresh_event {
            taken.push(i);
        }
    }
    taken
}

/// Counts of batches by size since a service started, and of set-based writes; clones share
/// the counts.
#[derive(Debug, Clone)]
pub struct BatchStats {
    /// `counts[n]`: batches of `n` orders; the last slot also takes anything larger.
    counts: Arc<[AtomicU64]>,
    /// Set-based writes that wrote their orders, and those that failed and fell back to the
    /// order-by-order path.
    set_writes: Arc<[AtomicU64; 2]>,
    /// Orders handed to the queue, whether it took them or refused them as full.
    offered: Arc<AtomicU64>,
}

impl BatchStats {
    /// Counts for batches of up to `max_batch` orders.
    pub(crate) fn new(max_batch: usize) -> Self {
        Self {
            counts: (0..=max_batch.max(1)).map(|_| AtomicU64::new(0)).collect(),
            set_writes: Arc::new([AtomicU64::new(0), AtomicU64::new(0)]),
            offered: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Counts one order the queue took or refused; called once the queue has decided, so an
    /// order counted here is already waiting in it (or already refused).
    pub(super) fn record_offered(&self) {
        self.offered.fetch_add(1, Ordering::Relaxed);
    }

    /// Orders handed to the queue so far, taken or refused: lets a caller wait until every
    /// order it sent is in the queue rather than guess how long that takes.
    pub fn offered(&self) -> u64 {
        self.offered.load(Ordering::Relaxed)
    }

    pub(super) fn record(&self, size: usize) {
        let slot = size.min(self.counts.len() - 1);
        self.counts[slot].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one set-based write: `written` or fallen back.
    pub(super) fn record_set_write(&self, written: bool) {
        self.set_writes[usize::from(!written)].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn snapshot(&self) -> BatchSizes {
        BatchSizes {
            counts: self.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect(),
            set_written: self.set_writes[0].load(Ordering::Relaxed),
            set_fell_back: self.set_writes[1].load(Ordering::Relaxed),
        }
    }
}

/// Batches by size at one moment, or between two moments ([`BatchSizes::since`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchSizes {
    counts: Vec<u64>,
    set_written: u64,
    set_fell_back: u64,
}

impl BatchSizes {
    /// The batches counted here and not in `earlier`.
    pub fn since(&self, earlier: &Self) -> Self {
        let counts = self
            .counts
            .iter()
            .enumerate()
            .map(|(n, c)| c - earlier.counts.get(n).copied().unwrap_or(0))
            .collect();
        Self {
            counts,
            set_written: self.set_written - earlier.set_written,
            set_fell_back: self.set_fell_back - earlier.set_fell_back,
        }
    }

    /// Set-based writes (one multi-row INSERT per table for a batch's orders) that wrote their
    /// orders; each run of a batch's transaction counts.
    pub fn set_written(&self) -> u64 {
        self.set_written
    }

    /// Set-based writes that failed (a row error, say) and were rolled back, their orders then
    /// written one by one.
    pub fn set_fell_back(&self) -> u64 {
        self.set_fell_back
    }

    /// Transactions written.
    pub fn batches(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Orders taken into those transactions (each run counted once, retries not again).
    pub fn orders(&self) -> u64 {
        self.counts.iter().zip(0u64..).map(|(c, n)| c * n).sum()
    }

    /// Mean orders per batch; 0 without batches.
    pub fn mean(&self) -> f64 {
        match self.batches() {
            0 => 0.0,
            batches => self.orders() as f64 / batches as f64,
        }
    }

    /// The smallest size that `quantile` (0..=1) of the batches do not exceed; 0 without
    /// batches.
    pub fn quantile(&self, quantile: f64) -> usize {
        let batches = self.batches();
        // The rank of the batch that decides, 1-based: at least the first.
        let rank = ((quantile.clamp(0.0, 1.0) * batches as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (size, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank && batches > 0 {
                return size;
            }
        }
        0
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use chrono::Utc;

    use super::*;
    use idempost::domain::SubmitOrder;
    use idempost::telemetry::TraceHeaders;

    fn accepting(request_id: &str, quantity: u32) -> Accepting {
        let submit = SubmitOrder::parse(
            7,
            request_id.to_owned(),
            "",
            "customer-1".to_owned(),
            "EUR".to_owned(),
            vec![("SKU-1".to_owned(), quantity, 100)],
        )
        .unwrap();
        Accepting {
            submit,
            event_id: EventId::new(),
            accepted_at: Utc::now(),
            trace: TraceHeaders::default(),
        }
    }

    fn written(leader: &Accepting) -> Submitted {
        leader.accepted(41)
    }

    #[test]
    fn a_repeat_in_the_same_batch_replays_the_order_written_first_with_its_event_id() {
        let leader = accepting("r-1", 2);
        let follower = accepting("r-1", 2);
        let answer = follow(&leader, &written(&leader), &follower).unwrap();
        assert!(answer.replayed);
        assert_eq!(answer.order, written(&leader).order);
        assert_eq!(answer.order.event_id, leader.event_id);
        assert_ne!(answer.order.event_id, follower.event_id);
    }

    #[test]
    fn a_different_order_under_the_same_key_in_the_same_batch_is_request_id_reused() {
        let leader = accepting("r-1", 2);
        let follower = accepting("r-1", 3);
        let Err(SubmitError::RequestIdReused { existing_event_id }) =
            follow(&leader, &written(&leader), &follower)
        else {
            panic!("not REQUEST_ID_REUSED");
        };
        assert_eq!(existing_event_id, leader.event_id);
    }

    #[test]
    fn batch_sizes_give_mean_and_quantiles_over_batches_not_orders() {
        let stats = BatchStats::new(8);
        let before = stats.snapshot();
        for size in [1, 1, 1, 1, 1, 1, 1, 1, 1, 8] {
            stats.record(size);
        }
        let sizes = stats.snapshot().since(&before);
        assert_eq!((sizes.batches(), sizes.orders()), (10, 17));
        assert!((sizes.mean() - 1.7).abs() < 1e-9);
        assert_eq!(sizes.quantile(0.5), 1);
        assert_eq!(sizes.quantile(0.9), 1);
        assert_eq!(sizes.quantile(0.99), 8);
        assert_eq!(BatchSizes::default().quantile(0.99), 0);
        assert_eq!(BatchSizes::default().mean(), 0.0);
    }

    #[test]
    fn a_set_write_takes_the_first_order_of_each_key_and_event_id_and_skips_answered_ones() {
        let [e1, e2, e3, e4] = [EventId::new(), EventId::new(), EventId::new(), EventId::new()];
        let rows = [
            Some(((7, "a"), e1)),
            // A repeat of "a": left for the follower path.
            Some(((7, "a"), e2)),
            // Answered already.
            None,
            // Another key, the event id of the first: left for the clash path.
            Some(((7, "b"), e1)),
            // The key of the row left out just above, its own event id: left out too, since
            // the row-by-row path decides that row before this one, against what was written
            // before it.
            Some(((7, "b"), e3)),
            // The same request id under another tenant is another key.
            Some(((8, "a"), e4)),
        ];
        assert_eq!(set_candidates(rows), vec![0, 5]);
        assert_eq!(set_candidates([None, Some(((7, "a"), e1))]), vec![1]);
    }

    #[test]
    fn set_write_counts_survive_since() {
        let stats = BatchStats::new(4);
        let before = stats.snapshot();
        stats.record_set_write(true);
        stats.record_set_write(true);
        stats.record_set_write(false);
        let seen = stats.snapshot().since(&before);
        assert_eq!((seen.set_written(), seen.set_fell_back()), (2, 1));
    }

    #[test]
    fn a_batch_larger_than_the_limit_counts_in_the_last_slot() {
        let stats = BatchStats::new(4);
        stats.record(9);
        assert_eq!(stats.snapshot().quantile(1.0), 4);
    }
}
