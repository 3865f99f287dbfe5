//! The storage repository: how large herald's busiest tables are on disk, how long the
//! oldest open transaction has kept VACUUM from reclaiming them, and rewriting a table that
//! was left mostly empty space. Read by the metrics (`telemetry/metrics.rs`), so operators see
//! a table growing and what holds it, and by the compactor (`crate::compaction`), which gives
//! the space back (docs/operations.md, "Giving back space").

use std::time::Duration;

use deadpool_postgres::GenericClient;
use tokio_postgres::error::SqlState;

use super::sql::{column, statement, Statement};
use super::{repository, StoreError};

repository!(
    /// Table sizes and the transaction that holds VACUUM back.
    StorageRepo
);

const TABLE_SIZES: Statement = statement!("table_sizes");
const OLDEST_TRANSACTION: Statement = statement!("oldest_transaction");
const COMPACTION_CANDIDATES: Statement = statement!("compaction_candidates");

/// The tables the compactor may rewrite: the hot ones every task passes through, which a
/// long-open transaction makes grow into space they keep after it ends. (The history gives its
/// space back by dropping partitions.)
pub const COMPACTED: [&str; 3] = ["tasks", "attempts", "recipient_sends"];

/// A table the compactor may rewrite, with what it weighs, as [`StorageRepo::candidates`]
/// finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The table, one of [`COMPACTED`].
    pub table: String,
    /// Its size on disk, indexes and TOAST included.
    pub bytes: i64,
    /// Its heap's size on disk.
    pub heap_bytes: i64,
    /// What its live rows take, estimated from the statistics.
    pub live_bytes: i64,
    /// What one row takes, estimated from the statistics.
    pub row_bytes: i64,
    /// How many row versions its updates and deletes have left dead since the statistics
    /// began counting (a running count: it only grows, until a crash or a reset).
    pub dead_versions: i64,
}

/// How a rewrite ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rewrite {
    /// The table was rewritten.
    Done,
    /// Another session held the table longer than the lock wait allowed; nothing changed.
    LockBusy,
}

/// The tables whose sizes are reported: those that grow with traffic. The history tables are
/// partitioned; each reports the sum of its partitions.
pub const SIZED: [&str; 5] = [
    "tasks",
    "attempts",
    "recipient_sends",
    "task_history",
    "attempt_history",
];

/// The oldest transaction that keeps VACUUM from removing dead row versions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OldestTransaction {
    /// How long it has been open, in seconds; 0 when none is.
    pub seconds: f64,
    /// Whether this session may see other roles' transactions (superuser or a member of
    /// `pg_read_all_stats`); without it, only the transactions of herald's own role count.
    pub sees_every_role: bool,
}

impl<C: GenericClient> StorageRepo<'_, C> {
    /// Each table of [`SIZED`] with its size in bytes, indexes and TOAST included, in that
    /// order (a table missing from the schema is left out).
    pub async fn table_sizes(&self) -> Result<Vec<(String, i64)>, StoreError> {
        TABLE_SIZES
            .query(self.db, &[&SIZED.as_slice()])
            .await?
            .iter()
            .map(|r| Ok((column(r, "table_name")?, column(r, "bytes")?)))
            .collect()
    }

    /// The oldest open transaction on herald's database that holds VACUUM back.
    pub async fn oldest_transaction(&self) -> Result<OldestTransaction, StoreError> {
        let row = OLDEST_TRANSACTION.query_one(self.db, &[]).await?;
        Ok(OldestTransaction {
            seconds: column(&row, "seconds")?,
            sees_every_role: column(&row, "sees_every_role")?,
        })
    }

    /// Of [`COMPACTED`], the tables between `min_bytes` and `max_bytes` on disk that this
    /// session's role may rewrite.
    pub async fn candidates(
        &self,
        min_bytes: i64,
        max_bytes: i64,
    ) -> Result<Vec<Candidate>, StoreError> {
        COMPACTION_CANDIDATES
            .query(self.db, &[&COMPACTED.as_slice(), &min_bytes, &max_bytes])
            .await?
            .iter()
            .map(|r| {
                Ok(Candidate {
                    table: column(r, "table_name")?,
                    bytes: column(r, "bytes")?,
                    heap_bytes: column(r, "heap_bytes")?,
                    live_bytes: column(r, "live_bytes")?,
                    row_bytes: column(r, "row_bytes")?,
                    dead_versions: column(r, "dead_versions")?,
                })
            })
            .collect()
    }

    /// Takes the compactor's lock for this session, if no other replica holds it: one rewrite
    /// at a time across replicas, so two never rewrite one table back to back. Released when
    /// the session ends (the compactor discards its connection after each round).
    pub async fn lock_compaction(&self) -> Result<bool, StoreError> {
        let row = self
            .db
            .query_one(
                "SELECT pg_try_advisory_lock(hashtext('herald.compaction')) AS locked",
                &[],
            )
            .await
            .map_err(StoreError::query("lock_compaction"))?;
        column(&row, "locked")
    }

    /// Rewrites `table`, one of [`COMPACTED`] (anything else is refused, so no name reaches
    /// the statement that herald did not write), with `VACUUM FULL`: a copy of its live rows
    /// and indexes anew, under an exclusive lock that holds every other statement on the
    /// table until it ends. Waits at most `lock_wait` for that lock, since every statement
    /// queues behind a waiting request. Outside any transaction, on a connection the caller
    /// discards afterwards (it changes `lock_timeout`).
    pub async fn rewrite(&self, table: &str, lock_wait: Duration) -> Result<Rewrite, StoreError> {
        let Some(table) = COMPACTED.iter().find(|c| **c == table) else {
            return Err(StoreError::Inconsistent(format!(
                "{table:?} is not a table the compactor rewrites"
            )));
        };
        self.db
            .batch_execute(&format!(
                "SET lock_timeout = {}",
                lock_wait.as_millis().max(1)
            ))
            .await
            .map_err(StoreError::query("set_lock_timeout"))?;
        match self
            .db
            .batch_execute(&format!("VACUUM FULL herald.{table}"))
            .await
        {
            Ok(()) => Ok(Rewrite::Done),
            Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => Ok(Rewrite::LockBusy),
            Err(e) => Err(StoreError::query("rewrite_table")(e)),
        }
    }

    /// The size on disk of `table`, indexes and TOAST included (0 when it does not exist).
    pub async fn table_bytes(&self, table: &str) -> Result<i64, StoreError> {
        let rows = TABLE_SIZES.query(self.db, &[&[table].as_slice()]).await?;
        match rows.first() {
            Some(row) => column(row, "bytes"),
            None => Ok(0),
        }
    }
}
