//! ScheduleService: recurring schedules (see the `schedule` domain).

use herald_proto::v1::{self as pb, schedule_service_server::ScheduleService};
use prost::Message;
use tonic::{Request, Response, Status};

use super::convert::{from_timestamp, timestamp};
use super::paging::Page;
use crate::auth::namespace_of;
use crate::error::Error;
use crate::rules;
use crate::schedule::model::{RunRecord, ScheduleRecord};
use crate::schedule::{spec, Schedules};
use crate::store::StoreError;

/// The ScheduleService implementation.
pub struct ScheduleApi {
    schedules: Schedules,
}

impl ScheduleApi {
    /// Serves the schedule domain.
    pub fn new(schedules: Schedules) -> Self {
        ScheduleApi { schedules }
    }
}

fn schedule(s: &ScheduleRecord) -> Result<pb::Schedule, Error> {
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

fn run(r: &RunRecord) -> pb::ScheduleRun {
    pb::ScheduleRun {
        fire_time: Some(timestamp(r.fire_time)),
        kind: match r.kind.as_str() {
            "catch_up" => pb::RunKind::CatchUp,
            "skipped_overlap" => pb::RunKind::SkippedOverlap,
            "skipped_expired" => pb::RunKind::SkippedExpired,
            "manual" => pb::RunKind::Manual,
            _ => pb::RunKind::Fired,
        } as i32,
        task_count: r.task_count,
        created_at: Some(timestamp(r.created_at)),
        overran_at: r.overran_at.map(timestamp),
        fanning_out: r.fanning_out,
        error: r.error.clone().unwrap_or_default(),
    }
}

/// A request's schedule id, checked as a name: an empty or malformed one is bad input, not a
/// schedule that was not found.
fn schedule_id<'a>(field: &str, id: &'a str) -> Result<&'a str, Error> {
    rules::name(field, id)?;
    Ok(id)
}

#[tonic::async_trait]
impl ScheduleService for ScheduleApi {
    async fn create_schedule(
        &self,
        request: Request<pb::CreateScheduleRequest>,
    ) -> Result<Response<pb::Schedule>, Status> {
        let ns = namespace_of(&request)?;
        let spec = request.into_inner().schedule.unwrap_or_default();
        let created = self.schedules.create(&ns, &spec).await?;
        Ok(Response::new(schedule(&created)?))
    }

    async fn get_schedule(
        &self,
        request: Request<pb::GetScheduleRequest>,
    ) -> Result<Response<pb::Schedule>, Status> {
        let ns = namespace_of(&request)?;
        let id = schedule_id("id", &request.get_ref().id)?;
        let s = self.schedules.get(&ns, id).await?;
        Ok(Response::new(schedule(&s)?))
    }

    async fn update_schedule(
        &self,
        request: Request<pb::UpdateScheduleRequest>,
    ) -> Result<Response<pb::UpdateScheduleResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let patch = req.schedule.unwrap_or_default();
        if patch.id.is_empty() {
            return Err(Error::invalid("schedule.id", "is required").into());
        }
        let paths = req.update_mask.map(|m| m.paths).unwrap_or_default();
        let (s, effective_from) = self.schedules.update(&ns, &patch, &paths).await?;
        Ok(Response::new(pb::UpdateScheduleResponse {
            schedule: Some(schedule(&s)?),
            effective_from: effective_from.map(timestamp),
        }))
    }

    async fn list_schedules(
        &self,
        request: Request<pb::ListSchedulesRequest>,
    ) -> Result<Response<pb::ListSchedulesResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let limit = rules::page_size("page_size", req.page_size, 100)?;
        let rows = self.schedules.list(&ns, &req.page_token, limit + 1).await?;
        let (schedules, next_page_token) =
            Page::new(rows, limit, |s| s.id.clone()).map(schedule)?;
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
        let id = schedule_id("id", &request.get_ref().id)?;
        self.schedules.delete(&ns, id).await?;
        Ok(Response::new(pb::DeleteScheduleResponse {}))
    }

    async fn pause_schedule(
        &self,
        request: Request<pb::PauseScheduleRequest>,
    ) -> Result<Response<pb::Schedule>, Status> {
        let ns = namespace_of(&request)?;
        let s = self
            .schedules
            .set_paused(&ns, schedule_id("id", &request.get_ref().id)?, true)
            .await?;
        Ok(Response::new(schedule(&s)?))
    }

    async fn resume_schedule(
        &self,
        request: Request<pb::ResumeScheduleRequest>,
    ) -> Result<Response<pb::Schedule>, Status> {
        let ns = namespace_of(&request)?;
        let s = self
            .schedules
            .set_paused(&ns, schedule_id("id", &request.get_ref().id)?, false)
            .await?;
        Ok(Response::new(schedule(&s)?))
    }

    async fn preview_fire_times(
        &self,
        request: Request<pb::PreviewFireTimesRequest>,
    ) -> Result<Response<pb::PreviewFireTimesResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let fires = if req.id.is_empty() {
            let mut v = crate::error::Violations::default();
            spec::check_dst_policy(req.skipped_time, req.repeated_time, "", &mut v);
            v.into_result(())?;
            spec::fire_times(
                &req.cron,
                &req.time_zone,
                spec::policy(req.skipped_time, req.repeated_time),
                "cron",
                "time_zone",
            )?
        } else {
            self.schedules
                .fire_times(&ns, schedule_id("id", &req.id)?)
                .await?
        };
        let after = match req.after.as_ref() {
            None => self.schedules.clock().now(),
            Some(ts) => from_timestamp(ts)
                .ok_or_else(|| Error::invalid("after", "is not a valid timestamp"))?,
        };
        let count = usize::try_from(rules::page_size("count", req.count, 10)?).unwrap_or(10);
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
        let id = schedule_id("id", &req.id)?;
        let before = match req.before.as_ref() {
            None => None,
            Some(ts) => Some(
                from_timestamp(ts)
                    .ok_or_else(|| Error::invalid("before", "is not a valid timestamp"))?,
            ),
        };
        let limit = rules::page_size("page_size", req.page_size, 100)?;
        let runs = self.schedules.runs(&ns, id, before, limit).await?;
        Ok(Response::new(pb::ListScheduleRunsResponse {
            runs: runs.iter().map(run).collect(),
        }))
    }

    async fn run_schedule_now(
        &self,
        request: Request<pb::RunScheduleNowRequest>,
    ) -> Result<Response<pb::ScheduleRun>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let created = self
            .schedules
            .run_now(&ns, schedule_id("id", &req.id)?)
            .await?;
        Ok(Response::new(run(&created)))
    }
}
