//! Bulk operations: cancel, retry or reschedule every task a filter selects.
//!
//! Starting one counts the selection (a dry run stops there) and records a durable operation
//! row; the work is done by [`run`], a background job on every replica. Each step is one
//! bounded transaction: lock the oldest unfinished operation (`FOR UPDATE SKIP LOCKED`, so
//! replicas share operations without coordination), lock its next batch of tasks in id order
//! after its cursor, change them through the same statements the single-task calls use
//! (cancel revokes leased tasks exactly as CancelTask does), and advance the cursor and counts
//! — all committed together. A replica killed mid-batch rolls that batch back and drops its
//! lock; any replica then resumes after the last committed batch. An operation is done when a
//! batch finds nothing more.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use herald_proto::v1 as pb;
use prost::Message;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::model::{TaskState, MAX_AHEAD, MAX_PAST};
use super::selection::Selection;
use super::Tasks;
use crate::error::{Error, Violations};
use crate::store::bulk::NewOperation;
use crate::store::tasks::CancelResult;
use crate::store::transaction;
use crate::store::{Db, StoreError};

/// What a bulk operation does to each task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Cancel (SCHEDULED and LEASED tasks).
    Cancel,
    /// Re-drive (FAILED tasks).
    Retry,
    /// Move the due time (SCHEDULED tasks).
    Reschedule,
}

impl Action {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Cancel => "cancel",
            Action::Retry => "retry",
            Action::Reschedule => "reschedule",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "cancel" => Action::Cancel,
            "retry" => Action::Retry,
            "reschedule" => Action::Reschedule,
            _ => return None,
        })
    }

    /// The states the action applies to.
    pub fn states(self) -> &'static [TaskState] {
        match self {
            Action::Cancel => &[TaskState::Scheduled, TaskState::Leased],
            Action::Retry => &[TaskState::Failed],
            Action::Reschedule => &[TaskState::Scheduled],
        }
    }
}

/// Where a reschedule moves tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// To this due time.
    To(DateTime<Utc>),
    /// By this many milliseconds (negative: earlier).
    By(i64),
}

/// A bulk operation as asked for.
#[derive(Debug, Clone)]
pub struct Request {
    /// What to do.
    pub action: Action,
    /// The wire filter (stored as given, states narrowed).
    pub filter: pb::TaskFilter,
    /// For a reschedule, where to.
    pub target: Option<Move>,
    /// Only count.
    pub dry_run: bool,
}

/// An operation as stored.
#[derive(Debug, Clone)]
pub struct OperationRecord {
    /// Id.
    pub id: Uuid,
    /// Stored action name.
    pub action: String,
    /// Encoded `herald.v1.TaskFilter`.
    pub filter: Vec<u8>,
    /// Reschedule target.
    pub run_at: Option<DateTime<Utc>>,
    /// Reschedule shift.
    pub shift_ms: Option<i64>,
    /// 'running' | 'done'.
    pub state: String,
    /// Selected at the start.
    pub matched: i64,
    /// Visited.
    pub processed: i64,
    /// Changed.
    pub changed: i64,
    /// Last task id handled.
    pub cursor_id: Option<Uuid>,
    /// Started.
    pub created_at: DateTime<Utc>,
    /// Last batch.
    pub updated_at: DateTime<Utc>,
    /// Done at.
    pub finished_at: Option<DateTime<Utc>>,
}

impl OperationRecord {
    /// The stored filter.
    pub fn decode_filter(&self) -> Result<pb::TaskFilter, StoreError> {
        pb::TaskFilter::decode(self.filter.as_slice())
            .map_err(|e| StoreError::Corrupt(format!("bulk operation {} filter: {e}", self.id)))
    }
}

/// What starting an operation answered.
#[derive(Debug, Clone)]
pub struct Started {
    /// Tasks selected now.
    pub matched: i64,
    /// The operation; None for a dry run.
    pub operation: Option<OperationRecord>,
}

/// How the workers pace themselves.
#[derive(Debug, Clone, Copy)]
pub struct BulkSettings {
    /// Tasks per batch (one transaction).
    pub batch_size: i64,
    /// Pause between two batches, so a large operation leaves the database room for claims.
    pub pause: Duration,
}

/// How often an idle worker looks for operations started on another replica (or left
/// unfinished by a replica that died). Operations started here wake it at once.
const IDLE_PROBE: Duration = Duration::from_secs(2);

/// Checks a request into the selection it acts on (states narrowed to the action's).
fn check(req: &Request, now: DateTime<Utc>) -> Result<(Selection, pb::TaskFilter), Error> {
    let mut v = Violations::default();
    let mut selection = Selection::from_wire(&req.filter, "filter", &mut v);
    if !selection.is_narrow() && v.is_empty() {
        v.add(
            "filter",
            "must name a queue, campaign_id, schedule_id, account_id, audience_id or a time bound",
        );
    }
    let allowed = req.action.states();
    if let Some(bad) = selection.states.iter().find(|s| !allowed.contains(s)) {
        v.add(
            "filter.states",
            format!(
                "{} does not apply to {} tasks",
                req.action.as_str(),
                bad.as_str()
            ),
        );
    }
    if selection.states.is_empty() {
        selection.states = allowed.to_vec();
    }
    match (req.action, req.target) {
        (Action::Reschedule, None) => {
            v.add("run_at", "is required to reschedule: set run_at or shift")
        }
        (Action::Reschedule, Some(Move::To(at))) if at < now - MAX_PAST || at > now + MAX_AHEAD => {
            v.add(
                "run_at",
                "must be within 24 hours in the past and 366 days ahead",
            )
        }
        (Action::Reschedule, Some(Move::By(ms)))
            if ms.unsigned_abs() > MAX_AHEAD.num_milliseconds().unsigned_abs() =>
        {
            v.add("shift", "must be at most 366 days either way")
        }
        (Action::Reschedule, _) => {}
        (_, Some(_)) => v.add("run_at", "is only for BULK_ACTION_RESCHEDULE"),
        (_, None) => {}
    }
    let mut filter = req.filter.clone();
    filter.states = selection
        .states
        .iter()
        .map(|s| s.to_wire() as i32)
        .collect();
    v.into_result((selection, filter))
}

impl Tasks {
    /// Counts what a bulk operation selects and, unless it is a dry run, records it for the
    /// workers and wakes this replica's.
    pub async fn start_bulk(&self, namespace: &str, req: Request) -> Result<Started, Error> {
        let (selection, filter) = check(&req, self.clock().now())?;
        let conn = self.store().conn().await?;
        let matched = conn.bulk().count(namespace, &selection).await?;
        if req.dry_run {
            return Ok(Started {
                matched,
                operation: None,
            });
        }
        let encoded = filter.encode_to_vec();
        let op = conn
            .bulk()
            .insert(
                namespace,
                &NewOperation {
                    id: Uuid::now_v7(),
                    action: req.action.as_str(),
                    filter: &encoded,
                    run_at: match req.target {
                        Some(Move::To(at)) => Some(at),
                        _ => None,
                    },
                    shift_ms: match req.target {
                        Some(Move::By(ms)) => Some(ms),
                        _ => None,
                    },
                    matched,
                },
            )
            .await?;
        self.bulk_wake.notify_one();
        Ok(Started {
            matched,
            operation: Some(op),
        })
    }

    /// Reads a bulk operation.
    pub async fn bulk_operation(
        &self,
        namespace: &str,
        id: Uuid,
    ) -> Result<OperationRecord, Error> {
        self.store()
            .conn()
            .await?
            .bulk()
            .get(namespace, id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("bulk operation {id}")))
    }

    /// A page of bulk operations, newest first.
    pub async fn bulk_operations(
        &self,
        namespace: &str,
        before: Option<Uuid>,
        limit: i64,
    ) -> Result<Vec<OperationRecord>, Error> {
        Ok(self
            .store()
            .conn()
            .await?
            .bulk()
            .list(namespace, before, limit)
            .await?)
    }

    /// Applies one batch of the oldest unfinished operation no other replica holds; false when
    /// there was none.
    async fn bulk_step(&self, batch_size: i64) -> Result<bool, Error> {
        transaction!(self.store(), Error, |tx| {
            let Some((namespace, op)) = tx.bulk().take_running().await? else {
                return Ok(false);
            };
            let Some(action) = Action::parse(&op.action) else {
                return Err(StoreError::Corrupt(format!(
                    "bulk operation {} action {:?}",
                    op.id, op.action
                ))
                .into());
            };
            let mut v = Violations::default();
            let selection = Selection::from_wire(&op.decode_filter()?, "filter", &mut v);
            let ids = tx
                .bulk()
                .next_batch(&namespace, &selection, &op, batch_size)
                .await?;
            let mut changed: u64 = 0;
            match action {
                Action::Cancel => {
                    for id in &ids {
                        // CancelTask's own statement: the transition, the account slot and
                        // the revoke announced to the replica holding the executor.
                        if matches!(
                            tx.tasks().cancel(&namespace, *id).await?,
                            CancelResult::CancelledScheduled | CancelResult::CancelledLeased { .. }
                        ) {
                            changed += 1;
                        }
                    }
                }
                Action::Retry => {
                    // The batch's campaigns all at once, in order: retries taking them one by
                    // one in task order could each wait for the other's.
                    tx.tasks().hold_campaigns(&ids).await?;
                    for id in &ids {
                        if tx.tasks().retry(&namespace, *id, None).await? {
                            changed += 1;
                        }
                    }
                }
                Action::Reschedule => {
                    changed = tx
                        .tasks()
                        .reschedule(&namespace, &ids, op.run_at, op.shift_ms)
                        .await?;
                }
            }
            tx.bulk()
                .advance(
                    &namespace,
                    op.id,
                    ids.last().copied(),
                    ids.len() as i64,
                    changed as i64,
                    ids.is_empty(),
                )
                .await?;
            tracing::debug!(operation = %op.id, batch = ids.len(), changed, "bulk batch applied");
            Ok::<_, Error>(true)
        })
    }
}

/// The bulk worker of a replica: applies batches while there are unfinished operations
/// (pausing `settings.pause` between them), then waits for `wake` (an operation started here)
/// or [`IDLE_PROBE`] (one started elsewhere, or left by a replica that died).
pub async fn run(tasks: Tasks, settings: BulkSettings, stop: CancellationToken) {
    let wake: Arc<Notify> = tasks.bulk_wake.clone();
    loop {
        let idle = match tasks.bulk_step(settings.batch_size.max(1)).await {
            Ok(true) => None,
            Ok(false) => Some(IDLE_PROBE),
            Err(e) => {
                tracing::warn!(error = %e, "bulk operation batch failed; retrying");
                Some(IDLE_PROBE)
            }
        };
        let wait = idle.unwrap_or(settings.pause);
        if wait.is_zero() {
            if stop.is_cancelled() {
                return;
            }
            continue;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
            _ = wake.notified(), if idle.is_some() => {}
        }
    }
}
