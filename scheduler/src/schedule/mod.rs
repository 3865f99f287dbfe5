//! Recurring schedules: what a schedule is ([`model`], [`spec`]), fire-time arithmetic
//! ([`fire_times`]), the spreading of a run's recipients over a window ([`spread`]), and the
//! single-leader loop that turns due fire times into tasks ([`materializer`]) through the task
//! domain, so a run's tasks are checked and rendered like any other.

pub mod fanout;
pub mod fire_times;
pub mod materializer;
pub mod model;
pub mod overrun;
pub mod source;
pub mod spec;
pub mod spread;

use chrono::{DateTime, Utc};
use herald_outbound::guard::AddressPolicy;
use herald_proto::v1 as pb;

use self::fire_times::FireTimes;
use self::model::{RunRecord, ScheduleRecord};
use crate::clock::Clock;
use crate::error::Error;
use crate::store::transaction;
use crate::store::{Db, Store, StoreError};
use crate::tasks::duplicates::DuplicateWindows;
use prost::Message;

/// The schedule operations of a replica.
#[derive(Clone)]
pub struct Schedules {
    store: Store,
    clock: Clock,
    min_period: chrono::Duration,
    source_policy: AddressPolicy,
    windows: DuplicateWindows,
}

impl Schedules {
    /// Schedules in `store`, refusing any that fires more often than `min_period`.
    pub fn new(store: Store, clock: Clock, min_period: std::time::Duration) -> Self {
        Schedules {
            store,
            clock,
            min_period: chrono::Duration::from_std(min_period).unwrap_or(chrono::Duration::MAX),
            source_policy: AddressPolicy::default(),
            windows: DuplicateWindows::default(),
        }
    }

    /// Creates a schedule. Its runs' tasks are checked now, rendered against the stored
    /// templates and targets as they will be at every fire time, so a schedule that could
    /// only ever fail is refused here.
    pub async fn create(
        &self,
        namespace: &str,
        spec: &pb::ScheduleSpec,
    ) -> Result<ScheduleRecord, Error> {
        let now = self.clock.now();
        let (mut record, fires) = spec::check(spec, now)?;
        spec::check_period(&fires, now, self.min_period)?;
        record.next_fire_at = fires.next_after(now);
        let conn = self.store.conn().await?;
        self.check_runs(&conn, namespace, spec, now).await?;
        drop(conn);
        transaction!(self.store, Error, |tx| Ok::<_, Error>(
            tx.schedules().create(namespace, &record).await?
        ))?
        .ok_or_else(|| Error::AlreadyExists(format!("schedule {} already exists", spec.id)))
    }

    /// Checks what every run of `spec` will need, on `db`: its audience and the date attribute
    /// it filters on, its variables source's address, and its inline recipients' tasks,
    /// rendered against the stored templates and targets as they will be at every fire time.
    /// CreateSchedule and UpdateSchedule check alike, so an edit cannot make a schedule that
    /// could only ever fail, nor refuse one that create accepts.
    async fn check_runs(
        &self,
        db: &impl deadpool_postgres::GenericClient,
        namespace: &str,
        spec: &pb::ScheduleSpec,
        now: DateTime<Utc>,
    ) -> Result<(), Error> {
        if let Some(target) = &spec.audience {
            crate::audiences::target_audience(db, namespace, target, "schedule.audience").await?;
        }
        self.check_source(spec)?;
        // A fan-out's tasks are rendered per recipient at each fire, with variables only the
        // contact or the source gives: nothing to render now.
        let fans_out = spec.audience.is_some() || spec.variables_source.is_some();
        let probes: Vec<_> = spec
            .recipients
            .iter()
            .filter(|_| !fans_out)
            .map(|r| spec::task_of(spec, r))
            .collect();
        crate::tasks::prepare(
            db,
            namespace,
            probes,
            &|i| format!("schedule.recipients[{i}]"),
            now,
        )
        .await?;
        Ok(())
    }

    /// Changes the fields of a schedule named in `paths` to their values in `patch`
    /// (UpdateSchedule). The merged schedule is checked as CreateSchedule checks one; under
    /// the schedule's row lock, which the materialiser also takes, so the change applies from
    /// the first fire time not yet materialised. Returns the schedule and that fire time (None
    /// while paused or when it never fires again). A change of the fire-time rules moves the
    /// cursor to the new rules' first fire time after now.
    pub async fn update(
        &self,
        namespace: &str,
        patch: &pb::ScheduleSpec,
        paths: &[String],
    ) -> Result<(ScheduleRecord, Option<DateTime<Utc>>), Error> {
        let id = patch.id.as_str();
        let updated = transaction!(self.store, Error, |tx| {
            let Some(current) = tx.schedules().get_for_update(namespace, id).await? else {
                return Err(Error::NotFound(format!("schedule {id}")));
            };
            let mut spec = pb::ScheduleSpec::decode(current.spec.as_slice())
                .map_err(|e| StoreError::Corrupt(format!("schedule {id} spec: {e}")))?;
            let rules_changed = spec::merge(&mut spec, patch, paths)?;
            let now = self.clock.now();
            let (mut record, fires) = spec::check(&spec, now)?;
            if rules_changed {
                spec::check_period(&fires, now, self.min_period)?;
            }
            self.check_runs(tx, namespace, &spec, now).await?;
            record.next_fire_at = match (current.paused, rules_changed) {
                (true, _) => current.next_fire_at,
                (false, true) => fires.next_after(now),
                (false, false) => current.next_fire_at,
            };
            let stored = tx.schedules().update(namespace, &record).await?;
            Ok::<_, Error>(stored)
        })?;
        let effective_from = updated.next_fire_at.filter(|_| !updated.paused);
        Ok((updated, effective_from))
    }

    /// Which addresses variables sources may name beyond the public internet (the scheduler's
    /// HERALD_VARIABLES_SOURCE_ALLOW_PRIVATE and _ALLOWED_NETWORKS).
    pub fn source_policy(mut self, policy: AddressPolicy) -> Self {
        self.source_policy = policy;
        self
    }

    /// The duplicate content windows runs created on request ([`Self::run_now`]) are
    /// guarded by, as the materialiser's are.
    pub fn duplicate_windows(mut self, windows: DuplicateWindows) -> Self {
        self.windows = windows;
        self
    }

    /// Creates a run now, outside the fire-time rules: the tasks (or fan-out) a fire would
    /// create. Returns the run. FAILED_PRECONDITION for a paused schedule, or with overlap
    /// SKIP while the last run is still going.
    pub async fn run_now(&self, namespace: &str, id: &str) -> Result<RunRecord, Error> {
        self.get(namespace, id).await?;
        let fire_time = transaction!(self.store, Error, |tx| {
            materializer::run_now(tx, namespace, id, &self.windows).await
        })?;
        // Read back straight from the store: the schedule was just checked under its lock.
        let after = fire_time + chrono::Duration::milliseconds(1);
        self.store
            .conn()
            .await?
            .schedules()
            .runs(namespace, id, Some(after), 1)
            .await?
            .into_iter()
            .find(|r| r.fire_time == fire_time)
            .ok_or_else(|| Error::NotFound(format!("schedule {id} run at {fire_time}")))
    }

    /// Refuses a variables source whose URL the outbound guard would refuse anyway, so the
    /// mistake shows at the call instead of at the first fire.
    fn check_source(&self, spec: &pb::ScheduleSpec) -> Result<(), Error> {
        match &spec.variables_source {
            Some(src) => source::check_url(&src.url, &self.source_policy)
                .map_err(|p| Error::invalid("schedule.variables_source.url", p)),
            None => Ok(()),
        }
    }

    /// Reads a schedule.
    pub async fn get(&self, namespace: &str, id: &str) -> Result<ScheduleRecord, Error> {
        self.store
            .conn()
            .await?
            .schedules()
            .get(namespace, id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("schedule {id}")))
    }

    /// Lists schedules with an id after `after`, by id.
    pub async fn list(
        &self,
        namespace: &str,
        after: &str,
        limit: i64,
    ) -> Result<Vec<ScheduleRecord>, Error> {
        Ok(self
            .store
            .conn()
            .await?
            .schedules()
            .list(namespace, after, limit)
            .await?)
    }

    /// Deletes a schedule and its runs.
    pub async fn delete(&self, namespace: &str, id: &str) -> Result<(), Error> {
        if self
            .store
            .conn()
            .await?
            .schedules()
            .delete(namespace, id)
            .await?
        {
            Ok(())
        } else {
            Err(Error::NotFound(format!("schedule {id}")))
        }
    }

    /// Pauses or resumes a schedule; resuming skips the fire times passed while paused.
    pub async fn set_paused(
        &self,
        namespace: &str,
        id: &str,
        paused: bool,
    ) -> Result<ScheduleRecord, Error> {
        transaction!(self.store, Error, |tx| {
            // The next fire time from the rules read under the row lock: an UpdateSchedule of
            // the cron or zone committing meanwhile must not leave a cursor from the old ones.
            let Some(current) = tx.schedules().get_for_update(namespace, id).await? else {
                return Ok(None);
            };
            let next = if paused {
                None
            } else {
                materializer::fire_times_of(&current).and_then(|f| f.next_after(self.clock.now()))
            };
            Ok::<_, Error>(
                tx.schedules()
                    .set_paused(namespace, id, paused, next)
                    .await?,
            )
        })?
        .ok_or_else(|| Error::NotFound(format!("schedule {id}")))
    }

    /// Herald's clock.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The fire-time rules of a stored schedule.
    pub async fn fire_times(&self, namespace: &str, id: &str) -> Result<FireTimes, Error> {
        let s = self.get(namespace, id).await?;
        materializer::fire_times_of(&s)
            .ok_or_else(|| Error::FailedPrecondition("stored schedule does not parse".into()))
    }

    /// A schedule's runs with a fire time before `before`, newest first.
    pub async fn runs(
        &self,
        namespace: &str,
        id: &str,
        before: Option<DateTime<Utc>>,
        limit: i64,
    ) -> Result<Vec<RunRecord>, Error> {
        self.get(namespace, id).await?;
        Ok(self
            .store
            .conn()
            .await?
            .schedules()
            .runs(namespace, id, before, limit)
            .await?)
    }
}
