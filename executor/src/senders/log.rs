//! The `log` sender: records the send in the log and succeeds. For local runs and tests.

use serde::Deserialize;
use tracing::info;

use super::config::{BuildContext, BuildSender, ConfigError};
use super::{BoxSender, SendError, SendReceipt, SendRequest, Sender};

/// `sender = "log"`: no settings.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {}

impl BuildSender for LogConfig {
    fn build(self, _cx: &mut BuildContext<'_>) -> Result<BoxSender, ConfigError> {
        Ok(LogSender.boxed())
    }
}

/// Logs each send at info level (never the content itself, only its size) and returns OK.
#[derive(Clone, Copy, Debug, Default)]
pub struct LogSender;

impl Sender for LogSender {
    async fn send(&self, req: SendRequest) -> Result<SendReceipt, SendError> {
        info!(
            task_id = %req.task_id,
            attempt = req.attempt,
            queue = %req.queue,
            account = %req.account_id,
            recipient = %req.recipient,
            content_len = req.content.len(),
            "log sender: message sent"
        );
        Ok(SendReceipt::default())
    }
}
