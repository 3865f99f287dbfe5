//! ScheduleService: recurring schedules (see `schedule/` for fire times and the materialiser).

use chrono::{DateTime, Utc};
use herald_proto::v1::{self as pb, schedule_service_server::ScheduleService};
use prost::Message;
use tonic::{Request, Response, Status};

use super::convert::{from_timestamp, timestamp};
use super::validate::{self, Violations};
use crate::auth::{namespace_of, DEFAULT_NAMESPACE};
use crate::error::Error;
use crate::schedule::fire_times::{DstPolicy, FireTimes, RepeatedTime, SkippedTime};
use crate::store::schedules::{RunRecord, ScheduleRecord};
use crate::store::{Store, StoreError};

/// Most recipients per schedule.
pub const MAX_RECIPIENTS: usize = 1_000;

/// The ScheduleService implementation.
pub struct ScheduleApi {
    store: Store,
    min_period: chrono::Duration,
}

/// How many upcoming fire times are checked against the minimum period: enough to cover a
/// day of a schedule that fires in bursts (`* 9 * * *` fires 60 times in its hour).
const PERIOD_SAMPLE: usize = 500;

impl ScheduleApi {
    /// A ScheduleService over `store` refusing schedules that fire more often than
    /// `min_period`.
    pub fn new(store: Store, min_period: std::time::Duration) -> Self {
        ScheduleApi {
            store,
            min_period: chrono::Duration::from_std(min_period).unwrap_or(chrono::Duration::MAX),
        }
    }

    /// Refuses expressions whose consecutive fire times come closer than the minimum period:
    /// a schedule per second would turn one RPC into an unbounded stream of sends.
    fn check_period(&self, fires: &FireTimes, now: DateTime<Utc>) -> Result<(), Error> {
        let upcoming = fires.preview(now, PERIOD_SAMPLE);
        let too_close = upcoming
            .windows(2)
            .any(|pair| pair[1] - pair[0] < self.min_period);
        if too_close {
            let mut v = Violations::default();
            v.add(
                "schedule.cron",
                format!(
                    "fires more often than the minimum period of {} s \
                     (HERALD_MIN_SCHEDULE_PERIOD)",
                    self.min_period.num_seconds()
                ),
            );
            return Err(Error::InvalidArgument(v.0));
        }
        Ok(())
    }

    async fn load(&self, ns: &str, id: &str) -> Result<ScheduleRecord, Error> {
        self.store
            .get_schedule(ns, id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("schedule {id}")))
    }
}

fn policy(skipped: i32, repeated: i32) -> DstPolicy {
    DstPolicy {
        skipped: if skipped == pb::SkippedTimePolicy::Skip as i32 {
            SkippedTime::Skip
        } else {
            SkippedTime::ShiftForward
        },
        repeated: if repeated == pb::RepeatedTimePolicy::FireTwice as i32 {
            RepeatedTime::FireTwice
        } else {
            RepeatedTime::FireOnce
        },
    }
}

fn zone_or_utc(z: &str) -> &str {
    if z.is_empty() {
        "UTC"
    } else {
        z
    }
}

fn ms_of(d: Option<&prost_types::Duration>) -> Option<i64> {
    // Saturating: a huge duration is out of range, not an overflow (found by fuzzing, #10).
    d.map(|d| {
        d.seconds
            .saturating_mul(1000)
            .saturating_add(i64::from(d.nanos) / 1_000_000)
    })
}

/// Validates a spec into a record (cursor unset) and its fire-time rules.
pub fn validate_spec(
    spec: &pb::ScheduleSpec,
    now: DateTime<Utc>,
) -> Result<(ScheduleRecord, FireTimes), Error> {
    let mut v = Violations::default();
    if let Some(p) = validate::queue_name_problem(&spec.id) {
        v.add("schedule.id", p);
    }
    let fires = match FireTimes::parse(
        &spec.cron,
        zone_or_utc(&spec.time_zone),
        policy(spec.skipped_time, spec.repeated_time),
    ) {
        Ok(f) => Some(f),
        Err(crate::schedule::fire_times::FireTimesError::Zone) => {
            v.add("schedule.time_zone", "is not an IANA time zone name");
            None
        }
        Err(e) => {
            v.add("schedule.cron", e.to_string());
            None
        }
    };
    let mut bounded = |field: &str, d: Option<&prost_types::Duration>, max_ms: i64| -> i64 {
        match ms_of(d) {
            None => 0,
            Some(ms) if (0..=max_ms).contains(&ms) => ms,
            Some(_) => {
                v.add(format!("schedule.{field}"), "is out of range");
                0
            }
        }
    };
    let jitter_ms = bounded("jitter", spec.jitter.as_ref(), 3_600_000);
    let stagger_ms = bounded("stagger", spec.stagger.as_ref(), 86_400_000);
    let grace_ms = match ms_of(spec.misfire_grace.as_ref()) {
        None => 60_000,
        Some(ms) if (1_000..=86_400_000).contains(&ms) => ms,
        Some(_) => {
            v.add("schedule.misfire_grace", "must be between 1 s and 24 h");
            60_000
        }
    };
    if spec.recipients.is_empty() || spec.recipients.len() > MAX_RECIPIENTS {
        v.add("schedule.recipients", "must hold 1 to 1,000 recipients");
    }
    let mut seen = std::collections::HashSet::new();
    if spec.recipients.iter().any(|r| !seen.insert(r)) {
        v.add("schedule.recipients", "must be distinct");
    }
    if spec.labels.keys().any(|k| k.starts_with("herald.")) {
        v.add("schedule.labels", "keys starting with herald. are reserved");
    }
    // Every task the schedule will create must validate: check one per recipient now.
    for (i, r) in spec.recipients.iter().enumerate().take(MAX_RECIPIENTS) {
        let probe = pb::TaskSpec {
            queue: spec.queue.clone(),
            recipient: r.clone(),
            content: spec.content.clone(),
            priority: spec.priority,
            max_attempts: spec.max_attempts,
            labels: spec.labels.clone(),
            pool: spec.pool.clone(),
            account_id: spec.account_id.clone(),
            ..Default::default()
        };
        let mut tv = Violations::default();
        // Only validity matters here: the probe is never stored, so its namespace is moot.
        validate::task_spec(&probe, "schedule", DEFAULT_NAMESPACE, now, &mut tv);
        for mut f in tv.0 {
            if f.field == "schedule.recipient" {
                f.field = format!("schedule.recipients[{i}]");
            }
            if !v.0.contains(&f) {
                v.0.push(f);
            }
        }
    }
    let overlap = if spec.overlap == pb::OverlapPolicy::Skip as i32 {
        "skip"
    } else {
        "allow"
    };
    let misfire = match pb::MisfirePolicy::try_from(spec.misfire) {
        Ok(pb::MisfirePolicy::Skip) => "skip",
        Ok(pb::MisfirePolicy::CatchUp) => "catch_up",
        _ => "fire_once_now",
    };
    let Some(fires) = fires.filter(|_| v.is_empty()) else {
        return Err(Error::InvalidArgument(v.0));
    };
    let mut stored = spec.clone();
    stored.time_zone = zone_or_utc(&spec.time_zone).to_string();
    let p = policy(spec.skipped_time, spec.repeated_time);
    Ok((
        ScheduleRecord {
            id: spec.id.clone(),
            cron: spec.cron.clone(),
            time_zone: stored.time_zone.clone(),
            skipped_time: match p.skipped {
                SkippedTime::Skip => "skip",
                SkippedTime::ShiftForward => "shift_forward",
            }
            .into(),
            repeated_time: match p.repeated {
                RepeatedTime::FireTwice => "fire_twice",
                RepeatedTime::FireOnce => "fire_once",
            }
            .into(),
            overlap: overlap.into(),
            misfire: misfire.into(),
            misfire_grace_ms: grace_ms,
            jitter_ms,
            stagger_ms,
            stagger_off_round: spec.stagger_off_round_minutes,
            spec: stored.encode_to_vec(),
            paused: false,
            next_fire_at: None,
            last_fire_at: None,
            created_at: now,
            updated_at: now,
        },
        fires,
    ))
}

fn to_wire(s: &ScheduleRecord) -> Result<pb::Schedule, StoreError> {
    let spec = pb::ScheduleSpec::decode(s.spec.as_slice())
        .map_err(|e| StoreError::Corrupt(format!("schedule {} spec: {e}", s.id)))?;
    Ok(pb::Schedule {
        spec: Some(spec),
        state: if s.paused {
            pb::ScheduleState::Paused
        } else {
            pb::ScheduleState::Active
        } as i32,
        next_fire_time: s.next_fire_at.filter(|_| !s.paused).map(timestamp),
        last_fire_time: s.last_fire_at.map(timestamp),
        created_at: Some(timestamp(s.created_at)),
        updated_at: Some(timestamp(s.updated_at)),
    })
}

fn run_to_wire(r: &RunRecord) -> pb::ScheduleRun {
    pb::ScheduleRun {
        fire_time: Some(timestamp(r.fire_time)),
        kind: match r.kind.as_str() {
            "catch_up" => pb::RunKind::CatchUp,
            "skipped_overlap" => pb::RunKind::SkippedOverlap,
            _ => pb::RunKind::Fired,
        } as i32,
        task_count: r.task_count,
        created_at: Some(timestamp(r.created_at)),
    }
}

fn page_size(n: i32, default: i64) -> i64 {
    if n <= 0 {
        default
    } else {
        i64::from(n).min(1_000)
    }
}

#[tonic::async_trait]
impl ScheduleService for ScheduleApi {
    async fn create_schedule(
        &self,
        request: Request<pb::CreateScheduleRequest>,
    ) -> Result<Response<pb::Schedule>, Status> {
        let ns = namespace_of(&request)?;
        let spec = request.into_inner().schedule.unwrap_or_default();
        let now = Utc::now();
        let (mut record, fires) = validate_spec(&spec, now)?;
        self.check_period(&fires, now)?;
        record.next_fire_at = fires.next_after(now);
        let created = self
            .store
            .create_schedule(&ns, &record)
            .await
            .map_err(Error::from)?
            .ok_or_else(|| Error::AlreadyExists(format!("schedule {} already exists", spec.id)))?;
        Ok(Response::new(to_wire(&created).map_err(Error::from)?))
    }

    async fn get_schedule(
        &self,
        request: Request<pb::GetScheduleRequest>,
    ) -> Result<Response<pb::Schedule>, Status> {
        let ns = namespace_of(&request)?;
        let s = self.load(&ns, &request.get_ref().id).await?;
        Ok(Response::new(to_wire(&s).map_err(Error::from)?))
    }

    async fn list_schedules(
        &self,
        request: Request<pb::ListSchedulesRequest>,
    ) -> Result<Response<pb::ListSchedulesResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let limit = page_size(req.page_size, 100);
        let rows = self
            .store
            .list_schedules(&ns, &req.page_token, limit)
            .await
            .map_err(Error::from)?;
        let next_page_token = if rows.len() as i64 == limit {
            rows.last().map(|s| s.id.clone()).unwrap_or_default()
        } else {
            String::new()
        };
        let schedules = rows
            .iter()
            .map(to_wire)
            .collect::<Result<_, _>>()
            .map_err(Error::from)?;
        Ok(Response::new(pb::ListSchedulesResponse {
            schedules,
            next_page_token,
        }))
    }

    async fn delete_schedule(
        &self,
        request: Request<pb::DeleteScheduleRequest>,
    ) -> Result<Response<pb::DeleteScheduleResponse>, Status> {
        let ns = namespace_of(&request)?;
        let id = &request.get_ref().id;
        if !self
            .store
            .delete_schedule(&ns, id)
            .await
            .map_err(Error::from)?
        {
            return Err(Error::NotFound(format!("schedule {id}")).into());
        }
        Ok(Response::new(pb::DeleteScheduleResponse {}))
    }

    async fn pause_schedule(
        &self,
        request: Request<pb::PauseScheduleRequest>,
    ) -> Result<Response<pb::Schedule>, Status> {
        let ns = namespace_of(&request)?;
        let id = &request.get_ref().id;
        let s = self
            .store
            .set_schedule_paused(&ns, id, true, None)
            .await
            .map_err(Error::from)?
            .ok_or_else(|| Error::NotFound(format!("schedule {id}")))?;
        Ok(Response::new(to_wire(&s).map_err(Error::from)?))
    }

    async fn resume_schedule(
        &self,
        request: Request<pb::ResumeScheduleRequest>,
    ) -> Result<Response<pb::Schedule>, Status> {
        let ns = namespace_of(&request)?;
        let id = &request.get_ref().id;
        let current = self.load(&ns, id).await?;
        let next = crate::schedule::materializer::fire_times_of(&current)
            .and_then(|f| f.next_after(Utc::now()));
        let s = self
            .store
            .set_schedule_paused(&ns, id, false, next)
            .await
            .map_err(Error::from)?
            .ok_or_else(|| Error::NotFound(format!("schedule {id}")))?;
        Ok(Response::new(to_wire(&s).map_err(Error::from)?))
    }

    async fn preview_fire_times(
        &self,
        request: Request<pb::PreviewFireTimesRequest>,
    ) -> Result<Response<pb::PreviewFireTimesResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let fires = if req.id.is_empty() {
            FireTimes::parse(
                &req.cron,
                zone_or_utc(&req.time_zone),
                policy(req.skipped_time, req.repeated_time),
            )
            .map_err(|e| {
                let mut v = Violations::default();
                match e {
                    crate::schedule::fire_times::FireTimesError::Zone => {
                        v.add("time_zone", e.to_string())
                    }
                    _ => v.add("cron", e.to_string()),
                }
                Error::InvalidArgument(v.0)
            })?
        } else {
            let s = self.load(&ns, &req.id).await?;
            crate::schedule::materializer::fire_times_of(&s)
                .ok_or_else(|| Error::FailedPrecondition("stored schedule does not parse".into()))?
        };
        let after = match req.after.as_ref() {
            None => Utc::now(),
            Some(ts) => from_timestamp(ts).ok_or_else(|| {
                let mut v = Violations::default();
                v.add("after", "is not a valid timestamp");
                Error::InvalidArgument(v.0)
            })?,
        };
        let count = page_size(req.count, 10) as usize;
        Ok(Response::new(pb::PreviewFireTimesResponse {
            fire_times: fires
                .preview(after, count)
                .into_iter()
                .map(timestamp)
                .collect(),
        }))
    }

    async fn list_schedule_runs(
        &self,
        request: Request<pb::ListScheduleRunsRequest>,
    ) -> Result<Response<pb::ListScheduleRunsResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        self.load(&ns, &req.id).await?;
        let before = req.before.as_ref().and_then(from_timestamp);
        let runs = self
            .store
            .list_schedule_runs(&ns, &req.id, before, page_size(req.page_size, 100))
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pb::ListScheduleRunsResponse {
            runs: runs.iter().map(run_to_wire).collect(),
        }))
    }
}
