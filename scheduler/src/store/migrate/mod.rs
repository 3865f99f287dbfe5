//! Versioned schema migrations, embedded in the binary and applied under an advisory lock so
//! that several replicas starting at once apply each migration exactly once. Numbered
//! migrations (`migrations/V<n>__<what>.sql`, listed by `build.rs`) run once each, in order;
//! repeatable ones (definitions replaced in place, such as the account limit functions) run
//! whenever their text changes, except by a binary older than the database (one that does not
//! know every numbered migration applied), which leaves the newer release's in place.

use sha2::{Digest, Sha256};

use super::sql::{column, statement, Statement};
use super::{Store, StoreError};

/// One migration: its version, a name saying what it does, and its SQL.
struct Migration {
    version: i32,
    name: &'static str,
    sql: &'static str,
}

/// Every migration, in order (generated from `migrations/` by `build.rs`). Append only; never
/// edit one that has shipped.
const MIGRATIONS: &[Migration] = include!(concat!(env!("OUT_DIR"), "/migrations.rs"));

/// SQL re-applied whenever its text changes, after the numbered migrations: definitions that
/// are replaced in place (`CREATE OR REPLACE FUNCTION`) rather than restated in new migrations.
const REPEATABLE: &[(&str, &str)] = &[
    // First: how recipients compare, which the others' functions call.
    ("recipient_functions", super::suppressions::FUNCTIONS_SQL),
    // Next: the others read the history's views.
    ("history_functions", super::history::FUNCTIONS_SQL),
    ("account_functions", super::accounts::FUNCTIONS_SQL),
    ("campaign_functions", super::campaigns::FUNCTIONS_SQL),
    ("task_functions", super::tasks::FUNCTIONS_SQL),
    ("delivery_functions", super::deliveries::FUNCTIONS_SQL),
];

/// Arbitrary but fixed: the advisory lock key that serialises migrations across replicas.
const MIGRATION_LOCK_KEY: i64 = 0x6865_7261_6c64_0001;

const LOCK: Statement = statement!("lock");
const UNLOCK: Statement = statement!("unlock");
const BOOKKEEPING: &str = include_str!("bookkeeping.sql");
const APPLIED_VERSIONS: Statement = statement!("applied_versions");
const RECORD_VERSION: Statement = statement!("record_version");
const REPEATABLE_CHECKSUM: Statement = statement!("repeatable_checksum");
const RECORD_REPEATABLE: Statement = statement!("record_repeatable");

/// Applies every migration not yet applied and returns how many ran.
pub async fn run(store: &Store) -> Result<usize, StoreError> {
    let mut conn = store.conn().await?;
    LOCK.execute(&conn, &[&MIGRATION_LOCK_KEY]).await?;
    let result = apply_pending(&mut conn).await;
    let unlock = UNLOCK.execute(&conn, &[&MIGRATION_LOCK_KEY]).await;
    let applied = result?;
    unlock?;
    Ok(applied)
}

async fn apply_pending(conn: &mut deadpool_postgres::Object) -> Result<usize, StoreError> {
    conn.batch_execute(BOOKKEEPING)
        .await
        .map_err(StoreError::query("bookkeeping"))?;
    let applied: Vec<i32> = APPLIED_VERSIONS
        .query(&*conn, &[])
        .await?
        .iter()
        .map(|r| column(r, "version"))
        .collect::<Result<_, _>>()?;
    let mut count = 0;
    for migration in MIGRATIONS.iter().filter(|m| !applied.contains(&m.version)) {
        let tx = conn
            .transaction()
            .await
            .map_err(StoreError::query("begin"))?;
        tx.batch_execute(migration.sql)
            .await
            .map_err(StoreError::query(migration.name))?;
        RECORD_VERSION
            .execute(&tx, &[&migration.version, &migration.name])
            .await?;
        tx.commit().await.map_err(StoreError::query("commit"))?;
        tracing::info!(
            version = migration.version,
            name = migration.name,
            "migration applied"
        );
        count += 1;
    }
    // A database that has numbered migrations this binary does not know was migrated by a
    // newer release: this is an older replica restarting during a rolling upgrade (or a
    // rollback). Its repeatables would replace the newer release's functions under the newer
    // replicas already running, until one of them restarted and put them back.
    let unknown = applied
        .iter()
        .filter(|v| !MIGRATIONS.iter().any(|m| m.version == **v))
        .max();
    if let Some(newest) = unknown {
        tracing::warn!(
            newest_applied = newest,
            newest_known = MIGRATIONS.iter().map(|m| m.version).max().unwrap_or(0),
            "the database was migrated by a newer release; its SQL functions are left in place"
        );
        return Ok(count);
    }
    // A numbered migration may change what a repeatable's `SELECT *` expands to (the history
    // views), so after one every repeatable is applied again.
    count += apply_repeatable(conn, count > 0).await?;
    Ok(count)
}

/// Applies each repeatable whose text differs from what was applied last (by SHA-256), or every
/// one when `all`.
async fn apply_repeatable(
    conn: &mut deadpool_postgres::Object,
    all: bool,
) -> Result<usize, StoreError> {
    let mut count = 0;
    for (name, sql) in REPEATABLE {
        let checksum = Sha256::digest(sql.as_bytes()).to_vec();
        let current: Option<Vec<u8>> = REPEATABLE_CHECKSUM
            .query_opt(&*conn, &[name])
            .await?
            .map(|r| column(&r, "checksum"))
            .transpose()?;
        if !all && current.as_deref() == Some(checksum.as_slice()) {
            continue;
        }
        let tx = conn
            .transaction()
            .await
            .map_err(StoreError::query("begin"))?;
        tx.batch_execute(sql)
            .await
            .map_err(StoreError::query(name))?;
        RECORD_REPEATABLE.execute(&tx, &[name, &checksum]).await?;
        tx.commit().await.map_err(StoreError::query("commit"))?;
        tracing::info!(name, "repeatable migration applied");
        count += 1;
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::scratch::ScratchStore;

    /// The checksum recorded for the task functions.
    async fn task_functions_checksum(store: &Store) -> Vec<u8> {
        let conn = store.conn().await.expect("a connection");
        conn.query_one(
            "SELECT checksum FROM herald.schema_repeatables WHERE name = 'task_functions'",
            &[],
        )
        .await
        .expect("the task functions were recorded")
        .get("checksum")
    }

    #[tokio::test]
    async fn an_older_binary_leaves_a_newer_releases_functions_in_place() {
        let scratch = ScratchStore::migrated().await;
        let store: &Store = &scratch;
        let conn = store.conn().await.expect("a connection");
        // As a newer release leaves the database: a numbered migration this binary lacks, and
        // function text other than this binary's.
        conn.batch_execute(
            "INSERT INTO herald.schema_migrations (version, name) VALUES (99999, 'from_the_future');
             UPDATE herald.schema_repeatables SET checksum = '\\x00'
             WHERE name = 'task_functions'",
        )
        .await
        .expect("the newer release's bookkeeping");
        assert_eq!(run(store).await.expect("migrations run"), 0);
        assert_eq!(task_functions_checksum(store).await, vec![0u8]);
        // Without the newer migration, the text that differs is this binary's to apply.
        conn.batch_execute("DELETE FROM herald.schema_migrations WHERE version = 99999")
            .await
            .expect("forgotten");
        assert_eq!(run(store).await.expect("migrations run"), 1);
        assert_ne!(task_functions_checksum(store).await, vec![0u8]);
    }
}
