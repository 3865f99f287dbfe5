//! The retention job: prunes finished tasks and forgets idempotency keys and recipient pairs
//! past their retention.
//! Safe on every replica at once (SKIP LOCKED); it runs on a fixed interval because nothing
//! waits on it. Batches walk the finished tasks from where the last one stopped
//! ([`LowWater`]), from the oldest once per interval.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::low_water::LowWater;
use crate::store::retention::Pruned;
use crate::store::{Db, Store, StoreError};

/// Rows deleted per statement, to keep each transaction short.
const BATCH: i64 = 1_000;

/// Runs until `shutdown`.
pub async fn run(
    store: Store,
    task_retention: Duration,
    key_retention: Duration,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let mut tasks_from = LowWater::new(interval);
    loop {
        loop {
            let from = tasks_from.next_walk_from();
            match prune(&store, task_retention, key_retention, from).await {
                Ok(p) => {
                    tasks_from.walked_through(p.tasks_through);
                    if p.tasks > 0 || p.keys > 0 || p.recipients > 0 || p.replies > 0 {
                        tracing::info!(
                            tasks = p.tasks,
                            keys = p.keys,
                            recipients = p.recipients,
                            replies = p.replies,
                            "pruned"
                        );
                    }
                    if (p.tasks as i64) < BATCH
                        && (p.recipients as i64) < BATCH
                        && (p.replies as i64) < BATCH
                    {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "pruning failed");
                    break;
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

async fn prune(
    store: &Store,
    tasks: Duration,
    keys: Duration,
    tasks_from: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<Pruned, StoreError> {
    store
        .conn()
        .await?
        .retention()
        .prune(tasks, keys, BATCH, tasks_from)
        .await
}
