//! The read model of StatsService and the dashboard: time windows and the figures over them.
//! Read-only; the SQL lives in `store/stats/`, once for both.

use std::collections::BTreeMap;
use std::str::FromStr;

use base64::Engine as _;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::tasks::model::{EndReason, Outcome, TaskState};

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

/// Tasks per state in a window (see `store/stats/count_tasks.sql` for how a task is placed).
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
    /// Tasks that ended in the window, by why they ended, in [`EndReason::ALL`] order; reasons
    /// no task ended with are left out.
    pub by_reason: Vec<(EndReason, i64)>,
}

impl StateCounts {
    /// Tasks that ended in the window with `reason`.
    pub fn ended_with(&self, reason: EndReason) -> i64 {
        self.by_reason
            .iter()
            .filter(|(r, _)| *r == reason)
            .map(|(_, n)| n)
            .sum()
    }
}

/// How far accepted messages got by the providers' reports (a read counts as delivered).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeliveryCounts {
    /// Accepted by the provider.
    pub accepted: i64,
    /// Reported delivered or read.
    pub delivered: i64,
    /// Reported read.
    pub read: i64,
    /// Reported failed after acceptance.
    pub failed_after_acceptance: i64,
}

/// Accepted → delivered percentiles, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeliveryLatency {
    /// Messages measured.
    pub count: i64,
    /// Median.
    pub p50_ms: i64,
    /// 95th percentile.
    pub p95_ms: i64,
    /// 99th percentile.
    pub p99_ms: i64,
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

/// Filters and page position for `StatsRepo::list_failures`; None means "any".
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

/// Default page size of ListFailures.
pub const DEFAULT_FAILURE_PAGE: i32 = 50;
/// Largest page size of ListFailures.
pub const MAX_FAILURE_PAGE: i32 = 500;

/// Why `name` is not a usable IANA time zone, if it is not. Empty means UTC and is fine.
pub fn time_zone_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() || chrono_tz::Tz::from_str(name).is_ok() {
        None
    } else {
        Some("is not an IANA time zone name (for example \"Europe/Berlin\")")
    }
}

/// The time zone to use: `name`, or UTC when empty. Call after [`time_zone_problem`].
pub fn time_zone_or_utc(name: &str) -> String {
    if name.is_empty() {
        "UTC".to_string()
    } else {
        name.to_string()
    }
}

/// The failure list's page token: the last row's `(finished_at, id)`, opaque to clients.
pub fn encode_failure_token(finished_at: DateTime<Utc>, id: Uuid) -> String {
    let mut bytes = finished_at.timestamp_micros().to_be_bytes().to_vec();
    bytes.extend_from_slice(id.as_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Reads a token made by [`encode_failure_token`].
pub fn decode_failure_token(token: &str) -> Option<(DateTime<Utc>, Uuid)> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()?;
    if bytes.len() != 24 {
        return None;
    }
    let micros = i64::from_be_bytes(bytes[..8].try_into().ok()?);
    // Within what PostgreSQL stores (rules::timestamp's years 1 to 9999): a tampered token
    // out there failed the query, INTERNAL instead of a bad page_token.
    let at = DateTime::from_timestamp_micros(micros)?;
    let seconds = prost_types::Timestamp {
        seconds: at.timestamp(),
        nanos: 0,
    };
    crate::rules::timestamp(&seconds)?;
    Some((at, Uuid::from_slice(&bytes[8..]).ok()?))
}

#[cfg(test)]
mod tests {
    use base64::Engine;

    use super::*;

    #[test]
    fn a_failure_token_outside_the_stored_years_is_refused() {
        let id = Uuid::nil();
        let now = Utc::now();
        assert_eq!(
            decode_failure_token(&encode_failure_token(now, id)).map(|(at, _)| at.timestamp()),
            Some(now.timestamp())
        );
        // About year -200000: chrono takes it, PostgreSQL does not.
        let mut bytes = (-6_400_000_000_000_000_000_i64).to_be_bytes().to_vec();
        bytes.extend_from_slice(id.as_bytes());
        let tampered = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        assert_eq!(decode_failure_token(&tampered), None);
    }
}
