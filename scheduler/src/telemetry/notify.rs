//! The operator notification webhook (`HERALD_NOTIFY_URL`): delivers the outbox
//! `herald.notifications` with retries and backoff, signed like the executor's webhook sender
//! (Standard Webhooks: `webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64
//! HMAC-SHA256 over "id.timestamp.body">`).
//!
//! Events are recorded in the transaction that makes the change: by database triggers (see
//! `V5__add_notifications.sql`) for `task.failed`, `task.expired` and `account.offline`, and
//! through `herald.notify_event` for `account.paused`, `schedule.run_overran` and
//! `campaign.finished`. So a crash between
//! the change and the delivery loses nothing; delivery is at least once, and the stable
//! `webhook-id` lets a receiver drop repeats. Every replica runs this loop; rows are taken with
//! SKIP LOCKED, so each delivery try happens on one replica.

use std::time::Duration;

use herald_outbound::signing::{SigningKey, WEBHOOK_ID, WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP};
use tokio_util::sync::CancellationToken;

use super::metrics::{NOTIFICATIONS, NOTIFICATIONS_PENDING};
use crate::store::notifications::PendingNotification;
use crate::store::{Db, Store};

/// Notifications sent per round.
const BATCH: i64 = 16;
/// How long a taken notification is reserved for this replica's delivery try.
const HOLD: Duration = Duration::from_secs(60);
/// One delivery try's time limit.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest sleep between rounds: a notification recorded meanwhile waits at most this long.
const MAX_SLEEP: Duration = Duration::from_secs(1);
/// How far ahead each round keeps the triggers recording.
const ENABLED_FOR: Duration = Duration::from_secs(300);
/// Backoff between tries: 1 s doubling, capped at 10 minutes; tries never stop, so an outage
/// of the receiver delays notifications without dropping them.
const BACKOFF_MAX: Duration = Duration::from_secs(600);

/// Where and how to deliver.
pub struct Notifier {
    /// The receiver.
    pub url: reqwest::Url,
    /// Signs bodies; None sends them unsigned.
    pub signer: Option<SigningKey>,
}

/// The notifier the configuration asks for: None without `notify_url`.
pub fn from_config(config: &crate::Config) -> Result<Option<Notifier>, String> {
    let Some(url) = config.notify_url.as_deref().filter(|u| !u.is_empty()) else {
        return Ok(None);
    };
    let url = reqwest::Url::parse(url).map_err(|e| format!("HERALD_NOTIFY_URL: {e}"))?;
    let signer = match config.notify_secret.as_deref().filter(|s| !s.is_empty()) {
        Some(secret) => Some(
            SigningKey::from_secret(secret).map_err(|e| format!("HERALD_NOTIFY_SECRET: {e}"))?,
        ),
        None => None,
    };
    Ok(Some(Notifier { url, signer }))
}

/// Delivers notifications until `stop`.
pub async fn run(store: Store, notifier: Notifier, stop: CancellationToken) {
    let client = match reqwest::Client::builder().timeout(SEND_TIMEOUT).build() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the notification HTTP client; notifications are off");
            return;
        }
    };
    let mut error_backoff = Duration::from_millis(100);
    loop {
        let sleep = match round(&store, &client, &notifier).await {
            Ok(sleep) => {
                error_backoff = Duration::from_millis(100);
                sleep
            }
            Err(e) => {
                tracing::warn!(error = %e, "notification round failed");
                error_backoff = (error_backoff * 2).min(Duration::from_secs(5));
                error_backoff
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(sleep) => {}
        }
    }
}

/// One round: keep recording enabled, deliver a batch, and say how long to sleep.
async fn round(
    store: &Store,
    client: &reqwest::Client,
    notifier: &Notifier,
) -> Result<Duration, crate::store::StoreError> {
    let db = store.conn().await?;
    let outbox = db.notifications();
    outbox.enable(ENABLED_FOR).await?;
    let batch = outbox.take(BATCH, HOLD).await?;
    let full = batch.len() as i64 >= BATCH;
    for n in batch {
        match deliver(client, notifier, &n).await {
            Ok(()) => {
                metrics::counter!(NOTIFICATIONS, "result" => "delivered").increment(1);
                tracing::info!(notification_id = %n.id, event = %n.event, "notification delivered");
                outbox.delivered(n.id).await?;
            }
            Err(error) => {
                metrics::counter!(NOTIFICATIONS, "result" => "failed").increment(1);
                let retry_in = backoff(n.attempts);
                tracing::warn!(notification_id = %n.id, event = %n.event, attempts = n.attempts, retry_in = ?retry_in, %error, "notification not delivered");
                outbox.failed(n.id, retry_in, &error).await?;
            }
        }
    }
    if full {
        return Ok(Duration::ZERO);
    }
    let (pending, next_ms) = outbox.backlog().await?;
    metrics::gauge!(NOTIFICATIONS_PENDING).set(pending as f64);
    Ok(match next_ms {
        Some(ms) if ms > 0.0 => Duration::from_millis(ms as u64 + 1).min(MAX_SLEEP),
        Some(_) => Duration::ZERO,
        None => MAX_SLEEP,
    })
}

async fn deliver(
    client: &reqwest::Client,
    notifier: &Notifier,
    n: &PendingNotification,
) -> Result<(), String> {
    let body = serde_json::to_vec(&n.payload).map_err(|e| e.to_string())?;
    let id = n.id.to_string();
    let timestamp = chrono::Utc::now().timestamp();
    let mut request = client
        .post(notifier.url.clone())
        .header("content-type", "application/json")
        .header(WEBHOOK_ID, &id)
        .header(WEBHOOK_TIMESTAMP, timestamp.to_string());
    if let Some(signer) = &notifier.signer {
        request = request.header(WEBHOOK_SIGNATURE, signer.sign(&id, timestamp, &body));
    }
    let response = request
        .body(body)
        .send()
        .await
        .map_err(|e| format!("request failed: {e}"))?;
    if response.status().is_success() {
        Ok(())
    } else {
        Err(format!("receiver answered {}", response.status()))
    }
}

/// 1 s, 2 s, 4 s, … capped at [`BACKOFF_MAX`], after the `attempts`-th failed try.
fn backoff(attempts: i32) -> Duration {
    let exp = attempts.clamp(1, 20) as u32 - 1;
    Duration::from_secs(1u64 << exp).min(BACKOFF_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(3), Duration::from_secs(4));
        assert_eq!(backoff(40), BACKOFF_MAX);
    }
}
