//! Editing a task that is still SCHEDULED (UpdateTask): the fields an edit may change, how an
//! edit is merged onto the stored task and checked exactly as a create would check it, and
//! the one fenced statement that applies it.
//!
//! Why the edit cannot race a claim: the store's update says `WHERE state = 'scheduled'` and
//! the claim locks the rows it leases. An edit that reaches a row a claim holds waits for that
//! claim's commit, re-reads the row, finds it LEASED and changes nothing, and the caller gets
//! FAILED_PRECONDITION; an edit that commits first is what the claim then leases.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::model::{content_of, NewTask, TaskRecord, TaskSpec, TaskState, When};
use super::Tasks;
use crate::error::{Error, Violations};
use crate::store::transaction;
use crate::store::Db;

/// A field UpdateTask may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EditField {
    /// When it is due: `run_at`, `delay` or `local_time`.
    When,
    /// What is sent (rendered again from a stored template).
    Content,
    /// Its priority.
    Priority,
    /// Its attempt budget.
    MaxAttempts,
    /// How its retries are spaced.
    RetryPolicy,
    /// Its deadline.
    ExpireAt,
    /// The caller's labels (herald's own `herald.` labels stay as they are).
    Labels,
}

impl EditField {
    /// The field an update-mask path names; None for a path that cannot be edited.
    pub fn from_path(path: &str) -> Option<Self> {
        Some(match path {
            "run_at" | "delay" | "local_time" | "local_time_zone" => EditField::When,
            "content" => EditField::Content,
            "priority" => EditField::Priority,
            "max_attempts" => EditField::MaxAttempts,
            "retry_policy" => EditField::RetryPolicy,
            "expire_at" => EditField::ExpireAt,
            "labels" => EditField::Labels,
            _ => return None,
        })
    }
}

/// An edit: the fields it changes, with their new values in `patch`.
#[derive(Debug, Clone)]
pub struct Edit {
    /// The fields to change.
    pub fields: Vec<EditField>,
    /// The new values (other fields are ignored).
    pub patch: TaskSpec,
}

/// The stored task as a spec (due no earlier than `now`, so an overdue task's old due time
/// does not trip the bounds of a create), with `edit` applied.
fn merged(record: &TaskRecord, edit: Edit, now: DateTime<Utc>) -> TaskSpec {
    let mut spec = TaskSpec {
        queue: record.queue.clone(),
        recipient: record.recipient.clone(),
        content: content_of(&record.content),
        when: Some(When::At(record.run_at.max(now))),
        priority: Some(i32::from(record.priority)),
        max_attempts: Some(record.max_attempts),
        retry: Some(record.retry.clone()),
        expire_at: record.expire_at,
        labels: record.labels.clone(),
        // Not editable, but the content is checked against what every account of the target
        // can send, as a create's is: without it, a location edited into a task pinned to a
        // WeCom account was stored and failed at its send. A pool wins over account_id, which
        // on a pooled task names the account of its last lease.
        pool: record.pool.clone().unwrap_or_default(),
        account_id: match record.pool {
            Some(_) => String::new(),
            None => record.account_id.clone().unwrap_or_default(),
        },
        // The send window is not editable and was checked when created.
        ..Default::default()
    };
    let patch = edit.patch;
    for field in edit.fields {
        match field {
            EditField::When => spec.when.clone_from(&patch.when),
            EditField::Content => spec.content.clone_from(&patch.content),
            EditField::Priority => spec.priority = patch.priority,
            EditField::MaxAttempts => spec.max_attempts = patch.max_attempts,
            EditField::RetryPolicy => spec.retry.clone_from(&patch.retry),
            EditField::ExpireAt => spec.expire_at = patch.expire_at,
            EditField::Labels => {
                // herald's own labels (schedule, campaign, fire time) say where the task came
                // from; the caller replaces only its own.
                spec.labels.retain(|k, _| k.starts_with("herald."));
                spec.labels
                    .extend(patch.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
    }
    spec
}

/// The checks an edit adds to a create's (herald's own labels are refused at the edge, for an
/// edit as for a create: `api::convert::tasks::task_spec`).
fn check_edit(edit: &Edit, v: &mut Violations) {
    if edit.fields.is_empty() {
        v.add("update_mask", "name at least one field to change");
    }
    // Left unset, the due time would be a create's default, now: a mask naming only
    // `local_time_zone`, or `run_at` without a value, sent a task due tomorrow at once.
    if edit.fields.contains(&EditField::When) && edit.patch.when.is_none() {
        v.add(
            "task.run_at",
            "the update mask names the due time but the task sets none: give run_at, delay, \
             or local_time with local_time_zone (a delay of 0 sends it now)",
        );
    }
}

impl Tasks {
    /// Edits a SCHEDULED task: the merged task is checked and rendered as a create would be,
    /// then written by one statement fenced on the SCHEDULED state. FAILED_PRECONDITION when
    /// the task is leased or has ended (also when a claim leased it while the edit was
    /// checked).
    pub async fn update(&self, namespace: &str, id: Uuid, edit: Edit) -> Result<TaskRecord, Error> {
        let mut v = Violations::default();
        check_edit(&edit, &mut v);
        v.into_result(())?;
        let when = edit.fields.contains(&EditField::When);
        let content = edit.fields.contains(&EditField::Content);
        let mut record = self.get(namespace, id).await?;
        for _ in 0..EDIT_TRIES {
            if record.state != TaskState::Scheduled {
                return Err(not_scheduled(id, record.state));
            }
            let now = self.clock().now();
            let spec = merged(&record, edit.clone(), now);
            let conn = self.store().conn().await?;
            let task: NewTask =
                super::prepare(&conn, namespace, vec![spec], &|_| "task".into(), now)
                    .await?
                    .pop()
                    .ok_or_else(|| {
                        Error::Unavailable("the edit was not prepared; retry it".into())
                    })?;
            drop(conn);
            let read_at = record.updated_at;
            let updated = transaction!(self.store(), Error, |tx| Ok::<_, Error>(
                tx.tasks()
                    .update(namespace, id, &task, when, content, read_at)
                    .await?
            ))?;
            if let Some(updated) = updated {
                return Ok(updated);
            }
            // Leased or ended meanwhile (refused above), or edited by another call: merged
            // again onto what that call wrote, so neither edit undoes the other.
            record = self.get(namespace, id).await?;
        }
        Err(Error::Aborted(format!(
            "task {id} kept changing while this edit was applied; read it and edit it again"
        )))
    }
}

/// How many times an edit is merged again onto a task another call changed meanwhile.
const EDIT_TRIES: usize = 3;

fn not_scheduled(id: Uuid, state: TaskState) -> Error {
    Error::FailedPrecondition(format!(
        "task {id} is {}; only SCHEDULED tasks can be edited",
        state.as_str()
    ))
}
