//! The delta folder: applies the released slots and successes that report batches leave in
//! `herald.account_deltas` to their account rows.
//!
//! Report batches that only free slots and count successes do not lock account rows, so they
//! never wait for a claim reserving on the same accounts, nor hold one up (docs/accounts.md,
//! "Feedback"). The freed slots count at once (`herald.account_in_flight`); the successes move
//! the adaptive rate and the success rate once folded. Folding every short while keeps the
//! table a few pages and the per-claim sum over it small, and takes each account's lock once
//! per fold instead of once per report batch (every `HERALD_FOLD_INTERVAL`, 200 ms by default).
//! Safe on every replica at once: two folds of one account take turns on its row and each delta
//! is applied once.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::store::transaction;
use crate::store::{Db, Store, StoreError};

/// Runs until `stop`, folding every `interval`.
pub async fn run(store: Store, interval: Duration, stop: CancellationToken) {
    crate::server::background::every(interval, stop, "fold account deltas", || fold_once(&store))
        .await;
}

/// Folds everything waiting now, one transaction per namespace; returns the accounts folded.
pub async fn fold_once(store: &Store) -> Result<usize, StoreError> {
    let waiting = store.conn().await?.accounts().waiting_deltas().await?;
    let mut folded = 0;
    for (namespace, ids) in waiting {
        // Idempotent: a fold that committed deleted what it applied, so a rerun finds nothing.
        transaction!(store, StoreError, idempotent = true, |tx| tx
            .accounts()
            .fold_deltas(&namespace, &ids)
            .await)?;
        folded += ids.len();
    }
    Ok(folded)
}
