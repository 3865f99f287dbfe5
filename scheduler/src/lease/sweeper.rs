//! The sweeper: returns leases that ran out to the queue and expires tasks past their deadline.
//! It sleeps until the next expiry by the database clock, capped so that a lease granted
//! meanwhile (which can only expire later than one TTL from now) is still seen in time.
//! Safe on every replica at once: each sweep locks rows with SKIP LOCKED. Each sweep walks the
//! lease expiries from where the last one stopped ([`LowWater`]), from the oldest every
//! [`FULL_WALK_PERIOD`].

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::low_water::LowWater;
use crate::store::transaction;
use crate::store::{Db, Store, StoreError};

/// Rows handled per statement.
const BATCH: i64 = 1_000;

/// How often a sweep walks the lease expiries from the oldest: how late, at most, a lapsed
/// lease a sweep passed (its row held by another transaction) is taken.
pub const FULL_WALK_PERIOD: Duration = Duration::from_secs(5);

/// Runs until `shutdown`. A WhatsApp task whose lease ran out unreported waits `grace` for a
/// status callback before it is due again (store/leases/expire_leases.sql).
pub async fn run(store: Store, max_sleep: Duration, grace: Duration, shutdown: CancellationToken) {
    let grace_ms = i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
    let mut error_backoff = Duration::from_millis(100);
    let mut expiries = LowWater::new(FULL_WALK_PERIOD);
    loop {
        let swept = sweep_once(&store, grace_ms, &mut expiries).await;
        if swept.is_ok() {
            // Back at full speed once the database answers again.
            error_backoff = Duration::from_millis(100);
        }
        let sleep = match swept {
            Ok(Some(more_now)) if more_now => Duration::ZERO,
            Ok(Some(_)) | Ok(None) => match next_sweep_ms(&store, &expiries, max_sleep).await {
                // A millisecond past the expiry, so the sweep's now() is beyond it.
                Ok(Some(ms)) if ms > 0.0 => {
                    Duration::from_micros((ms * 1000.0) as u64 + 1_000).min(max_sleep)
                }
                Ok(Some(_)) => Duration::from_millis(1),
                Ok(None) => max_sleep,
                Err(e) => {
                    tracing::warn!(error = %e, "sweeper cannot read the next expiry");
                    error_backoff
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "sweep failed");
                error_backoff = (error_backoff * 2).min(Duration::from_secs(5));
                error_backoff
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(sleep) => {}
        }
    }
}

async fn next_sweep_ms(
    store: &Store,
    expiries: &LowWater,
    within: Duration,
) -> Result<Option<f64>, StoreError> {
    store
        .conn()
        .await?
        .leases()
        .next_sweep_ms(expiries.mark(), within)
        .await
}

/// One sweep; Some(true) when a batch was full and more may be waiting. Lapsed leases and their
/// account slots change in one transaction.
async fn sweep_once(
    store: &Store,
    grace_ms: i64,
    expiries: &mut LowWater,
) -> Result<Option<bool>, StoreError> {
    let from = expiries.next_walk_from();
    // Idempotent: only leases still leased and past their expiry are taken.
    let leases = transaction!(store, StoreError, idempotent = true, |tx| {
        let leases = tx.leases().expire_leases(BATCH, grace_ms, from).await?;
        // A lapsed lease whose message a status reported failed: no report will come to
        // settle it, so it is settled here, as a report batch would have.
        let mut by_namespace: std::collections::BTreeMap<&str, Vec<uuid::Uuid>> =
            std::collections::BTreeMap::new();
        for (namespace, id) in &leases.failed_after_sent {
            by_namespace.entry(namespace).or_default().push(*id);
        }
        for (namespace, ids) in by_namespace {
            crate::callbacks::settle_failures(tx, namespace, &ids).await?;
        }
        Ok::<_, StoreError>(leases)
    })?;
    expiries.walked_through(leases.swept_through);
    let deadlines_passed = store.conn().await?.leases().expire_deadlines(BATCH).await?;
    // Campaigns whose last task ended are finished here, each once, with its notification. A
    // failure here must not hold up lease sweeping: it is retried on the next pass.
    match finish_campaigns(store).await {
        Ok(0) => {}
        Ok(finished) => tracing::info!(campaigns = finished, "campaigns finished"),
        Err(e) => tracing::warn!(error = %e, "cannot finish campaigns"),
    }
    crate::telemetry::metrics::swept(leases.expired, &leases.ended, deadlines_passed);
    if leases.expired > 0 || deadlines_passed > 0 {
        tracing::info!(
            leases_expired = leases.expired,
            rescheduled = leases.rescheduled,
            deadlines_passed,
            "sweep"
        );
    }
    Ok(Some(
        leases.expired as i64 >= BATCH || deadlines_passed as i64 >= BATCH,
    ))
}

async fn finish_campaigns(store: &Store) -> Result<i32, StoreError> {
    store.conn().await?.campaigns().finish().await
}
