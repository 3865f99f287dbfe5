//! The slot reconciler: keeps each account's `in_flight` equal to the leases it holds.
//!
//! Every path that begins or ends a lease changes `in_flight` in the same transaction, so the
//! two cannot drift through a crash or a lost connection part way. This is the backstop for
//! whatever this reasoning misses (a bug, a manual edit): every `HERALD_RECONCILE_INTERVAL` it finds accounts
//! whose count differs and, under each account's row lock, sets the count to the leases it
//! holds (see `store/accounts/lock_account.sql` for why that is exact even while claims and
//! reports run). Safe on every replica at once. A correction is logged and counted, since it
//! means a slot was lost or invented somewhere.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::store::accounts::Reconciled;
use crate::store::transaction;
use crate::store::{Db, Store, StoreError};

/// Runs until `stop`, reconciling every `interval`.
pub async fn run(store: Store, interval: Duration, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        if let Err(e) = reconcile_once(&store).await {
            tracing::warn!(error = %e, "cannot reconcile account slots");
        }
    }
}

/// Checks every account once; returns the corrections made.
pub async fn reconcile_once(store: &Store) -> Result<Vec<Reconciled>, StoreError> {
    let drifted = store.conn().await?.accounts().drifted().await?;
    let mut corrected = Vec::new();
    for (namespace, account) in drifted {
        // Idempotent: it sets the count to the leases held, under the account's lock.
        let fixed = transaction!(store, StoreError, idempotent = true, |tx| tx
            .accounts()
            .reconcile(&namespace, &account)
            .await)?;
        if let Some(fix) = fixed {
            tracing::warn!(namespace = %fix.namespace, account = %fix.account,
                before = fix.before, after = fix.after,
                "account in-flight count differed from its leases; corrected");
            crate::telemetry::metrics::slots_reconciled(1);
            corrected.push(fix);
        }
    }
    Ok(corrected)
}
