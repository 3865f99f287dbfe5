//! PostgreSQL access: the connection pool, migrations, and one module per aggregate. SQL lives
//! in `queries/*.sql`, prepared once per connection.

pub mod accounts;
pub mod campaigns;
pub mod claim;
mod error;
pub mod leases;
pub mod migrate;
pub mod retention;
pub mod schedules;
pub mod stats;
pub mod tasks;
pub mod telemetry;
pub mod templates;

pub use error::StoreError;

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};

/// The scheduler's handle on PostgreSQL; cheap to clone.
#[derive(Clone)]
pub struct Store {
    pool: Pool,
    config: tokio_postgres::Config,
    /// Namespaces seen without accounts, so claims can take the one-statement path.
    no_accounts: claim::NoAccountsCache,
}

impl Store {
    /// Builds a pool of at most `max_size` connections to `database_url`. Connections are opened
    /// lazily, so this succeeds while the database is down.
    pub fn connect(database_url: &str, max_size: usize) -> Result<Self, ConnectError> {
        let config: tokio_postgres::Config =
            database_url.parse().map_err(ConnectError::InvalidUrl)?;
        let manager = Manager::from_config(
            config.clone(),
            tokio_postgres::NoTls,
            ManagerConfig {
                // Fast recycling skips a round trip per checkout; broken connections are still
                // detected because tokio-postgres marks them closed.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(max_size)
            .wait_timeout(Some(Duration::from_secs(10)))
            .create_timeout(Some(Duration::from_secs(5)))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| ConnectError::Pool(e.to_string()))?;
        Ok(Store {
            pool,
            config,
            no_accounts: claim::NoAccountsCache::default(),
        })
    }

    /// A pooled connection.
    pub async fn conn(&self) -> Result<deadpool_postgres::Object, StoreError> {
        Ok(self.pool.get().await?)
    }

    /// The parsed connection settings, for the dedicated LISTEN connection.
    pub fn pg_config(&self) -> &tokio_postgres::Config {
        &self.config
    }

    /// Answers whether the database is reachable now (readiness).
    pub async fn ping(&self) -> Result<(), StoreError> {
        let conn = self.conn().await?;
        conn.simple_query("SELECT 1")
            .await
            .map_err(StoreError::query("checking the database"))?;
        Ok(())
    }

    /// Closes the pool: no new connections are handed out.
    pub fn close(&self) {
        self.pool.close();
    }
}

/// The database URL could not be turned into a pool.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// DATABASE_URL does not parse.
    #[error("invalid DATABASE_URL: {0}")]
    InvalidUrl(#[source] tokio_postgres::Error),
    /// The pool could not be built.
    #[error("cannot build the connection pool: {0}")]
    Pool(String),
}
