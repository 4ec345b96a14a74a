//! One writer: takes whatever is queued, writes it in one transaction, commits once, and
//! answers each caller exactly as a transaction of its own would. A batch of one is written
//! exactly as with group commit off.
//!
//! - Orders with distinct keys and event ids (two or more) are first written together, one
//!   multi-row INSERT per table ([`bulk_insert`]). If that fails on a lock conflict the batch runs again
//!   (below); on any other error the transaction, which holds nothing else, is rolled back and
//!   a new one writes every order on its own, in its own savepoint, as follows.
//! - A row error rolls back only that order's savepoint and is decided as today: a replay,
//!   REQUEST_ID_REUSED, EVENT_ID_IN_USE, or ROLLED_BACK (confirmed by the savepoint's rollback,
//!   so it is answered at once).
//! - An order written in the transaction, or answered from a row written in it, is answered
//!   only after the commit: COMMITTED if it succeeded, UNKNOWN if `commit()` failed.
//! - A deadlock or lock-wait victim (the server rolled back, and so did we) runs again as a
//!   whole with the same ids, after the same backoff as a single order.
//! - The commit-window failpoints are passed once per batch.
//! - An order whose caller went away before its savepoint was released (or before the
//!   set-based write began) is not written, as a transaction of its own would have been
//!   dropped; once written, it commits with the batch (the caller saw a cancelled call, which
//!   it reconciles).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use idempost_proto::EventId;
use opentelemetry::KeyValue;
use opentelemetry::trace::TraceContextExt as _;
use sea_orm::{ConnectionTrait, DatabaseConnection, DatabaseTransaction, TransactionTrait};
use tokio::sync::{Mutex, Semaphore, mpsc};
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::batch::{BatchStats, Fate, follow, set_candidates};
use super::bulk_insert::{self, IdsBack};
use super::job::Job;
use crate::accepting::{
    Accepting, KeyHolder, LOCK_CONFLICT_RETRIES, SubmitError, Submitted, decide_clash, find, insert_order,
    rolled_back, unknown,
};
use crate::alone::Alone;
use crate::transaction::read_committed;
use idempost::db::{LockConflict, TxFailure, commit_refused, lock_conflict, violated_unique_key};
use idempost::failpoint;
use idempost::telemetry::metrics;

/// The savepoint around each order. One name serves every order: each is released (or rolled
/// back to and released) before the next is set.
const SAVEPOINT: &str = "idempost_order";

pub(super) struct Writer {
    pub(super) db: DatabaseConnection,
    /// The same database, for a batch of one order: written exactly as with group commit off.
    pub(super) alone: Alone,
    pub(super) max_batch: usize,
    pub(super) stats: BatchStats,
    /// How inserted order ids come back from this server; shared by the writers.
    pub(super) ids_back: IdsBack,
}

impl Writer {
    /// Writes batches until the queue is closed and drained.
    pub(super) async fn run(self, waiting: Arc<Mutex<mpsc::Receiver<Job>>>, transactions: Arc<Semaphore>) {
        let mut jobs = Vec::with_capacity(self.max_batch);
        loop {
            // Whoever holds the lock waits for the next order, then for a free transaction
            // slot, and only then takes everything else already waiting: the batch is what
            // gathered while every slot was busy.
            let mut queue = waiting.lock().await;
            if queue.recv_many(&mut jobs, 1).await == 0 {
                return;
            }
            let Ok(slot) = Arc::clone(&transactions).acquire_owned().await else {
                return;
            };
            while jobs.len() < self.max_batch {
                match queue.try_recv() {
                    Ok(job) => jobs.push(job),
                    Err(_) => break,
                }
            }
            drop(queue);
            record_batch(&self.stats, jobs.len());
            self.write(std::mem::take(&mut jobs)).await;
            drop(slot);
        }
    }

    async fn write(&self, mut jobs: Vec<Job>) {
        if jobs.len() == 1
            && let Some(job) = jobs.pop()
        {
            return self.write_alone(job).await;
        }
        let mut rows: Vec<Row> = jobs.into_iter().map(|job| Row { job, fate: Fate::Open }).collect();
        // One lock order for every batch: two batches that share keys wait for each other
        // instead of deadlocking. Stable, so the first of two repeats is written first.
        rows.sort_by_key(Row::key);
        let span = tracing::info_span!(
            parent: None,
            "order batch transaction",
            otel.kind = "client",
            db.system.name = idempost::db::system_name(&self.db),
            db.operation.name = "INSERT orders, order_line, outbox_event",
            idempost.batch_size = rows.len(),
        );
        for row in &rows {
            span.add_link(row.job.span.context().span().span_context().clone());
        }
        let mut retries = 0;
        loop {
            let Some(conflict) = self.attempt(&mut rows).instrument(span.clone()).await else {
                return;
            };
            let (kind, cause) = conflict;
            if retries == LOCK_CONFLICT_RETRIES {
                for row in &mut rows {
                    row.settle(|row| rolled_back(row.event_id(), cause.clone()));
                }
                return;
            }
            retries += 1;
            metrics().order_lock_retries.add(1, &[KeyValue::new("reason", kind.as_str())]);
            let wait = LockConflict::backoff(retries);
            span.in_scope(|| {
                tracing::warn!(
                    reason = kind.as_str(),
                    retry = retries,
                    ?wait,
                    error = %cause,
                    "order batch transaction lost a lock conflict and was rolled back; retrying with the same ids"
                );
            });
            tokio::time::sleep(wait).await;
        }
    }

    /// A batch of one order (what low load gives) is written as with group commit off: no
    /// savepoint, no isolation level to set, so it costs no round trip more. If the caller goes
    /// away first, the transaction is dropped (rolled back) as its own call would have dropped it.
    async fn write_alone(&self, mut job: Job) {
        let Some(mut reply) = job.reply.take() else {
            return;
        };
        let a = &job.accepting;
        let writing = self.alone.submit_alone(&a.submit, a.event_id, a.accepted_at, &a.trace);
        let answer = tokio::select! {
            biased;
            () = reply.closed() => return,
            answer = writing.instrument(job.span.clone()) => answer,
        };
        let _ = reply.send(answer);
    }

    /// Begins the batch's transaction; `None` when none began, every unanswered order then
    /// answered UNAVAILABLE (nothing written).
    async fn begin(&self, rows: &mut [Row]) -> Option<DatabaseTransaction> {
        let isolation = read_committed(&self.db);
        match self.db.begin_with_config(isolation, None).await {
            Ok(txn) => Some(txn),
            Err(e) => {
                let cause = TxFailure::from(e);
                for row in rows.iter_mut() {
                    row.settle(|row| {
                        tracing::warn!(outcome = "UNAVAILABLE", error = %cause, "no transaction began; nothing written");
                        SubmitError::Unavailable { event_id: row.event_id(), cause: cause.clone() }
                    });
                }
                None
            }
        }
    }

    /// One run of the batch's transaction over the orders not answered yet. `Some` when it lost
    /// a lock conflict and was rolled back (confirmed): the unanswered orders are open again.
    async fn attempt(&self, rows: &mut [Row]) -> Option<(LockConflict, TxFailure)> {
        // No transaction: every order is answered, nothing to run again.
        let txn = self.begin(rows).await?;
        let mut batch = Written::default();
        let txn = match self.write_set(txn, rows, &mut batch).await {
            Ok(txn) => txn,
            Err(end) => return end,
        };
        if let Err(cause) = write_each(&txn, rows, &mut batch).await {
            return abort(txn, rows, cause).await;
        }
        commit(txn, rows).await
    }

    /// Writes the batch's open orders (two or more) in one statement per table into `txn`,
    /// noting them in `batch`. `Ok` with the transaction to go on in: `txn`, or after a row error
    /// (the set rolled back, counted as a fallback) a new one in which every order is then
    /// written on its own. `Err` ends the attempt with what [`Writer::attempt`] returns: a lock
    /// conflict rolled back, or `None` when every order is answered (no new transaction, or an
    /// unconfirmed rollback: UNKNOWN).
    async fn write_set(
        &self,
        mut txn: DatabaseTransaction,
        rows: &mut [Row],
        batch: &mut Written,
    ) -> Result<DatabaseTransaction, Option<(LockConflict, TxFailure)>> {
        let candidates = set_candidates(rows.iter().map(|row| {
            (matches!(row.fate, Fate::Open) && !row.abandoned()).then(|| {
                let submit = &row.job.accepting.submit;
                ((submit.tenant_id.get(), submit.request_id.as_str()), row.event_id())
            })
        }));
        if candidates.len() >= 2 {
            let orders: Vec<&Accepting> = candidates.iter().map(|&i| &rows[i].job.accepting).collect();
            match bulk_insert::write(&txn, &orders, &self.ids_back).await {
                Ok(order_ids) => {
                    self.stats.record_set_write(true);
                    metrics().order_batch_set_writes.add(1, &[KeyValue::new("outcome", "written")]);
                    let size = candidates.len();
                    for (&i, order_id) in candidates.iter().zip(order_ids) {
                        let row = &mut rows[i];
                        row.job.span.in_scope(|| {
                            tracing::info!(
                                order_id,
                                set_size = size,
                                "order and PENDING outbox row written with its batch in one statement per table; not yet committed"
                            );
                        });
                        batch.keys.insert(row.key(), i);
                        batch.order_ids.insert(order_id);
                        batch.event_ids.insert(row.event_id());
                        row.fate = Fate::IfCommitted(Ok(row.job.accepting.accepted(order_id)));
                    }
                }
                // A deadlock or lock-wait victim: the whole transaction is rolled back (MariaDB
                // has already rolled back a deadlock victim) and the batch runs again, as today.
                Err(cause) if cause.db_err().and_then(lock_conflict).is_some() => {
                    return Err(abort(txn, rows, cause).await);
                }
                Err(cause) => {
                    // A row error, most likely: nothing else is in this transaction yet, so
                    // rolling it all back costs nothing, and each order is then written and
                    // decided on its own, exactly as without the set-based write.
                    self.stats.record_set_write(false);
                    metrics().order_batch_set_writes.add(1, &[KeyValue::new("outcome", "fell_back")]);
                    tracing::info!(
                        error = %cause,
                        orders = candidates.len(),
                        "set-based write of the batch failed and is rolled back; writing its orders one by one"
                    );
                    if let Err(e) = txn.rollback().await {
                        tracing::warn!(error = %e, "batch rollback failed; outcome unknown");
                        settle_unknown(rows, &cause);
                        return Err(None);
                    }
                    txn = self.begin(rows).await.ok_or(None)?;
                }
            }
        }
        Ok(txn)
    }
}

/// Counts one transaction of `size` orders.
pub(super) fn record_batch(stats: &BatchStats, size: usize) {
    stats.record(size);
    metrics().order_batch_size.record(size as u64, &[]);
}

/// What one order's savepoint came to.
enum RowEnd {
    /// Its rows are in the transaction under this order id.
    Written(i64),
    /// Answered from a row this transaction wrote: holds only if it commits.
    IfCommitted(Result<Submitted, SubmitError>),
    /// Answered whatever becomes of the transaction.
    Final(Result<Submitted, SubmitError>),
    /// The caller went away while its order was written: the savepoint was rolled back.
    Abandoned,
    /// The transaction itself failed: every unanswered order shares its fate.
    Abort(TxFailure),
}

/// What this run of the transaction wrote so far.
#[derive(Default)]
struct Written {
    /// `(tenant_id, request_id)` to the row that wrote it.
    keys: HashMap<(i64, String), usize>,
    order_ids: HashSet<i64>,
    event_ids: HashSet<EventId>,
}

/// Writes, each in its own savepoint, the orders still open that the set-based write did not
/// take: an order whose key a row of this transaction already wrote follows that row, an
/// abandoned one is dropped unwritten. `Err` when the transaction itself failed; the caller
/// then rolls it back.
async fn write_each(
    txn: &DatabaseTransaction,
    rows: &mut [Row],
    batch: &mut Written,
) -> Result<(), TxFailure> {
    for i in 0..rows.len() {
        if !matches!(rows[i].fate, Fate::Open) {
            continue;
        }
        if let Some(&leader) = batch.keys.get(&rows[i].key())
            && let Fate::IfCommitted(Ok(written)) = &rows[leader].fate
        {
            let answer = follow(&rows[leader].job.accepting, written, &rows[i].job.accepting);
            rows[i].fate = Fate::IfCommitted(answer);
            continue;
        }
        let row = &mut rows[i];
        if row.abandoned() {
            // The caller went away (its deadline passed) before the order was written: as
            // with a transaction of its own, nothing of it is written.
            row.fate = Fate::Answered;
            continue;
        }
        let span = row.job.span.clone();
        match write_row(txn, row, batch).instrument(span).await {
            RowEnd::Written(order_id) => {
                batch.keys.insert(row.key(), i);
                batch.order_ids.insert(order_id);
                batch.event_ids.insert(row.event_id());
                row.fate = Fate::IfCommitted(Ok(row.job.accepting.accepted(order_id)));
            }
            RowEnd::IfCommitted(answer) => row.fate = Fate::IfCommitted(answer),
            RowEnd::Final(answer) => row.answer(answer),
            RowEnd::Abandoned => row.fate = Fate::Answered,
            RowEnd::Abort(cause) => return Err(cause),
        }
    }
    Ok(())
}

/// Commits the batch's transaction, unless every order was answered from rows committed before
/// (then it is rolled back: nothing to commit), and answers the orders it holds. A failed or
/// unacknowledged commit is UNKNOWN for every order, never ROLLED_BACK. Returns what [`abort`]
/// decides when the failpoint before the commit aborts the transaction, otherwise `None`.
async fn commit(txn: DatabaseTransaction, rows: &mut [Row]) -> Option<(LockConflict, TxFailure)> {
    if !rows.iter().any(|r| matches!(r.fate, Fate::IfCommitted(_))) {
        // Every order was answered from rows committed before: nothing to commit.
        let _ = txn.rollback().await;
        return None;
    }

    if let Err(injected) = failpoint::hit(failpoint::BEFORE_ORDER_TRANSACTION_COMMIT) {
        return abort(txn, rows, injected.into()).await;
    }
    if let Err(injected) = failpoint::hit(failpoint::COMMIT_FAILS_WITHOUT_COMMITTING) {
        let _ = txn.rollback().await;
        settle_unknown(rows, &injected.into());
        return None;
    }
    if let Err(e) = txn.commit().await {
        let cause = TxFailure::from(e);
        if let Some(conflict) = cause.db_err().and_then(commit_refused) {
            // The server's own answer that it rolled the batch back (on Galera: another node
            // committed the same rows first): the batch runs again, as after a deadlock.
            reopen(rows);
            return Some((conflict, cause));
        }
        // The server may have committed and only the acknowledgement was lost: never
        // ROLLED_BACK.
        settle_unknown(rows, &cause);
        return None;
    }
    if let Err(injected) = failpoint::hit(failpoint::COMMIT_SUCCEEDS_BUT_CLIENT_RECEIVES_EXCEPTION) {
        settle_unknown(rows, &injected.into());
        return None;
    }
    answer_committed(rows);
    None
}

/// Answers every order whose answer held only if the transaction committed, now that it did.
fn answer_committed(rows: &mut [Row]) {
    let size = rows.len();
    for row in rows.iter_mut() {
        if let Fate::IfCommitted(answer) = std::mem::replace(&mut row.fate, Fate::Open) {
            if let Ok(Submitted { order, replayed: false }) = &answer {
                row.job.span.in_scope(|| {
                    tracing::info!(
                        order_id = order.order_id,
                        outcome = "COMMITTED",
                        batch_size = size,
                        "transaction committed; order ACCEPTED, outbox event PENDING"
                    );
                });
            }
            row.answer(answer);
        }
    }
}

/// Writes one order in its own savepoint and decides a row error as a transaction of its own
/// would have been decided.
async fn write_row(txn: &DatabaseTransaction, row: &Row, batch: &Written) -> RowEnd {
    let accepting = &row.job.accepting;
    let (submit, event_id) = (&accepting.submit, accepting.event_id);
    if let Err(e) = savepoint(txn, "SAVEPOINT").await {
        return RowEnd::Abort(e);
    }
    let cause = match insert_order(txn, submit, event_id, accepting.accepted_at, &accepting.trace).await {
        Ok(_) if row.abandoned() => {
            tracing::info!("caller went away before the order was written; its savepoint is rolled back");
            return match rollback_to_savepoint(txn).await {
                Ok(()) => RowEnd::Abandoned,
                Err(e) => RowEnd::Abort(e),
            };
        }
        Ok(order_id) => {
            return match savepoint(txn, "RELEASE SAVEPOINT").await {
                Ok(()) => RowEnd::Written(order_id),
                Err(e) => RowEnd::Abort(e),
            };
        }
        Err(cause) => cause,
    };
    // A lock-conflict victim is the whole transaction (MariaDB has rolled all of it back).
    if cause.db_err().and_then(lock_conflict).is_some() {
        return RowEnd::Abort(cause);
    }
    // Also what lets PostgreSQL go on after the error.
    if let Err(e) = rollback_to_savepoint(txn).await {
        tracing::warn!(error = %cause, "savepoint rollback failed after this error");
        return RowEnd::Abort(e);
    }
    let Some(clash) = cause.db_err().and_then(violated_unique_key).filter(|key| key.is_order_key()) else {
        // Any other error, including other unique keys: this order alone rolled back.
        return RowEnd::Final(Err(rolled_back(event_id, cause)));
    };
    // Read inside the transaction (READ COMMITTED): it sees orders committed by others and
    // the ones this batch wrote.
    let existing = match find(txn, submit.tenant_id, &submit.request_id).await {
        Ok(existing) => existing,
        Err(e) => {
            let cause = TxFailure::from(e);
            if cause.db_err().and_then(lock_conflict).is_some() {
                return RowEnd::Abort(cause);
            }
            if let Err(e) = rollback_to_savepoint(txn).await {
                return RowEnd::Abort(e);
            }
            return RowEnd::Final(Err(rolled_back(event_id, cause)));
        }
    };
    let from_this_batch = match &existing {
        Some(KeyHolder::Order(order, _)) => batch.order_ids.contains(&order.order_id),
        // A batch holds submissions only.
        Some(KeyHolder::Change(_)) => false,
        None => clash.is_event_key() && batch.event_ids.contains(&event_id),
    };
    let answer = decide_clash(submit, event_id, clash, existing);
    if from_this_batch { RowEnd::IfCommitted(answer) } else { RowEnd::Final(answer) }
}

async fn savepoint(txn: &DatabaseTransaction, verb: &str) -> Result<(), TxFailure> {
    txn.execute_unprepared(&format!("{verb} {SAVEPOINT}")).await.map(drop).map_err(TxFailure::from)
}

/// Undoes the order's statements and drops its savepoint, leaving the rest of the batch.
async fn rollback_to_savepoint(txn: &DatabaseTransaction) -> Result<(), TxFailure> {
    savepoint(txn, "ROLLBACK TO SAVEPOINT").await?;
    savepoint(txn, "RELEASE SAVEPOINT").await
}

/// Rolls the whole transaction back after `cause` and decides what that means for every order
/// not answered yet. `Some` when it was a lock conflict worth another run.
async fn abort(
    txn: DatabaseTransaction,
    rows: &mut [Row],
    cause: TxFailure,
) -> Option<(LockConflict, TxFailure)> {
    if let Err(e) = txn.rollback().await {
        tracing::warn!(error = %e, "batch rollback failed; outcome unknown");
        settle_unknown(rows, &cause);
        return None;
    }
    if let Some(conflict) = cause.db_err().and_then(lock_conflict) {
        reopen(rows);
        return Some((conflict, cause));
    }
    for row in rows.iter_mut() {
        row.settle(|row| rolled_back(row.event_id(), cause.clone()));
    }
    None
}

/// Opens again every order whose answer held only if the rolled-back transaction committed.
fn reopen(rows: &mut [Row]) {
    for row in rows.iter_mut() {
        if matches!(row.fate, Fate::IfCommitted(_)) {
            row.fate = Fate::Open;
        }
    }
}

fn settle_unknown(rows: &mut [Row], cause: &TxFailure) {
    for row in rows.iter_mut() {
        row.settle(|row| unknown(row.event_id(), cause.clone()));
    }
}

/// One order of a batch.
struct Row {
    job: Job,
    fate: Fate,
}

impl Row {
    fn key(&self) -> (i64, String) {
        let submit = &self.job.accepting.submit;
        (submit.tenant_id.get(), submit.request_id.to_string())
    }

    fn event_id(&self) -> EventId {
        self.job.accepting.event_id
    }

    /// Whether the caller stopped waiting for the answer (a passed deadline, a cancelled call).
    fn abandoned(&self) -> bool {
        self.job.reply.as_ref().is_none_or(tokio::sync::oneshot::Sender::is_closed)
    }

    /// Answers the caller (once; a caller that went away is not an error).
    fn answer(&mut self, answer: Result<Submitted, SubmitError>) {
        self.fate = Fate::Answered;
        if let Some(reply) = self.job.reply.take() {
            let _ = reply.send(answer);
        }
    }

    /// Answers an order not answered yet with `failure`, computed in the order's span so its
    /// log lines land there.
    fn settle(&mut self, failure: impl FnOnce(&Self) -> SubmitError) {
        if matches!(self.fate, Fate::Answered) {
            return;
        }
        let answer = self.job.span.clone().in_scope(|| failure(self));
        self.answer(Err(answer));
    }
}
