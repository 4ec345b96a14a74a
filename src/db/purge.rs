//! What every retention purge shares, whichever service owns the table: cut-offs by the
//! database clock, and deletion in short batches.

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

/// Deletes the rows of `E` that `eligible` selects, oldest by `oldest` first, `batch` rows per
/// statement, and answers how many went; with `dry_run`, only counts them.
///
/// Each batch selects at most `batch` keys and deletes those rows with `eligible` repeated, so
/// several instances purging at once only ever delete eligible rows (a row that changed since
/// the select stays), and no statement holds locks for long. When the database fails, batches
/// already deleted stay deleted; none is half done.
pub async fn delete_in_batches<E, K>(
    db: &DatabaseConnection,
    eligible: Condition,
    key: E::Column,
    oldest: E::Column,
    batch: u64,
    dry_run: bool,
) -> Result<u64, DbErr>
where
    E: EntityTrait,
    E::Model: Sync,
    K: TryGetable + Into<Value> + Send + Sync,
{
    if dry_run {
        return E::find().filter(eligible).count(db).await;
    }
    let batch = batch.max(1);
    in_batches(batch, || async {
        let keys: Vec<K> = E::find()
            .filter(eligible.clone())
            .select_only()
            .column(key)
            .order_by_asc(oldest)
            .limit(batch)
            .into_tuple()
            .all(db)
            .await?;
        let found = keys.len();
        if found == 0 {
            return Ok((0, 0));
        }
        let deleted =
            E::delete_many().filter(key.is_in(keys)).filter(eligible.clone()).exec(db).await?.rows_affected;
        Ok((found, deleted))
    })
    .await
}

/// Runs `one` (select at most `batch` keys, delete them; answer how many were found and how many
/// deleted) until a batch comes back short, and sums the deletions.
async fn in_batches<F, Fut>(batch: u64, mut one: F) -> Result<u64, DbErr>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(usize, u64), DbErr>>,
{
    let mut deleted = 0;
    loop {
        let (found, gone) = one().await?;
        deleted += gone;
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

    #[tokio::test]
    async fn batches_run_until_one_comes_back_short() {
        let mut found = [3_usize, 3, 1].into_iter();
        let calls = std::cell::Cell::new(0);
        let deleted = in_batches(3, || {
            calls.set(calls.get() + 1);
            let n = found.next().unwrap();
            async move { Ok((n, n as u64)) }
        })
        .await
        .unwrap();
        assert_eq!((deleted, calls.get()), (7, 3));
    }
}
