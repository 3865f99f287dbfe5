//! The statistics keeper: refreshes the planner's statistics of a busy table as soon as it has
//! grown well past what they say, instead of waiting up to a minute for autovacuum.
//!
//! PostgreSQL keeps a prepared statement's plan until the statistics of a table it reads
//! change, and table growth alone does not change them. A plan made while `herald.tasks` was
//! nearly empty (a new deployment, a restored or upgraded database, the first seconds of a
//! burst) stays in use as the table grows. In S6 the claim's lease update, planned on an empty
//! table, walked every due task instead of probing the primary key for the ones it leased (a
//! claim of 32 read 60,000 rows; the batch updates by id no longer offer that walk, but on a
//! nearly empty table any statement may be planned as a sequential scan). Autovacuum analyzes
//! a table at most once per `autovacuum_naptime` (a minute by default), and the backlog built
//! in that minute took minutes more to work off (docs/performance.md, "Plans made on an empty
//! table"). An ANALYZE makes every session plan the table's statements afresh, for its size
//! now.
//!
//! Safe on every replica at once: a table is analyzed by one replica at a time (an advisory
//! lock), and one just analyzed no longer looks grown to the others.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::store::{transaction, Db, Store, StoreError};

/// How often the keeper looks: one read of the statistics system's counters, cheap enough to
/// do every second, and a plan made on a small table should not outlive much growth.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// A table is analyzed once it holds more than this many times the rows its statistics counted:
/// from empty to millions of rows that is a score of ANALYZEs, each a sample of at most 30,000
/// rows, and a plan is never made for a table less than half its size.
pub const GROWTH_FACTOR: f64 = 2.0;

/// Tables smaller than this are left to autovacuum: any plan is fast on them.
pub const MIN_ROWS: i64 = 1_000;

/// Runs until `stop`, looking every [`INTERVAL`]. Tables the scheduler's role may not ANALYZE
/// are left to autovacuum.
pub async fn run(store: Store, stop: CancellationToken) {
    crate::server::background::every(INTERVAL, stop, "refresh planner statistics", || {
        refresh_grown(&store)
    })
    .await;
}

/// Analyzes every watched table that has grown past its statistics; returns those analyzed
/// (not those another replica was analyzing at the time).
pub async fn refresh_grown(store: &Store) -> Result<Vec<String>, StoreError> {
    let grown = store
        .conn()
        .await?
        .statistics()
        .grown(GROWTH_FACTOR, MIN_ROWS)
        .await?;
    let mut analyzed = Vec::with_capacity(grown.len());
    for table in grown {
        // Idempotent: a second ANALYZE only samples the table again.
        let done = transaction!(store, StoreError, idempotent = true, |tx| tx
            .statistics()
            .analyze(&table)
            .await)?;
        if done {
            tracing::info!(table = %table, "planner statistics refreshed: the table outgrew them");
            analyzed.push(table);
        }
    }
    Ok(analyzed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::scratch::{insert_tasks, OtherRole, ScratchStore};

    /// The rows `herald.tasks`' statistics count.
    async fn counted_rows(conn: &deadpool_postgres::Object) -> f32 {
        conn.query_one(
            "SELECT reltuples FROM pg_class WHERE oid = 'herald.tasks'::regclass",
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .get(0)
    }

    /// A table analyzed while it held a few finished tasks is analyzed again once it holds
    /// twice as many rows, and then not again until it doubles once more. (That PostgreSQL
    /// plans the statements on a table afresh after an ANALYZE is its own documented rule.)
    #[tokio::test]
    async fn a_table_is_analyzed_again_once_it_outgrows_its_statistics() {
        let store = ScratchStore::migrated().await;
        let conn = store.conn().await.unwrap_or_else(|e| panic!("{e}"));
        // Only the keeper analyzes the table in this test.
        conn.batch_execute("ALTER TABLE herald.tasks SET (autovacuum_enabled = false)")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        insert_tasks(&conn, 50, "succeeded").await;
        conn.batch_execute("ANALYZE herald.tasks")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(refresh_grown(&store).await.ok(), Some(Vec::new()));
        assert_eq!(counted_rows(&conn).await, 50.0);

        insert_tasks(&conn, 20_000, "scheduled").await;
        let analyzed = refresh_grown(&store)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(analyzed, vec!["tasks".to_owned()]);
        assert_eq!(counted_rows(&conn).await, 20_050.0);
        // Analyzed for its size now, it is not grown any more.
        assert_eq!(refresh_grown(&store).await.ok(), Some(Vec::new()));
    }

    /// A role that does not own herald's tables may not ANALYZE them (PostgreSQL only warns):
    /// the keeper leaves them to autovacuum rather than trying every second.
    #[tokio::test]
    async fn tables_another_role_owns_are_left_to_autovacuum() {
        let store = ScratchStore::migrated().await;
        let conn = store.conn().await.unwrap_or_else(|e| panic!("{e}"));
        insert_tasks(&conn, 2_000, "scheduled").await;
        let other = OtherRole::assume(&conn).await;
        let as_other = conn.statistics().grown(GROWTH_FACTOR, MIN_ROWS).await;
        other.leave(&conn).await;
        assert_eq!(as_other.ok(), Some(Vec::new()));
        let as_owner = conn.statistics().grown(GROWTH_FACTOR, MIN_ROWS).await;
        assert_eq!(as_owner.ok(), Some(vec!["tasks".to_owned()]));
    }
}
