//! What telemetry reads from the database: the pool's state, live task counts for the
//! `herald_tasks` gauge, and the notification outbox (`herald.notifications`, filled by the
//! triggers of `V5__add_notifications.sql`).

use std::time::Duration;

use uuid::Uuid;

use super::{Store, StoreError};

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

impl Store {
    /// The connection pool's current state.
    pub fn pool_status(&self) -> deadpool_postgres::Status {
        self.pool.status()
    }

    /// Live tasks (scheduled, leased) counted by state and queue.
    pub async fn live_task_counts(&self) -> Result<Vec<(String, String, i64)>, StoreError> {
        let conn = self.conn().await?;
        // Only the two live states: the partial indexes on them keep finished tasks, the bulk
        // of the table, out of the scan.
        let rows = conn
            .query(
                "SELECT state::text, queue, count(*) FROM herald.tasks
                 WHERE state IN ('scheduled', 'leased') GROUP BY 1, 2",
                &[],
            )
            .await
            .map_err(StoreError::query("counting live tasks"))?;
        Ok(rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect())
    }

    /// Keeps notifications being recorded for `period` from now (see `herald.notify_settings`).
    pub async fn enable_notifications(&self, period: Duration) -> Result<(), StoreError> {
        let ms = i64::try_from(period.as_millis()).unwrap_or(i64::MAX);
        let conn = self.conn().await?;
        conn.execute(
            "INSERT INTO herald.notify_settings (id, enabled_until)
             VALUES (true, now() + $1::bigint * interval '1 millisecond')
             ON CONFLICT (id) DO UPDATE SET enabled_until =
                 GREATEST(herald.notify_settings.enabled_until, EXCLUDED.enabled_until)",
            &[&ms],
        )
        .await
        .map_err(StoreError::query("enabling notifications"))?;
        Ok(())
    }

    /// Takes up to `limit` due notifications for delivery, pushing their next try `hold` ahead
    /// so no other replica sends them meanwhile (and a crash mid-delivery only delays them).
    pub async fn take_notifications(
        &self,
        limit: i64,
        hold: Duration,
    ) -> Result<Vec<PendingNotification>, StoreError> {
        let ms = i64::try_from(hold.as_millis()).unwrap_or(i64::MAX);
        let conn = self.conn().await?;
        let rows = conn
            .query(
                "UPDATE herald.notifications n
                 SET attempts = n.attempts + 1,
                     next_attempt_at = now() + $2::bigint * interval '1 millisecond'
                 FROM (SELECT id FROM herald.notifications
                       WHERE next_attempt_at <= now()
                       ORDER BY next_attempt_at LIMIT $1
                       FOR UPDATE SKIP LOCKED) due
                 WHERE n.id = due.id
                 RETURNING n.id, n.event, n.payload, n.attempts",
                &[&limit, &ms],
            )
            .await
            .map_err(StoreError::query("taking notifications"))?;
        Ok(rows
            .iter()
            .map(|r| PendingNotification {
                id: r.get(0),
                event: r.get(1),
                payload: r.get(2),
                attempts: r.get(3),
            })
            .collect())
    }

    /// Forgets a delivered notification.
    pub async fn notification_delivered(&self, id: Uuid) -> Result<(), StoreError> {
        let conn = self.conn().await?;
        conn.execute("DELETE FROM herald.notifications WHERE id = $1", &[&id])
            .await
            .map_err(StoreError::query("deleting a notification"))?;
        Ok(())
    }

    /// Records a failed delivery and when to try again.
    pub async fn notification_failed(
        &self,
        id: Uuid,
        retry_in: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        let ms = i64::try_from(retry_in.as_millis()).unwrap_or(i64::MAX);
        let conn = self.conn().await?;
        conn.execute(
            "UPDATE herald.notifications
             SET next_attempt_at = now() + $2::bigint * interval '1 millisecond', last_error = $3
             WHERE id = $1",
            &[&id, &ms, &error],
        )
        .await
        .map_err(StoreError::query("recording a notification failure"))?;
        Ok(())
    }

    /// Notifications waiting, and milliseconds until the earliest is due (None when empty).
    pub async fn notification_backlog(&self) -> Result<(i64, Option<f64>), StoreError> {
        let conn = self.conn().await?;
        let row = conn
            .query_one(
                "SELECT count(*),
                        (EXTRACT(EPOCH FROM (min(next_attempt_at) - now())) * 1000)::float8
                 FROM herald.notifications",
                &[],
            )
            .await
            .map_err(StoreError::query("reading the notification backlog"))?;
        Ok((row.get(0), row.get(1)))
    }
}
