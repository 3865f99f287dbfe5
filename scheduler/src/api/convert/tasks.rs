//! A task on the wire: the spec in, the Task, its attempts and the Lease an executor receives
//! out. A task field crosses the wire here.

use herald_proto::v1 as pb;
use prost::Message;
use sha2::{Digest, Sha256};

use super::{duration_from_ms, duration_ms, from_timestamp, timestamp};
use crate::error::{Error, Violations};
use crate::store::StoreError;
use crate::tasks::bulk;
use crate::tasks::model::{
    AttemptRecord, CancelOutcome, EndReason, GrantedLease, Outcome, RetryPolicy, TaskRecord,
    TaskSpec, TaskState, When,
};

/// A wire spec as a domain spec; wire problems are recorded relative to the spec (`run_at`),
/// for the caller to put its path in front ([`Violations::under`]). The request hash, which idempotency keys are checked against, is the digest of
/// the spec's encoding (maps are BTreeMaps, so equal requests encode to equal bytes); only keyed
/// specs get one.
pub fn task_spec(spec: pb::TaskSpec, v: &mut Violations) -> TaskSpec {
    // Only a keyed request is ever compared; hashing every spec cost S2 a fifth of its rate.
    let request_hash = if spec.idempotency_key.is_empty() {
        Vec::new()
    } else {
        Sha256::digest(spec.encode_to_vec()).to_vec()
    };
    let when = match &spec.when {
        None => None,
        Some(pb::task_spec::When::RunAt(ts)) => match from_timestamp(ts) {
            Some(at) => Some(When::At(at)),
            None => {
                v.add("run_at", "is not a valid timestamp");
                None
            }
        },
        // A malformed duration is refused by the domain as a negative one.
        Some(pb::task_spec::When::Delay(d)) => Some(When::After(duration_ms(d).unwrap_or(-1))),
    };
    let when = match (spec.local_time.is_empty(), when) {
        (true, when) => when,
        (false, _) if spec.when.is_some() => {
            v.add("local_time", "cannot be combined with run_at or delay");
            None
        }
        (false, _) => Some(When::Local {
            time: spec.local_time,
            zone: spec.local_time_zone,
        }),
    };
    let expire_at = spec.expire_at.as_ref().and_then(|ts| {
        let at = from_timestamp(ts);
        if at.is_none() {
            v.add("expire_at", "is not a valid timestamp");
        }
        at
    });
    // herald's own labels say which schedule or campaign made a task: a client's task may not
    // claim one (the domain's checks cannot refuse them, since its own tasks carry them).
    if spec.labels.keys().any(|k| k.starts_with("herald.")) {
        v.add("labels", "keys starting with herald. are reserved");
    }
    TaskSpec {
        queue: spec.queue,
        recipient: spec.recipient,
        content: spec.content,
        when,
        priority: spec.priority,
        max_attempts: spec.max_attempts,
        idempotency_key: spec.idempotency_key,
        request_hash,
        retry: spec.retry_policy.as_ref().and_then(RetryPolicy::from_wire),
        expire_at,
        labels: spec.labels,
        pool: spec.pool,
        account_id: spec.account_id,
        send_window: spec.send_window,
        // A malformed duration is refused by the domain's range check.
        duplicate_window_ms: spec
            .duplicate_window
            .as_ref()
            .map(|d| duration_ms(d).unwrap_or(-1)),
        window_closed_fallback: spec.window_closed_fallback,
    }
}

/// A StartBulkOperation request as the domain's; wire problems name their field.
pub fn bulk_request(req: pb::StartBulkOperationRequest) -> Result<bulk::Request, Error> {
    let mut v = Violations::default();
    let action = match pb::BulkAction::try_from(req.action) {
        Ok(pb::BulkAction::Cancel) => Some(bulk::Action::Cancel),
        Ok(pb::BulkAction::Retry) => Some(bulk::Action::Retry),
        Ok(pb::BulkAction::Reschedule) => Some(bulk::Action::Reschedule),
        _ => {
            v.add("action", "is required: CANCEL, RETRY or RESCHEDULE");
            None
        }
    };
    let Some(filter) = req.filter else {
        v.add("filter", "is required");
        return Err(v.into_error());
    };
    let target = match req.reschedule {
        None => None,
        Some(pb::start_bulk_operation_request::Reschedule::RunAt(ts)) => {
            match from_timestamp(&ts) {
                Some(at) => Some(bulk::Move::To(at)),
                None => {
                    v.add("run_at", "is not a valid timestamp");
                    None
                }
            }
        }
        Some(pb::start_bulk_operation_request::Reschedule::Shift(d)) => {
            // Both parts carry the sign (google.protobuf.Duration).
            let signed = d.seconds == 0 || d.nanos == 0 || (d.seconds > 0) == (d.nanos > 0);
            let ms = d
                .seconds
                .checked_mul(1000)
                .and_then(|ms| ms.checked_add(i64::from(d.nanos / 1_000_000)));
            match ms {
                // unsigned_abs: i32::MIN has no positive twin, and abs() wraps it back to itself.
                Some(ms) if signed && d.nanos.unsigned_abs() < 1_000_000_000 => {
                    Some(bulk::Move::By(ms))
                }
                _ => {
                    v.add("shift", "is not a valid duration");
                    None
                }
            }
        }
    };
    let action = v.into_result(action)?;
    Ok(bulk::Request {
        action: action.unwrap_or(bulk::Action::Cancel),
        filter,
        target,
        dry_run: req.dry_run,
    })
}

/// A bulk operation with its progress on the wire.
pub fn bulk_operation(op: &bulk::OperationRecord) -> Result<pb::BulkOperation, StoreError> {
    let action = match bulk::Action::parse(&op.action) {
        Some(bulk::Action::Cancel) => pb::BulkAction::Cancel,
        Some(bulk::Action::Retry) => pb::BulkAction::Retry,
        Some(bulk::Action::Reschedule) => pb::BulkAction::Reschedule,
        None => pb::BulkAction::Unspecified,
    };
    let reschedule = match (op.run_at, op.shift_ms) {
        (Some(at), _) => Some(pb::bulk_operation::Reschedule::RunAt(timestamp(at))),
        (None, Some(ms)) => Some(pb::bulk_operation::Reschedule::Shift(duration_from_ms(ms))),
        (None, None) => None,
    };
    Ok(pb::BulkOperation {
        id: op.id.to_string(),
        action: action as i32,
        filter: Some(op.decode_filter()?),
        state: if op.state == "done" {
            pb::BulkOperationState::Done
        } else {
            pb::BulkOperationState::Running
        } as i32,
        matched: op.matched,
        processed: op.processed,
        changed: op.changed,
        created_at: Some(timestamp(op.created_at)),
        updated_at: Some(timestamp(op.updated_at)),
        finished_at: op.finished_at.map(timestamp),
        reschedule,
    })
}

/// Domain state to wire state.
pub fn state(s: TaskState) -> pb::TaskState {
    s.to_wire()
}

/// Wire state to domain state; None for UNSPECIFIED or unknown numbers.
pub fn state_from_wire(value: i32) -> Option<TaskState> {
    TaskState::from_wire(value)
}

/// Domain end reason to wire.
pub fn end_reason(r: EndReason) -> pb::EndReason {
    r.to_wire()
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

/// Wire outcome to a reportable domain outcome; None for UNSPECIFIED, LEASE_EXPIRED (the
/// scheduler's own) and unknown numbers.
pub fn outcome_from_wire(value: i32) -> Option<Outcome> {
    Some(match pb::OutcomeClass::try_from(value).ok()? {
        pb::OutcomeClass::Ok => Outcome::Ok,
        pb::OutcomeClass::RateLimited => Outcome::RateLimited,
        pb::OutcomeClass::Transient => Outcome::Transient,
        pb::OutcomeClass::Permanent => Outcome::Permanent,
        pb::OutcomeClass::AccountUnavailable => Outcome::AccountUnavailable,
        pb::OutcomeClass::Unspecified | pb::OutcomeClass::LeaseExpired => return None,
    })
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
        send_window: t.send_window.as_ref().map(|w| w.to_wire()),
        // Read separately (api/tasks.rs): reports are their own aggregate.
        delivery: None,
        end_reason: t
            .end_reason
            .map(|r| end_reason(r) as i32)
            .unwrap_or_default(),
        end_code: t.end_code.unwrap_or_default(),
        campaign_id: t.campaign_id.map(|id| id.to_string()).unwrap_or_default(),
        schedule_id: t.schedule_id.clone().unwrap_or_default(),
        audience_id: t.audience_id.clone().unwrap_or_default(),
        window_closed_fallback: t
            .window_closed_fallback
            .as_deref()
            .map(fallback)
            .transpose()?,
        window_closed_fallback_at: t.window_closed_fallback_at.map(timestamp),
        // Read separately, as `delivery` is.
        replaced_delivery: None,
    })
}

/// Decodes a stored window-closed fallback (content holding a template) to its template.
fn fallback(bytes: &[u8]) -> Result<pb::TemplateContent, StoreError> {
    crate::tasks::model::fallback_template(bytes).ok_or_else(|| {
        StoreError::Corrupt("task window_closed_fallback is not a template content".into())
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
        window_closed_fallback: a.window_closed_fallback,
    }
}

/// A granted lease on the wire: the task as the executor receives it. Takes the lease, since
/// it is sent once: its strings and labels move onto the wire instead of being copied.
///
/// Stored content (or fallback) that cannot be read goes as no content, with the reading error
/// beside it for the log: the executor refuses such a lease at once (PERMANENT, "lease carries
/// no content"), which ends the task FAILED. Dropped instead, the lease lapsed unheard, cost an
/// attempt at every lease until the task ran out of them, and kept one of the session's
/// credits each time.
pub fn lease(l: GrantedLease) -> (pb::Lease, Option<StoreError>) {
    let read = content(&l.content).and_then(|c| {
        let fallback = l
            .window_closed_fallback
            .as_deref()
            .map(fallback)
            .transpose()?;
        Ok((c, fallback))
    });
    let (content, window_closed_fallback, unread) = match read {
        Ok((c, f)) => (Some(Box::new(c)), f.map(Box::new), None),
        Err(e) => (None, None, Some(e)),
    };
    let lease = pb::Lease {
        task_id: l.task_id.to_string(),
        attempt: l.attempt,
        queue: l.queue,
        recipient: l.recipient,
        content,
        idempotency_key: l.idempotency_key,
        run_at: Some(timestamp(l.run_at)),
        leased_at: Some(timestamp(l.leased_at)),
        expires_at: Some(timestamp(l.expires_at)),
        attempts_before: l.attempts_before,
        max_attempts: l.max_attempts,
        labels: l.labels,
        account_id: l.account_id.unwrap_or_default(),
        credentials_ref: l.credentials_ref.unwrap_or_default(),
        traceparent: l.trace_parent.unwrap_or_default(),
        send_after: (!l.send_after.is_zero()).then(|| super::duration(l.send_after)),
        window_closed_fallback,
    };
    (lease, unread)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_request_hashes_equal_and_different_requests_differ() {
        let mut a = pb::TaskSpec {
            queue: "default".into(),
            recipient: "+15550001".into(),
            idempotency_key: "k1".into(),
            ..Default::default()
        };
        a.labels.insert("b".into(), "2".into());
        a.labels.insert("a".into(), "1".into());
        let mut b = a.clone();
        let hash = |s: &pb::TaskSpec| task_spec(s.clone(), &mut Violations::default()).request_hash;
        assert_eq!(hash(&a), hash(&b));
        b.recipient = "+15550002".into();
        assert_ne!(hash(&a), hash(&b));
    }

    #[test]
    fn malformed_wire_values_name_their_field() {
        let spec = pb::TaskSpec {
            when: Some(pb::task_spec::When::RunAt(prost_types::Timestamp {
                seconds: 0,
                nanos: -1,
            })),
            expire_at: Some(prost_types::Timestamp {
                seconds: i64::MAX,
                nanos: 0,
            }),
            ..Default::default()
        };
        let mut v = Violations::default();
        v.under(|| "task".into(), |v| task_spec(spec, v));
        assert_eq!(v.into_fields(), vec!["task.run_at", "task.expire_at"]);
    }

    #[test]
    fn retry_defaults_fill_what_the_wire_left_unset() {
        let p = pb::RetryPolicy {
            strategy: Some(pb::retry_policy::Strategy::Exponential(
                pb::ExponentialBackoff::default(),
            )),
        };
        assert_eq!(
            RetryPolicy::from_wire(&p),
            Some(RetryPolicy::default_exponential())
        );
    }
}
