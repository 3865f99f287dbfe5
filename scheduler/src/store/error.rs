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

    /// True when the transaction lost a race and may simply be run again.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.sql_state(),
            Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
        )
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
