//! What a campaign is as stored, and what its operations report.

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// A campaign as stored.
#[derive(Debug, Clone)]
pub struct CampaignRecord {
    /// Id.
    pub id: Uuid,
    /// 'active' | 'paused' | 'cancelled' | 'finished'.
    pub state: String,
    /// Encoded `herald.v1.CampaignSpec`.
    pub spec: Vec<u8>,
    /// Target pool.
    pub pool: Option<String>,
    /// Recipients accepted.
    pub recipient_count: i32,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Where adding its audience's contacts stands.
    pub audience: AudienceProgress,
}

/// How far a campaign to an audience has got adding the contacts, a page at a time.
#[derive(Debug, Clone, Default)]
pub struct AudienceProgress {
    /// Contacts are still to be added.
    pub pending: bool,
    /// The last contact handled.
    pub after: String,
    /// When a date attribute ("birthday is today") is compared.
    pub at: Option<DateTime<Utc>>,
    /// Why adding stopped early (the recipient cap, a deleted audience).
    pub error: Option<String>,
}

/// Task counts of a campaign by state, with what the finish estimate needs.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    /// SCHEDULED or LEASED.
    pub live: i64,
    /// SUCCEEDED.
    pub succeeded: i64,
    /// FAILED.
    pub failed: i64,
    /// CANCELLED.
    pub cancelled: i64,
    /// EXPIRED.
    pub expired: i64,
    /// The latest due time of a live task.
    pub last_due: Option<DateTime<Utc>>,
    /// Sum of the pool's active accounts' effective rates, per second.
    pub pool_rate: f64,
    /// The database's now.
    pub now: Option<DateTime<Utc>>,
    /// How far its accepted messages got.
    pub delivery: crate::stats::DeliveryCounts,
}

/// One group of a campaign's failed tasks: how their last attempt ended and what it said.
/// (When tasks carry an end reason of their own, it belongs here as the first key.)
#[derive(Debug, Clone, PartialEq)]
pub struct FailureReason {
    /// Why they ended (None only for tasks failed before end reasons were recorded).
    pub end_reason: Option<crate::tasks::model::EndReason>,
    /// The provider's code; 0 when none.
    pub end_code: i64,
    /// One of the group's errors.
    pub example: String,
    /// Tasks in the group.
    pub tasks: i64,
}

/// What AddRecipients did.
#[derive(Debug, Clone, Copy)]
pub struct Added {
    /// New tasks.
    pub added: usize,
    /// Dropped as already present.
    pub duplicates: usize,
    /// Recipients now.
    pub total: i32,
    /// An audience's page reached the campaign's recipient cap: the contacts that fitted were
    /// added, the rest left out.
    pub capped: bool,
}

/// What cancelling the rows did; the caller revokes `leased` through the task cancel path.
#[derive(Debug, Clone, Default)]
pub struct CancelledRows {
    /// Scheduled tasks cancelled.
    pub scheduled: u64,
    /// Leased tasks, to revoke.
    pub leased: Vec<Uuid>,
}
