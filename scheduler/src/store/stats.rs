//! Statistics over time windows: counts by state, attempt outcomes by group, trigger lag, send
//! durations and the failure list. Read-only; StatsService and the dashboard both call these, so
//! the SQL exists once (`queries/stats_*.sql`).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::tasks::{labels_from_json, parse_state};
use super::{Store, StoreError};
use crate::model::{Outcome, TaskState};

/// Which span of time a statistic covers, before the database's clock resolves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowSpec {
    /// Today, midnight to midnight in the time zone given with it.
    Today,
    /// The period of this many milliseconds ending now.
    Last(i64),
    /// Exactly `[start, end)`.
    Range(DateTime<Utc>, DateTime<Utc>),
}

/// A resolved window `[start, end)` and the time zone that aligns its hour buckets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// Inclusive start.
    pub start: DateTime<Utc>,
    /// Exclusive end.
    pub end: DateTime<Utc>,
    /// IANA time zone name.
    pub time_zone: String,
}

/// Tasks per state in a window (see `queries/stats_count_tasks.sql` for how a task is placed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StateCounts {
    /// Scheduled tasks due in the window.
    pub scheduled: i64,
    /// Leased tasks due in the window.
    pub leased: i64,
    /// Tasks that succeeded in the window.
    pub succeeded: i64,
    /// Tasks that failed in the window.
    pub failed: i64,
    /// Tasks cancelled in the window.
    pub cancelled: i64,
    /// Tasks that expired in the window.
    pub expired: i64,
}

/// How attempt outcomes are grouped. The numbers are the wire enum's and the SQL's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i16)]
pub enum GroupBy {
    /// By sending account.
    Account = 1,
    /// By template id.
    Template = 2,
    /// By hour, aligned in the window's time zone.
    Hour = 3,
    /// By minute.
    Minute = 4,
}

/// Attempts of one group and how they ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutcomeCounts {
    /// Account or template id; empty for time groupings.
    pub key: String,
    /// Start of the hour or minute, for time groupings.
    pub bucket: Option<DateTime<Utc>>,
    /// Attempts recorded.
    pub attempts: i64,
    /// OK.
    pub ok: i64,
    /// RATE_LIMITED.
    pub rate_limited: i64,
    /// TRANSIENT.
    pub transient: i64,
    /// PERMANENT.
    pub permanent: i64,
    /// ACCOUNT_UNAVAILABLE.
    pub account_unavailable: i64,
    /// LEASE_EXPIRED.
    pub lease_expired: i64,
}

impl OutcomeCounts {
    /// Attempts that did not succeed.
    pub fn failed(&self) -> i64 {
        self.attempts - self.ok
    }

    /// Successes over attempts, 0 when there were none.
    pub fn success_rate(&self) -> f64 {
        if self.attempts == 0 {
            0.0
        } else {
            self.ok as f64 / self.attempts as f64
        }
    }
}

/// Trigger lag percentiles, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LagStats {
    /// The queue; None for the overall figures.
    pub queue: Option<String>,
    /// Leases measured.
    pub count: i64,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

/// Trigger lag over a window: overall and per queue.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LagReport {
    /// Every lease measured.
    pub overall: LagStats,
    /// Per queue, by name.
    pub queues: Vec<LagStats>,
}

/// Send durations of one queue and template, in milliseconds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DurationStats {
    /// The queue.
    pub queue: String,
    /// The template id; empty for plain text.
    pub template_id: String,
    /// Attempts measured.
    pub count: i64,
    /// Mean.
    pub avg_ms: f64,
    /// Longest.
    pub max_ms: f64,
}

/// Filters and page position for [`Store::list_failures`]; None means "any".
#[derive(Debug, Clone, Default)]
pub struct FailureFilter {
    /// Queue.
    pub queue: Option<String>,
    /// Account of the last attempt.
    pub account: Option<String>,
    /// Outcome of the last attempt.
    pub outcome: Option<Outcome>,
    /// Template id.
    pub template_id: Option<String>,
    /// Continue after this `(finished_at, id)`, the previous page's last row.
    pub after: Option<(DateTime<Utc>, Uuid)>,
    /// Page size.
    pub limit: i64,
}

/// A task that ended without being sent, with its last attempt.
#[derive(Debug, Clone)]
pub struct FailureRecord {
    /// Task id.
    pub id: Uuid,
    /// Queue.
    pub queue: String,
    /// Recipient.
    pub recipient: String,
    /// Template id, for template content.
    pub template_id: Option<String>,
    /// `herald.v1.Content`, prost-encoded, as created.
    pub content: Vec<u8>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Failed or Expired.
    pub state: TaskState,
    /// How the last attempt ended; None when there was no attempt.
    pub outcome: Option<Outcome>,
    /// The last error text.
    pub error: Option<String>,
    /// Account of the last attempt, or the pinned account.
    pub account: Option<String>,
    /// Attempts charged.
    pub attempts: i32,
    /// When the task ended.
    pub finished_at: DateTime<Utc>,
}

impl Store {
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
                let conn = self.conn().await?;
                let stmt = conn
                    .prepare_cached(include_str!("queries/stats_window.sql"))
                    .await
                    .map_err(StoreError::query("preparing the window"))?;
                let row = conn
                    .query_one(&stmt, &[&time_zone, &last])
                    .await
                    .map_err(StoreError::query("resolving the window"))?;
                (row.get(0), row.get(1))
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
        let conn = self.conn().await?;
        let stmt = conn
            .prepare_cached(include_str!("queries/stats_count_tasks.sql"))
            .await
            .map_err(StoreError::query("preparing the task count"))?;
        let rows = conn
            .query(&stmt, &[&namespace, &window.start, &window.end, &queue])
            .await
            .map_err(StoreError::query("counting tasks"))?;
        let mut counts = StateCounts::default();
        for row in &rows {
            let n: i64 = row.get(1);
            match parse_state(row.get(0))? {
                TaskState::Scheduled => counts.scheduled = n,
                TaskState::Leased => counts.leased = n,
                TaskState::Succeeded => counts.succeeded = n,
                TaskState::Failed => counts.failed = n,
                TaskState::Cancelled => counts.cancelled = n,
                TaskState::Expired => counts.expired = n,
            }
        }
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
        let conn = self.conn().await?;
        let stmt = conn
            .prepare_cached(include_str!("queries/stats_success_rates.sql"))
            .await
            .map_err(StoreError::query("preparing success rates"))?;
        let rows = conn
            .query(
                &stmt,
                &[
                    &namespace,
                    &window.start,
                    &window.end,
                    &queue,
                    &(group as i16),
                    &window.time_zone,
                ],
            )
            .await
            .map_err(StoreError::query("computing success rates"))?;
        Ok(rows
            .iter()
            .map(|r| OutcomeCounts {
                key: r.get(0),
                bucket: r.get(1),
                attempts: r.get(2),
                ok: r.get(3),
                rate_limited: r.get(4),
                transient: r.get(5),
                permanent: r.get(6),
                account_unavailable: r.get(7),
                lease_expired: r.get(8),
            })
            .collect())
    }

    /// Trigger lag percentiles of leases granted in `window`, overall and per queue.
    pub async fn trigger_lag(
        &self,
        namespace: &str,
        window: &Window,
        queue: Option<&str>,
    ) -> Result<LagReport, StoreError> {
        let conn = self.conn().await?;
        let stmt = conn
            .prepare_cached(include_str!("queries/stats_trigger_lag.sql"))
            .await
            .map_err(StoreError::query("preparing trigger lag"))?;
        let rows = conn
            .query(&stmt, &[&namespace, &window.start, &window.end, &queue])
            .await
            .map_err(StoreError::query("computing trigger lag"))?;
        let mut report = LagReport::default();
        for r in &rows {
            let stats = LagStats {
                queue: r.get(0),
                count: r.get(1),
                p50_ms: r.get(2),
                p90_ms: r.get(3),
                p99_ms: r.get(4),
                max_ms: r.get(5),
            };
            let overall: bool = r.get(6);
            if overall {
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
        let conn = self.conn().await?;
        let stmt = conn
            .prepare_cached(include_str!("queries/stats_send_durations.sql"))
            .await
            .map_err(StoreError::query("preparing send durations"))?;
        let rows = conn
            .query(&stmt, &[&namespace, &window.start, &window.end, &queue])
            .await
            .map_err(StoreError::query("computing send durations"))?;
        Ok(rows
            .iter()
            .map(|r| DurationStats {
                queue: r.get(0),
                template_id: r.get(1),
                count: r.get(2),
                avg_ms: r.get(3),
                max_ms: r.get(4),
            })
            .collect())
    }

    /// One page of failed and expired tasks that ended in `window`, newest first.
    pub async fn list_failures(
        &self,
        namespace: &str,
        window: &Window,
        filter: &FailureFilter,
    ) -> Result<Vec<FailureRecord>, StoreError> {
        let conn = self.conn().await?;
        let stmt = conn
            .prepare_cached(include_str!("queries/stats_list_failures.sql"))
            .await
            .map_err(StoreError::query("preparing the failure list"))?;
        let outcome = filter.outcome.map(|o| o as i16);
        let (after_at, after_id) = match filter.after {
            Some((at, id)) => (Some(at), Some(id)),
            None => (None, None),
        };
        let rows = conn
            .query(
                &stmt,
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
            .await
            .map_err(StoreError::query("listing failures"))?;
        rows.iter()
            .map(|r| {
                let outcome: Option<i16> = r.get(7);
                let outcome = match outcome {
                    None => None,
                    Some(code) => Some(
                        Outcome::from_code(code)
                            .ok_or_else(|| StoreError::Corrupt(format!("outcome code {code}")))?,
                    ),
                };
                Ok(FailureRecord {
                    id: r.get(0),
                    queue: r.get(1),
                    recipient: r.get(2),
                    template_id: r.get(3),
                    content: r.get(4),
                    labels: labels_from_json(r.get(5)),
                    state: parse_state(r.get(6))?,
                    outcome,
                    error: r.get(8),
                    account: r.get(9),
                    attempts: r.get(10),
                    finished_at: r.get(11),
                })
            })
            .collect()
    }
}
