//! The replica's background jobs, each safe to run on every replica at once (or, for the
//! materialiser, electing one leader), stopped by the replica's background token.

use std::time::Duration;

use tokio::sync::broadcast;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::Replica;
use crate::config::Config;
use crate::lease::events::{self, Event};
use crate::lease::registry::Registry;
use crate::lease::{fold, reconcile, sweeper};
use crate::telemetry::notify::Notifier;

/// Starts every background job of the replica.
pub(super) fn start(replica: &Replica, config: &Config, notifier: Option<Notifier>) -> JoinSet<()> {
    let store = &replica.store;
    let stop = &replica.background;
    let mut jobs = JoinSet::new();
    // Cluster events (due tasks, revokes, resolved cancels) from every replica.
    jobs.spawn(events::listen(
        store.target().clone(),
        config.lease_ttl.max(config.cancel_wait),
        replica.events.clone(),
        replica.followers.clone(),
        stop.clone(),
    ));
    jobs.spawn(route_revokes(
        replica.events.subscribe(),
        replica.registry.clone(),
        stop.clone(),
    ));
    // A sweep at least every second (or lease TTL) notices lapsed leases in time.
    jobs.spawn(sweeper::run(
        store.clone(),
        config.lease_ttl.min(Duration::from_secs(1)),
        config.unknown_outcome_grace,
        stop.clone(),
    ));
    jobs.spawn(fold::run(store.clone(), config.fold_interval, stop.clone()));
    // Plans made while a busy table was small are made again as soon as it grows.
    jobs.spawn(crate::planner_statistics::run(store.clone(), stop.clone()));
    // The space a long transaction made the hot tables grow into, given back after it ends.
    if let Some(compaction) = crate::compaction::Compaction::of(config) {
        jobs.spawn(crate::compaction::run(
            store.clone(),
            compaction,
            stop.clone(),
        ));
    }
    jobs.spawn(reconcile::run(
        store.clone(),
        config.reconcile_interval,
        stop.clone(),
    ));
    jobs.spawn(crate::telemetry::metrics::refresh_task_counts(
        store.clone(),
        config.metrics_refresh,
        stop.clone(),
    ));
    if let Some(notifier) = notifier {
        jobs.spawn(crate::telemetry::notify::run(
            store.clone(),
            notifier,
            stop.clone(),
        ));
    }
    // Bulk operations: every replica works on unfinished ones (each batch locks its
    // operation), so one started anywhere, or left by a replica that died, is finished.
    jobs.spawn(crate::tasks::bulk::run(
        replica.tasks.clone(),
        crate::tasks::bulk::BulkSettings {
            batch_size: i64::from(config.bulk_batch_size.max(1)),
            pause: config.bulk_batch_pause,
        },
        stop.clone(),
    ));
    // Campaigns to an audience: every replica adds their pages (a page added twice adds
    // nothing), so a large audience keeps going after the replica that took the call dies.
    jobs.spawn(crate::campaigns::audience_expansion(
        crate::campaigns::Campaigns::new(replica.tasks.clone()),
        stop.clone(),
    ));
    // Overrunning schedule runs: safe on every replica (each run is checked once).
    jobs.spawn(crate::schedule::overrun::run(store.clone(), stop.clone()));
    jobs.spawn(crate::schedule::materializer::run(
        store.clone(),
        replica.tasks.duplicate_windows().clone(),
        replica.sources.clone(),
        stop.clone(),
    ));
    jobs.spawn(crate::retention::run(
        store.clone(),
        crate::retention::Retention::of(config),
        stop.clone(),
    ));
    jobs
}

/// Forwards revokes announced by any replica to the executors connected here.
async fn route_revokes(
    mut events: broadcast::Receiver<Event>,
    registry: Registry,
    stop: CancellationToken,
) {
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            e = events.recv() => e,
        };
        match event {
            Ok(Event::Revoke {
                task_id,
                attempt,
                executor_id,
            }) => registry.revoke(&executor_id, task_id, attempt),
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!(
                    missed = n,
                    "revoke router lagged; some revokes were not forwarded"
                );
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// Runs `job` every `interval` until `stop`. A failure is logged when the job starts to fail and
/// when it works again, not at every run while the database is away; `what` names the job in
/// those lines ("fold account deltas").
pub(crate) async fn every<T, F, Fut>(
    interval: Duration,
    stop: CancellationToken,
    what: &'static str,
    mut job: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, crate::store::StoreError>>,
{
    let mut failing = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        match job().await {
            Ok(_) if failing => {
                failing = false;
                tracing::info!(job = what, "working again");
            }
            Ok(_) => {}
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(job = what, error = %e, "failing; retrying quietly");
            }
            Err(_) => {}
        }
    }
}
