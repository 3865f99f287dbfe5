//! Cluster-wide wake-ups over PostgreSQL LISTEN/NOTIFY: new or re-scheduled tasks, revokes for
//! executors on whichever replica holds their stream, and resolved cancellations. One dedicated
//! connection per replica listens and fans events out on a broadcast channel.

use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use tokio::sync::broadcast;
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::claim::NoAccountsCache;
use crate::clock::Clock;

/// The test clock's skew in milliseconds (none in production).
const SKEW: &str =
    "SELECT (extract(epoch FROM skew) * 1000)::bigint AS skew_ms FROM herald.test_clock";

/// A cluster event.
#[derive(Debug, Clone)]
pub enum Event {
    /// Tasks became due at this time (None: now, or unknown — re-check).
    Due(Option<DateTime<Utc>>),
    /// A cancelled task's lease must be dropped by the executor holding it.
    Revoke {
        /// Task.
        task_id: Uuid,
        /// Fencing attempt.
        attempt: i32,
        /// The executor holding the lease.
        executor_id: String,
    },
    /// A cancelled task learned its outcome.
    CancelResolved(Uuid),
    /// The test clock's skew changed, in milliseconds.
    Clock(i64),
    /// A namespace gained an account: claims there must read accounts again.
    AccountsChanged(String),
}

const CHANNELS: &str = "LISTEN herald_due; LISTEN herald_revoke; LISTEN herald_cancel; \
     LISTEN herald_clock; LISTEN herald_accounts;";

/// What the listener keeps current itself, before any session sees the next event: so a
/// dispatcher woken by a `Due` announced in the same transaction already sees it.
#[derive(Clone, Default)]
pub struct Followers {
    /// The scheduler's clock, which follows the test clock's skew.
    pub clock: Clock,
    /// Namespaces known to have no accounts.
    pub no_accounts: NoAccountsCache,
}

impl Followers {
    /// Followers whose no-accounts cache keeps a namespace for `no_accounts_ttl`.
    pub fn new(no_accounts_ttl: std::time::Duration) -> Self {
        Followers {
            clock: Clock::default(),
            no_accounts: NoAccountsCache::with_ttl(no_accounts_ttl),
        }
    }

    fn apply(&self, event: &Event) {
        match event {
            Event::Clock(ms) => self.clock.set_skew_ms(*ms),
            Event::AccountsChanged(namespace) => self.no_accounts.forget(namespace),
            _ => {}
        }
    }
}

/// Keeps a LISTEN connection open until `shutdown`, reconnecting with backoff, and publishes
/// every notification on `events`. After each (re)connect it publishes `Due(None)`, since
/// notifications sent while disconnected are lost.
pub async fn listen(
    pg: tokio_postgres::Config,
    events: broadcast::Sender<Event>,
    followers: Followers,
    shutdown: CancellationToken,
) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let connected = tokio::select! {
            _ = shutdown.cancelled() => return,
            c = pg.connect(tokio_postgres::NoTls) => c,
        };
        match connected {
            Ok((client, mut connection)) => {
                let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
                // The connection only makes progress while polled, so LISTEN (and reading the
                // clock's skew after it) runs concurrently with draining its message stream.
                let listening = async {
                    client.batch_execute(CHANNELS).await?;
                    client.query_opt(SKEW, &[]).await
                };
                tokio::pin!(listening);
                let mut subscribed = false;
                loop {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        r = &mut listening, if !subscribed => {
                            let skew = match r {
                                Ok(row) => row
                                    .and_then(|r| r.try_get::<_, i64>("skew_ms").ok())
                                    .unwrap_or(0),
                                Err(e) => {
                                    tracing::warn!(error = %e, "LISTEN failed");
                                    break;
                                }
                            };
                            subscribed = true;
                            backoff = Duration::from_millis(100);
                            // Changes missed while disconnected: the skew is read again and every
                            // namespace's account state forgotten.
                            followers.clock.set_skew_ms(skew);
                            followers.no_accounts.forget_all();
                            let _ = events.send(Event::Due(None));
                        }
                        msg = messages.next() => match msg {
                            Some(Ok(AsyncMessage::Notification(n))) => {
                                if let Some(event) = parse(n.channel(), n.payload()) {
                                    followers.apply(&event);
                                    let _ = events.send(event);
                                }
                            }
                            Some(Ok(_)) => {}
                            Some(Err(e)) => {
                                tracing::warn!(error = %e, "notification connection failed");
                                break;
                            }
                            None => break,
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot open the notification connection"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

fn parse(channel: &str, payload: &str) -> Option<Event> {
    match channel {
        "herald_due" => {
            let micros: i64 = payload.parse().ok()?;
            Some(Event::Due(if micros <= 0 {
                None
            } else {
                DateTime::from_timestamp_micros(micros)
            }))
        }
        "herald_revoke" => {
            let mut parts = payload.splitn(3, ':');
            let task_id = parts.next()?.parse().ok()?;
            let attempt = parts.next()?.parse().ok()?;
            let executor_id = parts.next()?.to_string();
            Some(Event::Revoke {
                task_id,
                attempt,
                executor_id,
            })
        }
        "herald_cancel" => Some(Event::CancelResolved(payload.parse().ok()?)),
        "herald_clock" => Some(Event::Clock(payload.parse().ok()?)),
        "herald_accounts" => Some(Event::AccountsChanged(payload.to_owned())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_channel() {
        assert!(matches!(parse("herald_due", "0"), Some(Event::Due(None))));
        assert!(matches!(
            parse("herald_due", "1700000000000000"),
            Some(Event::Due(Some(_)))
        ));
        let id = Uuid::now_v7();
        match parse("herald_revoke", &format!("{id}:3:exec:1")) {
            Some(Event::Revoke {
                task_id,
                attempt,
                executor_id,
            }) => {
                assert_eq!(task_id, id);
                assert_eq!(attempt, 3);
                assert_eq!(executor_id, "exec:1");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(parse("herald_due", "garbage").is_none());
        assert!(parse("other", "0").is_none());
    }
}
