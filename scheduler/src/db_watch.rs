//! The database watch: a background job that checks once a second whether PostgreSQL answers
//! and mirrors the answer into grpc.health.v1, overall (`""`) and for every herald service the
//! replica reports. While the database is unreachable the replica says `NOT_SERVING`, so load
//! balancers and executors' health checks move away from it; the moment it answers again the
//! replica says `SERVING`. RPCs keep answering (UNAVAILABLE while the database is gone), new
//! lease streams are refused with UNAVAILABLE ([`DatabaseReachable`]) so executors move to a
//! replica that can lease, and every other job reconnects by itself.
//!
//! The check runs on a dedicated connection rather than a pooled one: a pool that is busy
//! (every connection checked out under load) must not read as an outage.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::store::connection::Target;
use crate::telemetry::metrics::DATABASE_WRITABLE;

/// How often the database is checked.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// How many checks in a row must fail before the replica says `NOT_SERVING`. One slow answer
/// (a connection that took longer than its bound while the server was busy) is not an outage:
/// flipping health on it would send every executor of the replica elsewhere for nothing, and
/// the other replicas share the same database. Kubernetes' probes wait for several failures for
/// the same reason.
pub const FAILURES_BEFORE_DOWN: u32 = 2;
/// How long the check's query may take before it counts as a failure. Opening the connection
/// has its own bound, [`Target::open_timeout`]: every host of the URL may be tried.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether the last check reached the database; starts true (start-up has just migrated).
#[derive(Debug, Clone)]
pub struct DatabaseReachable(Arc<AtomicBool>);

impl DatabaseReachable {
    /// Whether the database answered the last check.
    pub fn is_up(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

impl Default for DatabaseReachable {
    fn default() -> Self {
        DatabaseReachable(Arc::new(AtomicBool::new(true)))
    }
}

/// A running database watch; [`DbWatch::stop`] ends it.
pub struct DbWatch {
    stop: CancellationToken,
    task: JoinHandle<()>,
    reachable: DatabaseReachable,
}

impl DbWatch {
    /// Starts checking the database of `target` every [`INTERVAL`], setting the health of each of
    /// `services` (`""` for the server as a whole) to match.
    pub fn spawn(
        target: Target,
        health: HealthReporter,
        services: &'static [&'static str],
    ) -> Self {
        let stop = CancellationToken::new();
        let reachable = DatabaseReachable::default();
        let task = tokio::spawn(run(
            target,
            health,
            services,
            reachable.clone(),
            stop.clone(),
        ));
        DbWatch {
            stop,
            task,
            reachable,
        }
    }

    /// The watch's latest answer, for parts that act on it (the lease service).
    pub fn reachable(&self) -> DatabaseReachable {
        self.reachable.clone()
    }

    /// Stops the watch and waits for it to end. Call it before shutdown sets `NOT_SERVING`, so
    /// a last check cannot set `SERVING` again afterwards.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// Checks until `stop`; changes health only when the answer changes.
async fn run(
    target: Target,
    health: HealthReporter,
    services: &'static [&'static str],
    reachable: DatabaseReachable,
    stop: CancellationToken,
) {
    let mut client: Option<tokio_postgres::Client> = None;
    let mut verdict = Verdict::default();
    let mut ticks = tokio::time::interval(INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let up = tokio::select! {
            _ = stop.cancelled() => return,
            up = check(&target, &mut client) => up,
        };
        metrics::gauge!(DATABASE_WRITABLE).set(if up { 1.0 } else { 0.0 });
        if !up {
            // A half-dead connection must not be reused by the next check.
            client = None;
        }
        if let Some(up) = verdict.observe(up) {
            reachable.0.store(up, Ordering::Relaxed);
            let status = if up {
                tracing::info!("database reachable again; health SERVING");
                ServingStatus::Serving
            } else {
                tracing::warn!("database unreachable; health NOT_SERVING until it answers");
                ServingStatus::NotServing
            };
            for service in services {
                health.set_service_status(service, status).await;
            }
        }
    }
}

/// What the replica says about its database, from the checks so far: `SERVING` until
/// [`FAILURES_BEFORE_DOWN`] checks in a row fail, then `NOT_SERVING` until one succeeds.
#[derive(Debug)]
struct Verdict {
    serving: bool,
    failures_in_a_row: u32,
}

impl Default for Verdict {
    fn default() -> Self {
        // Start-up set SERVING after migrations, so that is the state being watched from.
        Verdict {
            serving: true,
            failures_in_a_row: 0,
        }
    }
}

impl Verdict {
    /// Takes one check's answer; returns the new state when it changes.
    fn observe(&mut self, answered: bool) -> Option<bool> {
        self.failures_in_a_row = if answered {
            0
        } else {
            self.failures_in_a_row.saturating_add(1)
        };
        let serving = answered || self.failures_in_a_row < FAILURES_BEFORE_DOWN;
        if serving == self.serving {
            return None;
        }
        self.serving = serving;
        Some(serving)
    }
}

/// One check: is the watch's connection on a server that takes writes? It opens the connection
/// first when there is none (to the first of the URL's hosts that takes writes), and asks
/// `transaction_read_only` rather than `SELECT 1`, so a primary demoted to a standby under an
/// open connection reads as down, and the next check connects afresh and finds the new one.
async fn check(target: &Target, client: &mut Option<tokio_postgres::Client>) -> bool {
    if client.as_ref().is_none_or(|c| c.is_closed()) {
        let opened = tokio::time::timeout(target.open_timeout(), target.connect()).await;
        match opened {
            Ok(Ok((c, connection))) => {
                tokio::spawn(async move {
                    // Ends with the client or the server; the next check notices either.
                    let _ = connection.await;
                });
                *client = Some(c);
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "database check cannot connect");
                return false;
            }
            Err(_) => {
                tracing::debug!("database check timed out connecting");
                return false;
            }
        }
    }
    let Some(c) = client else {
        return false;
    };
    match tokio::time::timeout(CHECK_TIMEOUT, c.simple_query("SHOW transaction_read_only")).await {
        Err(_) => {
            tracing::debug!("database check timed out");
            false
        }
        Ok(Ok(messages)) => {
            let read_only = messages.iter().any(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(row) => {
                    row.get("transaction_read_only") == Some("on")
                }
                _ => false,
            });
            if read_only {
                tracing::warn!("the database server no longer takes writes (a standby now?)");
            }
            !read_only
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "database check failed");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_failed_check_between_answers_changes_nothing() {
        let mut verdict = Verdict::default();
        assert_eq!(verdict.observe(false), None);
        assert_eq!(verdict.observe(true), None);
        assert_eq!(verdict.observe(false), None);
    }

    #[test]
    fn two_failed_checks_in_a_row_say_not_serving_until_one_answers() {
        let mut verdict = Verdict::default();
        assert_eq!(verdict.observe(false), None);
        assert_eq!(verdict.observe(false), Some(false));
        assert_eq!(verdict.observe(false), None);
        assert_eq!(verdict.observe(true), Some(true));
        assert_eq!(verdict.observe(true), None);
    }
}
