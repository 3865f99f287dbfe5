//! The service error: every failure an RPC can answer with, mapped to a gRPC status once.

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::store::StoreError;

/// One invalid field: its path in the request (`task.recipient`, `tasks[3].queue`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    /// Path of the field in the request.
    pub field: String,
    /// What is wrong with it.
    pub description: String,
}

/// Why an RPC failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed; nothing was written.
    #[error("invalid request: {}", describe(.0))]
    InvalidArgument(Vec<FieldViolation>),
    /// The named thing does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// An idempotency key (or other unique name) is taken by a different request.
    #[error("{0}")]
    AlreadyExists(String),
    /// The target is in a state that does not allow the call.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn describe(violations: &[FieldViolation]) -> String {
    violations
        .iter()
        .map(|v| format!("{}: {}", v.field, v.description))
        .collect::<Vec<_>>()
        .join("; ")
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        match e {
            Error::InvalidArgument(violations) => {
                let message = describe(&violations);
                let mut details = ErrorDetails::new();
                for v in &violations {
                    details.add_bad_request_violation(v.field.clone(), v.description.clone());
                }
                Status::with_error_details(Code::InvalidArgument, message, details)
            }
            Error::NotFound(what) => Status::not_found(format!("{what} not found")),
            Error::AlreadyExists(m) => Status::already_exists(m),
            Error::FailedPrecondition(m) => Status::failed_precondition(m),
            Error::Store(e) if e.is_unavailable() => {
                tracing::warn!(error = %e, "database unavailable");
                Status::unavailable("database unavailable; retry later")
            }
            Error::Store(e) => {
                tracing::error!(error = %e, "store failure");
                Status::internal("internal error")
            }
        }
    }
}
