//! Cluster-wide wake-ups over PostgreSQL LISTEN/NOTIFY: new or re-scheduled tasks, revokes for
//! executors on whichever replica holds their stream, and resolved cancellations. One dedicated
//! connection per replica listens and fans events out on a broadcast channel.

use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use tokio::sync::{broadcast, mpsc};
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::claim::NoAccountsCache;
use crate::clock::Clock;
use crate::store::connection::Target;

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
/// The cancels a replica may have missed while it was not listening (starting, or
/// reconnecting after a lost connection or a failover): tasks cancelled while leased whose
/// executor has not answered (cancel outcome 5, UNCONFIRMED) and whose lease has not run out,
/// which need their revoke sent again; and those whose executor has answered, which a
/// CancelTask on this replica may still be waiting for. Only cancels within the last $1 ms
/// matter (a cancelled lease is never extended, and no CancelTask waits longer than the cancel
/// wait), so the walk covers the tasks_finished index over that window only.
const MISSED_CANCELS: &str = "
    SELECT id, lease_count, namespace || '/' || executor_id AS executor,
           cancel_outcome = 5 AS unanswered
    FROM herald.tasks
    WHERE finished_at >= herald.now() - $1::bigint * interval '1 millisecond'
      AND state = 'cancelled' AND executor_id IS NOT NULL
      AND ((cancel_outcome = 5 AND lease_expires_at > herald.now()) OR cancel_outcome <> 5)";
/// How the listener's connection names itself in `pg_stat_activity` (operations.md; the
/// lease protocol tests find it by this name).
const LISTENER_APPLICATION_NAME: &str = "herald-scheduler listener";
/// Longest pause between attempts to reopen the LISTEN connection.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How often the LISTEN connection is asked whether its server is still there.
const PROBE_INTERVAL: Duration = Duration::from_secs(5);
/// How long the probe may take before the connection counts as lost.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

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
/// every notification on `events`. After each (re)connect it publishes `Due(None)`, a `Revoke`
/// for every cancelled lease still unanswered and a `CancelResolved` for every cancel answered
/// within `missed_window` (the longer of the lease TTL and the cancel wait: a missed cancel
/// older than that no longer matters), since notifications sent while disconnected are lost.
/// `target` carries herald's connection settings, so after a failover the listener reconnects to
/// the new primary, where the notifications are now sent (a standby can neither LISTEN nor
/// NOTIFY).
///
/// The connection is probed every [`PROBE_INTERVAL`]: a listener whose server died without
/// closing the connection (a machine gone, no RST) would otherwise wait for TCP keepalives
/// while every notification goes to the new primary unheard.
pub async fn listen(
    target: Target,
    missed_window: Duration,
    events: broadcast::Sender<Event>,
    followers: Followers,
    shutdown: CancellationToken,
) {
    let target = target.named(LISTENER_APPLICATION_NAME);
    let mut backoff = Duration::from_millis(100);
    loop {
        let connected = tokio::select! {
            _ = shutdown.cancelled() => return,
            c = target.connect() => c,
        };
        match connected {
            Ok((client, connection)) => {
                // The connection is driven on its own task, so LISTEN, the skew and the probe
                // can be awaited here while notifications keep arriving.
                let (tx, mut notifications) = mpsc::unbounded_channel();
                let driver = tokio::spawn(drive(connection, tx));
                let listener = Listener {
                    client: &client,
                    missed_window,
                    events: &events,
                    followers: &followers,
                };
                let outcome = listener.listen(&mut notifications, &shutdown).await;
                driver.abort();
                match outcome {
                    Listened::Stopped => return,
                    Listened::Subscribed => backoff = Duration::from_millis(100),
                    Listened::Failed => {}
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot open the notification connection"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        // Capped low: after a failover every wake-up waits for this connection.
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// How a listening connection ended.
enum Listened {
    /// Shut down.
    Stopped,
    /// It listened for a while, then was lost.
    Subscribed,
    /// LISTEN itself failed.
    Failed,
}

/// Polls the connection, forwarding its notifications, until it fails or nobody listens.
async fn drive<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    tx: mpsc::UnboundedSender<tokio_postgres::Notification>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    while let Some(message) = messages.next().await {
        match message {
            Ok(AsyncMessage::Notification(n)) => {
                if tx.send(n).is_err() {
                    return;
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "notification connection failed");
                return;
            }
        }
    }
}

/// One listening connection and where its events go.
struct Listener<'a> {
    client: &'a tokio_postgres::Client,
    missed_window: Duration,
    events: &'a broadcast::Sender<Event>,
    followers: &'a Followers,
}

impl Listener<'_> {
    /// LISTENs, reads the clock's skew and the cancels that may have been missed, then
    /// publishes the notifications until the connection is lost (closed, or silent to a probe)
    /// or `shutdown`.
    async fn listen(
        &self,
        notifications: &mut mpsc::UnboundedReceiver<tokio_postgres::Notification>,
        shutdown: &CancellationToken,
    ) -> Listened {
        let (client, events, followers) = (self.client, self.events, self.followers);
        // LISTEN first: a cancel committed after it is notified, one committed before it is
        // found by the read (one in between is both, and a repeated revoke is harmless).
        let listening = async {
            client.batch_execute(CHANNELS).await?;
            let skew = client.query_opt(SKEW, &[]).await?;
            let window_ms = i64::try_from(self.missed_window.as_millis()).unwrap_or(i64::MAX);
            let cancels = client.query(MISSED_CANCELS, &[&window_ms]).await?;
            Ok::<_, tokio_postgres::Error>((skew, cancels))
        };
        let (skew, cancels) = tokio::select! {
            _ = shutdown.cancelled() => return Listened::Stopped,
            r = listening => match r {
                Ok((skew, cancels)) => (
                    skew.and_then(|r| r.try_get::<_, i64>("skew_ms").ok()).unwrap_or(0),
                    cancels,
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "LISTEN failed");
                    return Listened::Failed;
                }
            },
        };
        // Changes missed while disconnected: the skew is read again, every namespace's account
        // state forgotten, every due task looked for, and every unanswered revoke sent again.
        followers.clock.set_skew_ms(skew);
        followers.no_accounts.forget_all();
        let _ = events.send(Event::Due(None));
        publish_missed_cancels(events, &cancels);
        let mut probe =
            tokio::time::interval_at(tokio::time::Instant::now() + PROBE_INTERVAL, PROBE_INTERVAL);
        probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return Listened::Stopped,
                n = notifications.recv() => match n {
                    Some(n) => {
                        if let Some(event) = parse(n.channel(), n.payload()) {
                            followers.apply(&event);
                            let _ = events.send(event);
                        }
                    }
                    None => return Listened::Subscribed,
                },
                _ = probe.tick() => {
                    let answered =
                        tokio::time::timeout(PROBE_TIMEOUT, client.simple_query("SELECT 1")).await;
                    if !matches!(answered, Ok(Ok(_))) {
                        tracing::warn!("notification connection stopped answering; reconnecting");
                        return Listened::Subscribed;
                    }
                }
            }
        }
    }
}

/// Sends again what the listener missed of `cancels` (rows of [`MISSED_CANCELS`]): the revoke
/// of each cancel still unanswered, the resolution of each answered one.
fn publish_missed_cancels(events: &broadcast::Sender<Event>, cancels: &[tokio_postgres::Row]) {
    let mut revokes = 0;
    for row in cancels {
        let event = match (
            row.try_get("id"),
            row.try_get("lease_count"),
            row.try_get("executor"),
            row.try_get("unanswered"),
        ) {
            (Ok(task_id), Ok(attempt), Ok(executor_id), Ok(true)) => {
                revokes += 1;
                Event::Revoke {
                    task_id,
                    attempt,
                    executor_id,
                }
            }
            (Ok(task_id), _, _, Ok(false)) => Event::CancelResolved(task_id),
            _ => {
                tracing::warn!("a missed cancel could not be read; skipped");
                continue;
            }
        };
        let _ = events.send(event);
    }
    if revokes > 0 {
        tracing::info!(revokes, "unanswered revokes sent again");
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
