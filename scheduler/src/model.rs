//! The scheduler's domain types: what a task is, independent of the wire format and of SQL.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// A task's lifecycle state; the names match the `herald.task_state` enum in the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    /// Waiting to become due.
    Scheduled,
    /// Held by an executor.
    Leased,
    /// Sent. Terminal.
    Succeeded,
    /// Permanently failed or out of attempts. Terminal.
    Failed,
    /// Cancelled. Terminal.
    Cancelled,
    /// Its deadline passed first. Terminal.
    Expired,
}

impl TaskState {
    /// The database's name for the state.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Scheduled => "scheduled",
            TaskState::Leased => "leased",
            TaskState::Succeeded => "succeeded",
            TaskState::Failed => "failed",
            TaskState::Cancelled => "cancelled",
            TaskState::Expired => "expired",
        }
    }

    /// Parses the database's name for a state.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "scheduled" => TaskState::Scheduled,
            "leased" => TaskState::Leased,
            "succeeded" => TaskState::Succeeded,
            "failed" => TaskState::Failed,
            "cancelled" => TaskState::Cancelled,
            "expired" => TaskState::Expired,
            _ => return None,
        })
    }

    /// True for states a task never leaves (except by RetryTask).
    pub fn is_terminal(self) -> bool {
        !matches!(self, TaskState::Scheduled | TaskState::Leased)
    }
}

/// How an attempt ended. The numbers are stored in the database and equal the wire enum's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i16)]
pub enum Outcome {
    /// Sent.
    Ok = 1,
    /// Throttled by the provider.
    RateLimited = 2,
    /// A passing failure.
    Transient = 3,
    /// Will never succeed as sent.
    Permanent = 4,
    /// The account is unusable; not charged as an attempt.
    AccountUnavailable = 5,
    /// The lease ran out without a report.
    LeaseExpired = 6,
}

impl Outcome {
    /// Parses the stored number.
    pub fn from_code(code: i16) -> Option<Self> {
        Some(match code {
            1 => Outcome::Ok,
            2 => Outcome::RateLimited,
            3 => Outcome::Transient,
            4 => Outcome::Permanent,
            5 => Outcome::AccountUnavailable,
            6 => Outcome::LeaseExpired,
            _ => return None,
        })
    }
}

/// What cancelling a task achieved. The numbers are stored and equal the wire enum's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i16)]
pub enum CancelOutcome {
    /// The task was not leased.
    NotStarted = 1,
    /// The executor dropped it before sending.
    StoppedBeforeSend = 2,
    /// The provider had already accepted it.
    AlreadySent = 3,
    /// The executor had tried and the provider refused.
    SendFailed = 4,
    /// No answer from the executor yet.
    Unconfirmed = 5,
}

impl CancelOutcome {
    /// Parses the stored number.
    pub fn from_code(code: i16) -> Option<Self> {
        Some(match code {
            1 => CancelOutcome::NotStarted,
            2 => CancelOutcome::StoppedBeforeSend,
            3 => CancelOutcome::AlreadySent,
            4 => CancelOutcome::SendFailed,
            5 => CancelOutcome::Unconfirmed,
            _ => return None,
        })
    }
}

/// How retries are spaced.
#[derive(Debug, Clone, PartialEq)]
pub enum RetryPolicy {
    /// Capped exponential backoff with jitter.
    Exponential {
        /// First delay, in milliseconds.
        initial_ms: i64,
        /// Largest delay, in milliseconds.
        max_ms: i64,
        /// Growth per attempt.
        multiplier: f64,
        /// Randomised fraction of each delay.
        jitter: f64,
    },
    /// Explicit delays in milliseconds, the last repeating.
    Delays(Vec<i64>),
}

impl RetryPolicy {
    /// Default first delay.
    pub const DEFAULT_INITIAL_MS: i64 = 1_000;
    /// Default largest delay.
    pub const DEFAULT_MAX_MS: i64 = 3_600_000;
    /// Default growth per attempt.
    pub const DEFAULT_MULTIPLIER: f64 = 2.0;
    /// Default jitter fraction.
    pub const DEFAULT_JITTER: f64 = 0.2;

    /// Exponential backoff with every default.
    pub fn default_exponential() -> Self {
        RetryPolicy::Exponential {
            initial_ms: Self::DEFAULT_INITIAL_MS,
            max_ms: Self::DEFAULT_MAX_MS,
            multiplier: Self::DEFAULT_MULTIPLIER,
            jitter: Self::DEFAULT_JITTER,
        }
    }
}

/// When a new task becomes due.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DueAt {
    /// At this instant.
    At(DateTime<Utc>),
    /// This many milliseconds after the database receives it (0 = now).
    After(i64),
}

/// A validated task, ready to insert.
#[derive(Debug, Clone)]
pub struct NewTask {
    /// Assigned before insert (UUIDv7, so ids sort by creation).
    pub id: Uuid,
    /// Namespace owning the task.
    pub namespace: String,
    /// Queue name.
    pub queue: String,
    /// Recipient.
    pub recipient: String,
    /// The encoded `herald.v1.Content`.
    pub content: Vec<u8>,
    /// The template id, when the content is a template.
    pub template_id: Option<String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// 0..=9.
    pub priority: i16,
    /// Due time.
    pub due: DueAt,
    /// Deadline.
    pub expire_at: Option<DateTime<Utc>>,
    /// Idempotency key and the hash of the request it came with.
    pub idempotency: Option<(String, Vec<u8>)>,
    /// Attempt budget.
    pub max_attempts: i32,
    /// Retry spacing.
    pub retry: RetryPolicy,
    /// Where the task is sent from.
    pub target: Target,
    /// The W3C `traceparent` of the CreateTask span, carried to the lease and the send.
    pub trace_parent: Option<String>,
}

/// Which sending account a task goes out through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// No account: the executor picks its sender by queue.
    Queue,
    /// Any eligible account of this pool, chosen at lease time.
    Pool(String),
    /// This account only.
    Account(String),
}

/// A task as stored.
#[derive(Debug, Clone)]
pub struct TaskRecord {
    /// Id.
    pub id: Uuid,
    /// Queue.
    pub queue: String,
    /// Recipient.
    pub recipient: String,
    /// Encoded content.
    pub content: Vec<u8>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// State.
    pub state: TaskState,
    /// Priority.
    pub priority: i16,
    /// Due time.
    pub run_at: DateTime<Utc>,
    /// Deadline.
    pub expire_at: Option<DateTime<Utc>>,
    /// Idempotency key.
    pub idempotency_key: Option<String>,
    /// Leases granted.
    pub lease_count: i32,
    /// Attempts charged.
    pub attempts: i32,
    /// Budget.
    pub max_attempts: i32,
    /// Retry spacing.
    pub retry: RetryPolicy,
    /// Lease holder.
    pub executor_id: Option<String>,
    /// Lease start.
    pub leased_at: Option<DateTime<Utc>>,
    /// Lease end.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// Cancellation result.
    pub cancel_outcome: Option<CancelOutcome>,
    /// Last error.
    pub last_error: Option<String>,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
    /// Terminal since.
    pub finished_at: Option<DateTime<Utc>>,
    /// The targeted pool.
    pub pool: Option<String>,
    /// The pinned account, or the account of the current or last lease.
    pub account_id: Option<String>,
}

/// One recorded attempt.
#[derive(Debug, Clone)]
pub struct AttemptRecord {
    /// Task.
    pub task_id: Uuid,
    /// Attempt number.
    pub attempt: i32,
    /// Executor.
    pub executor_id: String,
    /// Account used, if routed.
    pub account: Option<String>,
    /// How it ended.
    pub outcome: Outcome,
    /// Error text.
    pub error: Option<String>,
    /// Provider message id.
    pub provider_message_id: Option<String>,
    /// Provider-requested delay.
    pub retry_after_ms: Option<i64>,
    /// Lease start.
    pub leased_at: DateTime<Utc>,
    /// Recorded at.
    pub finished_at: DateTime<Utc>,
}

/// A lease just granted by a claim: everything the executor needs to send.
#[derive(Debug, Clone)]
pub struct GrantedLease {
    /// Task.
    pub task_id: Uuid,
    /// Fencing attempt number.
    pub attempt: i32,
    /// Queue.
    pub queue: String,
    /// Recipient.
    pub recipient: String,
    /// Encoded content.
    pub content: Vec<u8>,
    /// The provider-facing idempotency key (the task's key, else its id).
    pub idempotency_key: String,
    /// Due time.
    pub run_at: DateTime<Utc>,
    /// Grant time.
    pub leased_at: DateTime<Utc>,
    /// Expiry.
    pub expires_at: DateTime<Utc>,
    /// Attempts charged before this one.
    pub attempts_before: i32,
    /// Budget.
    pub max_attempts: i32,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// The account chosen, if routed.
    pub account_id: Option<String>,
    /// Where executors hold that account's credentials.
    pub credentials_ref: Option<String>,
    /// The W3C `traceparent` recorded when the task was created.
    pub trace_parent: Option<String>,
}

/// An executor's report of one attempt.
#[derive(Debug, Clone)]
pub struct AttemptReport {
    /// Task.
    pub task_id: Uuid,
    /// Fencing attempt number.
    pub attempt: i32,
    /// How it ended (never LeaseExpired).
    pub outcome: Outcome,
    /// Error text.
    pub error: Option<String>,
    /// Provider message id.
    pub provider_message_id: Option<String>,
    /// Provider-requested delay.
    pub retry_after_ms: Option<i64>,
    /// When the executor started sending.
    pub started_at: Option<DateTime<Utc>>,
    /// For RateLimited: only this recipient was throttled, not the account.
    pub recipient_scoped: bool,
}

/// The scheduler's answer to one report.
#[derive(Debug, Clone)]
pub struct ReportVerdict {
    /// Task.
    pub task_id: Uuid,
    /// Attempt.
    pub attempt: i32,
    /// Whether the report was applied.
    pub accepted: bool,
    /// The task's state afterwards, if it exists.
    pub state: Option<TaskState>,
}

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

/// An account's configured limits.
#[derive(Debug, Clone, PartialEq)]
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
    /// Quiet window in local time, (start, end).
    pub quiet_hours: Option<(chrono::NaiveTime, chrono::NaiveTime)>,
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
}

/// A sending account's definition.
#[derive(Debug, Clone, PartialEq)]
pub struct AccountSpec {
    /// Id.
    pub id: String,
    /// Sender kind.
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
    /// Created.
    pub created_at: DateTime<Utc>,
}

/// What a stored template renders into.
#[derive(Debug, Clone, PartialEq)]
pub enum TemplateKind {
    /// Final text from a Jinja body.
    Text {
        /// The body.
        body: String,
    },
    /// A provider's own template with positional parameters.
    Provider {
        /// The provider's template name.
        name: String,
        /// Its language code.
        language: String,
        /// Variable names in parameter order.
        parameters: Vec<String>,
    },
}

/// A stored template.
#[derive(Debug, Clone)]
pub struct TemplateRecord {
    /// Id.
    pub id: String,
    /// Description.
    pub description: String,
    /// What it renders into.
    pub kind: TemplateKind,
    /// The variables it needs.
    pub variables: Vec<String>,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Last changed.
    pub updated_at: DateTime<Utc>,
}
