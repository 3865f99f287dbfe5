//! The `noop` sender: succeeds at once without doing or logging anything. For load tests, where
//! a per-send log line or network call would measure the sender instead of herald.

use serde::Deserialize;

use super::config::{BuildContext, BuildSender, ConfigError};
use super::{BoxSender, SendError, SendReceipt, SendRequest, Sender};

/// `sender = "noop"`: no settings.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoopConfig {}

impl BuildSender for NoopConfig {
    fn build(self, _cx: &mut BuildContext<'_>) -> Result<BoxSender, ConfigError> {
        Ok(NoopSender.boxed())
    }
}

/// Returns OK for every send, immediately and silently.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoopSender;

impl Sender for NoopSender {
    async fn send(&self, _req: SendRequest) -> Result<SendReceipt, SendError> {
        Ok(SendReceipt::default())
    }
}
