//! The `noop` sender: succeeds at once without doing or logging anything. For load tests, where
//! a per-send log line or network call would measure the sender instead of herald. A load test
//! that needs retries can have a fixed share of tasks fail their first attempt.

use serde::Deserialize;

use super::config::{BuildContext, BuildSender, ConfigError};
use super::{BoxSender, SendError, SendReceipt, SendRequest, Sender};

/// `sender = "noop"`, optionally with `fail_first_attempts = <share, 0 to 1>`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoopConfig {
    /// The share of tasks whose first attempt answers TRANSIENT (chosen by task id, so the
    /// same tasks every run); their retries succeed.
    #[serde(default)]
    fail_first_attempts: f64,
}

impl BuildSender for NoopConfig {
    fn build(self, cx: &mut BuildContext<'_>) -> Result<BoxSender, ConfigError> {
        if !(0.0..=1.0).contains(&self.fail_first_attempts) {
            return Err(cx.invalid_table("fail_first_attempts must be between 0 and 1"));
        }
        Ok(NoopSender {
            fail_per_mille: (self.fail_first_attempts * 1000.0).round() as u64,
        }
        .boxed())
    }
}

/// Returns OK for every send, immediately and silently, except the first attempt of the
/// configured share of tasks.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoopSender {
    fail_per_mille: u64,
}

impl NoopSender {
    /// Whether `task_id`'s first attempt fails: its FNV-1a hash, per mille, falls below the
    /// share (stable across runs and processes, spread evenly over ids).
    fn fails_first(&self, task_id: &str) -> bool {
        let hash = task_id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        hash % 1000 < self.fail_per_mille
    }
}

impl Sender for NoopSender {
    async fn send(&self, req: SendRequest) -> Result<SendReceipt, SendError> {
        if self.fail_per_mille > 0 && !req.is_retry() && self.fails_first(&req.task_id) {
            return Err(SendError::transient(
                "noop: first attempt fails (load test)",
            ));
        }
        Ok(SendReceipt::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configured_share_of_tasks_fails_its_first_attempt() {
        let sender = NoopSender {
            fail_per_mille: 200,
        };
        let failing = (0..10_000)
            .filter(|i| {
                sender.fails_first(&format!(
                    "0190a1b2-{:04x}-7000-8000-{:012x}",
                    i % 7,
                    i * 7919
                ))
            })
            .count();
        assert!((1_700..2_300).contains(&failing), "{failing} of 10000");
        assert!(!NoopSender::default().fails_first("anything"));
    }
}
