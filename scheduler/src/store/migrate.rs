//! Versioned schema migrations, embedded in the binary and applied under an advisory lock so
//! that several replicas starting at once apply each migration exactly once.

use super::sql::column;
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
const REPEATABLE: &[(&str, &str)] = &[("account_functions", super::accounts::FUNCTIONS_SQL)];

/// Arbitrary but fixed: the advisory lock key that serialises migrations across replicas.
const MIGRATION_LOCK_KEY: i64 = 0x6865_7261_6c64_0001;

/// Applies every migration not yet applied and returns how many ran.
pub async fn run(store: &Store) -> Result<usize, StoreError> {
    let mut conn = store.conn().await?;
    // Session-level lock: held across the transactions below, released even if we crash because
    // the connection closes.
    conn.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK_KEY])
        .await
        .map_err(StoreError::query("taking the migration lock"))?;
    let result = apply_pending(&mut conn).await;
    let unlock = conn
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK_KEY])
        .await
        .map_err(StoreError::query("releasing the migration lock"));
    let applied = result?;
    unlock?;
    Ok(applied)
}

async fn apply_pending(conn: &mut deadpool_postgres::Object) -> Result<usize, StoreError> {
    conn.batch_execute(
        "CREATE SCHEMA IF NOT EXISTS herald;
         CREATE TABLE IF NOT EXISTS herald.schema_migrations (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         );",
    )
    .await
    .map_err(StoreError::query("creating the migrations table"))?;
    let rows = conn
        .query("SELECT version FROM herald.schema_migrations", &[])
        .await
        .map_err(StoreError::query("reading applied migrations"))?;
    let applied: Vec<i32> = rows
        .iter()
        .map(|r| column(r, "version"))
        .collect::<Result<_, _>>()?;

    let mut count = 0;
    for migration in MIGRATIONS.iter().filter(|m| !applied.contains(&m.version)) {
        let tx = conn
            .transaction()
            .await
            .map_err(StoreError::query("starting a migration"))?;
        tx.batch_execute(migration.sql)
            .await
            .map_err(StoreError::query("applying a migration"))?;
        tx.execute(
            "INSERT INTO herald.schema_migrations (version, name) VALUES ($1, $2)",
            &[&migration.version, &migration.name],
        )
        .await
        .map_err(StoreError::query("recording a migration"))?;
        tx.commit()
            .await
            .map_err(StoreError::query("committing a migration"))?;
        tracing::info!(
            version = migration.version,
            name = migration.name,
            "migration applied"
        );
        count += 1;
    }
    count += apply_repeatable(conn).await?;
    Ok(count)
}

/// Applies each repeatable whose text differs from what was applied last (by SHA-256).
async fn apply_repeatable(conn: &mut deadpool_postgres::Object) -> Result<usize, StoreError> {
    use sha2::{Digest, Sha256};
    conn.batch_execute(
        "CREATE TABLE IF NOT EXISTS herald.schema_repeatables (
             name       text PRIMARY KEY,
             checksum   bytea NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         );",
    )
    .await
    .map_err(StoreError::query("creating the repeatables table"))?;
    let mut count = 0;
    for (name, sql) in REPEATABLE {
        let checksum = Sha256::digest(sql.as_bytes()).to_vec();
        let current: Option<Vec<u8>> = conn
            .query_opt(
                "SELECT checksum FROM herald.schema_repeatables WHERE name = $1",
                &[name],
            )
            .await
            .map_err(StoreError::query("reading a repeatable's checksum"))?
            .map(|r| column(&r, "checksum"))
            .transpose()?;
        if current.as_deref() == Some(checksum.as_slice()) {
            continue;
        }
        let tx = conn
            .transaction()
            .await
            .map_err(StoreError::query("starting a repeatable"))?;
        tx.batch_execute(sql)
            .await
            .map_err(StoreError::query("applying a repeatable"))?;
        tx.execute(
            "INSERT INTO herald.schema_repeatables (name, checksum) VALUES ($1, $2)
             ON CONFLICT (name) DO UPDATE SET checksum = $2, applied_at = now()",
            &[name, &checksum],
        )
        .await
        .map_err(StoreError::query("recording a repeatable"))?;
        tx.commit()
            .await
            .map_err(StoreError::query("committing a repeatable"))?;
        tracing::info!(name, "repeatable migration applied");
        count += 1;
    }
    Ok(count)
}
