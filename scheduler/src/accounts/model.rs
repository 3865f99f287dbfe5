//! What a sending account is: its definition, the limits it sends within and the rules they
//! must meet, and its live status. A limit is a field of [`AccountLimits`] named as its column:
//! the store reads and writes the limits as one record, so adding one touches this file, the
//! wire conversion, a migration and the limit functions (`store/accounts/functions.sql`).

use chrono::{DateTime, NaiveDate, NaiveTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::Violations;
use crate::rules;

/// Whether an account may send; names match the `herald.account_state` enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccountState {
    /// Sends within its limits.
    Active,
    /// Paused by an operator.
    Paused,
    /// Reported unusable; active again after its cool-down.
    Offline,
}

impl AccountState {
    /// The database's name.
    pub fn as_str(self) -> &'static str {
        match self {
            AccountState::Active => "active",
            AccountState::Paused => "paused",
            AccountState::Offline => "offline",
        }
    }

    /// Parses the database's name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "active" => AccountState::Active,
            "paused" => AccountState::Paused,
            "offline" => AccountState::Offline,
            _ => return None,
        })
    }
}

/// An account's configured limits. Field names are the `herald.accounts` column names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AccountLimits {
    /// Sustained sends per second.
    pub rate_per_sec: f64,
    /// Bucket size.
    pub burst: i32,
    /// Sends per local day.
    pub daily_cap: Option<i32>,
    /// Leases held at once.
    pub max_in_flight: Option<i32>,
    /// Least time between sends to one recipient, in milliseconds.
    pub recipient_interval_ms: Option<i64>,
    /// Start of the quiet window in local time (set together with `quiet_end`).
    pub quiet_start: Option<NaiveTime>,
    /// End of the quiet window in local time.
    pub quiet_end: Option<NaiveTime>,
    /// Share of max_in_flight kept for high priority.
    pub high_priority_reserve: f64,
    /// Lowest priority that may use the reserve.
    pub high_priority_min: i16,
    /// Lowest effective rate, as a fraction of the configured one.
    pub adaptive_floor: f64,
    /// Successes per recovery step.
    pub recovery_successes: i32,
    /// How long ACCOUNT_UNAVAILABLE keeps the account offline, in milliseconds.
    pub offline_cooldown_ms: i64,
    /// First day of the warm-up ramp in the account's zone (None: the day it was created).
    pub ramp_start: Option<NaiveDate>,
    /// The ramp's cap on its first day (a ramp is set by this or by `ramp_table`).
    pub ramp_initial: Option<i32>,
    /// What the ramp's cap grows by each day.
    pub ramp_step: Option<i32>,
    /// The highest cap the ramp reaches.
    pub ramp_ceiling: Option<i32>,
    /// An explicit cap per ramp day instead of initial and step; its last value holds after.
    pub ramp_table: Option<Vec<i32>>,
    /// Least time between two sends through the account, in milliseconds.
    pub gap_min_ms: Option<i64>,
    /// Most time between two sends (the gap is uniform between min and max).
    pub gap_max_ms: Option<i64>,
    /// Unique recipients of business-initiated conversations per rolling 24 hours.
    pub tier_limit: Option<i32>,
    /// Recent failure rate (0 to 1) at which the account pauses itself.
    pub pause_failure_rate: Option<f64>,
}

impl AccountLimits {
    /// Default lowest priority that may use the high-priority reserve.
    pub const DEFAULT_HIGH_PRIORITY_MIN: i16 = 7;
    /// Default adaptive floor.
    pub const DEFAULT_ADAPTIVE_FLOOR: f64 = 0.1;
    /// Default successes per recovery step.
    pub const DEFAULT_RECOVERY_SUCCESSES: i32 = 20;
    /// Default offline cool-down.
    pub const DEFAULT_OFFLINE_COOLDOWN_MS: i64 = 300_000;
    /// Longest recipient interval or cool-down.
    pub const MAX_INTERVAL_MS: i64 = 7 * 86_400_000;
    /// Longest gap between two sends.
    pub const MAX_GAP_MS: i64 = 3_600_000;

    /// The limits of an account sending `rate_per_sec`, everything else at its default.
    pub fn with_rate(rate_per_sec: f64) -> Self {
        AccountLimits {
            rate_per_sec,
            burst: Self::default_burst(rate_per_sec),
            daily_cap: None,
            max_in_flight: None,
            recipient_interval_ms: None,
            quiet_start: None,
            quiet_end: None,
            high_priority_reserve: 0.0,
            high_priority_min: Self::DEFAULT_HIGH_PRIORITY_MIN,
            adaptive_floor: Self::DEFAULT_ADAPTIVE_FLOOR,
            recovery_successes: Self::DEFAULT_RECOVERY_SUCCESSES,
            offline_cooldown_ms: Self::DEFAULT_OFFLINE_COOLDOWN_MS,
            ramp_start: None,
            ramp_initial: None,
            ramp_step: None,
            ramp_ceiling: None,
            ramp_table: None,
            gap_min_ms: None,
            gap_max_ms: None,
            tier_limit: None,
            pause_failure_rate: None,
        }
    }

    /// The burst of a rate without one: a second's worth, at least 1.
    pub fn default_burst(rate_per_sec: f64) -> i32 {
        (rate_per_sec.ceil() as i32).max(1)
    }

    /// The quiet window, when set.
    pub fn quiet_hours(&self) -> Option<(NaiveTime, NaiveTime)> {
        self.quiet_start.zip(self.quiet_end)
    }

    /// Records what is out of range under `path` (the wire path of the limits).
    pub fn check(&self, path: &str, v: &mut Violations) {
        let f = |name: &str| format!("{path}.{name}");
        if !(self.rate_per_sec > 0.0 && self.rate_per_sec <= 10_000.0) {
            v.add(
                f("rate_per_second"),
                "must be greater than 0 and at most 10000",
            );
        }
        if !(1..=100_000).contains(&self.burst) {
            v.add(f("burst"), "must be between 1 and 100000");
        }
        if self.daily_cap.is_some_and(|c| c < 0) {
            v.add(f("daily_cap"), "must not be negative");
        }
        if self.max_in_flight.is_some_and(|m| m < 1) {
            v.add(f("max_in_flight"), "must be at least 1");
        }
        if self
            .recipient_interval_ms
            .is_some_and(|ms| !(0..=Self::MAX_INTERVAL_MS).contains(&ms))
        {
            v.add(f("recipient_interval"), "must be between 0 and 7 days");
        }
        match (self.quiet_start, self.quiet_end) {
            (Some(s), Some(e)) if s == e => v.add(f("quiet_hours"), "start and end must differ"),
            (Some(_), None) | (None, Some(_)) => {
                v.add(f("quiet_hours"), "start and end must be HH:MM")
            }
            _ => {}
        }
        if !(0.0..=0.9).contains(&self.high_priority_reserve) {
            v.add(f("high_priority_reserve"), "must be between 0 and 0.9");
        }
        if self.high_priority_reserve > 0.0 && self.max_in_flight.is_none() {
            v.add(f("high_priority_reserve"), "needs max_in_flight");
        }
        if !(0..=9).contains(&self.high_priority_min) {
            v.add(f("high_priority_min"), "must be between 0 and 9");
        }
        if !(0.01..=1.0).contains(&self.adaptive_floor) {
            v.add(f("adaptive_floor"), "must be between 0.01 and 1");
        }
        if !(1..=100_000).contains(&self.recovery_successes) {
            v.add(f("recovery_successes"), "must be between 1 and 100000");
        }
        if !(0..=Self::MAX_INTERVAL_MS).contains(&self.offline_cooldown_ms) {
            v.add(f("offline_cooldown"), "must be between 0 and 7 days");
        }
        self.check_pacing(path, v);
    }

    /// The careful-sending limits: warm-up, gaps, tier, self-pause.
    fn check_pacing(&self, path: &str, v: &mut Violations) {
        let f = |name: &str| format!("{path}.{name}");
        let cap_range = 1..=10_000_000;
        let ramp = self.ramp_initial.is_some() || self.ramp_table.is_some();
        if self.ramp_initial.is_some() && self.ramp_table.is_some() {
            v.add(
                f("warm_up"),
                "set either initial (with step) or per_day, not both",
            );
        }
        if self.ramp_initial.is_some_and(|c| !cap_range.contains(&c)) {
            v.add(f("warm_up.initial"), "must be between 1 and 10000000");
        }
        if self
            .ramp_step
            .is_some_and(|c| !(0..=10_000_000).contains(&c))
        {
            v.add(f("warm_up.step"), "must be between 0 and 10000000");
        }
        if self
            .ramp_ceiling
            .is_some_and(|c| !cap_range.contains(&c) || self.ramp_initial.is_some_and(|i| c < i))
        {
            v.add(
                f("warm_up.ceiling"),
                "must be between 1 and 10000000 and at least initial",
            );
        }
        if let Some(table) = &self.ramp_table {
            if table.is_empty()
                || table.len() > 366
                || table.iter().any(|c| !(0..=10_000_000).contains(c))
            {
                v.add(
                    f("warm_up.per_day"),
                    "must hold 1 to 366 caps, each between 0 and 10000000",
                );
            }
        }
        if !ramp
            && (self.ramp_step.is_some()
                || self.ramp_ceiling.is_some()
                || self.ramp_start.is_some())
        {
            v.add(
                f("warm_up.initial"),
                "is required for a warm-up without per_day",
            );
        }
        match (self.gap_min_ms, self.gap_max_ms) {
            (Some(min), max) => {
                if !(1..=Self::MAX_GAP_MS).contains(&min) {
                    v.add(f("gaps.min"), "must be between 1 ms and 1 hour");
                }
                if max.is_some_and(|max| max < min || max > Self::MAX_GAP_MS) {
                    v.add(f("gaps.max"), "must be at least min and at most 1 hour");
                }
            }
            (None, Some(_)) => v.add(f("gaps.min"), "is required with gaps.max"),
            (None, None) => {}
        }
        if self.tier_limit.is_some_and(|t| t < 1) {
            v.add(f("messaging_tier"), "is not a messaging tier");
        }
        if self
            .pause_failure_rate
            .is_some_and(|r| !(r > 0.0 && r <= 1.0))
        {
            v.add(
                f("pause_failure_rate"),
                "must be greater than 0 and at most 1",
            );
        }
    }
}

/// A sending account's definition.
#[derive(Debug, Clone, PartialEq)]
pub struct AccountSpec {
    /// Id.
    pub id: String,
    /// Sender kind (one of [`herald_proto::SenderKind`]'s names).
    pub sender_kind: String,
    /// Pool.
    pub pool: String,
    /// IANA time zone.
    pub time_zone: String,
    /// Where executors hold its credentials.
    pub credentials_ref: String,
    /// Operator-set state.
    pub state: AccountState,
    /// Limits.
    pub limits: AccountLimits,
}

impl AccountSpec {
    /// Records every rule the definition breaks under `path` (`account`).
    pub fn check(&self, path: &str, v: &mut Violations) {
        let f = |name: &str| format!("{path}.{name}");
        if let Some(p) = rules::name_problem(&self.id) {
            v.add(f("id"), p);
        }
        if !crate::accounts::is_sender_kind(&self.sender_kind) {
            v.add(
                f("sender_kind"),
                format!("must be one of {}", crate::accounts::sender_kinds()),
            );
        }
        if let Some(p) = rules::name_problem(&self.pool) {
            v.add(f("pool"), p);
        }
        if !rules::is_time_zone(&self.time_zone) {
            v.add(f("time_zone"), "is not an IANA time zone name");
        }
        if self.credentials_ref.len() > 128 || self.credentials_ref.chars().any(char::is_control) {
            v.add(
                f("credentials_ref"),
                "must be at most 128 printable characters",
            );
        }
        self.limits.check(&f("limits"), v);
    }
}

/// An account as stored, with its live status.
#[derive(Debug, Clone)]
pub struct AccountRecord {
    /// Definition.
    pub spec: AccountSpec,
    /// Current effective rate.
    pub effective_rate: f64,
    /// Why it last changed.
    pub rate_reason: String,
    /// When it last changed.
    pub rate_changed_at: DateTime<Utc>,
    /// Sends counted today.
    pub today_count: i32,
    /// Leases held.
    pub in_flight: i32,
    /// Offline until.
    pub offline_until: Option<DateTime<Utc>>,
    /// Why it is in its state.
    pub state_reason: String,
    /// Provider-requested pause.
    pub throttled_until: Option<DateTime<Utc>>,
    /// Today's daily cap, warm-up included (None: no cap).
    pub today_cap: Option<i32>,
    /// The day of the warm-up ramp today (1 on its first day; None without a ramp).
    pub ramp_day: Option<i32>,
    /// Business-initiated conversations opened in the last 24 hours.
    pub tier_used: i32,
    /// Health score, 0 to 1 (recent success rate, throttling, provider quality).
    pub health: f64,
    /// The provider's quality rating: "green", "yellow", "red" or "unknown".
    pub quality: String,
    /// When the next send may be granted under the account's gaps.
    pub next_send_at: Option<DateTime<Utc>>,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Definition last changed.
    pub updated_at: DateTime<Utc>,
}

/// A pool as stored.
#[derive(Debug, Clone)]
pub struct PoolRecord {
    /// Name.
    pub name: String,
    /// Description.
    pub description: String,
    /// Member accounts.
    pub account_ids: Vec<String>,
    /// Sum of active members' effective rates.
    pub effective_rate: f64,
    /// Tasks waiting for it.
    pub scheduled_tasks: i64,
    /// Whether each recipient stays on the account that last messaged them while it is healthy.
    pub sticky: bool,
    /// Created.
    pub created_at: DateTime<Utc>,
}
