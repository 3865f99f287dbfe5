//! The retention repository: pruning finished tasks, idempotency keys and recipient pairs past
//! their retention.

use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;

use super::sql::{column, millis, statement, Statement};
use super::{repository, StoreError};

repository!(
    /// Pruning.
    RetentionRepo
);

const PRUNE_TASKS: Statement = statement!("prune_tasks");
const FORGET_KEYS: Statement = statement!("forget_keys");
const FORGET_RECIPIENTS: Statement = statement!("forget_recipients");
const FORGET_REPLIES: Statement = statement!("forget_replies");

/// What one pruning pass removed.
#[derive(Debug, Default, Clone, Copy)]
pub struct Pruned {
    /// Finished tasks (and their attempts) deleted.
    pub tasks: u64,
    /// The latest end time of a task deleted, where the next batch's walk can start.
    pub tasks_through: Option<DateTime<Utc>>,
    /// Idempotency keys forgotten.
    pub keys: u64,
    /// (account, recipient) pairs forgotten.
    pub recipients: u64,
    /// Stored replies forgotten.
    pub replies: u64,
}

impl<C: GenericClient> RetentionRepo<'_, C> {
    /// Deletes up to `batch` tasks that ended more than `task_retention` ago, with their
    /// attempts; their idempotency keys start their own retention from the task's end. Then
    /// forgets keys whose retention is over, up to `batch` recipient pairs nothing needs (see
    /// `forget_recipients.sql`) and up to `batch` stored replies older than the task retention.
    /// The walk for tasks starts at `tasks_from` (see [`LowWater`](crate::low_water::LowWater)).
    pub async fn prune(
        &self,
        task_retention: Duration,
        key_retention: Duration,
        batch: i64,
        tasks_from: Option<DateTime<Utc>>,
    ) -> Result<Pruned, StoreError> {
        let task_ms = millis(task_retention);
        let key_ms = millis(key_retention);
        let row = PRUNE_TASKS
            .query_one(self.db, &[&task_ms, &key_ms, &batch, &tasks_from])
            .await?;
        let tasks = u64::try_from(column::<i64>(&row, "pruned")?).unwrap_or(0);
        let tasks_through = column(&row, "pruned_through")?;
        let keys = FORGET_KEYS.execute(self.db, &[]).await?;
        let recipients = FORGET_RECIPIENTS
            .execute(self.db, &[&task_ms, &batch])
            .await?;
        let replies = FORGET_REPLIES.execute(self.db, &[&task_ms, &batch]).await?;
        Ok(Pruned {
            tasks,
            tasks_through,
            keys,
            recipients,
            replies,
        })
    }
}
