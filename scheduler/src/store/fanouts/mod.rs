//! The fan-out repository: schedule runs whose recipients (an audience's contacts, or those a
//! variables source is asked about) become tasks batch by batch, each batch fenced by the
//! last recipient the previous one wrote.

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use super::sql::{column, notify, statement, FromRow, Statement};
use super::{repository, StoreError};

repository!(
    /// Fan-outs of schedule runs.
    FanoutRepo
);

const INSERT_FANOUT: Statement = statement!("insert_fanout");
const PENDING_FANOUTS: Statement = statement!("pending_fanouts");
const LOCK_FANOUT: Statement = statement!("lock_fanout");
const ADVANCE_FANOUT: Statement = statement!("advance_fanout");
const FAIL_FANOUT: Statement = statement!("fail_fanout");
const NEXT_FANOUT: Statement = statement!("next_fanout");

/// An unfinished fan-out.
#[derive(Debug, Clone)]
pub struct PendingFanout {
    /// Its namespace.
    pub namespace: String,
    /// Its schedule.
    pub schedule_id: String,
    /// Its run's fire time.
    pub fire_time: DateTime<Utc>,
    /// The run is a catch-up.
    pub catch_up: bool,
    /// The run's period: from the previous fire time (None: the schedule never fired before it
    /// could know one)…
    pub period_start: Option<DateTime<Utc>>,
    /// …to this one (for a catch-up of several missed fire times, the latest).
    pub period_end: DateTime<Utc>,
    /// The last recipient written; empty before the first batch.
    pub after_recipient: String,
    /// Failed batches in a row.
    pub failures: i32,
    /// The schedule's spec (encoded) when the run was made, which every batch of the run
    /// follows; None for runs made before migration 39.
    pub spec: Option<Vec<u8>>,
}

impl FromRow for PendingFanout {
    fn from_row(r: &Row) -> Result<Self, StoreError> {
        Ok(PendingFanout {
            namespace: column(r, "namespace")?,
            schedule_id: column(r, "schedule_id")?,
            fire_time: column(r, "fire_time")?,
            catch_up: column(r, "catch_up")?,
            period_start: column(r, "period_start")?,
            period_end: column(r, "period_end")?,
            after_recipient: column(r, "after_recipient")?,
            failures: column(r, "failures")?,
            spec: column(r, "spec")?,
        })
    }
}

impl<C: GenericClient> FanoutRepo<'_, C> {
    /// Records a run to fan out (with the run, in its transaction), and wakes the
    /// materialiser's leader at commit: it writes fan-outs' batches after a pass, and a run made
    /// by hand (RunScheduleNow, on any replica) otherwise waited for its next pass, up to half a
    /// minute, before its first task.
    pub async fn insert(&self, f: &PendingFanout) -> Result<(), StoreError> {
        INSERT_FANOUT
            .execute(
                self.db,
                &[
                    &f.namespace,
                    &f.schedule_id,
                    &f.fire_time,
                    &f.catch_up,
                    &f.period_start,
                    &f.period_end,
                    &f.spec,
                ],
            )
            .await?;
        notify(self.db, "herald_schedules", "").await
    }

    /// Up to `limit` fan-outs due for a batch.
    pub async fn pending(&self, limit: i64) -> Result<Vec<PendingFanout>, StoreError> {
        PENDING_FANOUTS.fetch(self.db, &[&limit]).await
    }

    /// Locks `f` for a batch: its last written recipient and the database clock, or None when
    /// it is finished, gone, or another replica is writing it now.
    pub async fn lock(
        &self,
        f: &PendingFanout,
    ) -> Result<Option<(String, DateTime<Utc>)>, StoreError> {
        let row = LOCK_FANOUT
            .query_opt(self.db, &[&f.namespace, &f.schedule_id, &f.fire_time])
            .await?;
        row.map(|r| Ok((column(&r, "after_recipient")?, column(&r, "db_now")?)))
            .transpose()
    }

    /// Moves `f` past a batch ending at `last`, which created `created` tasks.
    pub async fn advance(
        &self,
        f: &PendingFanout,
        last: &str,
        created: i32,
        done: bool,
    ) -> Result<(), StoreError> {
        ADVANCE_FANOUT
            .execute(
                self.db,
                &[
                    &f.namespace,
                    &f.schedule_id,
                    &f.fire_time,
                    &last,
                    &created,
                    &done,
                ],
            )
            .await?;
        Ok(())
    }

    /// Records a failed batch: tried again after `retry_ms`, or given up when `give_up`.
    pub async fn fail(
        &self,
        f: &PendingFanout,
        retry_ms: i64,
        error: &str,
        give_up: bool,
    ) -> Result<(), StoreError> {
        FAIL_FANOUT
            .execute(
                self.db,
                &[
                    &f.namespace,
                    &f.schedule_id,
                    &f.fire_time,
                    &retry_ms,
                    &error,
                    &give_up,
                ],
            )
            .await?;
        Ok(())
    }

    /// Milliseconds until the earliest unfinished fan-out is due; None when there is none.
    pub async fn next_due_ms(&self) -> Result<Option<f64>, StoreError> {
        let row = NEXT_FANOUT.query_one(self.db, &[]).await?;
        column(&row, "wait_ms")
    }
}
