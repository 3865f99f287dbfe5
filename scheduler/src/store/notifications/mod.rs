//! The notification repository: the outbox of the notification webhook (`herald.notifications`,
//! filled by the triggers of `V5__add_notifications.sql`) and the live task counts of the
//! `herald_tasks` gauge.

use std::time::Duration;

use deadpool_postgres::GenericClient;
use uuid::Uuid;

use super::sql::{column, millis as ms, statement, Statement};
use super::{repository, StoreError};

repository!(
    /// The notification outbox and live counts.
    NotificationRepo
);

const LIVE_TASK_COUNTS: Statement = statement!("live_task_counts");

/// Live tasks of one state and queue (`herald.live_task_counts`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct LiveCount {
    /// `scheduled` or `leased`.
    pub state: String,
    /// The queue.
    pub queue: String,
    /// How many.
    pub tasks: i64,
    /// Of those, scheduled tasks due now and not parked behind a paused campaign.
    pub due: i64,
}
const ENABLE: Statement = statement!("enable");
const TAKE: Statement = statement!("take");
const DELIVERED: Statement = statement!("delivered");
const FAILED: Statement = statement!("failed");
const BACKLOG: Statement = statement!("backlog");
const RAISE: Statement = statement!("raise");

/// Queues the notification webhook event `event` with `data` in `db`'s transaction (see
/// `herald.notify_event`): delivered only if it commits.
pub async fn notify_event(
    db: &impl GenericClient,
    event: &str,
    data: &serde_json::Value,
) -> Result<(), StoreError> {
    RAISE.execute(db, &[&event, data]).await?;
    Ok(())
}

/// One notification taken for delivery.
#[derive(Debug, Clone)]
pub struct PendingNotification {
    /// Its id, also the `webhook-id` of every delivery try.
    pub id: Uuid,
    /// Event type, e.g. `task.failed`.
    pub event: String,
    /// The JSON body to send.
    pub payload: serde_json::Value,
    /// Delivery tries so far, this one included.
    pub attempts: i32,
}

impl<C: GenericClient> NotificationRepo<'_, C> {
    /// Live tasks (scheduled, leased) counted by state and queue.
    pub async fn live_task_counts(&self) -> Result<Vec<LiveCount>, StoreError> {
        LIVE_TASK_COUNTS
            .query(self.db, &[])
            .await?
            .iter()
            .map(|r| {
                Ok(LiveCount {
                    state: column(r, "state")?,
                    queue: column(r, "queue")?,
                    tasks: column(r, "tasks")?,
                    due: column(r, "due")?,
                })
            })
            .collect()
    }

    /// Keeps notifications being recorded for `period` from now.
    pub async fn enable(&self, period: Duration) -> Result<(), StoreError> {
        ENABLE.execute(self.db, &[&ms(period)]).await?;
        Ok(())
    }

    /// Takes up to `limit` due notifications for delivery, holding each for `hold`.
    pub async fn take(
        &self,
        limit: i64,
        hold: Duration,
    ) -> Result<Vec<PendingNotification>, StoreError> {
        TAKE.query(self.db, &[&limit, &ms(hold)])
            .await?
            .iter()
            .map(|r| {
                Ok(PendingNotification {
                    id: column(r, "id")?,
                    event: column(r, "event")?,
                    payload: column(r, "payload")?,
                    attempts: column(r, "attempts")?,
                })
            })
            .collect()
    }

    /// Forgets a delivered notification.
    pub async fn delivered(&self, id: Uuid) -> Result<(), StoreError> {
        DELIVERED.execute(self.db, &[&id]).await?;
        Ok(())
    }

    /// Records a failed delivery and when to try again.
    pub async fn failed(
        &self,
        id: Uuid,
        retry_in: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        FAILED
            .execute(self.db, &[&id, &ms(retry_in), &error])
            .await?;
        Ok(())
    }

    /// Notifications waiting, and milliseconds until the earliest is due (None when empty).
    pub async fn backlog(&self) -> Result<(i64, Option<f64>), StoreError> {
        let row = BACKLOG.query_one(self.db, &[]).await?;
        Ok((column(&row, "waiting")?, column(&row, "next_due_ms")?))
    }
}

#[cfg(test)]
mod tests {
    use super::LiveCount;
    use crate::store::scratch::{insert_tasks, ScratchStore};
    use crate::store::Db as _;

    /// The gauge's count gives each live state's tasks by queue, and runs without parallel
    /// workers whatever the server allows: with millions of live tasks a parallel count took
    /// every core from the claims (docs/performance.md, S4). Fails if the function loses its
    /// setting.
    #[tokio::test]
    async fn live_tasks_are_counted_by_state_and_queue_without_parallel_workers() {
        let store = ScratchStore::migrated().await;
        let conn = store.conn().await.unwrap_or_else(|e| panic!("{e}"));
        insert_tasks(&conn, 4, "scheduled").await;
        insert_tasks(&conn, 2, "leased").await;
        insert_tasks(&conn, 4, "succeeded").await;
        // Of the scheduled ones (due ten minutes ago), one not due yet and one parked behind a
        // paused campaign: neither is due work.
        conn.batch_execute(
            "UPDATE herald.tasks SET run_at = now() + interval '1 hour'
             WHERE id = (SELECT id FROM herald.tasks WHERE state = 'scheduled' ORDER BY id LIMIT 1);
             UPDATE herald.tasks SET route = 'paused:' || route
             WHERE id = (SELECT id FROM herald.tasks WHERE state = 'scheduled'
                         ORDER BY id DESC LIMIT 1)",
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let mut counts = conn
            .notifications()
            .live_task_counts()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        counts.sort();
        let count = |state: &str, tasks, due| LiveCount {
            state: state.to_owned(),
            queue: "q".to_owned(),
            tasks,
            due,
        };
        assert_eq!(
            counts,
            vec![count("leased", 2, 0), count("scheduled", 4, 2)]
        );
        let settings: Vec<String> = conn
            .query(
                "SELECT unnest(proconfig) AS setting FROM pg_proc
                 WHERE oid = 'herald.live_task_counts()'::regprocedure",
                &[],
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .iter()
            .map(|r| r.get("setting"))
            .collect();
        assert_eq!(settings, vec!["max_parallel_workers_per_gather=0"]);
    }
}
