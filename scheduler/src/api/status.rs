//! The one mapping from a service [`Error`] to a gRPC status, for every RPC and the lease
//! stream. Field violations travel as `google.rpc.BadRequest` details so clients in any
//! language see which field; database failures are logged here and answered without their
//! text.

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::error::{describe, Error};
use crate::store::StoreError;

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        match e {
            Error::InvalidArgument(violations) => {
                let mut details = ErrorDetails::new();
                for v in &violations {
                    details.add_bad_request_violation(v.field.clone(), v.description.clone());
                }
                Status::with_error_details(Code::InvalidArgument, describe(&violations), details)
            }
            Error::NotFound(what) => Status::not_found(format!("{what} not found")),
            Error::AlreadyExists(m) => Status::already_exists(m),
            Error::FailedPrecondition(m) => Status::failed_precondition(m),
            Error::Unauthenticated(m) => Status::unauthenticated(m),
            Error::PermissionDenied(m) => Status::permission_denied(m),
            Error::ResourceExhausted(m) => Status::resource_exhausted(m),
            Error::Unavailable(m) => Status::unavailable(m),
            Error::DeadlineExceeded(m) => Status::deadline_exceeded(m),
            Error::Aborted(m) => Status::aborted(m),
            Error::Cancelled(m) => Status::cancelled(m),
            Error::Store(e @ StoreError::CommitInDoubt { .. }) => {
                tracing::warn!(error = %e, "commit in doubt");
                Status::unavailable(
                    "the database connection was lost while committing: the change may or may \
                     not have been applied; retry with the same idempotency key, or read it back",
                )
            }
            Error::Store(e) if e.is_unstorable_text() => {
                tracing::info!(error = %e, "request refused: a text the database cannot store");
                Status::invalid_argument(
                    "a text field holds a NUL character (U+0000), which cannot be stored; \
                     nothing was written",
                )
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn violations_name_their_fields_in_the_details() {
        let status = Status::from(Error::invalid("task.queue", "is required"));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(status.message(), "task.queue: is required");
        let details = status.get_error_details();
        let violations = details.bad_request().map(|b| b.field_violations.clone());
        assert_eq!(
            violations.map(|v| v.iter().map(|f| f.field.clone()).collect::<Vec<_>>()),
            Some(vec!["task.queue".to_string()])
        );
    }

    /// The backstop for a text field no check caught: PostgreSQL refuses NUL in `text` and
    /// `\u0000` in `jsonb`, and the client hears INVALID_ARGUMENT for it, not INTERNAL.
    #[tokio::test]
    async fn text_the_database_cannot_store_is_the_clients_fault() {
        let store = crate::store::scratch::ScratchStore::new().await;
        let conn = store.conn().await.expect("a connection");
        let text = conn
            .query_one("SELECT $1::text", &[&"a\0b"])
            .await
            .map_err(StoreError::query("nul in text"))
            .expect_err("PostgreSQL stored a NUL in text");
        let json = conn
            .query_one(
                "SELECT $1::jsonb",
                &[&serde_json::json!({ "label": "a\u{0}b" })],
            )
            .await
            .map_err(StoreError::query("nul in jsonb"))
            .expect_err("PostgreSQL stored \\u0000 in jsonb");
        for error in [text, json] {
            assert!(error.is_unstorable_text(), "{error}");
            let status = Status::from(Error::Store(error));
            assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
            assert!(status.message().contains("NUL"), "{status:?}");
        }
    }

    #[test]
    fn database_text_never_reaches_the_client() {
        let status = Status::from(Error::Store(StoreError::Corrupt(
            "column secret_column: bad value".into(),
        )));
        assert_eq!(status.code(), Code::Internal);
        assert!(!status.message().contains("secret_column"));
    }
}
