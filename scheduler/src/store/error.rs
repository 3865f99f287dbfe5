//! Store errors, with PostgreSQL failures classified by SQLSTATE in one place.

use tokio_postgres::error::SqlState;

/// What went wrong talking to PostgreSQL, classified for the callers that decide on it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The pool could not hand out a connection (database down, pool exhausted, timeout).
    #[error("database unavailable: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    /// A statement failed.
    #[error("database error while {context}: {}", detail(source))]
    Query {
        /// What the store was doing.
        context: &'static str,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// A row held a value this build cannot interpret.
    #[error("corrupt row: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// Wraps a driver error with what the store was doing.
    pub(crate) fn query(context: &'static str) -> impl FnOnce(tokio_postgres::Error) -> Self {
        move |source| StoreError::Query { context, source }
    }

    /// The SQLSTATE of a failed statement, if the server sent one.
    pub fn sql_state(&self) -> Option<&SqlState> {
        match self {
            StoreError::Query { source, .. } => source.code(),
            _ => None,
        }
    }

    /// True when the failure is about reaching the database rather than the request: callers
    /// answer UNAVAILABLE and clients may retry.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Pool(_) => true,
            StoreError::Query { source, .. } => {
                source.is_closed()
                    || matches!(
                        source.code(),
                        Some(c) if *c == SqlState::ADMIN_SHUTDOWN
                            || *c == SqlState::CRASH_SHUTDOWN
                            || *c == SqlState::CANNOT_CONNECT_NOW
                            || *c == SqlState::CONNECTION_FAILURE
                            || *c == SqlState::CONNECTION_EXCEPTION
                            || *c == SqlState::TOO_MANY_CONNECTIONS
                    )
                    || source.code().is_none()
            }
            StoreError::Corrupt(_) => false,
        }
    }

    /// True when the transaction lost a race (serialization failure, deadlock) and may simply
    /// be run again: [`super::Store::transaction`] does so.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.sql_state(),
            Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
        )
    }

    /// True when a unique constraint refused the write: the thing already exists.
    pub fn is_unique_violation(&self) -> bool {
        self.sql_state() == Some(&SqlState::UNIQUE_VIOLATION)
    }
}

/// Errors that may wrap a store error that is worth running the transaction again for.
pub trait Retryable {
    /// True when running the whole transaction again may succeed.
    fn is_retryable(&self) -> bool;
}

impl Retryable for StoreError {
    fn is_retryable(&self) -> bool {
        StoreError::is_retryable(self)
    }
}

/// The server's message when there is one: tokio-postgres's own Display only says "db error".
fn detail(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => match db.detail() {
            Some(d) => format!("{} ({}: {d})", db.message(), db.code().code()),
            None => format!("{} ({})", db.message(), db.code().code()),
        },
        None => e.to_string(),
    }
}

/// Why a write of a named thing (account, pool, template, schedule) was refused.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The id or name is taken.
    #[error("{0} already exists")]
    AlreadyExists(String),
    /// The thing to change does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// Something still depends on it.
    #[error("{0}")]
    InUse(String),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl WriteError {
    /// Maps a unique violation of an insert to [`WriteError::AlreadyExists`] naming `what`.
    pub fn from_insert(e: StoreError, what: impl FnOnce() -> String) -> Self {
        if e.is_unique_violation() {
            WriteError::AlreadyExists(what())
        } else {
            WriteError::Store(e)
        }
    }
}
