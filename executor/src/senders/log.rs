//! The `log` sender: records the send in the log and succeeds. For local runs and tests.

use std::future::{ready, Ready};
use std::task::{Context, Poll};

use tracing::info;

use super::{BoxSender, SendError, SendReceipt, SendRequest};

/// Logs each send at info level (never the content itself, only its size) and returns OK.
#[derive(Clone, Copy, Debug, Default)]
pub struct LogSender;

impl LogSender {
    /// The sender, boxed.
    pub fn boxed() -> BoxSender {
        tower::util::BoxCloneService::new(LogSender)
    }
}

impl tower::Service<SendRequest> for LogSender {
    type Response = SendReceipt;
    type Error = SendError;
    type Future = Ready<Result<SendReceipt, SendError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), SendError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: SendRequest) -> Self::Future {
        info!(
            task_id = %req.task_id,
            attempt = req.attempt,
            queue = %req.queue,
            recipient = %req.recipient,
            content_len = req.content.len(),
            "log sender: message sent"
        );
        ready(Ok(SendReceipt::default()))
    }
}
