//! The schedule aggregate: stored schedules and their materialised runs. The materialiser's
//! own transaction (one per schedule and pass) lives in `schedule/materializer.rs`.

use chrono::{DateTime, Utc};
use tokio_postgres::Row;

use super::{Store, StoreError};

/// A schedule as stored. `spec` is the encoded `herald.v1.ScheduleSpec`; the policy columns
/// are copies of its fields the materialiser needs without decoding.
#[derive(Debug, Clone)]
pub struct ScheduleRecord {
    /// Id.
    pub id: String,
    /// Cron expression.
    pub cron: String,
    /// IANA zone.
    pub time_zone: String,
    /// 'shift_forward' | 'skip'.
    pub skipped_time: String,
    /// 'fire_once' | 'fire_twice'.
    pub repeated_time: String,
    /// 'skip' | 'allow'.
    pub overlap: String,
    /// 'skip' | 'fire_once_now' | 'catch_up'.
    pub misfire: String,
    /// Lateness still counted as on time, in milliseconds.
    pub misfire_grace_ms: i64,
    /// Random offset bound, in milliseconds.
    pub jitter_ms: i64,
    /// Stagger window, in milliseconds.
    pub stagger_ms: i64,
    /// Stagger keeps off minutes :00 and :30.
    pub stagger_off_round: bool,
    /// Encoded spec.
    pub spec: Vec<u8>,
    /// Paused.
    pub paused: bool,
    /// The next fire time to handle.
    pub next_fire_at: Option<DateTime<Utc>>,
    /// The last fire time that created a run.
    pub last_fire_at: Option<DateTime<Utc>>,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

/// A materialised run.
#[derive(Debug, Clone)]
pub struct RunRecord {
    /// Fire time.
    pub fire_time: DateTime<Utc>,
    /// 'fired' | 'catch_up' | 'skipped_overlap'.
    pub kind: String,
    /// Tasks created.
    pub task_count: i32,
    /// Materialised at.
    pub created_at: DateTime<Utc>,
}

/// Columns [`schedule_from_row`] expects, in order.
pub(crate) const SCHEDULE_COLUMNS: &str = "id, cron, time_zone, skipped_time, repeated_time, \
     overlap, misfire, misfire_grace_ms, jitter_ms, stagger_ms, stagger_off_round, spec, paused, \
     next_fire_at, last_fire_at, created_at, updated_at";

/// Reads a row selected with [`SCHEDULE_COLUMNS`].
pub(crate) fn schedule_from_row(r: &Row) -> ScheduleRecord {
    ScheduleRecord {
        id: r.get(0),
        cron: r.get(1),
        time_zone: r.get(2),
        skipped_time: r.get(3),
        repeated_time: r.get(4),
        overlap: r.get(5),
        misfire: r.get(6),
        misfire_grace_ms: r.get(7),
        jitter_ms: r.get(8),
        stagger_ms: r.get(9),
        stagger_off_round: r.get(10),
        spec: r.get(11),
        paused: r.get(12),
        next_fire_at: r.get(13),
        last_fire_at: r.get(14),
        created_at: r.get(15),
        updated_at: r.get(16),
    }
}

/// Wakes the materialiser on every replica (only the leader acts on it).
const NOTIFY: &str = "SELECT pg_notify('herald_schedules', '')";

impl Store {
    /// Inserts a schedule; None if the id is taken. `next_fire_at` is its first fire time.
    pub async fn create_schedule(
        &self,
        namespace: &str,
        s: &ScheduleRecord,
    ) -> Result<Option<ScheduleRecord>, StoreError> {
        let mut conn = self.conn().await?;
        let tx = conn
            .transaction()
            .await
            .map_err(StoreError::query("starting a schedule create"))?;
        let row = tx
            .query_opt(
                &format!(
                    "INSERT INTO herald.schedules (namespace, id, cron, time_zone, skipped_time,
                         repeated_time, overlap, misfire, misfire_grace_ms, jitter_ms, stagger_ms,
                         stagger_off_round, spec, next_fire_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
                     ON CONFLICT DO NOTHING
                     RETURNING {SCHEDULE_COLUMNS}"
                ),
                &[
                    &namespace,
                    &s.id,
                    &s.cron,
                    &s.time_zone,
                    &s.skipped_time,
                    &s.repeated_time,
                    &s.overlap,
                    &s.misfire,
                    &s.misfire_grace_ms,
                    &s.jitter_ms,
                    &s.stagger_ms,
                    &s.stagger_off_round,
                    &s.spec,
                    &s.next_fire_at,
                ],
            )
            .await
            .map_err(StoreError::query("inserting a schedule"))?;
        tx.execute(NOTIFY, &[])
            .await
            .map_err(StoreError::query("announcing a schedule"))?;
        tx.commit()
            .await
            .map_err(StoreError::query("committing a schedule create"))?;
        Ok(row.as_ref().map(schedule_from_row))
    }

    /// Reads a schedule.
    pub async fn get_schedule(
        &self,
        namespace: &str,
        id: &str,
    ) -> Result<Option<ScheduleRecord>, StoreError> {
        let conn = self.conn().await?;
        let row = conn
            .query_opt(
                &format!(
                    "SELECT {SCHEDULE_COLUMNS} FROM herald.schedules
                     WHERE namespace = $1 AND id = $2"
                ),
                &[&namespace, &id],
            )
            .await
            .map_err(StoreError::query("reading a schedule"))?;
        Ok(row.as_ref().map(schedule_from_row))
    }

    /// Lists schedules with an id after `after`, by id.
    pub async fn list_schedules(
        &self,
        namespace: &str,
        after: &str,
        limit: i64,
    ) -> Result<Vec<ScheduleRecord>, StoreError> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                &format!(
                    "SELECT {SCHEDULE_COLUMNS} FROM herald.schedules
                     WHERE namespace = $1 AND id > $2 ORDER BY id LIMIT $3"
                ),
                &[&namespace, &after, &limit],
            )
            .await
            .map_err(StoreError::query("listing schedules"))?;
        Ok(rows.iter().map(schedule_from_row).collect())
    }

    /// Deletes a schedule and its runs; false if it did not exist.
    pub async fn delete_schedule(&self, namespace: &str, id: &str) -> Result<bool, StoreError> {
        let conn = self.conn().await?;
        let n = conn
            .execute(
                "DELETE FROM herald.schedules WHERE namespace = $1 AND id = $2",
                &[&namespace, &id],
            )
            .await
            .map_err(StoreError::query("deleting a schedule"))?;
        Ok(n > 0)
    }

    /// Pauses or resumes a schedule. Resuming sets the cursor to `next_fire_at` (the first fire
    /// time after now), so fire times passed while paused are not treated as missed.
    pub async fn set_schedule_paused(
        &self,
        namespace: &str,
        id: &str,
        paused: bool,
        next_fire_at: Option<DateTime<Utc>>,
    ) -> Result<Option<ScheduleRecord>, StoreError> {
        let mut conn = self.conn().await?;
        let tx = conn
            .transaction()
            .await
            .map_err(StoreError::query("starting a schedule pause"))?;
        // Resuming an active schedule keeps its cursor: nothing changes.
        let row = tx
            .query_opt(
                &format!(
                    "UPDATE herald.schedules
                     SET paused = $3,
                         next_fire_at = CASE WHEN paused AND NOT $3 THEN $4 ELSE next_fire_at END,
                         updated_at = now()
                     WHERE namespace = $1 AND id = $2
                     RETURNING {SCHEDULE_COLUMNS}"
                ),
                &[&namespace, &id, &paused, &next_fire_at],
            )
            .await
            .map_err(StoreError::query("pausing a schedule"))?;
        tx.execute(NOTIFY, &[])
            .await
            .map_err(StoreError::query("announcing a schedule change"))?;
        tx.commit()
            .await
            .map_err(StoreError::query("committing a schedule pause"))?;
        Ok(row.as_ref().map(schedule_from_row))
    }

    /// A schedule's runs with a fire time before `before`, newest first.
    pub async fn list_schedule_runs(
        &self,
        namespace: &str,
        id: &str,
        before: Option<DateTime<Utc>>,
        limit: i64,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                "SELECT fire_time, kind, task_count, created_at FROM herald.schedule_runs
                 WHERE namespace = $1 AND schedule_id = $2
                   AND ($3::timestamptz IS NULL OR fire_time < $3)
                 ORDER BY fire_time DESC LIMIT $4",
                &[&namespace, &id, &before, &limit],
            )
            .await
            .map_err(StoreError::query("listing schedule runs"))?;
        Ok(rows
            .iter()
            .map(|r| RunRecord {
                fire_time: r.get(0),
                kind: r.get(1),
                task_count: r.get(2),
                created_at: r.get(3),
            })
            .collect())
    }
}
