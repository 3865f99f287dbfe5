//! StatsService: counts, success rates, trigger lag, send durations and the failure list over a
//! window of time. Validates and converts; the figures come from `store::stats`.

use chrono::Duration as ChronoDuration;
use herald_proto::v1::{self as pb, stats_service_server::StatsService};
use tonic::{Request, Response, Status};

use super::convert;
use super::paging::Page;
use crate::auth::namespace_of;
use crate::error::Error;
use crate::error::Violations;
use crate::stats::{
    decode_failure_token, encode_failure_token, time_zone_or_utc, time_zone_problem, DurationStats,
    FailureFilter, FailureRecord, GroupBy, LagStats, OutcomeCounts, Window, WindowSpec,
    DEFAULT_FAILURE_PAGE, MAX_FAILURE_PAGE,
};
use crate::store::{Db, Store};
use crate::tasks::model::Outcome;

/// The longest window a statistic may cover: a little over a year, so a mistyped year fails
/// loudly instead of scanning every row.
pub const MAX_WINDOW: ChronoDuration = ChronoDuration::days(400);
/// The StatsService implementation.
pub struct StatsApi {
    store: Store,
}

impl StatsApi {
    /// A service answering from `store`.
    pub fn new(store: Store) -> Self {
        StatsApi { store }
    }

    /// Checks the window and queue filter every figure takes, with `extra`'s fields, then
    /// resolves the window by the database's clock. INVALID_ARGUMENT names every bad field.
    async fn scope<T>(
        &self,
        window: Option<&pb::StatsWindow>,
        queue: &str,
        extra: impl FnOnce(&mut Violations) -> Option<T>,
    ) -> Result<(Window, Option<String>, T), Error> {
        let mut v = Violations::default();
        let spec = window_spec(window, &mut v);
        let queue = queue_filter(queue, "queue", &mut v);
        let extra = extra(&mut v);
        check(v)?;
        let (Some(spec), Some(extra)) = (spec, extra) else {
            return Err(Error::InvalidArgument(Vec::new()));
        };
        Ok((self.window(spec).await?, queue, extra))
    }

    /// A pooled connection for the stats repository.
    async fn db(&self) -> Result<deadpool_postgres::Object, Error> {
        Ok(self.store.conn().await?)
    }

    /// Validates the window, then resolves it by the database's clock.
    async fn window(&self, spec: (WindowSpec, String)) -> Result<Window, Error> {
        Ok(self
            .store
            .conn()
            .await?
            .stats()
            .resolve_window(&spec.0, &spec.1)
            .await?)
    }
}

/// Validates a request's window (field path `window`); absent means today in UTC.
pub fn window_spec(
    w: Option<&pb::StatsWindow>,
    v: &mut Violations,
) -> Option<(WindowSpec, String)> {
    let Some(w) = w else {
        return Some((WindowSpec::Today, "UTC".to_string()));
    };
    let before = v.len();
    if let Some(problem) = time_zone_problem(&w.time_zone) {
        v.add("window.time_zone", problem);
    }
    let spec = match (&w.start, &w.end, &w.last) {
        (None, None, None) => Some(WindowSpec::Today),
        (None, None, Some(last)) => match convert::duration_ms(last) {
            Some(ms) if ms > 0 && ms <= MAX_WINDOW.num_milliseconds() => Some(WindowSpec::Last(ms)),
            _ => {
                v.add("window.last", "must be positive and at most 400 days");
                None
            }
        },
        (Some(_), Some(_), Some(_)) => {
            v.add("window.last", "set either start and end, or last");
            None
        }
        (Some(start), Some(end), None) => {
            let start = convert::from_timestamp(start);
            let end = convert::from_timestamp(end);
            match (start, end) {
                (None, _) => {
                    v.add("window.start", "is not a valid timestamp");
                    None
                }
                (_, None) => {
                    v.add("window.end", "is not a valid timestamp");
                    None
                }
                (Some(s), Some(e)) if e <= s => {
                    v.add("window.end", "must be after start");
                    None
                }
                (Some(s), Some(e)) if e - s > MAX_WINDOW => {
                    v.add("window.end", "must be at most 400 days after start");
                    None
                }
                (Some(s), Some(e)) => Some(WindowSpec::Range(s, e)),
            }
        }
        (Some(_), None, _) => {
            v.add("window.end", "is required with start");
            None
        }
        (None, Some(_), _) => {
            v.add("window.start", "is required with end");
            None
        }
    };
    if v.len() > before {
        return None;
    }
    Some((spec?, time_zone_or_utc(&w.time_zone)))
}

/// Validates an optional queue filter.
fn queue_filter(queue: &str, field: &str, v: &mut Violations) -> Option<String> {
    if queue.is_empty() {
        return None;
    }
    if let Some(problem) = crate::rules::name_problem(queue) {
        v.add(field, problem);
    }
    Some(queue.to_string())
}

fn check(v: Violations) -> Result<(), Error> {
    if v.is_empty() {
        Ok(())
    } else {
        Err(v.into_error())
    }
}

/// Fractional milliseconds to a wire duration (negative clamps to zero).
fn duration_ms_f64(ms: f64) -> prost_types::Duration {
    let nanos_total = (ms.max(0.0) * 1_000_000.0).round() as i64;
    prost_types::Duration {
        seconds: nanos_total / 1_000_000_000,
        nanos: (nanos_total % 1_000_000_000) as i32,
    }
}

fn rate(c: &OutcomeCounts) -> pb::SuccessRate {
    pb::SuccessRate {
        key: c.key.clone(),
        bucket_start: c.bucket.map(convert::timestamp),
        attempts: c.attempts,
        succeeded: c.ok,
        failed: c.failed(),
        rate_limited: c.rate_limited,
        transient: c.transient,
        permanent: c.permanent,
        account_unavailable: c.account_unavailable,
        lease_expired: c.lease_expired,
        success_rate: c.success_rate(),
    }
}

fn lag(l: &LagStats) -> pb::LagPercentiles {
    pb::LagPercentiles {
        queue: l.queue.clone().unwrap_or_default(),
        count: l.count,
        p50: Some(duration_ms_f64(l.p50_ms)),
        p90: Some(duration_ms_f64(l.p90_ms)),
        p99: Some(duration_ms_f64(l.p99_ms)),
        max: Some(duration_ms_f64(l.max_ms)),
    }
}

fn send_duration(d: &DurationStats) -> pb::SendDuration {
    pb::SendDuration {
        queue: d.queue.clone(),
        template_id: d.template_id.clone(),
        count: d.count,
        average: Some(duration_ms_f64(d.avg_ms)),
        max: Some(duration_ms_f64(d.max_ms)),
    }
}

fn failure(f: &FailureRecord) -> Result<pb::Failure, Error> {
    Ok(pb::Failure {
        task_id: f.id.to_string(),
        queue: f.queue.clone(),
        recipient: f.recipient.clone(),
        template_id: f.template_id.clone().unwrap_or_default(),
        content: Some(convert::tasks::content(&f.content)?),
        labels: f.labels.clone(),
        state: convert::tasks::state(f.state) as i32,
        outcome: f
            .outcome
            .map_or(pb::OutcomeClass::Unspecified, convert::tasks::outcome) as i32,
        error: f.error.clone().unwrap_or_default(),
        account_id: f.account.clone().unwrap_or_default(),
        attempts: f.attempts,
        finished_at: Some(convert::timestamp(f.finished_at)),
    })
}

fn outcome_from_wire(value: i32) -> Option<Outcome> {
    Outcome::from_code(i16::try_from(value).ok()?)
}

#[tonic::async_trait]
impl StatsService for StatsApi {
    async fn count_tasks(
        &self,
        request: Request<pb::CountTasksRequest>,
    ) -> Result<Response<pb::CountTasksResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let (window, queue, ()) = self
            .scope(req.window.as_ref(), &req.queue, |_| Some(()))
            .await?;
        let c = self
            .db()
            .await?
            .stats()
            .count_tasks(&ns, &window, queue.as_deref())
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pb::CountTasksResponse {
            start: Some(convert::timestamp(window.start)),
            end: Some(convert::timestamp(window.end)),
            scheduled: c.scheduled,
            leased: c.leased,
            succeeded: c.succeeded,
            failed: c.failed,
            cancelled: c.cancelled,
            expired: c.expired,
            end_reasons: c
                .by_reason
                .iter()
                .map(|(reason, tasks)| pb::EndReasonCount {
                    reason: convert::tasks::end_reason(*reason) as i32,
                    tasks: *tasks,
                })
                .collect(),
        }))
    }

    async fn success_rates(
        &self,
        request: Request<pb::SuccessRatesRequest>,
    ) -> Result<Response<pb::SuccessRatesResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let group_by = req.group_by;
        let (window, queue, group) = self
            .scope(
                req.window.as_ref(),
                &req.queue,
                |v| match pb::StatsGroupBy::try_from(group_by) {
                    Ok(pb::StatsGroupBy::Account) => Some(GroupBy::Account),
                    Ok(pb::StatsGroupBy::Template) => Some(GroupBy::Template),
                    Ok(pb::StatsGroupBy::Hour) => Some(GroupBy::Hour),
                    Ok(pb::StatsGroupBy::Minute) => Some(GroupBy::Minute),
                    Ok(pb::StatsGroupBy::Unspecified) | Err(_) => {
                        v.add("group_by", "must be ACCOUNT, TEMPLATE, HOUR or MINUTE");
                        None
                    }
                },
            )
            .await?;
        let rates = self
            .db()
            .await?
            .stats()
            .success_rates(&ns, &window, group, queue.as_deref())
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pb::SuccessRatesResponse {
            start: Some(convert::timestamp(window.start)),
            end: Some(convert::timestamp(window.end)),
            rates: rates.iter().map(rate).collect(),
        }))
    }

    async fn delivery_stats(
        &self,
        request: Request<pb::DeliveryStatsRequest>,
    ) -> Result<Response<pb::DeliveryStatsResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let (window, queue, ()) = self
            .scope(req.window.as_ref(), &req.queue, |_| Some(()))
            .await?;
        let (counts, latency) = self
            .db()
            .await?
            .stats()
            .delivery_stats(&ns, &window, queue.as_deref())
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pb::DeliveryStatsResponse {
            start: Some(convert::timestamp(window.start)),
            end: Some(convert::timestamp(window.end)),
            counts: Some(convert::delivery_counts(&counts)),
            latency: Some(pb::DeliveryLatency {
                count: latency.count,
                p50_ms: latency.p50_ms,
                p95_ms: latency.p95_ms,
                p99_ms: latency.p99_ms,
            }),
        }))
    }

    async fn trigger_lag(
        &self,
        request: Request<pb::TriggerLagRequest>,
    ) -> Result<Response<pb::TriggerLagResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let (window, queue, ()) = self
            .scope(req.window.as_ref(), &req.queue, |_| Some(()))
            .await?;
        let report = self
            .db()
            .await?
            .stats()
            .trigger_lag(&ns, &window, queue.as_deref())
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pb::TriggerLagResponse {
            start: Some(convert::timestamp(window.start)),
            end: Some(convert::timestamp(window.end)),
            overall: Some(lag(&report.overall)),
            queues: if req.by_queue {
                report.queues.iter().map(lag).collect()
            } else {
                Vec::new()
            },
        }))
    }

    async fn send_durations(
        &self,
        request: Request<pb::SendDurationsRequest>,
    ) -> Result<Response<pb::SendDurationsResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let (window, queue, ()) = self
            .scope(req.window.as_ref(), &req.queue, |_| Some(()))
            .await?;
        let durations = self
            .db()
            .await?
            .stats()
            .send_durations(&ns, &window, queue.as_deref())
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pb::SendDurationsResponse {
            start: Some(convert::timestamp(window.start)),
            end: Some(convert::timestamp(window.end)),
            durations: durations.iter().map(send_duration).collect(),
        }))
    }

    async fn list_failures(
        &self,
        request: Request<pb::ListFailuresRequest>,
    ) -> Result<Response<pb::ListFailuresResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let mut v = Violations::default();
        let spec = window_spec(req.window.as_ref(), &mut v);
        let queue = queue_filter(&req.queue, "queue", &mut v);
        let account = queue_filter(&req.account_id, "account_id", &mut v);
        let outcome = match req.outcome {
            0 => None,
            value => {
                let outcome = outcome_from_wire(value);
                if outcome.is_none() {
                    v.add("outcome", "is not an OutcomeClass");
                }
                outcome
            }
        };
        let template_id = (!req.template_id.is_empty()).then(|| req.template_id.clone());
        if req.template_id.chars().count() > 200 {
            v.add("template_id", "must be at most 200 characters");
        }
        let limit = match req.page_size {
            0 => DEFAULT_FAILURE_PAGE,
            n if (1..=MAX_FAILURE_PAGE).contains(&n) => n,
            _ => {
                v.add("page_size", "must be between 1 and 500");
                DEFAULT_FAILURE_PAGE
            }
        };
        let after = if req.page_token.is_empty() {
            None
        } else {
            let decoded = decode_failure_token(&req.page_token);
            if decoded.is_none() {
                v.add("page_token", "is not a token returned by ListFailures");
            }
            decoded
        };
        check(v)?;
        let Some(spec) = spec else {
            return Err(Error::InvalidArgument(Vec::new()).into());
        };
        let window = self.window(spec).await?;
        let filter = FailureFilter {
            queue,
            account,
            outcome,
            template_id,
            after,
            limit: i64::from(limit),
        };
        let records = self
            .store
            .conn()
            .await
            .map_err(Error::from)?
            .stats()
            .list_failures(
                &ns,
                &window,
                &FailureFilter {
                    limit: filter.limit + 1,
                    ..filter.clone()
                },
            )
            .await
            .map_err(Error::from)?;
        let (failures, next_page_token) = Page::new(records, filter.limit, |last| {
            encode_failure_token(last.finished_at, last.id)
        })
        .map(failure)?;
        Ok(Response::new(pb::ListFailuresResponse {
            failures,
            next_page_token,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::DateTime;
    use uuid::Uuid;

    fn fields(w: pb::StatsWindow) -> Vec<String> {
        let mut v = Violations::default();
        window_spec(Some(&w), &mut v);
        v.into_fields()
    }

    fn ts(seconds: i64) -> prost_types::Timestamp {
        prost_types::Timestamp { seconds, nanos: 0 }
    }

    #[test]
    fn absent_window_is_today_in_utc() {
        let mut v = Violations::default();
        assert_eq!(
            window_spec(None, &mut v),
            Some((WindowSpec::Today, "UTC".to_string()))
        );
        let w = pb::StatsWindow {
            time_zone: "Asia/Tokyo".into(),
            ..Default::default()
        };
        assert_eq!(
            window_spec(Some(&w), &mut v),
            Some((WindowSpec::Today, "Asia/Tokyo".to_string()))
        );
        assert!(v.is_empty());
    }

    #[test]
    fn names_each_bad_window_field() {
        let tz = |z: &str| pb::StatsWindow {
            time_zone: z.into(),
            ..Default::default()
        };
        assert_eq!(fields(tz("Mars/Olympus_Mons")), vec!["window.time_zone"]);
        assert_eq!(fields(tz("utc+1")), vec!["window.time_zone"]);
        let backwards = pb::StatsWindow {
            start: Some(ts(1_000)),
            end: Some(ts(1_000)),
            ..Default::default()
        };
        assert_eq!(fields(backwards), vec!["window.end"]);
        let half = pb::StatsWindow {
            start: Some(ts(1_000)),
            ..Default::default()
        };
        assert_eq!(fields(half), vec!["window.end"]);
        let too_long = pb::StatsWindow {
            start: Some(ts(0)),
            end: Some(ts(401 * 86_400)),
            ..Default::default()
        };
        assert_eq!(fields(too_long), vec!["window.end"]);
        let zero = pb::StatsWindow {
            last: Some(prost_types::Duration {
                seconds: 0,
                nanos: 0,
            }),
            ..Default::default()
        };
        assert_eq!(fields(zero), vec!["window.last"]);
    }

    #[test]
    fn failure_tokens_round_trip_and_reject_garbage() {
        let at = DateTime::from_timestamp_micros(1_764_000_000_123_456).unwrap();
        let id = Uuid::now_v7();
        let token = encode_failure_token(at, id);
        assert_eq!(decode_failure_token(&token), Some((at, id)));
        assert_eq!(decode_failure_token("not a token"), None);
        assert_eq!(decode_failure_token(""), None);
    }

    #[test]
    fn fractional_milliseconds_become_exact_durations() {
        let d = duration_ms_f64(1_234.5);
        assert_eq!((d.seconds, d.nanos), (1, 234_500_000));
        let d = duration_ms_f64(-3.0);
        assert_eq!((d.seconds, d.nanos), (0, 0));
    }
}
