//! PostgreSQL access: the connection pool, migrations, and one repository per aggregate.
//!
//! A repository is a view of any client (a pooled connection or a transaction), reached through
//! [`Db`]: `conn.tasks().get(..)`, `tx.accounts().apply_feedback(..)`. So one transaction can
//! span aggregates (a report moves tasks, records attempts and frees account slots at once)
//! while each aggregate's SQL stays in its own folder, in named `.sql` files beside the Rust that
//! runs them. Errors are classified by SQLSTATE in [`error`], once.

pub mod accounts;
pub(crate) mod arrays;
pub mod audiences;
pub mod bulk;
pub mod campaigns;
pub mod connection;
pub mod deliveries;
mod error;
pub mod executors;
pub mod fanouts;
pub mod history;
pub mod leases;
pub mod migrate;
pub mod notifications;
pub mod retention;
pub mod schedules;
pub mod sql;
pub mod statistics;
pub mod stats;
pub mod storage;
pub mod suppressions;
pub mod tasks;
pub mod templates;
pub mod tls;

pub use error::{Rerun, Retryable, StoreError, WriteError};

use std::time::Duration;

use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Pool, RecyclingMethod};

/// The scheduler's handle on PostgreSQL; cheap to clone.
#[derive(Clone)]
pub struct Store {
    pool: Pool,
    target: connection::Target,
}

/// How often a transaction that failed without committing (it lost a race, or lost its server
/// before COMMIT), or an idempotent one whose commit was in doubt, is run again.
pub const MAX_TRANSACTION_RETRIES: u32 = 3;

/// The pause before running again a transaction that lost its server: doubled each time, so a
/// connection broken by a failover is replaced by one to the new primary when there is one
/// (100, 200, 400 ms), and the caller hears UNAVAILABLE quickly when there is none yet.
pub const SERVER_LOST_BACKOFF: Duration = Duration::from_millis(100);

/// Pins the output type of a transaction's body, so `?` inside it knows the error type.
pub fn body<T, E, F: std::future::Future<Output = Result<T, E>>>(f: F) -> F {
    f
}

/// Runs `$body` in one transaction of `$store`, with a reference to the transaction bound to
/// `$tx`, and commits it when the body returns `Ok`. The body is an expression of type
/// `Result<T, E>` (E converting into `$err`) in which `?` and `return` work as in an `async`
/// block.
///
/// A transaction that certainly did not commit is rolled back and run again, up to
/// [`MAX_TRANSACTION_RETRIES`] times: one that lost a race (serialization failure or deadlock,
/// whether the body or the commit reported it) at once; one whose server went away or turned
/// read-only before COMMIT (a failover) after [`SERVER_LOST_BACKOFF`], on a new connection —
/// the broken one is dropped, not returned to the pool, as is one whose COMMIT went unanswered.
/// So the body must leave nothing behind but its writes: callers act on the result after it
/// returns.
///
/// A transaction whose COMMIT got no answer may have committed ([`StoreError::CommitInDoubt`]).
/// It is run again only when it says `idempotent = true` (or an expression that is true for
/// this call): its writes are fenced or keyed, so applying it twice changes nothing the first
/// run did not (docs/reliability.md lists which are). Otherwise the error goes to the caller,
/// which answers UNAVAILABLE.
///
/// A macro rather than a method taking a closure: a closure over a borrowed transaction makes
/// futures the compiler cannot prove `Send` for every lifetime, which every gRPC handler needs.
macro_rules! transaction {
    ($store:expr, $err:ty, |$tx:ident| $body:expr) => {
        $crate::store::transaction!($store, $err, idempotent = false, |$tx| $body)
    };
    ($store:expr, $err:ty, idempotent = $idempotent:expr, |$tx:ident| $body:expr) => {{
        let store: &$crate::store::Store = &$store;
        let idempotent: bool = $idempotent;
        let mut tries: u32 = 0;
        loop {
            tries += 1;
            let outcome = $crate::store::body::<_, $err, _>(async {
                let mut conn = store.conn().await?;
                let outcome = $crate::store::body::<_, $err, _>(async {
                    let transaction = conn
                        .transaction()
                        .await
                        .map_err($crate::store::StoreError::query("begin"))?;
                    let $tx = &transaction;
                    let value = match async { $body }.await {
                        Ok(value) => value,
                        Err(e) => return Err(<$err>::from(e)),
                    };
                    transaction
                        .commit()
                        .await
                        .map_err($crate::store::StoreError::commit)?;
                    Ok(value)
                })
                .await;
                if let Err(e) = &outcome {
                    if matches!(
                        $crate::store::Retryable::rerun(e),
                        $crate::store::Rerun::ServerLost | $crate::store::Rerun::InDoubt
                    ) {
                        // Open but read-only (a demoted primary), or half dead (its closing
                        // may not have been noticed yet): never reuse it.
                        $crate::store::Store::discard(conn);
                    }
                }
                outcome
            })
            .await;
            let rerun = match &outcome {
                Err(e) if tries <= $crate::store::MAX_TRANSACTION_RETRIES => {
                    $crate::store::Retryable::rerun(e)
                }
                _ => $crate::store::Rerun::Never,
            };
            match rerun {
                $crate::store::Rerun::LostRace => {
                    tracing::debug!(tries, "transaction lost a race; running it again");
                }
                $crate::store::Rerun::ServerLost => {
                    tracing::info!(
                        tries,
                        "transaction lost its database server before commit; running it again"
                    );
                    tokio::time::sleep($crate::store::SERVER_LOST_BACKOFF * (1 << (tries - 1)))
                        .await;
                }
                $crate::store::Rerun::InDoubt if idempotent => {
                    tracing::warn!(
                        tries,
                        "transaction's commit is in doubt; running it again, it is idempotent"
                    );
                    tokio::time::sleep($crate::store::SERVER_LOST_BACKOFF * (1 << (tries - 1)))
                        .await;
                }
                _ => break outcome,
            }
        }
    }};
}
pub(crate) use transaction;

impl Store {
    /// Builds a pool of at most `max_size` connections to `database_url`, with herald's
    /// connection settings ([`connection`]: the primary among the URL's hosts, timeouts,
    /// keepalives). Connections are opened lazily, so this succeeds while the database is down.
    pub fn connect(database_url: &str, max_size: usize) -> Result<Self, ConnectError> {
        let (driver_url, tls) = tls::for_url(database_url)?;
        let config = connection::settings(&driver_url).map_err(ConnectError::InvalidUrl)?;
        Self::with_target(connection::Target::new(config, tls), max_size)
    }

    /// Builds a pool of at most `max_size` connections to `target`, whose settings already
    /// carry herald's (from [`connection::settings`]).
    fn with_target(target: connection::Target, max_size: usize) -> Result<Self, ConnectError> {
        let manager = Manager::from_config(
            target.config().clone(),
            target.tls(),
            ManagerConfig {
                // Fast recycling skips a round trip per checkout; broken connections are still
                // detected because tokio-postgres marks them closed (the server closed them,
                // or a keepalive or the user timeout gave up on them), and a transaction that
                // finds its connection read-only drops it (`transaction!`).
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(max_size)
            // The most recently returned connection first: the pool's default (the longest
            // idle) turns every checkout over to a different backend, so each of them plans
            // the routed claim's functions afresh and none keeps its caches warm.
            .queue_mode(deadpool_postgres::QueueMode::Lifo)
            .wait_timeout(Some(Duration::from_secs(10)))
            .create_timeout(Some(target.open_timeout()))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| ConnectError::Pool(e.to_string()))?;
        Ok(Store { pool, target })
    }

    /// A pooled connection.
    pub async fn conn(&self) -> Result<deadpool_postgres::Object, StoreError> {
        Ok(self.pool.get().await?)
    }

    /// Takes a connection out of the pool for good: it is closed instead of reused.
    pub fn discard(conn: deadpool_postgres::Object) {
        drop(deadpool_postgres::Object::take(conn));
    }

    /// Where the pool connects, for the dedicated connections: the notification listener, the
    /// materialiser's leader lock, the database watch.
    pub fn target(&self) -> &connection::Target {
        &self.target
    }

    /// The connection pool's current state.
    pub fn pool_status(&self) -> deadpool_postgres::Status {
        self.pool.status()
    }

    /// Closes the pool: no new connections are handed out.
    pub fn close(&self) {
        self.pool.close();
    }
}

/// The repositories, on any client: a pooled connection or a transaction.
pub trait Db: GenericClient + Sized {
    /// Tasks, their attempts and idempotency keys.
    fn tasks(&self) -> tasks::TaskRepo<'_, Self> {
        tasks::TaskRepo::new(self)
    }
    /// The lease lifecycle of tasks: claims, reports, extensions, releases and sweeps.
    fn leases(&self) -> leases::LeaseRepo<'_, Self> {
        leases::LeaseRepo::new(self)
    }
    /// Sending accounts and pools.
    fn accounts(&self) -> accounts::AccountRepo<'_, Self> {
        accounts::AccountRepo::new(self)
    }
    /// Providers' delivery reports and the deliveries folded from them.
    fn deliveries(&self) -> deliveries::DeliveryRepo<'_, Self> {
        deliveries::DeliveryRepo::new(self)
    }
    /// Connected executors, their queues and credentials.
    fn executors(&self) -> executors::ExecutorRepo<'_, Self> {
        executors::ExecutorRepo::new(self)
    }
    /// Stored message templates.
    fn templates(&self) -> templates::TemplateRepo<'_, Self> {
        templates::TemplateRepo::new(self)
    }
    /// Recurring schedules and their runs.
    fn schedules(&self) -> schedules::ScheduleRepo<'_, Self> {
        schedules::ScheduleRepo::new(self)
    }
    /// Bulk operations on the tasks a filter selects.
    fn bulk(&self) -> bulk::BulkRepo<'_, Self> {
        bulk::BulkRepo::new(self)
    }
    /// Audiences, their contacts and the fan-outs of runs that target them.
    fn audiences(&self) -> audiences::AudienceRepo<'_, Self> {
        audiences::AudienceRepo::new(self)
    }
    /// Schedule runs still becoming tasks, batch by batch.
    fn fanouts(&self) -> fanouts::FanoutRepo<'_, Self> {
        fanouts::FanoutRepo::new(self)
    }
    /// Campaigns.
    fn campaigns(&self) -> campaigns::CampaignRepo<'_, Self> {
        campaigns::CampaignRepo::new(self)
    }
    /// The suppression list and inbound replies.
    fn suppressions(&self) -> suppressions::SuppressionRepo<'_, Self> {
        suppressions::SuppressionRepo::new(self)
    }
    /// Read-only figures for StatsService and the dashboard.
    fn stats(&self) -> stats::StatsRepo<'_, Self> {
        stats::StatsRepo::new(self)
    }
    /// The notification outbox and live counts telemetry reads.
    fn notifications(&self) -> notifications::NotificationRepo<'_, Self> {
        notifications::NotificationRepo::new(self)
    }
    /// Finished tasks moved out of the hot table, and back.
    fn history(&self) -> history::HistoryRepo<'_, Self> {
        history::HistoryRepo::new(self)
    }
    /// Pruning of what outlived its retention.
    fn retention(&self) -> retention::RetentionRepo<'_, Self> {
        retention::RetentionRepo::new(self)
    }
    /// Planner statistics of the busiest tables.
    fn statistics(&self) -> statistics::StatisticsRepo<'_, Self> {
        statistics::StatisticsRepo::new(self)
    }
    /// Table sizes and the transaction that holds VACUUM back.
    fn storage(&self) -> storage::StorageRepo<'_, Self> {
        storage::StorageRepo::new(self)
    }
}

impl<C: GenericClient> Db for C {}

/// Declares a repository type: a borrowed client and a constructor.
macro_rules! repository {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        pub struct $name<'c, C> {
            db: &'c C,
        }

        impl<'c, C: deadpool_postgres::GenericClient> $name<'c, C> {
            /// The repository on `db`.
            pub fn new(db: &'c C) -> Self {
                $name { db }
            }
        }
    };
}
pub(crate) use repository;

/// The database URL could not be turned into a pool.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// DATABASE_URL does not parse.
    #[error("invalid DATABASE_URL: {0}")]
    InvalidUrl(#[source] tokio_postgres::Error),
    /// The pool could not be built.
    #[error("cannot build the connection pool: {0}")]
    Pool(String),
    /// The TLS settings for the database are unusable.
    #[error(transparent)]
    Tls(#[from] tls::DbTlsError),
}

#[cfg(test)]
pub(crate) mod scratch;

#[cfg(test)]
mod tests {
    use super::scratch::ScratchStore;
    use super::*;

    /// A store on a database of its own with a `tries` table for the retry tests.
    async fn store() -> ScratchStore {
        let store = ScratchStore::new().await;
        let conn = store.conn().await.unwrap_or_else(|e| panic!("{e}"));
        conn.batch_execute("CREATE TABLE tries (n integer)")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        store
    }

    /// Raises `sqlstate` the first `fail` times it runs in a transaction, counted by a sequence
    /// (not rolled back with it); writes a row each time.
    async fn attempt(
        tx: &deadpool_postgres::Transaction<'_>,
        sqlstate: &str,
        fail: i64,
    ) -> Result<i64, StoreError> {
        let row = tx
            .query_one("SELECT nextval('attempts') AS n", &[])
            .await
            .map_err(StoreError::query("counting"))?;
        let n: i64 = row.get("n");
        tx.execute("INSERT INTO tries VALUES ($1)", &[&(n as i32)])
            .await
            .map_err(StoreError::query("writing"))?;
        if n <= fail {
            tx.batch_execute(&format!(
                "DO $$ BEGIN RAISE EXCEPTION 'lost a race' USING ERRCODE = '{sqlstate}'; END $$"
            ))
            .await
            .map_err(StoreError::query("racing"))?;
        }
        Ok(n)
    }

    async fn rows(store: &Store) -> i64 {
        let conn = store.conn().await.unwrap_or_else(|e| panic!("{e}"));
        conn.query_one("SELECT count(*) AS n FROM tries", &[])
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .get("n")
    }

    #[tokio::test]
    async fn a_transaction_that_lost_a_race_runs_again_and_keeps_only_its_last_writes() {
        let store = store().await;
        let conn = store.conn().await.unwrap_or_else(|e| panic!("{e}"));
        conn.batch_execute("CREATE SEQUENCE attempts")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // A serialization failure, then a deadlock, then success.
        let mut states = ["40001", "40P01"].into_iter();
        let result = transaction!(store, StoreError, |tx| {
            match states.next() {
                Some(state) => attempt(tx, state, i64::MAX).await,
                None => attempt(tx, "00000", 0).await,
            }
        });
        assert_eq!(result.ok(), Some(3));
        assert_eq!(rows(&store).await, 1, "the failed tries were rolled back");
    }

    #[tokio::test]
    async fn other_failures_are_not_retried_and_unique_violations_are_classified() {
        let store = store().await;
        let conn = store.conn().await.unwrap_or_else(|e| panic!("{e}"));
        conn.batch_execute("CREATE SEQUENCE attempts")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let result = transaction!(store, StoreError, |tx| attempt(tx, "23505", 10).await);
        let Err(e) = result else {
            panic!("a unique violation committed")
        };
        assert!(e.is_unique_violation() && !e.is_retryable(), "{e}");
        assert_eq!(rows(&store).await, 0);
        let tries = conn
            .query_one("SELECT last_value FROM attempts", &[])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(tries.get::<_, i64>("last_value"), 1, "ran once");
    }

    #[tokio::test]
    async fn a_race_lost_every_time_gives_up_after_the_retries() {
        let store = store().await;
        let conn = store.conn().await.unwrap_or_else(|e| panic!("{e}"));
        conn.batch_execute("CREATE SEQUENCE attempts")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let result = transaction!(store, StoreError, |tx| attempt(tx, "40001", i64::MAX).await);
        assert!(result.is_err_and(|e| e.is_retryable()));
        let tries = conn
            .query_one("SELECT last_value FROM attempts", &[])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            tries.get::<_, i64>("last_value"),
            i64::from(MAX_TRANSACTION_RETRIES) + 1
        );
    }

    /// A pooled session on the test cluster's admin database, as `Store::connect` opens it.
    async fn admin_conn() -> deadpool_postgres::Object {
        let admin = std::env::var("HERALD_TEST_PG_URL")
            .unwrap_or_else(|_| panic!("HERALD_TEST_PG_URL is not set; run script/test"));
        let store = Store::connect(&admin, 1).unwrap_or_else(|e| panic!("{e}"));
        store.conn().await.unwrap_or_else(|e| panic!("{e}"))
    }

    #[tokio::test]
    async fn pooled_sessions_never_jit_compile() {
        let conn = admin_conn().await;
        let jit: String = conn
            .query_one("SHOW jit", &[])
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .get(0);
        assert_eq!(jit, "off");
    }

    #[tokio::test]
    async fn columns_are_found_by_name_in_any_order_and_a_missing_one_is_named() {
        let conn = admin_conn().await;
        let row = conn
            .query_one("SELECT 1::int4 AS a, 'x'::text AS b, 3::int4 AS c", &[])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut columns = sql::Columns::new(&row);
        // In order, then back to the first, then past the end and round again.
        assert_eq!(columns.get::<i32>("a").ok(), Some(1));
        assert_eq!(columns.get::<&str>("b").ok(), Some("x"));
        assert_eq!(columns.get::<i32>("a").ok(), Some(1));
        assert_eq!(columns.get::<i32>("c").ok(), Some(3));
        assert_eq!(columns.get::<&str>("b").ok(), Some("x"));
        let missing = columns.get::<i32>("d").err().map(|e| e.to_string());
        assert!(
            missing.as_deref().is_some_and(|m| m.contains("column d")),
            "{missing:?}"
        );
        let mistyped = columns.get::<i32>("b").err().map(|e| e.to_string());
        assert!(
            mistyped.as_deref().is_some_and(|m| m.contains("column b")),
            "{mistyped:?}"
        );
    }

    #[tokio::test]
    async fn a_transaction_whose_server_turned_read_only_runs_again_on_a_fresh_connection() {
        let store = store().await;
        let conn = store.conn().await.unwrap_or_else(|e| panic!("{e}"));
        conn.batch_execute("CREATE SEQUENCE attempts; CREATE TABLE pids (pid integer)")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // "cannot execute INSERT in a read-only transaction": a primary demoted under its
        // connections. The connection is dropped, so the second run gets another backend.
        let result = transaction!(store, StoreError, |tx| {
            tx.execute("INSERT INTO pids VALUES (pg_backend_pid())", &[])
                .await
                .map_err(StoreError::query("pid"))?;
            attempt(tx, "25006", 1).await
        });
        assert_eq!(result.ok(), Some(2));
        assert_eq!(rows(&store).await, 1, "the failed try was rolled back");
        let pids: i64 = conn
            .query_one("SELECT count(DISTINCT pid) AS pids FROM pids", &[])
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .get("pids");
        assert_eq!(pids, 1, "only the second run's row is kept");
        assert_eq!(
            store.pool_status().size,
            2,
            "one connection replaced, not reused"
        );
    }

    #[tokio::test]
    async fn a_commit_in_doubt_runs_again_only_when_the_transaction_is_idempotent() {
        let store = store().await;
        let conn = store.conn().await.unwrap_or_else(|e| panic!("{e}"));
        // The first COMMIT after each RESTART kills its own backend before answering: the
        // client cannot know whether it committed (here it did not).
        conn.batch_execute(
            "CREATE SEQUENCE attempts;
             CREATE SEQUENCE kill_once;
             CREATE FUNCTION die_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF nextval('kill_once') = 1 THEN
                     PERFORM pg_terminate_backend(pg_backend_pid());
                 END IF;
                 RETURN NULL;
             END $$;
             CREATE CONSTRAINT TRIGGER die_at_commit AFTER INSERT ON tries
                 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION die_at_commit();",
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let result = transaction!(store, StoreError, |tx| attempt(tx, "00000", 0).await);
        assert!(
            matches!(result, Err(StoreError::CommitInDoubt { .. })),
            "{result:?}"
        );
        assert!(result.is_err_and(|e| e.is_unavailable() && !e.is_retryable()));
        assert_eq!(rows(&store).await, 0, "not run again");

        conn.batch_execute("ALTER SEQUENCE kill_once RESTART")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let result = transaction!(store, StoreError, idempotent = true, |tx| attempt(
            tx, "00000", 0
        )
        .await);
        assert_eq!(result.ok(), Some(3), "the idempotent one ran again");
        assert_eq!(rows(&store).await, 1);
    }
}
