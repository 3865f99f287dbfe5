//! The retention job: moves finished tasks into the history, drops history partitions past the
//! task retention, and prunes what is left of finished tasks, idempotency keys and recipient
//! pairs past their retention.
//! Safe on every replica at once (SKIP LOCKED, and an advisory lock around partition changes);
//! it runs on a fixed interval because nothing waits on it. Batches walk the finished tasks
//! from where the last one stopped ([`LowWater`]), from the oldest once per interval.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::low_water::LowWater;
use crate::store::{Db, Store, StoreError};

/// Rows deleted per statement, to keep each transaction short.
const BATCH: i64 = 1_000;

/// Tasks moved into the history per statement: larger than a pruning batch, since a move
/// writes each task twice and its per-statement cost is worth spreading; no other path locks
/// finished tasks but a retry or a late delivery failure, which waits at most one batch.
const ARCHIVE_BATCH: i64 = 5_000;

/// How long a partition change waits for a reader of the history before giving up until the
/// next pass: every query on the history would queue behind a waiting one.
const PARTITION_LOCK_TIMEOUT: Duration = Duration::from_secs(2);

/// How many partition widths ahead partitions exist, so a pass that could not make one (a long
/// reader held the lock) is retried long before a task needs it.
const PARTITIONS_AHEAD: u32 = 2;

/// What the retention job keeps and for how long.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    /// How long finished tasks (and their attempts) are kept.
    pub tasks: Duration,
    /// How long idempotency keys outlive their task's end, at least the task retention.
    pub keys: Duration,
    /// How often a pass runs.
    pub interval: Duration,
    /// How long a finished task stays in the hot table before it moves into the history.
    pub history_after: Duration,
    /// How wide each history partition is.
    pub history_partition: Duration,
}

/// At most this many history partition pairs within the task retention: each is two tables
/// and their indexes, and every query on the history plans over all of them.
pub const MAX_HISTORY_PARTITIONS: u128 = 1_000;

impl Retention {
    /// The retention settings of `config`.
    pub fn of(config: &crate::config::Config) -> Self {
        Retention {
            tasks: config.task_retention,
            keys: config.idempotency_retention,
            interval: config.retention_interval,
            history_after: config.history_after,
            history_partition: config.history_partition,
        }
    }

    /// Refuses a partition width under a second or not a whole number of seconds, or so narrow
    /// that the task retention would take more than [`MAX_HISTORY_PARTITIONS`] of them.
    pub fn check(&self) -> Result<(), String> {
        let width = self.history_partition.as_millis();
        if width < 1_000 {
            return Err(format!(
                "HERALD_HISTORY_PARTITION is {:?}; it must be at least 1s",
                self.history_partition
            ));
        }
        // The partitions' bounds are multiples of the width from the epoch: a fraction of a
        // second (86.4 s) put a boundary a float's rounding apart from where it should be, and
        // the upkeep failed at every pass on an empty range, so nothing was moved any more.
        if !width.is_multiple_of(1_000) {
            return Err(format!(
                "HERALD_HISTORY_PARTITION is {:?}; it must be a whole number of seconds",
                self.history_partition
            ));
        }
        let partitions = self.tasks.as_millis().div_ceil(width);
        if partitions > MAX_HISTORY_PARTITIONS {
            return Err(format!(
                "HERALD_HISTORY_PARTITION {:?} would split HERALD_TASK_RETENTION {:?} into \
                 {partitions} partitions; at most {MAX_HISTORY_PARTITIONS} are allowed, so make \
                 it at least {:?}",
                self.history_partition,
                self.tasks,
                Duration::from_secs(
                    u64::try_from(
                        self.tasks
                            .as_millis()
                            .div_ceil(MAX_HISTORY_PARTITIONS)
                            .div_ceil(1_000)
                    )
                    .unwrap_or(u64::MAX)
                )
            ));
        }
        Ok(())
    }
}

/// Runs until `shutdown`.
pub async fn run(store: Store, retention: Retention, shutdown: CancellationToken) {
    let mut archive_from = LowWater::new(retention.interval);
    let mut prune_from = LowWater::new(retention.interval);
    loop {
        match drop_expired_partitions(&store, &retention).await {
            Ok(dropped) if dropped > 0 => {
                tracing::info!(
                    tasks = dropped,
                    "history partitions past the retention dropped"
                );
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "dropping history partitions failed; trying again next pass");
            }
        }
        loop {
            let from = archive_from.next_walk_from();
            // Again before every batch: a backlog of moves can take longer than the partitions
            // made at the start of the pass reach ahead, and a task whose partition does not
            // exist fails its whole batch.
            match ensure_partitions(&store, &retention).await {
                Ok(made) if made > 0 => tracing::info!(made, "history partitions made"),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "making history partitions failed; trying again next pass");
                    break;
                }
            }
            match archive(&store, &retention, from).await {
                Ok(a) => {
                    archive_from.walked_through(a.through);
                    if a.tasks > 0 {
                        tracing::debug!(tasks = a.tasks, "finished tasks moved to the history");
                    }
                    if (a.tasks as i64) < ARCHIVE_BATCH {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "moving finished tasks to the history failed");
                    break;
                }
            }
        }
        loop {
            let from = prune_from.next_walk_from();
            match prune(&store, &retention, from).await {
                Ok(p) => {
                    prune_from.walked_through(p.tasks_through);
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
            _ = tokio::time::sleep(retention.interval) => {}
        }
    }
}

/// Makes the history partitions from the retention's start to a little ahead; returns how many.
async fn ensure_partitions(store: &Store, r: &Retention) -> Result<i32, StoreError> {
    store
        .conn()
        .await?
        .history()
        .ensure_partitions(
            r.tasks,
            r.history_partition * PARTITIONS_AHEAD,
            r.history_partition,
            PARTITION_LOCK_TIMEOUT,
        )
        .await
}

/// Drops the history partitions past the retention; returns how many tasks went.
async fn drop_expired_partitions(store: &Store, r: &Retention) -> Result<u64, StoreError> {
    // A connection of its own, discarded after: the drop sets its lock_timeout.
    let conn = store.conn().await?;
    let dropped = conn
        .history()
        .drop_expired(r.tasks, PARTITION_LOCK_TIMEOUT)
        .await;
    Store::discard(conn);
    dropped
}

async fn archive(
    store: &Store,
    r: &Retention,
    from: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<crate::store::history::Archived, StoreError> {
    store
        .conn()
        .await?
        .history()
        .archive(
            r.history_after,
            r.tasks,
            r.keys,
            r.history_partition,
            ARCHIVE_BATCH,
            from,
        )
        .await
}

async fn prune(
    store: &Store,
    r: &Retention,
    from: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<crate::store::retention::Pruned, StoreError> {
    store
        .conn()
        .await?
        .retention()
        .prune(r.tasks, r.keys, BATCH, from)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retention(tasks: Duration, partition: Duration) -> Retention {
        Retention {
            tasks,
            keys: tasks,
            interval: Duration::from_secs(60),
            history_after: Duration::from_secs(600),
            history_partition: partition,
        }
    }

    #[test]
    fn the_defaults_pass() {
        let day = Duration::from_secs(86_400);
        assert_eq!(retention(day * 7, day).check(), Ok(()));
    }

    #[test]
    fn a_partition_under_a_second_is_refused() {
        let err = retention(Duration::from_secs(60), Duration::from_millis(500))
            .check()
            .unwrap_err();
        assert!(err.contains("at least 1s"), "{err}");
    }

    #[test]
    fn too_many_partitions_within_the_retention_are_refused_naming_the_least_width() {
        let err = retention(Duration::from_secs(7 * 86_400), Duration::from_secs(60))
            .check()
            .unwrap_err();
        assert!(err.contains("10080 partitions"), "{err}");
        assert!(err.contains("at least 605s"), "{err}");
        // The least width it names passes; a day's retention names 87 s, not 86.4 s.
        assert_eq!(
            retention(Duration::from_secs(7 * 86_400), Duration::from_secs(605)).check(),
            Ok(())
        );
        let err = retention(Duration::from_secs(86_400), Duration::from_secs(60))
            .check()
            .unwrap_err();
        assert!(err.contains("at least 87s"), "{err}");
    }

    #[test]
    fn a_partition_of_a_fraction_of_a_second_is_refused() {
        let err = retention(Duration::from_secs(86_400), Duration::from_millis(86_400))
            .check()
            .unwrap_err();
        assert!(err.contains("whole number of seconds"), "{err}");
    }
}
