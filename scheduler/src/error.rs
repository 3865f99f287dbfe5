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

    /// Runs `check`, which records fields relative to one part of the request (`queue`,
    /// `retry_policy.exponential.initial`, or `` for the part itself), and puts `parent()`
    /// (`tasks[3]`) in front of each. The parent's path is built only when something was
    /// recorded: valid input, the common case, formats no path at all (the create path checks
    /// a thousand specs a call, and building their paths up front was a tenth of its CPU).
    pub fn under<T>(
        &mut self,
        parent: impl FnOnce() -> String,
        check: impl FnOnce(&mut Self) -> T,
    ) -> T {
        let before = self.0.len();
        let checked = check(self);
        if self.0.len() > before {
            let parent = parent();
            for violation in &mut self.0[before..] {
                violation.field = join_path(&parent, &violation.field);
            }
        }
        checked
    }
}

/// `field` under `parent`: `tasks[3]` and `queue` make `tasks[3].queue`, an index or a map key
/// (`[2]`) joins without a dot, and an empty field is the parent itself.
fn join_path(parent: &str, field: &str) -> String {
    if field.is_empty() {
        parent.to_owned()
    } else if field.starts_with('[') {
        format!("{parent}{field}")
    } else {
        format!("{parent}.{field}")
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
    /// Concurrent changes kept the call from applying; read again and retry.
    #[error("{0}")]
    Aborted(String),
    /// The database failed. Its text is logged, never sent to clients.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Error {
    /// The same error with violations of `from` named `to` instead: for a call that fills a
    /// field of the spec it checks from a request field of its own (SendTest's
    /// `test_recipient` becomes the task's recipient).
    pub fn renamed(self, from: &str, to: &str) -> Self {
        match self {
            Error::InvalidArgument(violations) => Error::InvalidArgument(
                violations
                    .into_iter()
                    .map(|mut f| {
                        if f.field == from {
                            f.field = to.to_owned();
                        }
                        f
                    })
                    .collect(),
            ),
            other => other,
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(v: &Violations) -> Vec<&str> {
        v.as_slice().iter().map(|f| f.field.as_str()).collect()
    }

    #[test]
    fn fields_recorded_under_a_parent_are_named_from_the_request_root() {
        let mut v = Violations::default();
        v.add("tasks", "outside");
        v.under(
            || "tasks[3]".to_owned(),
            |v| {
                v.add("queue", "bad");
                v.add("", "the task itself");
                v.add("labels[k]", "a key");
                v.under(
                    || "retry_policy".to_owned(),
                    |v| v.add("exponential.initial", "too small"),
                );
            },
        );
        assert_eq!(
            fields(&v),
            [
                "tasks",
                "tasks[3].queue",
                "tasks[3]",
                "tasks[3].labels[k]",
                "tasks[3].retry_policy.exponential.initial"
            ]
        );
    }

    #[test]
    fn a_parent_with_nothing_recorded_under_it_is_never_built() {
        let mut v = Violations::default();
        let built = std::cell::Cell::new(0);
        let answer = v.under(
            || {
                built.set(built.get() + 1);
                "tasks[0]".to_owned()
            },
            |_| 42,
        );
        assert_eq!((answer, built.get()), (42, 0));
        assert!(v.is_empty());
    }
}
