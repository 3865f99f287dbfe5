//! The `noop` sender: succeeds at once without doing or logging anything. For benchmarks, where
//! a per-send log line or network call would measure the sender instead of herald.

use std::future::{ready, Ready};
use std::task::{Context, Poll};

use super::{BoxSender, SendError, SendReceipt, SendRequest};

/// Returns OK for every send, immediately and silently.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoopSender;

impl NoopSender {
    /// The sender, boxed.
    pub fn boxed() -> BoxSender {
        tower::util::BoxCloneService::new(NoopSender)
    }
}

impl tower::Service<SendRequest> for NoopSender {
    type Response = SendReceipt;
    type Error = SendError;
    type Future = Ready<Result<SendReceipt, SendError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), SendError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _req: SendRequest) -> Self::Future {
        ready(Ok(SendReceipt::default()))
    }
}
