//! The stats repository: counts by state, attempt outcomes by group, trigger lag, send
//! durations and the failure list over time windows. Read-only; StatsService and the dashboard
//! both call these, so the SQL exists once.

use deadpool_postgres::GenericClient;

use super::sql::{column, statement, Statement};
use super::tasks::columns::{end_reason, labels, state};
use super::{repository, StoreError};
use crate::stats::{
    DeliveryCounts, DeliveryLatency, DurationStats, FailureFilter, FailureRecord, GroupBy,
    LagReport, LagStats, OutcomeCounts, StateCounts, Window, WindowSpec,
};
use crate::tasks::model::{EndReason, Outcome, TaskState};

repository!(
    /// Read-only figures.
    StatsRepo
);

const WINDOW: Statement = statement!("window");
const COUNT_TASKS: Statement = statement!("count_tasks");
const SUCCESS_RATES: Statement = statement!("success_rates");
const TRIGGER_LAG: Statement = statement!("trigger_lag");
const SEND_DURATIONS: Statement = statement!("send_durations");
const LIST_FAILURES: Statement = statement!("list_failures");
const DELIVERY_STATS: Statement = statement!("delivery_stats");

/// Reads the `accepted`, `delivered`, `read` and `failed` counts of a row.
pub fn delivery_counts(r: &tokio_postgres::Row) -> Result<DeliveryCounts, StoreError> {
    Ok(DeliveryCounts {
        accepted: column(r, "accepted")?,
        delivered: column(r, "delivered")?,
        read: column(r, "read")?,
        failed_after_acceptance: column(r, "failed")?,
    })
}

impl<C: GenericClient> StatsRepo<'_, C> {
    /// Resolves `spec` to concrete bounds by the database's clock. `time_zone` must be a zone
    /// name the caller validated.
    pub async fn resolve_window(
        &self,
        spec: &WindowSpec,
        time_zone: &str,
    ) -> Result<Window, StoreError> {
        let (start, end) = match spec {
            WindowSpec::Range(start, end) => (*start, *end),
            WindowSpec::Today | WindowSpec::Last(_) => {
                let last = match spec {
                    WindowSpec::Last(ms) => Some(*ms),
                    _ => None,
                };
                let row = WINDOW.query_one(self.db, &[&time_zone, &last]).await?;
                (column(&row, "window_start")?, column(&row, "window_end")?)
            }
        };
        Ok(Window {
            start,
            end,
            time_zone: time_zone.to_string(),
        })
    }

    /// Tasks per state in `window`, optionally of one queue.
    pub async fn count_tasks(
        &self,
        namespace: &str,
        window: &Window,
        queue: Option<&str>,
    ) -> Result<StateCounts, StoreError> {
        let mut counts = StateCounts::default();
        for row in COUNT_TASKS
            .query(self.db, &[&namespace, &window.start, &window.end, &queue])
            .await?
        {
            let n: i64 = column(&row, "tasks")?;
            let slot = match state(&row, "state")? {
                TaskState::Scheduled => &mut counts.scheduled,
                TaskState::Leased => &mut counts.leased,
                TaskState::Succeeded => &mut counts.succeeded,
                TaskState::Failed => &mut counts.failed,
                TaskState::Cancelled => &mut counts.cancelled,
                TaskState::Expired => &mut counts.expired,
            };
            *slot += n;
            if let Some(reason) = end_reason(&row, "end_reason")? {
                match counts.by_reason.iter_mut().find(|(r, _)| *r == reason) {
                    Some((_, total)) => *total += n,
                    None => counts.by_reason.push((reason, n)),
                }
            }
        }
        counts
            .by_reason
            .sort_by_key(|(r, _)| EndReason::ALL.iter().position(|a| a == r));
        Ok(counts)
    }

    /// Attempt outcomes in `window`, grouped by `group`.
    pub async fn success_rates(
        &self,
        namespace: &str,
        window: &Window,
        group: GroupBy,
        queue: Option<&str>,
    ) -> Result<Vec<OutcomeCounts>, StoreError> {
        SUCCESS_RATES
            .query(
                self.db,
                &[
                    &namespace,
                    &window.start,
                    &window.end,
                    &queue,
                    &(group as i16),
                    &window.time_zone,
                ],
            )
            .await?
            .iter()
            .map(|r| {
                Ok(OutcomeCounts {
                    key: column(r, "key")?,
                    bucket: column(r, "bucket")?,
                    attempts: column(r, "attempts")?,
                    ok: column(r, "ok")?,
                    rate_limited: column(r, "rate_limited")?,
                    transient: column(r, "transient")?,
                    permanent: column(r, "permanent")?,
                    account_unavailable: column(r, "account_unavailable")?,
                    lease_expired: column(r, "lease_expired")?,
                })
            })
            .collect()
    }

    /// How far the messages accepted in `window` got, and accepted → delivered percentiles.
    pub async fn delivery_stats(
        &self,
        namespace: &str,
        window: &Window,
        queue: Option<&str>,
    ) -> Result<(DeliveryCounts, DeliveryLatency), StoreError> {
        let r = DELIVERY_STATS
            .query_one(self.db, &[&namespace, &window.start, &window.end, &queue])
            .await?;
        let ms: Vec<i64> = column::<Option<Vec<i64>>>(&r, "latency_ms")?.unwrap_or_default();
        let at = |i: usize| ms.get(i).copied().unwrap_or_default();
        let latency = DeliveryLatency {
            count: column(&r, "measured")?,
            p50_ms: at(0),
            p95_ms: at(1),
            p99_ms: at(2),
        };
        Ok((delivery_counts(&r)?, latency))
    }

    /// Trigger lag percentiles of leases granted in `window`, overall and per queue.
    pub async fn trigger_lag(
        &self,
        namespace: &str,
        window: &Window,
        queue: Option<&str>,
    ) -> Result<LagReport, StoreError> {
        let mut report = LagReport::default();
        for r in TRIGGER_LAG
            .query(self.db, &[&namespace, &window.start, &window.end, &queue])
            .await?
        {
            let stats = LagStats {
                queue: column(&r, "queue")?,
                count: column(&r, "leases")?,
                p50_ms: column(&r, "p50_ms")?,
                p90_ms: column(&r, "p90_ms")?,
                p99_ms: column(&r, "p99_ms")?,
                max_ms: column(&r, "max_ms")?,
            };
            if column(&r, "overall")? {
                report.overall = LagStats {
                    queue: None,
                    ..stats
                };
            } else {
                report.queues.push(stats);
            }
        }
        Ok(report)
    }

    /// Send durations of attempts recorded in `window`, per queue and template.
    pub async fn send_durations(
        &self,
        namespace: &str,
        window: &Window,
        queue: Option<&str>,
    ) -> Result<Vec<DurationStats>, StoreError> {
        SEND_DURATIONS
            .query(self.db, &[&namespace, &window.start, &window.end, &queue])
            .await?
            .iter()
            .map(|r| {
                Ok(DurationStats {
                    queue: column(r, "queue")?,
                    template_id: column(r, "template_id")?,
                    count: column(r, "attempts")?,
                    avg_ms: column(r, "avg_ms")?,
                    max_ms: column(r, "max_ms")?,
                })
            })
            .collect()
    }

    /// One page of failed and expired tasks that ended in `window`, newest first.
    pub async fn list_failures(
        &self,
        namespace: &str,
        window: &Window,
        filter: &FailureFilter,
    ) -> Result<Vec<FailureRecord>, StoreError> {
        let outcome = filter.outcome.map(|o| o as i16);
        let (after_at, after_id) = match filter.after {
            Some((at, id)) => (Some(at), Some(id)),
            None => (None, None),
        };
        LIST_FAILURES
            .query(
                self.db,
                &[
                    &namespace,
                    &window.start,
                    &window.end,
                    &filter.queue,
                    &filter.account,
                    &outcome,
                    &filter.template_id,
                    &after_at,
                    &after_id,
                    &filter.limit,
                ],
            )
            .await?
            .iter()
            .map(|r| {
                let outcome = match column::<Option<i16>>(r, "outcome")? {
                    None => None,
                    Some(code) => Some(
                        Outcome::from_code(code)
                            .ok_or_else(|| StoreError::Corrupt(format!("outcome code {code}")))?,
                    ),
                };
                Ok(FailureRecord {
                    id: column(r, "id")?,
                    queue: column(r, "queue")?,
                    recipient: column(r, "recipient")?,
                    template_id: column(r, "template_id")?,
                    content: column(r, "content")?,
                    labels: labels(r, "labels")?,
                    state: state(r, "state")?,
                    outcome,
                    error: column(r, "error")?,
                    account: column(r, "account")?,
                    attempts: column(r, "attempts")?,
                    finished_at: column(r, "finished_at")?,
                })
            })
            .collect()
    }
}
