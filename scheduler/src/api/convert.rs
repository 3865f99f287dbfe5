//! Conversions between wire types and domain types, in one place.

use chrono::{DateTime, Utc};
use herald_proto::v1 as pb;
use prost::Message;

use crate::model::{
    AttemptRecord, CancelOutcome, GrantedLease, Outcome, RetryPolicy, TaskRecord, TaskState,
};
use crate::store::StoreError;

/// Domain time to wire time.
pub fn timestamp(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: t.timestamp_subsec_nanos() as i32,
    }
}

/// Wire time to domain time; None when malformed or outside the range protobuf's Timestamp
/// allows (years 1 to 9999). PostgreSQL stores that whole range; a year-200000 start time or
/// deadline used to fail the statement that stored it (found by fuzzing, #10).
pub fn from_timestamp(t: &prost_types::Timestamp) -> Option<DateTime<Utc>> {
    /// 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z.
    const SECONDS: std::ops::RangeInclusive<i64> = -62_135_596_800..=253_402_300_799;
    if !(0..1_000_000_000).contains(&t.nanos) || !SECONDS.contains(&t.seconds) {
        return None;
    }
    DateTime::from_timestamp(t.seconds, t.nanos as u32)
}

/// Milliseconds to a wire duration.
pub fn duration_from_ms(ms: i64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: ms / 1000,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

/// Domain state to wire state.
pub fn state(s: TaskState) -> pb::TaskState {
    match s {
        TaskState::Scheduled => pb::TaskState::Scheduled,
        TaskState::Leased => pb::TaskState::Leased,
        TaskState::Succeeded => pb::TaskState::Succeeded,
        TaskState::Failed => pb::TaskState::Failed,
        TaskState::Cancelled => pb::TaskState::Cancelled,
        TaskState::Expired => pb::TaskState::Expired,
    }
}

/// Wire state to domain state; None for UNSPECIFIED or unknown numbers.
pub fn state_from_wire(value: i32) -> Option<TaskState> {
    Some(match pb::TaskState::try_from(value).ok()? {
        pb::TaskState::Unspecified => return None,
        pb::TaskState::Scheduled => TaskState::Scheduled,
        pb::TaskState::Leased => TaskState::Leased,
        pb::TaskState::Succeeded => TaskState::Succeeded,
        pb::TaskState::Failed => TaskState::Failed,
        pb::TaskState::Cancelled => TaskState::Cancelled,
        pb::TaskState::Expired => TaskState::Expired,
    })
}

/// Domain outcome to wire outcome.
pub fn outcome(o: Outcome) -> pb::OutcomeClass {
    match o {
        Outcome::Ok => pb::OutcomeClass::Ok,
        Outcome::RateLimited => pb::OutcomeClass::RateLimited,
        Outcome::Transient => pb::OutcomeClass::Transient,
        Outcome::Permanent => pb::OutcomeClass::Permanent,
        Outcome::AccountUnavailable => pb::OutcomeClass::AccountUnavailable,
        Outcome::LeaseExpired => pb::OutcomeClass::LeaseExpired,
    }
}

/// Domain cancel outcome to wire.
pub fn cancel_outcome(o: CancelOutcome) -> pb::CancelOutcome {
    match o {
        CancelOutcome::NotStarted => pb::CancelOutcome::NotStarted,
        CancelOutcome::StoppedBeforeSend => pb::CancelOutcome::StoppedBeforeSend,
        CancelOutcome::AlreadySent => pb::CancelOutcome::AlreadySent,
        CancelOutcome::SendFailed => pb::CancelOutcome::SendFailed,
        CancelOutcome::Unconfirmed => pb::CancelOutcome::Unconfirmed,
    }
}

/// Domain retry policy to wire.
pub fn retry_policy(p: &RetryPolicy) -> pb::RetryPolicy {
    let strategy = match p {
        RetryPolicy::Exponential {
            initial_ms,
            max_ms,
            multiplier,
            jitter,
        } => pb::retry_policy::Strategy::Exponential(pb::ExponentialBackoff {
            initial: Some(duration_from_ms(*initial_ms)),
            max: Some(duration_from_ms(*max_ms)),
            multiplier: *multiplier,
            jitter: Some(*jitter),
        }),
        RetryPolicy::Delays(list) => pb::retry_policy::Strategy::Delays(pb::FixedDelays {
            delays: list.iter().map(|ms| duration_from_ms(*ms)).collect(),
        }),
    };
    pb::RetryPolicy {
        strategy: Some(strategy),
    }
}

/// Decodes stored content.
pub fn content(bytes: &[u8]) -> Result<pb::Content, StoreError> {
    pb::Content::decode(bytes).map_err(|e| StoreError::Corrupt(format!("task content: {e}")))
}

/// A stored task on the wire.
pub fn task(t: &TaskRecord) -> Result<pb::Task, StoreError> {
    let lease = match (t.state, &t.executor_id, t.leased_at, t.lease_expires_at) {
        (TaskState::Leased, Some(executor_id), Some(leased_at), Some(expires_at)) => {
            Some(pb::LeaseInfo {
                executor_id: executor_id.clone(),
                attempt: t.lease_count,
                leased_at: Some(timestamp(leased_at)),
                expires_at: Some(timestamp(expires_at)),
            })
        }
        _ => None,
    };
    Ok(pb::Task {
        id: t.id.to_string(),
        queue: t.queue.clone(),
        recipient: t.recipient.clone(),
        content: Some(content(&t.content)?),
        state: state(t.state) as i32,
        priority: i32::from(t.priority),
        run_at: Some(timestamp(t.run_at)),
        expire_at: t.expire_at.map(timestamp),
        idempotency_key: t.idempotency_key.clone().unwrap_or_default(),
        attempts: t.attempts,
        max_attempts: t.max_attempts,
        retry_policy: Some(retry_policy(&t.retry)),
        created_at: Some(timestamp(t.created_at)),
        updated_at: Some(timestamp(t.updated_at)),
        finished_at: t.finished_at.map(timestamp),
        last_error: t.last_error.clone().unwrap_or_default(),
        lease,
        labels: t.labels.clone(),
        lease_count: t.lease_count,
        cancel_outcome: t
            .cancel_outcome
            .map(|o| cancel_outcome(o) as i32)
            .unwrap_or_default(),
        pool: t.pool.clone().unwrap_or_default(),
        account_id: t.account_id.clone().unwrap_or_default(),
    })
}

/// A recorded attempt on the wire.
pub fn attempt(a: &AttemptRecord) -> pb::Attempt {
    pb::Attempt {
        task_id: a.task_id.to_string(),
        attempt: a.attempt,
        executor_id: a.executor_id.clone(),
        outcome: outcome(a.outcome) as i32,
        error: a.error.clone().unwrap_or_default(),
        provider_message_id: a.provider_message_id.clone().unwrap_or_default(),
        leased_at: Some(timestamp(a.leased_at)),
        finished_at: Some(timestamp(a.finished_at)),
        retry_after: a.retry_after_ms.map(duration_from_ms),
        account: a.account.clone().unwrap_or_default(),
    }
}

/// A granted lease on the wire.
pub fn lease(l: &GrantedLease) -> Result<pb::Lease, StoreError> {
    Ok(pb::Lease {
        task_id: l.task_id.to_string(),
        attempt: l.attempt,
        queue: l.queue.clone(),
        recipient: l.recipient.clone(),
        content: Some(content(&l.content)?),
        idempotency_key: l.idempotency_key.clone(),
        run_at: Some(timestamp(l.run_at)),
        leased_at: Some(timestamp(l.leased_at)),
        expires_at: Some(timestamp(l.expires_at)),
        attempts_before: l.attempts_before,
        max_attempts: l.max_attempts,
        labels: l.labels.clone(),
        account_id: l.account_id.clone().unwrap_or_default(),
        credentials_ref: l.credentials_ref.clone().unwrap_or_default(),
        traceparent: l.trace_parent.clone().unwrap_or_default(),
    })
}
