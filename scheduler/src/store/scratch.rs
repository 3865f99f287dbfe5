//! A store on a database of its own on the test cluster, for the store's tests that need a real
//! PostgreSQL: created empty (or migrated) per test, dropped when the test ends.

use super::Store;

/// A store on a database of its own, dropped when the test ends, passed or failed.
pub(crate) struct ScratchStore {
    store: Store,
    admin: String,
    name: String,
}

impl std::ops::Deref for ScratchStore {
    type Target = Store;
    fn deref(&self) -> &Store {
        &self.store
    }
}

impl Drop for ScratchStore {
    fn drop(&mut self) {
        let (admin, name) = (self.admin.clone(), self.name.clone());
        // Drop cannot await, and the test's runtime may be ending: a runtime of its own.
        // FORCE ends the pool's sessions, still open here.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            runtime.block_on(async {
                let (client, connection) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
                    .await
                    .ok()?;
                tokio::spawn(connection);
                client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await
                    .ok()
            })
        });
        let _ = dropped.join();
    }
}

impl ScratchStore {
    /// A database of its own on the test cluster (`HERALD_TEST_PG_URL`, set by `script/test`).
    pub(crate) async fn new() -> ScratchStore {
        Self::created_with("").await
    }

    /// A database of its own whose default collation is the ICU locale `locale` (`en-US`, say):
    /// text sorts linguistically there, as on many production databases, not byte by byte as
    /// on the test cluster.
    pub(crate) async fn with_icu_collation(locale: &str) -> ScratchStore {
        // Locale names are letters, digits and dashes; nothing else is formatted in.
        assert!(
            locale
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-'),
            "not a locale name: {locale}"
        );
        Self::created_with(&format!(
            " TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE '{locale}'"
        ))
        .await
    }

    /// A database of its own, created with `options` after its name.
    async fn created_with(options: &str) -> ScratchStore {
        let admin = std::env::var("HERALD_TEST_PG_URL")
            .unwrap_or_else(|_| panic!("HERALD_TEST_PG_URL is not set; run script/test"));
        let name = format!("t_store_{}", uuid::Uuid::new_v4().simple());
        let (client, connection) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("connecting to {admin}: {e}"));
        tokio::spawn(connection);
        client
            .batch_execute(&format!("CREATE DATABASE {name}{options}"))
            .await
            .unwrap_or_else(|e| panic!("creating {name}: {e}"));
        // herald's own session settings, as `Store::connect` gives every replica.
        let mut config =
            super::connection::settings(&admin).unwrap_or_else(|e| panic!("{admin}: {e}"));
        config.dbname(&name);
        let tls = super::tls::connector(false, None).unwrap_or_else(|e| panic!("tls: {e}"));
        let store = Store::with_target(super::connection::Target::new(config, tls), 2)
            .unwrap_or_else(|e| panic!("pool: {e}"));
        ScratchStore { store, admin, name }
    }

    /// A database of its own with herald's migrations applied.
    pub(crate) async fn migrated() -> ScratchStore {
        Self::new().await.with_migrations().await
    }

    /// This database with herald's migrations applied.
    pub(crate) async fn with_migrations(self) -> ScratchStore {
        super::migrate::run(&self)
            .await
            .unwrap_or_else(|e| panic!("migrating {}: {e}", self.name));
        self
    }
}

/// Inserts `n` tasks in `state` (with a lease's columns filled in, whatever the state), due ten
/// minutes ago on the default route, and has the session's counts reach the statistics system
/// before its next statement (they otherwise wait up to a second).
pub(crate) async fn insert_tasks(conn: &deadpool_postgres::Object, n: i32, state: &str) {
    conn.batch_execute(&format!(
        "INSERT INTO herald.tasks (id, queue, recipient, content, priority, run_at,
             max_attempts, backoff_initial_ms, backoff_max_ms, backoff_multiplier,
             backoff_jitter, route, state, lease_count, executor_id, leased_at,
             lease_expires_at)
         SELECT gen_random_uuid(), 'q', 'r' || i, '\\x00', 5,
                now() - interval '10 minutes' + i * interval '1 ms', 10, 1000, 60000, 2, 0.2,
                'default/', '{state}', 1, 'x', now(), now() + interval '1 hour'
         FROM generate_series(1, {n}) AS i;
         SELECT pg_stat_force_next_flush();"
    ))
    .await
    .unwrap_or_else(|e| panic!("inserting {n} {state} tasks: {e}"));
}

/// Rows the plan of `sql` read and threw away (its filters' and join filters' removals, summed
/// over every node), from `EXPLAIN ANALYZE` in a transaction rolled back after: a statement
/// planned as a walk instead of the probes it needs discards what it walked past.
pub(crate) async fn rows_discarded(
    conn: &mut deadpool_postgres::Object,
    sql: &str,
    params: &super::sql::Params<'_>,
) -> i64 {
    fn sum(node: &serde_json::Value) -> i64 {
        let own: i64 = ["Rows Removed by Filter", "Rows Removed by Join Filter"]
            .iter()
            .filter_map(|k| node.get(*k).and_then(serde_json::Value::as_i64))
            .sum();
        let children = node
            .get("Plans")
            .and_then(serde_json::Value::as_array)
            .map_or(0, |plans| plans.iter().map(sum).sum());
        own + children
    }
    let tx = conn.transaction().await.unwrap_or_else(|e| panic!("{e}"));
    let explained: serde_json::Value = tx
        .query_one(&format!("EXPLAIN (ANALYZE, FORMAT JSON) {sql}"), params)
        .await
        .unwrap_or_else(|e| panic!("{e}: {sql}"))
        .get(0);
    tx.rollback().await.unwrap_or_else(|e| panic!("{e}"));
    sum(&explained[0]["Plan"])
}

/// A role that owns nothing, which a session acts as between [`OtherRole::assume`] and
/// [`OtherRole::leave`]: what herald's jobs do when the scheduler's role does not own its tables.
pub(crate) struct OtherRole(String);

impl OtherRole {
    /// Makes the role (allowed into the `herald` schema, owning nothing) and has `conn` act as
    /// it.
    pub(crate) async fn assume(conn: &deadpool_postgres::Object) -> OtherRole {
        let role = format!("r_{}", uuid::Uuid::new_v4().simple());
        conn.batch_execute(&format!(
            "CREATE ROLE {role} NOLOGIN; GRANT USAGE ON SCHEMA herald TO {role}; SET ROLE {role}"
        ))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        OtherRole(role)
    }

    /// Has `conn` act as itself again and drops the role.
    pub(crate) async fn leave(self, conn: &deadpool_postgres::Object) {
        let role = self.0;
        conn.batch_execute(&format!(
            "RESET ROLE; REVOKE USAGE ON SCHEMA herald FROM {role}; DROP ROLE {role}"
        ))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }
}
