//! The history repository: finished tasks and their attempts leave `herald.tasks` for
//! time-partitioned history tables (migration V28), whole partitions of which retention drops;
//! and the way back for a write meant for a finished task.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use uuid::Uuid;

use super::sql::{column, millis, statement, Statement};
use super::{repository, StoreError};

repository!(
    /// The task history.
    HistoryRepo
);

/// The history's partition upkeep and `herald.restore_tasks`, applied by the migrator whenever
/// it changes.
pub const FUNCTIONS_SQL: &str = include_str!("functions.sql");

const ARCHIVE_TASKS: Statement = statement!("archive_tasks");
const ENSURE_PARTITIONS: Statement = statement!("ensure_partitions");
const EXPIRED_PARTITIONS: Statement = statement!("expired_partitions");
const FORGET_PARTITION: Statement = statement!("forget_partition");
const ATTACHED_PARTITIONS: Statement = statement!("attached_partitions");
const DROP_PARTITION_ROW: Statement = statement!("drop_partition_row");
const LOCK_PARTITIONS: Statement = statement!("lock_partitions");
const UNLOCK_PARTITIONS: Statement = statement!("unlock_partitions");
const RESTORE_TASKS: Statement = statement!("restore_tasks");

/// The partitioned history tables; each partition pair is `<table>_<suffix>`.
const HISTORY_TABLES: [&str; 2] = ["task_history", "attempt_history"];

/// The tables of the partition pair `suffix`, in [`HISTORY_TABLES`] order.
fn pair_names(suffix: &str) -> Vec<String> {
    HISTORY_TABLES
        .iter()
        .map(|table| format!("{table}_{suffix}"))
        .collect()
}

/// What one archive batch moved.
#[derive(Debug, Default, Clone, Copy)]
pub struct Archived {
    /// Finished tasks moved into the history, with their attempts.
    pub tasks: u64,
    /// The latest end time of a task moved, where the next batch's walk can start.
    pub through: Option<DateTime<Utc>>,
}

impl<C: GenericClient> HistoryRepo<'_, C> {
    /// Moves up to `batch` tasks that ended more than `after` ago (and within
    /// `task_retention`) into the history, walking from `from` (see
    /// [`LowWater`](crate::low_water::LowWater)); their idempotency keys are kept for the key
    /// retention, and at least as long as a partition `partition_width` wide keeps them.
    pub async fn archive(
        &self,
        after: Duration,
        task_retention: Duration,
        key_retention: Duration,
        partition_width: Duration,
        batch: i64,
        from: Option<DateTime<Utc>>,
    ) -> Result<Archived, StoreError> {
        let row = ARCHIVE_TASKS
            .query_one(
                self.db,
                &[
                    &millis(after),
                    &millis(task_retention),
                    &millis(key_retention),
                    &batch,
                    &from,
                    &millis(partition_width),
                ],
            )
            .await?;
        Ok(Archived {
            tasks: u64::try_from(column::<i64>(&row, "archived")?).unwrap_or(0),
            through: column(&row, "archived_through")?,
        })
    }

    /// Makes the partitions, `width` wide, for tasks ending from `back` ago to `ahead` from
    /// now; returns how many it made. Fails rather than wait longer than `lock_timeout` for a
    /// reader of the history.
    pub async fn ensure_partitions(
        &self,
        back: Duration,
        ahead: Duration,
        width: Duration,
        lock_timeout: Duration,
    ) -> Result<i32, StoreError> {
        let row = ENSURE_PARTITIONS
            .query_one(
                self.db,
                &[
                    &millis(back),
                    &millis(ahead),
                    &millis(width),
                    &millis(lock_timeout),
                ],
            )
            .await?;
        column(&row, "made")
    }

    /// Drops the partitions holding only tasks that ended more than `task_retention` ago;
    /// returns how many tasks went with them. Runs outside any transaction, on a connection of
    /// its own that the caller discards afterwards (it changes `lock_timeout`): each partition
    /// is detached CONCURRENTLY, which takes only a SHARE UPDATE EXCLUSIVE lock on its parent,
    /// so readers of the history neither wait for the drop nor deadlock with it. Skipped when
    /// another replica is changing partitions.
    pub async fn drop_expired(
        &self,
        task_retention: Duration,
        lock_timeout: Duration,
    ) -> Result<u64, StoreError> {
        let locked: bool = column(&LOCK_PARTITIONS.query_one(self.db, &[]).await?, "locked")?;
        if !locked {
            return Ok(0);
        }
        let dropped = self.drop_expired_locked(task_retention, lock_timeout).await;
        let unlocked = UNLOCK_PARTITIONS.query_one(self.db, &[]).await;
        let dropped = dropped?;
        unlocked?;
        Ok(dropped)
    }

    async fn drop_expired_locked(
        &self,
        task_retention: Duration,
        lock_timeout: Duration,
    ) -> Result<u64, StoreError> {
        let mut expired: Vec<String> = EXPIRED_PARTITIONS
            .query(self.db, &[&millis(task_retention)])
            .await?
            .iter()
            .map(|r| column(r, "suffix"))
            .collect::<Result<_, _>>()?;
        if expired.is_empty() {
            return Ok(0);
        }
        self.ddl(&format!(
            "SET lock_timeout = {}",
            lock_timeout.as_millis().max(1)
        ))
        .await?;
        let all_names: Vec<String> = expired.iter().flat_map(|s| pair_names(s)).collect();
        // Each table still attached, and whether a detach of it was started and not finished.
        let attached: HashMap<String, bool> = ATTACHED_PARTITIONS
            .query(self.db, &[&all_names])
            .await?
            .iter()
            .map(|r| Ok((column(r, "name")?, column(r, "detach_pending")?)))
            .collect::<Result<_, StoreError>>()?;
        // A detach left pending (a pass cut short between its two transactions) makes every
        // other concurrent detach from the same parent fail: the pairs holding one go first.
        expired.sort_by_key(|suffix| {
            !pair_names(suffix)
                .iter()
                .any(|name| attached.get(name) == Some(&true))
        });
        let mut dropped = 0;
        for suffix in expired {
            // Ours (digits of an instant), but checked: it becomes part of DDL text.
            if suffix.is_empty() || !suffix.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
                return Err(StoreError::Corrupt(format!(
                    "history partition suffix {suffix:?} is not a number"
                )));
            }
            let tasks: i64 = column(
                &FORGET_PARTITION.query_one(self.db, &[&suffix]).await?,
                "tasks",
            )?;
            let names = pair_names(&suffix);
            for (parent, name) in HISTORY_TABLES.iter().zip(&names) {
                // A table no longer attached was detached by a pass cut short: only the drop
                // below is left for it. One statement per batch: CONCURRENTLY may not run in a
                // transaction block, and a multi-statement batch is one.
                if let Some(pending) = attached.get(name) {
                    let how = if *pending { "FINALIZE" } else { "CONCURRENTLY" };
                    self.ddl(&format!(
                        "ALTER TABLE herald.{parent} DETACH PARTITION herald.{name} {how}"
                    ))
                    .await?;
                }
            }
            for name in &names {
                self.ddl(&format!("DROP TABLE IF EXISTS herald.{name}"))
                    .await?;
            }
            DROP_PARTITION_ROW.execute(self.db, &[&suffix]).await?;
            dropped += u64::try_from(tasks).unwrap_or(0);
        }
        Ok(dropped)
    }

    async fn ddl(&self, sql: &str) -> Result<(), StoreError> {
        self.db
            .batch_execute(sql)
            .await
            .map_err(StoreError::query("history partition change"))
    }

    /// Brings the tasks among `ids` that are in the history back into `herald.tasks`, so the
    /// write that follows in the same transaction finds them.
    pub async fn restore(&self, ids: &[Uuid]) -> Result<(), StoreError> {
        if !ids.is_empty() {
            RESTORE_TASKS.execute(self.db, &[&ids]).await?;
        }
        Ok(())
    }
}
