//! What a task is: the spec a caller asks for, the task as stored, its attempts, and the lease
//! an executor receives. A field of a task lives here once; its rule is in `spec_checks.rs`,
//! and the wire conversion (`api/convert/tasks.rs`) and the row mapping
//! (`store/tasks/columns.rs`) are the only other places that name it.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use herald_proto::v1 as pb;
use uuid::Uuid;

pub use super::retry_policy::{RetryPolicy, MAX_RETRY_DELAY_MS};
pub use super::send_window::SendWindow;

/// Largest text or template payload, in bytes.
pub const MAX_CONTENT_BYTES: usize = 64 * 1024;
/// Largest recipient, in characters.
pub const MAX_RECIPIENT_CHARS: usize = 256;
/// Most tasks in one CreateTasks.
pub const MAX_BATCH: usize = 1_000;
/// How far in the past a run_at may be (a little clock skew or a slow client is fine; a
/// timestamp from yesterday is almost certainly a bug).
pub const MAX_PAST: ChronoDuration = ChronoDuration::hours(24);
/// How far ahead a task may be scheduled.
pub const MAX_AHEAD: ChronoDuration = ChronoDuration::days(366);
/// Default attempt budget.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 10;
/// Default priority.
pub const DEFAULT_PRIORITY: i32 = 5;

/// A task's lifecycle state; the names match the `herald.task_state` enum in the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

/// Why a terminal task ended; the names match the `herald.end_reason` enum in the database
/// (migration 14) and the variants the wire's `EndReason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EndReason {
    /// The provider accepted the message.
    Sent,
    /// Every attempt was used.
    Exhausted,
    /// The provider refused the message for good.
    PermanentError,
    /// The deadline passed first.
    Expired,
    /// Cancelled by a client or with its campaign.
    Cancelled,
    /// The recipient is on the namespace's suppression list: nothing was sent.
    Suppressed,
    /// The provider says the recipient cannot receive messages.
    InvalidRecipient,
    /// The duplicate-content guard stopped it: nothing was sent.
    DuplicateContent,
    /// The provider accepted the message and later reported it undeliverable.
    FailedAfterAcceptance,
}

impl EndReason {
    /// Every reason, in the wire enum's order.
    pub const ALL: [EndReason; 9] = [
        EndReason::Sent,
        EndReason::Exhausted,
        EndReason::PermanentError,
        EndReason::Expired,
        EndReason::Cancelled,
        EndReason::Suppressed,
        EndReason::InvalidRecipient,
        EndReason::DuplicateContent,
        EndReason::FailedAfterAcceptance,
    ];

    /// The database's name for the reason.
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Sent => "sent",
            EndReason::Exhausted => "exhausted",
            EndReason::PermanentError => "permanent_error",
            EndReason::Expired => "expired",
            EndReason::Cancelled => "cancelled",
            EndReason::Suppressed => "suppressed",
            EndReason::InvalidRecipient => "invalid_recipient",
            EndReason::DuplicateContent => "duplicate_content",
            EndReason::FailedAfterAcceptance => "failed_after_acceptance",
        }
    }

    /// Parses the database's name for a reason.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
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
    /// The wire name without its prefix (`OK`, `RATE_LIMITED`, …), for people.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "OK",
            Outcome::RateLimited => "RATE_LIMITED",
            Outcome::Transient => "TRANSIENT",
            Outcome::Permanent => "PERMANENT",
            Outcome::AccountUnavailable => "ACCOUNT_UNAVAILABLE",
            Outcome::LeaseExpired => "LEASE_EXPIRED",
        }
    }

    /// Parses a [`Outcome::name`].
    pub fn from_name(name: &str) -> Option<Self> {
        [
            Outcome::Ok,
            Outcome::RateLimited,
            Outcome::Transient,
            Outcome::Permanent,
            Outcome::AccountUnavailable,
            Outcome::LeaseExpired,
        ]
        .into_iter()
        .find(|o| o.name() == name)
    }

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

/// When a task asks to become due.
#[derive(Debug, Clone, PartialEq)]
pub enum When {
    /// As soon as it is stored.
    Now,
    /// At this instant.
    At(DateTime<Utc>),
    /// This many milliseconds after the database receives it.
    After(i64),
    /// At a wall-clock time (`2026-12-24T09:00`) in an IANA zone: the recipient's local time.
    Local {
        /// The wall-clock date-time.
        time: String,
        /// The zone it is read in.
        zone: String,
    },
}

/// When a new task becomes due, as stored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DueAt {
    /// At this instant.
    At(DateTime<Utc>),
    /// This many milliseconds after the database receives it (0 = now).
    After(i64),
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

/// What made a task, when not a plain create call.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Origin {
    /// CreateTask(s) or a test send.
    #[default]
    Request,
    /// One run of a recurring schedule.
    ScheduleRun {
        /// The schedule.
        schedule_id: String,
        /// The run's fire time.
        fire_time: DateTime<Utc>,
        /// The audience the run targets, for a fan-out.
        audience_id: Option<String>,
    },
    /// A campaign; a paused campaign's tasks are created parked.
    Campaign {
        /// The campaign.
        campaign_id: Uuid,
        /// Whether the campaign is paused.
        paused: bool,
        /// The audience a page of the campaign's contacts came from.
        audience_id: Option<String>,
    },
}

/// A task as a caller asks for it: what the wire carried, before any rule was checked.
#[derive(Debug, Clone, Default)]
pub struct TaskSpec {
    /// Queue name.
    pub queue: String,
    /// Recipient.
    pub recipient: String,
    /// What to send: text, or a template stored in herald or at the provider.
    pub content: Option<pb::Content>,
    /// When it becomes due.
    pub when: Option<When>,
    /// 0..=9; None for the default.
    pub priority: Option<i32>,
    /// Attempt budget; None for the default.
    pub max_attempts: Option<i32>,
    /// Idempotency key; empty for none.
    pub idempotency_key: String,
    /// A digest of the whole request: a key reused with a different request is refused.
    pub request_hash: Vec<u8>,
    /// Retry spacing; None for the default.
    pub retry: Option<RetryPolicy>,
    /// Deadline.
    pub expire_at: Option<DateTime<Utc>>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// The pool to send from; empty for none.
    pub pool: String,
    /// The account to send from; empty for none.
    pub account_id: String,
    /// Only send inside this window of the recipient's day (wire form; checked here).
    pub send_window: Option<pb::SendWindow>,
    /// The duplicate content guard's window, in milliseconds; None for the queue's.
    pub duplicate_window_ms: Option<i64>,
    /// The template sent instead when WhatsApp says the 24-hour window is closed (131047).
    pub window_closed_fallback: Option<pb::TemplateContent>,
}

/// A task that met every rule, ready to insert.
#[derive(Debug, Clone)]
pub struct NewTask {
    /// Assigned before insert (UUIDv7, so ids sort by creation).
    pub id: Uuid,
    /// Queue name.
    pub queue: String,
    /// Recipient.
    pub recipient: String,
    /// What will be sent: the content as given, then rendered (stored templates become what
    /// they render to), so the stored task holds exactly what is sent.
    pub content: pb::Content,
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
    /// The W3C `traceparent` of the span that created it, carried to the lease and the send.
    pub trace_parent: Option<String>,
    /// What made it.
    pub origin: Origin,
    /// Only sent inside this window of the recipient's day.
    pub send_window: Option<SendWindow>,
    /// The duplicate content guard's window, in milliseconds (see `tasks::duplicates`).
    pub duplicate_window_ms: Option<i64>,
    /// The template sent instead when WhatsApp says the 24-hour window is closed (131047):
    /// the spec's, else (when rendered) its stored template's.
    pub window_closed_fallback: Option<pb::TemplateContent>,
    /// The fallback came from the stored template, not the spec: a target that cannot send
    /// it drops it rather than refusing the task.
    pub fallback_inherited: bool,
}

/// A window-closed fallback template as the task row stores it: a `herald.v1.Content` with
/// the template as its body, so a lease can send it in place of the content as it is.
pub fn fallback_content(template: &pb::TemplateContent) -> pb::Content {
    pb::Content {
        body: Some(pb::content::Body::Template(template.clone())),
        link_preview: false,
    }
}

/// The template of a stored window-closed fallback; None when it does not decode to one.
pub fn fallback_template(bytes: &[u8]) -> Option<pb::TemplateContent> {
    match content_of(bytes)?.body? {
        pb::content::Body::Template(t) => Some(t),
        _ => None,
    }
}

/// Decodes stored content (a `herald.v1.Content`); None when it does not decode.
pub fn content_of(bytes: &[u8]) -> Option<pb::Content> {
    prost::Message::decode(bytes).ok()
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
    /// Its send window.
    pub send_window: Option<SendWindow>,
    /// Why it ended, once terminal.
    pub end_reason: Option<EndReason>,
    /// The provider's error code behind the end, when it gave one.
    pub end_code: Option<i64>,
    /// The W3C `traceparent` of the request that created it, if traced.
    pub trace_parent: Option<String>,
    /// The campaign it belongs to, if any.
    pub campaign_id: Option<Uuid>,
    /// The schedule that fired it, if any.
    pub schedule_id: Option<String>,
    /// The audience it was made for, if any.
    pub audience_id: Option<String>,
    /// Parked by its campaign (paused or cancelled): the claim does not visit it.
    pub parked: bool,
    /// The window-closed fallback, encoded as content ([`fallback_content`]).
    pub window_closed_fallback: Option<Vec<u8>>,
    /// When the fallback took the place of the content, once it has.
    pub window_closed_fallback_at: Option<DateTime<Utc>>,
    /// The provider message id of the accepted message the fallback replaced, if any.
    pub fallback_replaces: Option<String>,
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
    /// The send was refused with 131047 and the window-closed fallback went instead.
    pub window_closed_fallback: bool,
}

/// A lease just granted by a claim: the task as the executor receives it.
#[derive(Debug, Clone, Default)]
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
    /// Priority level: with the due time, where the claim's walk found it (lease/due_marks.rs).
    pub priority: i16,
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
    /// How long after the grant the executor waits before sending: a paced send's instant lies
    /// ahead of the claim (human-like gaps); zero for every other lease.
    pub send_after: std::time::Duration,
    /// The window-closed fallback the executor may send in place of `content` (encoded as
    /// content), while it has not been used; None once `content` is the fallback itself.
    pub window_closed_fallback: Option<Vec<u8>>,
}
