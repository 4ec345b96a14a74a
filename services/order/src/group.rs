//! Opportunistic group commit: orders that arrive while a transaction is in flight wait in a
//! bounded queue, and the next free writer writes everything waiting (up to a batch limit) in
//! one transaction, with one multi-row INSERT per table where it can (else each order in its own
//! savepoint), then commits once and answers each caller.
//!
//! Nothing waits for a timer: a writer takes whatever is queued the moment it is free, so at low
//! load a batch is one order and under load batches grow by themselves. Every order keeps the
//! answer it would get from a transaction of its own (see [`writer`]).

mod batch;
mod bulk_insert;
mod job;
mod writer;

use std::sync::Arc;

use sea_orm::{DatabaseConnection, DbErr};
use tokio::sync::{Mutex, Semaphore, SemaphorePermit, mpsc, oneshot};

pub use batch::{BatchSizes, BatchStats};

use self::job::Job;
use super::accepting::{Accepting, SubmitError, Submitted, unknown};
use super::alone::Alone;

use idempost::db::TxFailure;

/// Whether orders share transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GroupCommitMode {
    /// Orders that arrive while a transaction is in flight share the next one.
    On,
    /// One transaction per order.
    Off,
}

/// How the order service groups orders into transactions.
#[derive(Debug, Clone, clap::Args)]
pub struct GroupCommitSettings {
    /// `on`: orders that arrive while a transaction is in flight share the next one, each in its
    /// own savepoint; `off`: one transaction per order.
    #[arg(long = "group-commit", env = "IDEMPOST_GROUP_COMMIT", value_enum, default_value_t = GroupCommitMode::On)]
    pub mode: GroupCommitMode,

    /// Most orders one shared transaction writes.
    #[arg(long = "group-commit-max-batch", env = "IDEMPOST_GROUP_COMMIT_MAX_BATCH", default_value_t = DEFAULT_MAX_BATCH, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub max_batch: u16,

    /// Writers, each with at most one transaction (one pooled connection) in flight. Keep it
    /// below `--db-max-connections`: Reconcile shares the pool.
    #[arg(long = "group-commit-writers", env = "IDEMPOST_GROUP_COMMIT_WRITERS", default_value_t = DEFAULT_WRITERS, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub writers: u16,

    /// Orders that may wait for a writer; past it SubmitOrder answers RESOURCE_EXHAUSTED
    /// (OVERLOADED) at once, nothing written.
    #[arg(long = "group-commit-queue", env = "IDEMPOST_GROUP_COMMIT_QUEUE", default_value_t = DEFAULT_QUEUE, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub queue: u32,
}

// Larger batches did not raise throughput, only the tail (docs/design/group-commit.md).
const DEFAULT_MAX_BATCH: u16 = 32;
// Fewer writers make bigger batches, but with one a single order waiting on a lock (a hot key
// resubmitted) would hold up every other order; with two, the other writer goes on
// (docs/design/group-commit.md).
const DEFAULT_WRITERS: u16 = 2;
const DEFAULT_QUEUE: u32 = 1024;

impl Default for GroupCommitSettings {
    fn default() -> Self {
        Self {
            mode: GroupCommitMode::On,
            max_batch: DEFAULT_MAX_BATCH,
            writers: DEFAULT_WRITERS,
            queue: DEFAULT_QUEUE,
        }
    }
}

impl GroupCommitSettings {
    /// Whether group commit is on.
    pub(crate) fn is_on(&self) -> bool {
        self.mode == GroupCommitMode::On
    }
}

/// The queue in front of the writers. Clones share it; the writers stop once every clone is
/// dropped and the queue is drained.
#[derive(Debug, Clone)]
pub(super) struct GroupCommit {
    queue: mpsc::Sender<Job>,
    bound: usize,
    /// One permit per writer: at most that many order transactions run at once, whether a
    /// caller runs its own or a writer runs a batch.
    transactions: Arc<Semaphore>,
    stats: BatchStats,
}

impl GroupCommit {
    /// Starts `settings.writers` writers over `db` on the current Tokio runtime.
    pub(super) fn start(db: DatabaseConnection, settings: &GroupCommitSettings, stats: BatchStats) -> Self {
        let bound = settings.queue as usize;
        let (queue, waiting) = mpsc::channel(bound);
        let waiting = Arc::new(Mutex::new(waiting));
        let transactions = Arc::new(Semaphore::new(usize::from(settings.writers)));
        let ids_back = bulk_insert::IdsBack::default();
        for _ in 0..settings.writers {
            let writer = writer::Writer {
                db: db.clone(),
                alone: Alone::new(db.clone()),
                max_batch: usize::from(settings.max_batch),
                stats: stats.clone(),
                ids_back: ids_back.clone(),
            };
            tokio::spawn(writer.run(Arc::clone(&waiting), Arc::clone(&transactions)));
        }
        Self { queue, bound, transactions, stats }
    }

    /// A transaction slot, if one is free and no queued order waits for it (what low load
    /// gives): the caller then writes its order at once in a transaction of its own, in its own
    /// task, with no hand-off. Counted as a batch of one. The semaphore is fair: while a writer
    /// waits for a slot with queued orders, no caller gets one past it.
    pub(super) fn free_slot(&self) -> Option<SemaphorePermit<'_>> {
        let slot = self.transactions.try_acquire().ok()?;
        writer::record_batch(&self.stats, 1);
        Some(slot)
    }

    /// Queues `accepting` and waits for its answer. A full queue is refused at once.
    pub(super) async fn submit(&self, accepting: Accepting) -> Result<Submitted, SubmitError> {
        let event_id = accepting.event_id;
        let (reply, answer) = oneshot::channel();
        let job = Job { accepting, span: tracing::Span::current(), reply: Some(reply) };
        let sent = self.queue.try_send(job);
        self.stats.record_offered();
        match sent {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::warn!(
                    outcome = "OVERLOADED",
                    queued = self.bound,
                    "order queue full; nothing written"
                );
                return Err(SubmitError::Overloaded { event_id, queued: self.bound });
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                let cause = TxFailure::from(DbErr::Custom("no order writer is running".into()));
                tracing::warn!(outcome = "UNAVAILABLE", error = %cause, "no transaction began; nothing written");
                return Err(SubmitError::Unavailable { event_id, cause });
            }
        }
        match answer.await {
            Ok(answer) => answer,
            // A writer that vanished mid-batch (only a panic does that) may have committed.
            Err(_) => {
                let cause =
                    TxFailure::from(DbErr::Custom("the order writer stopped before answering".into()));
                Err(unknown(event_id, cause))
            }
        }
    }
}
