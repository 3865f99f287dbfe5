//! Runs that overrun: a schedule run still unfinished `overrun_after` after its fire time
//! raises the `schedule.run_overran` notification and counts
//! `herald_schedule_runs_overran_total`, once per run.
//!
//! Each run records its deadline when it is created (from the spec then in force, so an
//! UpdateSchedule applies from the next run). Every replica runs [`run`]: it checks the runs
//! whose deadline passed in one transaction (`SKIP LOCKED`, so replicas never check a run
//! twice), marks the unfinished ones and queues their notification in the same transaction,
//! then sleeps until the next deadline, at most [`MAX_SLEEP`] (runs created meanwhile have
//! deadlines at least a second ahead, so an alert is at most that late).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::store::transaction;
use crate::store::{Db, Store};

/// Longest sleep between two checks.
const MAX_SLEEP: Duration = Duration::from_secs(5);

/// Checks overrun deadlines until `stop`.
pub async fn run(store: Store, stop: CancellationToken) {
    loop {
        let sleep = match check(&store).await {
            Ok(next) => next.unwrap_or(MAX_SLEEP).min(MAX_SLEEP),
            Err(e) => {
                tracing::warn!(error = %e, "overrun check failed; retrying");
                MAX_SLEEP
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(sleep) => {}
        }
    }
}

/// One check; returns how long until the next deadline (None: none pending).
async fn check(store: &Store) -> Result<Option<Duration>, Error> {
    let overran = transaction!(store, Error, |tx| Ok::<_, Error>(
        tx.schedules().check_overruns().await?
    ))?;
    for r in &overran {
        tracing::warn!(namespace = %r.namespace, schedule_id = %r.schedule_id,
            fire_time = %r.fire_time, live_tasks = r.live_tasks, "schedule run overran");
        crate::telemetry::metrics::run_overran(&r.namespace, &r.schedule_id);
    }
    let ms = store.conn().await?.schedules().next_overrun_ms().await?;
    Ok(ms.map(|ms| Duration::from_millis(ms.max(0.0) as u64)))
}
