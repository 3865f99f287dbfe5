//! Applying a batch of executor reports: task transitions, attempt rows, recipient blocks, the
//! account feedback (slots freed, adaptive rate, offline spells) and the wake-ups for every
//! replica, all in one transaction. Either the whole batch is recorded or none of it is, so a
//! failure part way (a lost connection, a crash) cannot leave a task moved with its account slot
//! still held: the executor's re-sent report is then applied as if it were the first.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::LeaseRef;
use crate::accounts::feedback::Feedback;
use crate::store::deliveries::AwaitedSend;
use crate::store::leases::{announce_cancel_resolved, Applied};
use crate::store::tasks::{announce_due, announce_due_now};
use crate::store::transaction;
use crate::store::{Db, Store, StoreError};
use crate::tasks::model::{Outcome, TaskState};

/// How long a recipient-scoped RATE_LIMITED without a retry-after keeps that recipient alone.
const DEFAULT_RECIPIENT_BLOCK_MS: i64 = 6_000;

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
    /// The provider's error code, when the executor reported one.
    pub error_code: Option<i64>,
    /// The content was refused with 131047 and the window-closed fallback went instead; the
    /// outcome is the fallback's (with OK, the error and code describe the refusal).
    pub window_closed_fallback: bool,
    /// With TRANSIENT: the answer was lost after the request went, so the provider may have
    /// accepted the message; where a status callback can tell, the task waits for one.
    pub outcome_unknown: bool,
}

/// One entry of a report batch: the lease it is about, and the report when it is one that can
/// be applied (Err: why it cannot be read, such as an outcome a report may not carry or a task
/// id that does not parse; it is refused and answered with its task's state and that reason).
#[derive(Debug, Clone)]
pub struct ReportEntry {
    /// The lease, as the executor named it.
    pub lease: LeaseRef,
    /// The report to apply, or why it cannot be read.
    pub report: Result<AttemptReport, &'static str>,
}

/// The answer to one report, in the batch's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Whether the report was applied.
    pub accepted: bool,
    /// The task's state afterwards; None when no task of that id exists in the namespace.
    pub state: Option<TaskState>,
    /// Why it was not applied; None when it was.
    pub refusal: Option<Refusal>,
}

/// Why a report was refused, said back to the executor so its log tells a bug in what it sent
/// from a lease it simply lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The report cannot be read (the text says what is wrong with it).
    Unreadable(&'static str),
    /// The same lease was reported earlier in the batch; the first report counts.
    Repeated,
    /// The lease is not the task's current one: it lapsed, was revoked or released, or its
    /// result was recorded before.
    NotCurrent,
    /// The namespace has no task of that id.
    UnknownTask,
}

impl Refusal {
    /// The reason as the executor's log shows it.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::Unreadable(why) => why,
            Refusal::Repeated => "repeats a result earlier in the same batch",
            Refusal::NotCurrent => {
                "the lease is not the task's current one: it lapsed, was revoked or released, \
                 or its result was recorded before"
            }
            Refusal::UnknownTask => "no task of this id in the executor's namespace",
        }
    }
}

/// What a batch did, for the caller's metrics and events.
#[derive(Debug, Default)]
pub struct BatchOutcome {
    /// One verdict per report, in the batch's order.
    pub verdicts: Vec<Verdict>,
    /// Tasks whose report ended them, with their final state and attempt.
    pub finished: Vec<(TaskState, i32)>,
}

/// Applies a batch of reports for `namespace` in one transaction and answers each, in order.
/// A report is applied only while its fencing token names the task's current lease, and at
/// most once per batch; a refused report is answered with the task's current state, or none
/// when the namespace has no such task.
/// `unknown_outcome_grace` is how long a send whose answer was lost waits for a status
/// callback before it is due again.
pub async fn apply(
    store: &Store,
    namespace: &str,
    batch: &[ReportEntry],
    unknown_outcome_grace: std::time::Duration,
) -> Result<BatchOutcome, StoreError> {
    // One outcome per fencing token: a repeat within a batch is refused as a repeat in a later
    // batch is. Applied together, one statement picked either outcome for the task, recorded
    // the other as the attempt and freed the account slot twice (found by fuzzing, #10).
    let mut tokens = HashSet::with_capacity(batch.len());
    let applicable: Vec<Option<&AttemptReport>> = batch
        .iter()
        .map(|e| {
            e.report
                .as_ref()
                .ok()
                .filter(|r| tokens.insert((r.task_id, r.attempt)))
        })
        .collect();
    let reports: Vec<&AttemptReport> = applicable.iter().flatten().copied().collect();
    // Idempotent: every write is fenced by the lease token, so a second run after a commit
    // that did happen matches no lease and answers each report refused, with the task's state.
    let (applied, current) = transaction!(store, StoreError, idempotent = true, |tx| {
        // Before the tasks move: a webhook reporting on one of these messages waits, or is
        // waited for, so neither misses the other (see lock_messages.sql).
        let sent: Vec<&str> = reports
            .iter()
            .filter(|r| r.outcome == Outcome::Ok)
            .filter_map(|r| r.provider_message_id.as_deref())
            .collect();
        tx.deliveries().lock_messages(namespace, &sent).await?;
        // Then the tasks whose send may have gone out unheard, as a callback naming them does.
        let unknown: Vec<Uuid> = reports
            .iter()
            .filter(|r| r.outcome_unknown && r.outcome == Outcome::Transient)
            .map(|r| r.task_id)
            .collect();
        tx.deliveries().lock_tasks(namespace, &unknown).await?;
        let mut applied = if reports.is_empty() {
            Vec::new()
        } else {
            tx.leases().complete(namespace, &reports).await?
        };
        await_callbacks(tx, namespace, &mut applied, &reports, unknown_outcome_grace).await?;
        // The account feedback is the live leases' alone: a lease the sweeper took back had
        // its slot freed then.
        let (feedback, blocks) = feedback_of(&applied, &reports);
        // An OK refused above may be on a lease that lapsed while the executor could not
        // report: if nothing leased the task since, it was sent, and is settled as such.
        let mut applied_tokens: HashSet<(Uuid, i32)> =
            applied.iter().map(|a| (a.task_id, a.attempt)).collect();
        let late: Vec<&AttemptReport> = reports
            .iter()
            .filter(|r| {
                r.outcome == Outcome::Ok && !applied_tokens.contains(&(r.task_id, r.attempt))
            })
            .copied()
            .collect();
        // The lapsed lease's task may have ended and moved into the history meanwhile (its
        // last attempt, exhausted by the sweeper): back first, or the OK is refused and a
        // later retry sends the message again.
        if !late.is_empty() {
            let ids: Vec<Uuid> = late.iter().map(|r| r.task_id).collect();
            tx.history().restore(&ids).await?;
        }
        let settled = tx.leases().settle_late(namespace, &late).await?;
        applied_tokens.extend(settled.iter().map(|a| (a.task_id, a.attempt)));
        applied.extend(settled);
        crate::callbacks::on_accepted(tx, namespace, &accepted(&applied, &reports)).await?;
        let freed = tx.accounts().apply_feedback(namespace, &feedback).await?;
        list_undeliverable(tx, namespace, &applied, &reports).await?;
        // After the account rows, as a claim's grant locks them: account, then the recipient
        // marks. The other way round, a claim marking the same pair deadlocked with this batch.
        tx.leases().block_recipients(&blocks).await?;
        announce(tx, &applied, freed).await?;
        let refused: Vec<Uuid> = batch
            .iter()
            .zip(&applicable)
            .filter(|(_, a)| !a.is_some_and(|a| applied_tokens.contains(&(a.task_id, a.attempt))))
            .filter_map(|(e, _)| e.lease.task_id())
            .collect();
        let current = tx.leases().states(namespace, &refused).await?;
        Ok::<_, StoreError>((applied, current))
    })?;
    Ok(verdicts(batch, &applicable, &applied, &current))
}

/// Sends of unknown outcome that were rescheduled wait for a status callback before they are
/// sent again; those a callback named already end SUCCEEDED, and a failure it reported is
/// settled as a late failure (`DeliveryRepo::await_callbacks`). `applied` is brought up to
/// date with what that changed.
async fn await_callbacks(
    db: &impl Db,
    namespace: &str,
    applied: &mut [Applied],
    reports: &[&AttemptReport],
    grace: std::time::Duration,
) -> Result<(), StoreError> {
    let unknown: HashSet<(Uuid, i32)> = reports
        .iter()
        .filter(|r| r.outcome_unknown && r.outcome == Outcome::Transient)
        .map(|r| (r.task_id, r.attempt))
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    // Rescheduled, or ended by this report (its last attempt, or past its expiry): a callback
    // that came first still proves the send went out.
    let decided: Vec<Uuid> = applied
        .iter()
        .filter(|a| {
            matches!(
                a.state,
                TaskState::Scheduled | TaskState::Failed | TaskState::Expired
            ) && unknown.contains(&(a.task_id, a.attempt))
        })
        .map(|a| a.task_id)
        .collect();
    let changed: HashMap<Uuid, AwaitedSend> = db
        .deliveries()
        .await_callbacks(namespace, &decided, grace)
        .await?
        .into_iter()
        .map(|c| (c.task_id, c))
        .collect();
    for a in applied.iter_mut() {
        if let Some(c) = changed.get(&a.task_id) {
            a.state = c.state;
            a.run_at = c.run_at;
        }
    }
    let failed: Vec<Uuid> = changed
        .values()
        .filter(|c| c.failed)
        .map(|c| c.task_id)
        .collect();
    if !failed.is_empty() {
        crate::callbacks::settle_failures(db, namespace, &failed).await?;
    }
    Ok(())
}

/// Lists the recipients a provider says cannot receive messages at all (a PERMANENT that
/// ended the task INVALID_RECIPIENT: WhatsApp 131026, as Meta advises, or WeCom 81013) on the
/// suppression list, reason INVALID_RECIPIENT, so later tasks to them end suppressed instead of
/// being sent and refused again; an operator removes the entry when they can receive again.
async fn list_undeliverable(
    db: &impl Db,
    namespace: &str,
    applied: &[Applied],
    reports: &[&AttemptReport],
) -> Result<(), StoreError> {
    let refused: HashSet<(Uuid, i32)> = reports
        .iter()
        .filter(|r| r.outcome == Outcome::Permanent)
        .map(|r| (r.task_id, r.attempt))
        .collect();
    if refused.is_empty() {
        return Ok(());
    }
    let tasks: Vec<Uuid> = applied
        .iter()
        .filter(|a| a.state == TaskState::Failed && refused.contains(&(a.task_id, a.attempt)))
        .map(|a| a.task_id)
        .collect();
    for recipient in db
        .suppressions()
        .list_undeliverable(namespace, &tasks, false)
        .await?
    {
        tracing::info!(%recipient, "the provider cannot deliver to the recipient; suppressed");
    }
    Ok(())
}

/// Each report's answer, in the batch's order.
fn verdicts(
    batch: &[ReportEntry],
    applicable: &[Option<&AttemptReport>],
    applied: &[Applied],
    current: &HashMap<Uuid, TaskState>,
) -> BatchOutcome {
    let by_token: HashMap<(Uuid, i32), TaskState> = applied
        .iter()
        .map(|a| ((a.task_id, a.attempt), a.state))
        .collect();
    let verdicts = batch
        .iter()
        .zip(applicable)
        .map(|(e, a)| {
            if let Some(state) = a.and_then(|a| by_token.get(&(a.task_id, a.attempt))) {
                return Verdict {
                    accepted: true,
                    state: Some(*state),
                    refusal: None,
                };
            }
            let state = e.lease.task_id().and_then(|id| current.get(&id).copied());
            let refusal = match (&e.report, a) {
                (Err(why), _) => Refusal::Unreadable(why),
                (Ok(_), None) => Refusal::Repeated,
                (Ok(_), Some(_)) if state.is_none() => Refusal::UnknownTask,
                (Ok(_), Some(_)) => Refusal::NotCurrent,
            };
            Verdict {
                accepted: false,
                state,
                refusal: Some(refusal),
            }
        })
        .collect();
    let finished = applied
        .iter()
        .filter(|a| a.state.is_terminal())
        .map(|a| (a.state, a.attempt))
        .collect();
    BatchOutcome { verdicts, finished }
}

/// The applied sends the provider accepted with a message id, for the delivery reports that
/// follow (or came first).
fn accepted(applied: &[Applied], reports: &[&AttemptReport]) -> Vec<(Uuid, String)> {
    let ids: HashMap<(Uuid, i32), &str> = reports
        .iter()
        .filter(|r| r.outcome == Outcome::Ok)
        .filter_map(|r| Some(((r.task_id, r.attempt), r.provider_message_id.as_deref()?)))
        .collect();
    applied
        .iter()
        .filter_map(|a| {
            let id = ids.get(&(a.task_id, a.attempt))?;
            Some((a.task_id, (*id).to_owned()))
        })
        .collect()
}

/// What the applied reports tell each account, and the recipients to leave alone.
fn feedback_of(applied: &[Applied], reports: &[&AttemptReport]) -> (Feedback, Vec<(Uuid, i64)>) {
    let by_token: HashMap<(Uuid, i32), &AttemptReport> = reports
        .iter()
        .map(|r| ((r.task_id, r.attempt), *r))
        .collect();
    let mut feedback = Feedback::default();
    let mut blocks = Vec::new();
    for a in applied {
        let (Some(account), Some(report)) = (&a.account_id, by_token.get(&(a.task_id, a.attempt)))
        else {
            continue;
        };
        let f = feedback.account(account);
        // A task cancelled while leased gave its slot back when it was cancelled.
        if !a.was_cancelled {
            f.released += 1;
        }
        match report.outcome {
            Outcome::Ok => f.ok += 1,
            Outcome::RateLimited if report.recipient_scoped => blocks.push((
                a.task_id,
                report.retry_after_ms.unwrap_or(DEFAULT_RECIPIENT_BLOCK_MS),
            )),
            Outcome::RateLimited => {
                f.rate_limited += 1;
                f.retry_after_ms = f.retry_after_ms.max(report.retry_after_ms.unwrap_or(0));
            }
            Outcome::AccountUnavailable => {
                f.unavailable += 1;
                // Nothing was sent; a lease from before the account's midnight was counted on
                // the day before, which is over.
                if a.counted_today.unwrap_or(true) {
                    f.refund += 1;
                }
                f.reason.clone_from(&report.error);
            }
            Outcome::Transient | Outcome::Permanent => f.failed += 1,
            _ => {}
        }
    }
    (feedback, blocks)
}

/// Wakes dispatchers on every replica for retries (or at once when an account at its in-flight
/// limit got room back), and CancelTask callers waiting on a cancelled task's outcome.
async fn announce(
    db: &impl Db,
    applied: &[Applied],
    capacity_freed: bool,
) -> Result<(), StoreError> {
    if capacity_freed {
        announce_due_now(db).await?;
    } else if let Some(at) = applied
        .iter()
        .filter(|a| a.state == TaskState::Scheduled)
        .map(|a| a.run_at)
        .min()
    {
        announce_due(db, at).await?;
    }
    for a in applied.iter().filter(|a| a.state == TaskState::Cancelled) {
        announce_cancel_resolved(db, a.task_id).await?;
    }
    Ok(())
}
