//! Versioned schema migrations, embedded in the binary and applied under an advisory lock so
//! that several replicas starting at once apply each migration exactly once.

use super::{Store, StoreError};

/// One migration: its version, a name saying what it does, and its SQL.
struct Migration {
    version: i32,
    name: &'static str,
    sql: &'static str,
}

/// Every migration, in order. Append only; never edit one that has shipped.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "create_tasks",
        sql: include_str!("../../migrations/V1__create_tasks.sql"),
    },
    Migration {
        version: 2,
        name: "add_accounts",
        sql: include_str!("../../migrations/V2__add_accounts.sql"),
    },
    Migration {
        version: 3,
        name: "add_templates",
        sql: include_str!("../../migrations/V3__add_templates.sql"),
    },
    Migration {
        version: 4,
        name: "add_trace_context",
        sql: include_str!("../../migrations/V4__add_trace_context.sql"),
    },
    Migration {
        version: 5,
        name: "add_notifications",
        sql: include_str!("../../migrations/V5__add_notifications.sql"),
    },
    Migration {
        version: 6,
        name: "add_stats_indexes",
        sql: include_str!("../../migrations/V6__add_stats_indexes.sql"),
    },
    Migration {
        version: 7,
        name: "add_schedules_and_campaigns",
        sql: include_str!("../../migrations/V7__add_schedules_and_campaigns.sql"),
    },
    Migration {
        version: 8,
        name: "finish_campaigns",
        sql: include_str!("../../migrations/V8__finish_campaigns.sql"),
    },
    Migration {
        version: 9,
        name: "claim_plan_indexes",
        sql: include_str!("../../migrations/V9__claim_plan_indexes.sql"),
    },
];

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
    let applied: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();

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
    Ok(count)
}
