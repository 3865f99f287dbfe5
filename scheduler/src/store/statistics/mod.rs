//! The planner statistics repository: which of herald's busiest tables have grown far past
//! what their statistics say, and refreshing those (see `crate::planner_statistics`).

use deadpool_postgres::GenericClient;

use super::sql::{column, statement, Statement};
use super::{repository, StoreError};

repository!(
    /// Planner statistics of herald's busiest tables.
    StatisticsRepo
);

const GROWN_TABLES: Statement = statement!("grown_tables");

/// The tables whose statistics the keeper watches: those every claim, report and create plans
/// against, and which grow from nothing to millions of rows.
pub const WATCHED: [&str; 3] = ["tasks", "attempts", "recipient_sends"];

impl<C: GenericClient> StatisticsRepo<'_, C> {
    /// Of [`WATCHED`], the tables holding at least `floor` live rows and more than `factor`
    /// times the rows their statistics last counted (any rows at all before the first ANALYZE).
    pub async fn grown(&self, factor: f64, floor: i64) -> Result<Vec<String>, StoreError> {
        GROWN_TABLES
            .query(self.db, &[&WATCHED.as_slice(), &factor, &floor])
            .await?
            .iter()
            .map(|r| column(r, "table_name"))
            .collect()
    }

    /// Refreshes the statistics of `table`, one of [`WATCHED`] (anything else is refused, so
    /// no name reaches the statement that herald did not write). Within a transaction, so that
    /// a replica finding another already at it skips the table instead of queueing behind it:
    /// false then.
    pub async fn analyze(&self, table: &str) -> Result<bool, StoreError> {
        let Some(table) = WATCHED.iter().find(|w| **w == table) else {
            return Ok(false);
        };
        let row = self
            .db
            .query_one(
                "SELECT pg_try_advisory_xact_lock(hashtext('herald.analyze.' || $1::text)) \
                 AS locked",
                &[table],
            )
            .await
            .map_err(StoreError::query("lock_analyze"))?;
        if !column::<bool>(&row, "locked")? {
            return Ok(false);
        }
        self.db
            .batch_execute(&format!("ANALYZE herald.{table}"))
            .await
            .map_err(StoreError::query("analyze"))?;
        Ok(true)
    }
}
