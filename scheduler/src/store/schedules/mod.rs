//! The schedule repository: stored schedules and their materialised runs, including the
//! statements of the materialiser's transaction (one per schedule and pass).

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::sql::{column, notify, statement, FromRow, Statement};
use super::{repository, StoreError};
use crate::schedule::model::{RunRecord, ScheduleRecord};

repository!(
    /// Recurring schedules and their runs.
    ScheduleRepo
);

/// What a schedule read selects; decoded by [`ScheduleRecord::from_row`].
const SCHEDULE_COLUMNS: &str = "id, cron, time_zone, skipped_time, repeated_time, overlap, \
     misfire, misfire_grace_ms, jitter_ms, stagger_ms, stagger_off_round, spec, paused, \
     next_fire_at, last_fire_at, created_at, updated_at";

fn expand(name: &'static str, sql: &str) -> Statement {
    Statement::built(name, sql.replace("{schedule_columns}", SCHEDULE_COLUMNS))
}

static INSERT_SCHEDULE: LazyLock<Statement> =
    LazyLock::new(|| expand("insert_schedule", include_str!("insert_schedule.sql")));
static GET_SCHEDULE: LazyLock<Statement> =
    LazyLock::new(|| expand("get_schedule", include_str!("get_schedule.sql")));
static LIST_SCHEDULES: LazyLock<Statement> =
    LazyLock::new(|| expand("list_schedules", include_str!("list_schedules.sql")));
static SET_PAUSED: LazyLock<Statement> =
    LazyLock::new(|| expand("set_paused", include_str!("set_paused.sql")));
static GET_FOR_UPDATE: LazyLock<Statement> = LazyLock::new(|| {
    expand(
        "get_schedule_for_update",
        include_str!("get_schedule_for_update.sql"),
    )
});
static UPDATE_SCHEDULE: LazyLock<Statement> =
    LazyLock::new(|| expand("update_schedule", include_str!("update_schedule.sql")));
static DUE_SCHEDULES: LazyLock<Statement> =
    LazyLock::new(|| expand("due_schedules", include_str!("due_schedules.sql")));
static LOCK_SCHEDULE: LazyLock<Statement> =
    LazyLock::new(|| expand("lock_schedule", include_str!("lock_schedule.sql")));
const DELETE_SCHEDULE: Statement = statement!("delete_schedule");
const LIST_RUNS: Statement = statement!("list_runs");
const NEXT_FIRE: Statement = statement!("next_fire");
const ADVANCE_CURSOR: Statement = statement!("advance_cursor");
const RUN_IN_PROGRESS: Statement = statement!("run_in_progress");
const INSERT_RUN: Statement = statement!("insert_run");
const CHECK_OVERRUNS: Statement = statement!("check_overruns");
const NEXT_OVERRUN: Statement = statement!("next_overrun");

impl FromRow for ScheduleRecord {
    fn from_row(r: &Row) -> Result<Self, StoreError> {
        Ok(ScheduleRecord {
            id: column(r, "id")?,
            cron: column(r, "cron")?,
            time_zone: column(r, "time_zone")?,
            skipped_time: column(r, "skipped_time")?,
            repeated_time: column(r, "repeated_time")?,
            overlap: column(r, "overlap")?,
            misfire: column(r, "misfire")?,
            misfire_grace_ms: column(r, "misfire_grace_ms")?,
            jitter_ms: column(r, "jitter_ms")?,
            stagger_ms: column(r, "stagger_ms")?,
            stagger_off_round: column(r, "stagger_off_round")?,
            spec: column(r, "spec")?,
            paused: column(r, "paused")?,
            next_fire_at: column(r, "next_fire_at")?,
            last_fire_at: column(r, "last_fire_at")?,
            created_at: column(r, "created_at")?,
            updated_at: column(r, "updated_at")?,
        })
    }
}

impl FromRow for RunRecord {
    fn from_row(r: &Row) -> Result<Self, StoreError> {
        Ok(RunRecord {
            fire_time: column(r, "fire_time")?,
            kind: column(r, "kind")?,
            task_count: column(r, "task_count")?,
            created_at: column(r, "created_at")?,
            overran_at: column(r, "overran_at")?,
            fanning_out: column(r, "fanning_out")?,
            error: column(r, "error")?,
        })
    }
}

/// A run found unfinished past its overrun deadline.
#[derive(Debug, Clone)]
pub struct OverranRun {
    /// Its namespace.
    pub namespace: String,
    /// Its schedule.
    pub schedule_id: String,
    /// Its fire time.
    pub fire_time: DateTime<Utc>,
    /// Its tasks still SCHEDULED or LEASED.
    pub live_tasks: i64,
    /// The schedule's overrun_after when the run was created, in milliseconds.
    pub overrun_after_ms: i64,
}

/// A schedule due for materialising, with its namespace.
#[derive(Debug, Clone)]
pub struct DueSchedule {
    /// Its namespace.
    pub namespace: String,
    /// The schedule as read.
    pub schedule: ScheduleRecord,
}

/// Wakes the materialiser on every replica (only the leader acts on it); delivered at commit.
async fn announce(db: &impl GenericClient) -> Result<(), StoreError> {
    notify(db, "herald_schedules", "").await
}

/// A schedule's stored fields as `insert_schedule.sql` and `update_schedule.sql` both take them
/// ($1 to $14, in this order), so a new field is bound in one place.
fn record_params<'a>(namespace: &'a &str, s: &'a ScheduleRecord) -> [&'a (dyn ToSql + Sync); 14] {
    [
        namespace,
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
    ]
}

impl<C: GenericClient> ScheduleRepo<'_, C> {
    /// Inserts a schedule and wakes the materialiser; None if the id is taken.
    pub async fn create(
        &self,
        namespace: &str,
        s: &ScheduleRecord,
    ) -> Result<Option<ScheduleRecord>, StoreError> {
        let created = INSERT_SCHEDULE
            .fetch_opt(self.db, &record_params(&namespace, s))
            .await?;
        announce(self.db).await?;
        Ok(created)
    }

    /// Reads a schedule.
    pub async fn get(
        &self,
        namespace: &str,
        id: &str,
    ) -> Result<Option<ScheduleRecord>, StoreError> {
        GET_SCHEDULE.fetch_opt(self.db, &[&namespace, &id]).await
    }

    /// Reads a schedule and locks it for the rest of the transaction (UpdateSchedule): the
    /// materialiser locks the same row, so a change and a run never interleave.
    pub async fn get_for_update(
        &self,
        namespace: &str,
        id: &str,
    ) -> Result<Option<ScheduleRecord>, StoreError> {
        GET_FOR_UPDATE.fetch_opt(self.db, &[&namespace, &id]).await
    }

    /// Replaces a schedule's definition and cursor (the caller merged and checked them) and
    /// wakes the materialiser.
    pub async fn update(
        &self,
        namespace: &str,
        s: &ScheduleRecord,
    ) -> Result<ScheduleRecord, StoreError> {
        let updated = ScheduleRecord::from_row(
            &UPDATE_SCHEDULE
                .query_one(self.db, &record_params(&namespace, s))
                .await?,
        )?;
        announce(self.db).await?;
        Ok(updated)
    }

    /// Lists schedules with an id after `after`, by id.
    pub async fn list(
        &self,
        namespace: &str,
        after: &str,
        limit: i64,
    ) -> Result<Vec<ScheduleRecord>, StoreError> {
        LIST_SCHEDULES
            .fetch(self.db, &[&namespace, &after, &limit])
            .await
    }

    /// Deletes a schedule and its runs; false if it did not exist.
    pub async fn delete(&self, namespace: &str, id: &str) -> Result<bool, StoreError> {
        Ok(DELETE_SCHEDULE.execute(self.db, &[&namespace, &id]).await? > 0)
    }

    /// Pauses or resumes a schedule and wakes the materialiser. Resuming sets the cursor to
    /// `next_fire_at` (the first fire time after now).
    pub async fn set_paused(
        &self,
        namespace: &str,
        id: &str,
        paused: bool,
        next_fire_at: Option<DateTime<Utc>>,
    ) -> Result<Option<ScheduleRecord>, StoreError> {
        let changed = SET_PAUSED
            .fetch_opt(self.db, &[&namespace, &id, &paused, &next_fire_at])
            .await?;
        announce(self.db).await?;
        Ok(changed)
    }

    /// A schedule's runs with a fire time before `before`, newest first.
    pub async fn runs(
        &self,
        namespace: &str,
        id: &str,
        before: Option<DateTime<Utc>>,
        limit: i64,
    ) -> Result<Vec<RunRecord>, StoreError> {
        LIST_RUNS
            .fetch(self.db, &[&namespace, &id, &before, &limit])
            .await
    }

    /// Active schedules whose cursor is due within `lookahead_ms`, earliest first.
    pub async fn due(&self, lookahead_ms: i64) -> Result<Vec<DueSchedule>, StoreError> {
        DUE_SCHEDULES
            .query(self.db, &[&lookahead_ms])
            .await?
            .iter()
            .map(|r| {
                Ok(DueSchedule {
                    namespace: column(r, "namespace")?,
                    schedule: ScheduleRecord::from_row(r)?,
                })
            })
            .collect()
    }

    /// Re-reads an active schedule under a lock, with the database clock; None when it was
    /// paused or deleted since.
    pub async fn lock(
        &self,
        namespace: &str,
        id: &str,
    ) -> Result<Option<(ScheduleRecord, DateTime<Utc>)>, StoreError> {
        let Some(row) = LOCK_SCHEDULE.query_opt(self.db, &[&namespace, &id]).await? else {
            return Ok(None);
        };
        Ok(Some((
            ScheduleRecord::from_row(&row)?,
            column(&row, "db_now")?,
        )))
    }

    /// Milliseconds until the earliest cursor of an active schedule; None when none fires.
    pub async fn next_fire_ms(&self) -> Result<Option<f64>, StoreError> {
        column(&NEXT_FIRE.query_one(self.db, &[]).await?, "wait_ms")
    }

    /// Moves a schedule's cursor.
    pub async fn advance(
        &self,
        namespace: &str,
        id: &str,
        next_fire_at: Option<DateTime<Utc>>,
        last_fire_at: Option<DateTime<Utc>>,
    ) -> Result<(), StoreError> {
        ADVANCE_CURSOR
            .execute(self.db, &[&namespace, &id, &next_fire_at, &last_fire_at])
            .await?;
        Ok(())
    }

    /// Whether an earlier run of the schedule still has live tasks.
    pub async fn run_in_progress(&self, namespace: &str, id: &str) -> Result<bool, StoreError> {
        column(
            &RUN_IN_PROGRESS
                .query_one(self.db, &[&id, &namespace])
                .await?,
            "busy",
        )
    }

    /// Records a run, to be checked for overrunning at `overrun_deadline` (None: never), with
    /// why recipients were left out of it (`error`); false when that fire time already had one.
    #[allow(clippy::too_many_arguments)]
    pub async fn insert_run(
        &self,
        namespace: &str,
        id: &str,
        fire_time: DateTime<Utc>,
        kind: &str,
        task_count: i32,
        overrun_deadline: Option<DateTime<Utc>>,
        error: Option<&str>,
    ) -> Result<bool, StoreError> {
        Ok(INSERT_RUN
            .execute(
                self.db,
                &[
                    &namespace,
                    &id,
                    &fire_time,
                    &kind,
                    &task_count,
                    &overrun_deadline,
                    &error,
                ],
            )
            .await?
            > 0)
    }

    /// Checks the runs whose overrun deadline passed (see `check_overruns.sql`) and raises
    /// `schedule.run_overran` for each unfinished one, in this transaction; returns those.
    pub async fn check_overruns(&self) -> Result<Vec<OverranRun>, StoreError> {
        let mut overran = Vec::new();
        for r in CHECK_OVERRUNS.query(self.db, &[]).await? {
            let run = OverranRun {
                namespace: column(&r, "namespace")?,
                schedule_id: column(&r, "schedule_id")?,
                fire_time: column(&r, "fire_time")?,
                live_tasks: column(&r, "live_tasks")?,
                overrun_after_ms: column(&r, "overrun_after_ms")?,
            };
            let data = serde_json::json!({
                "namespace": run.namespace,
                "schedule_id": run.schedule_id,
                "fire_time": run.fire_time.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                "live_tasks": run.live_tasks,
                "overrun_after_seconds": run.overrun_after_ms / 1000,
            });
            super::notifications::notify_event(self.db, "schedule.run_overran", &data).await?;
            overran.push(run);
        }
        Ok(overran)
    }

    /// Milliseconds until the earliest overrun deadline still to check; None when none.
    pub async fn next_overrun_ms(&self) -> Result<Option<f64>, StoreError> {
        column(&NEXT_OVERRUN.query_one(self.db, &[]).await?, "wait_ms")
    }
}
