//! The storage repository: how large herald's busiest tables are on disk, and how long the
//! oldest open transaction has kept VACUUM from reclaiming them. Read by the metrics
//! (`telemetry/metrics.rs`), so operators see a table growing and what holds it
//! (docs/operations.md, "Giving back space").

use deadpool_postgres::GenericClient;

use super::sql::{column, statement, Statement};
use super::{repository, StoreError};

repository!(
    /// Table sizes and the transaction that holds VACUUM back.
    StorageRepo
);

const TABLE_SIZES: Statement = statement!("table_sizes");
const OLDEST_TRANSACTION: Statement = statement!("oldest_transaction");

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
}
