//! Pruning of finished tasks and of idempotency keys past their retention.

use std::time::Duration;

use super::{Store, StoreError};

/// What one pruning pass removed.
#[derive(Debug, Default, Clone, Copy)]
pub struct Pruned {
    /// Finished tasks (and their attempts) deleted.
    pub tasks: u64,
    /// Idempotency keys forgotten.
    pub keys: u64,
}

impl Store {
    /// Deletes up to `batch` tasks that ended more than `task_retention` ago, with their
    /// attempts; their idempotency keys start their own retention from the task's end. Then
    /// forgets keys whose retention is over.
    pub async fn prune(
        &self,
        task_retention: Duration,
        key_retention: Duration,
        batch: i64,
    ) -> Result<Pruned, StoreError> {
        let conn = self.conn().await?;
        let task_ms = i64::try_from(task_retention.as_millis()).unwrap_or(i64::MAX);
        let key_ms = i64::try_from(key_retention.as_millis()).unwrap_or(i64::MAX);
        let row = conn
            .query_one(
                "WITH old AS (
                     SELECT id, finished_at FROM herald.tasks
                     WHERE finished_at < now() - $1::bigint * interval '1 millisecond'
                     ORDER BY finished_at
                     LIMIT $3::bigint
                     FOR UPDATE SKIP LOCKED
                 ),
                 gone AS (
                     DELETE FROM herald.tasks t USING old WHERE t.id = old.id
                     RETURNING t.id, old.finished_at
                 ),
                 attempts AS (
                     DELETE FROM herald.attempts a USING gone WHERE a.task_id = gone.id
                 ),
                 keys AS (
                     UPDATE herald.idempotency_keys k
                     SET forget_after = gone.finished_at + $2::bigint * interval '1 millisecond'
                     FROM gone WHERE k.task_id = gone.id
                 )
                 SELECT count(*)::bigint FROM gone",
                &[&task_ms, &key_ms, &batch],
            )
            .await
            .map_err(StoreError::query("pruning finished tasks"))?;
        let tasks = u64::try_from(row.get::<_, i64>(0)).unwrap_or(0);
        let keys = conn
            .execute(
                "DELETE FROM herald.idempotency_keys
                 WHERE forget_after IS NOT NULL AND forget_after < now()",
                &[],
            )
            .await
            .map_err(StoreError::query("forgetting idempotency keys"))?;
        Ok(Pruned { tasks, keys })
    }
}
