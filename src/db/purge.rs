//! What every retention purge shares, whichever service owns the table: cut-offs by the
//! database clock, and deletion in short keyset batches.
//!
//! Each batch continues after the last row the batch before it selected instead of starting at
//! the head of the index again: rows deleted by earlier batches stay in the index as dead entries
//! for as long as a snapshot is held (PostgreSQL) or purge lags (InnoDB), and a batch that started
//! at the head would walk all of them, so a purge's cost would grow with the rows it already
//! removed. A periodic purge also keeps its [`Cursor`] between runs ([`Resume`]), so a run starts
//! where the one before stopped. See "Retention under a held snapshot" in
//! docs/design/consumer-dedup.md.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{
    ColumnTrait, Condition, DatabaseConnection, DbErr, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder,
    QuerySelect, TryGetable, Value,
};

/// `at - age`, refusing an age beyond what timestamps can hold.
pub fn before(at: DateTime<Utc>, age: Duration) -> Result<DateTime<Utc>, DbErr> {
    chrono::Duration::from_std(age)
        .ok()
        .and_then(|age| at.checked_sub_signed(age))
        .ok_or_else(|| DbErr::Custom(format!("{age:?} reaches before the earliest representable time")))
}

/// Where a purge stopped: the `(oldest, key)` of the last row its last batch selected. The next
/// batch (or run) takes only rows after it in that order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor<K> {
    oldest: DateTime<Utc>,
    key: K,
}

/// A periodic purge takes one run in this many from the head of the index; the others continue
/// after the [`Cursor`] the run before left.
///
/// A row can become eligible behind the cursor only when its `oldest` value lies before the
/// cursor's yet it was not visible (or not eligible) when the cursor passed: a transaction that
/// stamped its time and committed later than a whole retention window after, a clock set back, a
/// restored backup. None of these is a steady flow, and retention promises "kept at least this
/// long", not "deleted at once", so such rows may wait. With the default `--purge-every` of an
/// hour, 24 makes that wait at most a day, while a full pass, which walks every dead index entry
/// that VACUUM or purge has not removed yet, costs what every run cost before the cursor once a
/// day instead of every hour.
pub const FULL_PASS_EVERY: u32 = 24;

/// A periodic purge's memory between its runs: where the last one stopped, and how many runs
/// ago the last full pass was. It lives in the purging task only: a restarted service, or
/// another instance, starts with a full pass.
#[derive(Debug)]
pub struct Resume<K> {
    after: Option<Cursor<K>>,
    runs: u32,
}

impl<K> Default for Resume<K> {
    fn default() -> Self {
        Self { after: None, runs: 0 }
    }
}

impl<K> Resume<K> {
    /// The cursor the next run continues after, for [`delete_in_batches`] to advance: none (from
    /// the head) on the first run and on every [`FULL_PASS_EVERY`]th after it.
    pub fn next_run(&mut self) -> &mut Option<Cursor<K>> {
        if self.runs == 0 {
            self.after = None;
        }
        self.runs = (self.runs + 1) % FULL_PASS_EVERY;
        &mut self.after
    }
}

/// Deletes the rows of `E` that `eligible` selects after `after`, in `(oldest, key)` order,
/// `batch` rows per statement, and answers how many went; with `dry_run`, only counts every
/// eligible row (from the head, `after` untouched). `after` follows the last row of each batch,
/// so a later call with it continues where this one stopped; `&mut None` purges from the head.
///
/// Each batch selects at most `batch` keys after the cursor, so its scan starts where the last
/// one ended instead of walking the entries earlier batches left dead, then deletes those rows
/// with `eligible` repeated, so several instances purging at once only ever delete eligible rows
/// (a row that changed since the select stays, behind the cursor until the next full pass), and
/// no statement holds locks for long. When the database fails, batches already deleted stay
/// deleted and `after` points past them; none is half done.
///
/// The index `eligible` is served by must lead with `oldest` (after any columns `eligible` fixes
/// by equality) and end with `key`, or with the row's address when `key` is not in it: ties of
/// `oldest` then cost a batch at most the dead entries of one tie.
pub async fn delete_in_batches<E, K>(
    db: &DatabaseConnection,
    eligible: Condition,
    key: E::Column,
    oldest: E::Column,
    batch: u64,
    dry_run: bool,
    after: &mut Option<Cursor<K>>,
) -> Result<u64, DbErr>
where
    E: EntityTrait,
    E::Model: Sync,
    K: TryGetable + Into<Value> + Clone + Send + Sync,
{
    if dry_run {
        return E::find().filter(eligible).count(db).await;
    }
    let batch = batch.max(1);
    in_batches(batch, after, |from: Option<Cursor<K>>| {
        let eligible = eligible.clone();
        async move {
            let mut select = E::find().filter(eligible.clone());
            if let Some(from) = from {
                select = select.filter(past(oldest, key, from));
            }
            let rows: Vec<(K, DateTime<Utc>)> = select
                .select_only()
                .column(key)
                .column(oldest)
                .order_by_asc(oldest)
                .order_by_asc(key)
                .limit(batch)
                .into_tuple()
                .all(db)
                .await?;
            let Some((last_key, last_oldest)) = rows.last().cloned() else {
                return Ok((0, 0, None));
            };
            let found = rows.len();
            let keys = rows.into_iter().map(|(key, _)| key);
            let deleted =
                E::delete_many().filter(key.is_in(keys)).filter(eligible).exec(db).await?.rows_affected;
            Ok((found, deleted, Some(Cursor { oldest: last_oldest, key: last_key })))
        }
    })
    .await
}

/// `(oldest, key) > (from.oldest, from.key)`, spelled so that every database can start an index
/// range scan at `oldest >= from.oldest` (PostgreSQL's row comparison would be one condition, but
/// MariaDB and SQLite do not seek on it).
fn past<C, K>(oldest: C, key: C, from: Cursor<K>) -> Condition
where
    C: ColumnTrait,
    K: Into<Value>,
{
    Condition::all()
        .add(oldest.gte(from.oldest))
        .add(Condition::any().add(oldest.gt(from.oldest)).add(key.gt(from.key)))
}

/// Runs `one` (select at most `batch` rows after a cursor, delete them; answer how many were
/// found, how many deleted and the last row found) until a batch comes back short, moving
/// `after` past each batch, and sums the deletions.
async fn in_batches<K, F, Fut>(batch: u64, after: &mut Option<Cursor<K>>, mut one: F) -> Result<u64, DbErr>
where
    K: Clone,
    F: FnMut(Option<Cursor<K>>) -> Fut,
    Fut: Future<Output = Result<(usize, u64, Option<Cursor<K>>), DbErr>>,
{
    let mut deleted = 0;
    loop {
        let (found, gone, last) = one(after.clone()).await?;
        deleted += gone;
        if last.is_some() {
            *after = last;
        }
        if (found as u64) < batch.max(1) {
            return Ok(deleted);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_cutoff_beyond_representable_time_is_refused() {
        let now = Utc::now();
        assert_eq!(before(now, Duration::from_secs(60)).unwrap(), now - chrono::Duration::seconds(60));
        assert!(before(now, Duration::from_secs(u64::MAX)).is_err());
    }

    fn at(key: i64) -> Cursor<i64> {
        Cursor { oldest: DateTime::from_timestamp(1_800_000_000 + key, 0).unwrap(), key }
    }

    #[tokio::test]
    async fn batches_run_until_one_comes_back_short_each_after_the_last_row_of_the_one_before() {
        // Three batches of 3, 3 and 1 rows: keys 1-3, 4-6, 7.
        let mut last = [3_i64, 6, 7].into_iter();
        let mut asked = Vec::new();
        let mut after = Some(at(0));
        let deleted = in_batches(3, &mut after, |from| {
            asked.push(from.map(|c| c.key));
            let last = last.next().unwrap();
            let found = if last == 7 { 1 } else { 3 };
            async move { Ok((found, found as u64, Some(at(last)))) }
        })
        .await
        .unwrap();
        assert_eq!(deleted, 7);
        assert_eq!(asked, [Some(0), Some(3), Some(6)]);
        assert_eq!(after, Some(at(7)), "the next run continues after the last row found");
    }

    #[tokio::test]
    async fn an_empty_batch_leaves_the_cursor_where_it_was() {
        let mut after = Some(at(5));
        let deleted = in_batches(3, &mut after, |_| async { Ok((0, 0, None)) }).await.unwrap();
        assert_eq!((deleted, after), (0, Some(at(5))));
    }

    #[tokio::test]
    async fn a_failed_batch_keeps_the_cursor_past_the_batches_already_deleted() {
        let mut calls = 0;
        let mut after = None;
        let failed = in_batches(2, &mut after, |_| {
            calls += 1;
            let answer = if calls == 1 { Ok((2, 2, Some(at(2)))) } else { Err(DbErr::Custom("gone".into())) };
            async move { answer }
        })
        .await;
        assert!(failed.is_err());
        assert_eq!(after, Some(at(2)));
    }

    #[test]
    fn a_periodic_purge_starts_at_the_head_on_its_first_run_and_every_full_pass_after() {
        let mut resume = Resume::default();
        let mut from_head = Vec::new();
        for run in 0..(2 * FULL_PASS_EVERY + 1) {
            let after = resume.next_run();
            from_head.push(after.is_none());
            *after = Some(at(i64::from(run)));
        }
        let expected: Vec<bool> =
            (0..(2 * FULL_PASS_EVERY + 1)).map(|run| run % FULL_PASS_EVERY == 0).collect();
        assert_eq!(from_head, expected);
    }

    #[test]
    fn a_keyset_run_continues_after_the_cursor_the_run_before_left() {
        let mut resume = Resume::default();
        *resume.next_run() = Some(at(41));
        let after = resume.next_run();
        assert_eq!(*after, Some(at(41)));
        *after = Some(at(90));
        assert_eq!(*resume.next_run(), Some(at(90)));
    }
}
