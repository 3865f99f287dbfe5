//! The service error: every way a request can fail, independent of the wire. `api/status.rs`
//! maps it to a gRPC status, once; the dashboard maps it to an HTTP answer.

use crate::store::{Rerun, Retryable, StoreError, WriteError};

/// One invalid field: its path in the request (`task.recipient`, `tasks[3].queue`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    /// Path of the field in the request.
    pub field: String,
    /// What is wrong with it.
    pub description: String,
}

/// Field violations collected while checking a request, so one answer names every bad field.
#[derive(Debug, Default)]
pub struct Violations(Vec<FieldViolation>);

impl Violations {
    /// Records that `field` is invalid.
    pub fn add(&mut self, field: impl Into<String>, description: impl Into<String>) {
        self.0.push(FieldViolation {
            field: field.into(),
            description: description.into(),
        });
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many violations were recorded.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The violations recorded so far.
    pub fn as_slice(&self) -> &[FieldViolation] {
        &self.0
    }

    /// The paths of the invalid fields, in the order they were found.
    pub fn into_fields(self) -> Vec<String> {
        self.0.into_iter().map(|v| v.field).collect()
    }

    /// Keeps only the violations `keep` accepts.
    pub fn retain(&mut self, keep: impl FnMut(&FieldViolation) -> bool) {
        self.0.retain(keep);
    }

    /// `Ok(value)` when nothing was recorded, else INVALID_ARGUMENT naming every field.
    pub fn into_result<T>(self, value: T) -> Result<T, Error> {
        if self.0.is_empty() {
            Ok(value)
        } else {
            Err(Error::InvalidArgument(self.0))
        }
    }

    /// INVALID_ARGUMENT naming every recorded field.
    pub fn into_error(self) -> Error {
        Error::InvalidArgument(self.0)
    }
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed; nothing was written.
    #[error("invalid request: {}", describe(.0))]
    InvalidArgument(Vec<FieldViolation>),
    /// The named thing does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// An idempotency key (or other unique name) is taken.
    #[error("{0}")]
    AlreadyExists(String),
    /// The target is in a state that does not allow the call.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The caller did not say who it is, or said it badly.
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller may not do this.
    #[error("{0}")]
    PermissionDenied(String),
    /// The caller asked for too much, too often or too large.
    #[error("{0}")]
    ResourceExhausted(String),
    /// This replica cannot serve the call now (shutting down, database unreachable); another
    /// replica or a later try may.
    #[error("{0}")]
    Unavailable(String),
    /// The caller did not do its part in time (no Hello on a lease stream).
    #[error("{0}")]
    DeadlineExceeded(String),
    /// The peer went away.
    #[error("{0}")]
    Cancelled(String),
    /// The database failed. Its text is logged, never sent to clients.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Error {
    /// INVALID_ARGUMENT about one field.
    pub fn invalid(field: impl Into<String>, description: impl Into<String>) -> Self {
        let mut v = Violations::default();
        v.add(field, description);
        v.into_error()
    }
}

impl Retryable for Error {
    fn rerun(&self) -> Rerun {
        match self {
            Error::Store(e) => e.rerun(),
            _ => Rerun::Never,
        }
    }
}

/// Every violation as `field: description`, joined.
pub fn describe(violations: &[FieldViolation]) -> String {
    violations
        .iter()
        .map(|v| format!("{}: {}", v.field, v.description))
        .collect::<Vec<_>>()
        .join("; ")
}

impl From<WriteError> for Error {
    fn from(e: WriteError) -> Self {
        match e {
            WriteError::AlreadyExists(what) => {
                Error::AlreadyExists(format!("{what} already exists"))
            }
            WriteError::NotFound(what) => Error::NotFound(what),
            WriteError::InUse(m) => Error::FailedPrecondition(m),
            WriteError::Store(e) => Error::Store(e),
        }
    }
}
