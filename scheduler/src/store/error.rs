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
    /// COMMIT was sent and no verdict came back: the connection died (or the server was shut
    /// down) before it answered, so the transaction may or may not have committed.
    #[error(
        "database connection lost while committing; the change may or may not have been \
         applied: {}",
        detail(source)
    )]
    CommitInDoubt {
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// A row held a value this build cannot interpret.
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// The database answered what the transaction's own locks and inputs rule out (a row it
    /// locked that its update then did not find, a kept assignment it never asked for); the
    /// transaction is rolled back rather than committed.
    #[error("inconsistent answer: {0}")]
    Inconsistent(String),
}

/// What a failed transaction's error says about running it again; decided here, once, for
/// the [`super::transaction`] macro.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rerun {
    /// Running it again cannot help: the request or the data is at fault, or no connection
    /// could be opened (the pool already waited its timeouts).
    Never,
    /// It did not commit: it lost a race (serialization failure, deadlock). Run it again at once.
    LostRace,
    /// It did not commit: its server went away or stopped accepting writes before COMMIT was
    /// sent (a failover, a restart, a primary demoted to a standby). Run it again on a new
    /// connection, which finds the primary, after a short pause.
    ServerLost,
    /// COMMIT was sent and no verdict came back: it may have committed. Only a transaction that
    /// is harmless to apply twice may run again (see `docs/reliability.md`).
    InDoubt,
}

impl StoreError {
    /// Wraps a driver error with what the store was doing.
    pub(crate) fn query(context: &'static str) -> impl FnOnce(tokio_postgres::Error) -> Self {
        move |source| StoreError::Query { context, source }
    }

    /// Whether PostgreSQL refused a text value it cannot store (a NUL character in `text`, or
    /// `\u0000` in `jsonb`): the request's fault, not the database's, for a field no check
    /// caught.
    pub fn is_unstorable_text(&self) -> bool {
        matches!(
            self.sql_state(),
            Some(c) if *c == SqlState::CHARACTER_NOT_IN_REPERTOIRE
                || *c == SqlState::UNTRANSLATABLE_CHARACTER
        )
    }

    /// The SQLSTATE of a failed statement, if the server sent one.
    pub fn sql_state(&self) -> Option<&SqlState> {
        match self {
            StoreError::Query { source, .. } => source.code(),
            _ => None,
        }
    }

    /// Classifies a failed COMMIT: a verdict from the server (a serialization failure, a
    /// deferred constraint) is an ordinary statement error, since the server rolled back; a
    /// lost connection or a shutdown while waiting for the answer leaves the outcome unknown.
    /// (A backend terminated while it waits for its synchronous standby has committed locally
    /// and says so in a warning before the FATAL: in doubt too.)
    pub(crate) fn commit(source: tokio_postgres::Error) -> Self {
        if server_lost(&source) {
            StoreError::CommitInDoubt { source }
        } else {
            StoreError::Query {
                context: "commit",
                source,
            }
        }
    }

    /// True when the failure is about reaching the database rather than the request: callers
    /// answer UNAVAILABLE and clients may retry (with the same idempotency key when the commit
    /// was in doubt).
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Pool(_) | StoreError::CommitInDoubt { .. } => true,
            StoreError::Query { source, .. } => {
                server_lost(source)
                    || source.code() == Some(&SqlState::TOO_MANY_CONNECTIONS)
                    || source.code().is_none()
            }
            StoreError::Corrupt(_) | StoreError::Inconsistent(_) => false,
        }
    }

    /// What this failure says about running its transaction again.
    pub fn rerun(&self) -> Rerun {
        match self {
            StoreError::Query { source, .. } => match source.code() {
                Some(c)
                    if *c == SqlState::T_R_SERIALIZATION_FAILURE
                        || *c == SqlState::T_R_DEADLOCK_DETECTED =>
                {
                    Rerun::LostRace
                }
                _ if server_lost(source) => Rerun::ServerLost,
                _ => Rerun::Never,
            },
            StoreError::CommitInDoubt { .. } => Rerun::InDoubt,
            StoreError::Pool(_) | StoreError::Corrupt(_) | StoreError::Inconsistent(_) => {
                Rerun::Never
            }
        }
    }

    /// True when the transaction certainly did not commit and running it again may succeed:
    /// it lost a race, or lost its server before COMMIT.
    pub fn is_retryable(&self) -> bool {
        matches!(self.rerun(), Rerun::LostRace | Rerun::ServerLost)
    }

    /// True when a unique constraint refused the write: the thing already exists.
    pub fn is_unique_violation(&self) -> bool {
        self.sql_state() == Some(&SqlState::UNIQUE_VIOLATION)
    }
}

/// True when `e` says the server is gone or no longer takes writes on this connection: the
/// connection closed (the server died, a network failure, a keepalive or user timeout), the
/// server is shutting down or starting, or it is read-only (a standby, a demoted primary).
fn server_lost(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>()) {
        return true;
    }
    matches!(
        e.code(),
        Some(c) if *c == SqlState::ADMIN_SHUTDOWN
            || *c == SqlState::CRASH_SHUTDOWN
            || *c == SqlState::CANNOT_CONNECT_NOW
            || *c == SqlState::READ_ONLY_SQL_TRANSACTION
            || c.code().starts_with("08")
    )
}

/// Errors that may wrap a store error, classified for the [`super::transaction`] macro.
pub trait Retryable {
    /// What the failure says about running the whole transaction again.
    fn rerun(&self) -> Rerun;

    /// True when running the whole transaction again may succeed and cannot apply it twice.
    fn is_retryable(&self) -> bool {
        matches!(self.rerun(), Rerun::LostRace | Rerun::ServerLost)
    }
}

impl Retryable for StoreError {
    fn rerun(&self) -> Rerun {
        StoreError::rerun(self)
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
