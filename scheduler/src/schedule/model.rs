//! What a schedule is as stored, and its runs.

use chrono::{DateTime, Utc};

/// A schedule as stored. `spec` is the encoded `herald.v1.ScheduleSpec`; the policy columns
/// are copies of its fields the materialiser needs without decoding.
#[derive(Debug, Clone)]
pub struct ScheduleRecord {
    /// Id.
    pub id: String,
    /// Cron expression.
    pub cron: String,
    /// IANA zone.
    pub time_zone: String,
    /// 'shift_forward' | 'skip'.
    pub skipped_time: String,
    /// 'fire_once' | 'fire_twice'.
    pub repeated_time: String,
    /// 'skip' | 'allow'.
    pub overlap: String,
    /// 'skip' | 'fire_once_now' | 'catch_up'.
    pub misfire: String,
    /// Lateness still counted as on time, in milliseconds.
    pub misfire_grace_ms: i64,
    /// Random offset bound, in milliseconds.
    pub jitter_ms: i64,
    /// Stagger window, in milliseconds.
    pub stagger_ms: i64,
    /// Stagger keeps off minutes :00 and :30.
    pub stagger_off_round: bool,
    /// Encoded spec.
    pub spec: Vec<u8>,
    /// Paused.
    pub paused: bool,
    /// The next fire time to handle.
    pub next_fire_at: Option<DateTime<Utc>>,
    /// The last fire time that created a run.
    pub last_fire_at: Option<DateTime<Utc>>,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

/// A materialised run.
#[derive(Debug, Clone)]
pub struct RunRecord {
    /// Fire time.
    pub fire_time: DateTime<Utc>,
    /// 'fired' | 'catch_up' | 'manual' | 'skipped_overlap' | 'skipped_expired'.
    pub kind: String,
    /// Tasks created.
    pub task_count: i32,
    /// Materialised at.
    pub created_at: DateTime<Utc>,
    /// When it was found unfinished past its overrun deadline.
    pub overran_at: Option<DateTime<Utc>>,
    /// Recipients are still to become tasks (an audience or variables-source run).
    pub fanning_out: bool,
    /// Why the fan-out's last batch failed (a variables source that did not answer, an
    /// audience deleted; cleared by a batch that succeeds; with `fanning_out` false, the run
    /// gave up there), else why recipients were left out of the run (their tasks no longer
    /// check or render).
    pub error: Option<String>,
}
