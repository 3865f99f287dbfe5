//! The task pages: search (recipient, id, state, queue, campaign, schedule, account, creation
//! time), one task with its content, attempts, delivery, trace id and what holds it; cancel and
//! retry as CancelTask and RetryTask do.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Extension;
use chrono::{DateTime, NaiveDateTime, Utc};
use serde_json::{json, Value};
use uuid::Uuid;

use super::why::{self, Pending};
use super::{
    csv, done, page_context, param, render, require_admin, when, when_opt, Console, PageError,
    Params,
};
use crate::auth::Caller;
use crate::http::dashboard::content_summary;
use crate::rules;
use crate::store::tasks::TaskFilter;
use crate::store::Db;
use crate::tasks::model::{CancelOutcome, EndReason, TaskRecord, TaskState};
use crate::tasks::selection::Selection;

/// Tasks per page.
const PAGE: i64 = 50;
/// Tasks per export query.
const EXPORT_PAGE: i64 = 1_000;

const STATES: &[&str] = &[
    "scheduled",
    "leased",
    "succeeded",
    "failed",
    "cancelled",
    "expired",
];

/// A `datetime-local` field (`2026-03-02T12:00`, seconds optional) read as UTC.
fn time_param(
    params: &HashMap<String, String>,
    name: &str,
) -> Result<Option<DateTime<Utc>>, PageError> {
    let Some(text) = param(params, name) else {
        return Ok(None);
    };
    ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(text, f).ok())
        .map(|t| Some(t.and_utc()))
        .ok_or_else(|| PageError::bad(name, "is not a date and time (YYYY-MM-DDTHH:MM, UTC)"))
}

fn uuid_param(params: &HashMap<String, String>, name: &str) -> Result<Option<Uuid>, PageError> {
    param(params, name)
        .map(|s| {
            s.parse::<Uuid>()
                .map_err(|_| PageError::bad(name, "is not an id (a UUID)"))
        })
        .transpose()
}

fn name_param(params: &HashMap<String, String>, name: &str) -> Result<Option<String>, PageError> {
    param(params, name)
        .map(|s| {
            rules::name(name, s)?;
            Ok(s.to_owned())
        })
        .transpose()
}

/// The search form's filter.
fn filter(params: &HashMap<String, String>, limit: i64) -> Result<TaskFilter, PageError> {
    let states = match param(params, "state") {
        None => Vec::new(),
        Some(s) => vec![TaskState::parse(s).ok_or_else(|| {
            PageError::bad("state", format!("must be one of {}", STATES.join(", ")))
        })?],
    };
    let end_reasons = match param(params, "reason") {
        None => Vec::new(),
        Some(s) => vec![EndReason::parse(s).ok_or_else(|| {
            PageError::bad(
                "reason",
                format!("must be one of {}", reason_names().join(", ")),
            )
        })?],
    };
    let recipient = param(params, "recipient").map(str::to_owned);
    if recipient.as_ref().is_some_and(|r| r.len() > 256) {
        return Err(PageError::bad("recipient", "must be at most 256 bytes"));
    }
    Ok(TaskFilter {
        selection: Selection {
            states,
            queue: name_param(params, "queue")?,
            created_after: time_param(params, "from")?,
            created_before: time_param(params, "to")?,
            recipient,
            id: uuid_param(params, "id")?,
            campaign_id: uuid_param(params, "campaign")?,
            schedule_id: name_param(params, "schedule")?,
            account_id: name_param(params, "account")?,
            audience_id: name_param(params, "audience")?,
            end_reasons,
            ..Default::default()
        },
        before_id: uuid_param(params, "page")?,
        limit,
    })
}

/// Every end reason's name, as the search form offers them.
fn reason_names() -> Vec<&'static str> {
    EndReason::ALL.iter().map(|r| r.as_str()).collect()
}

fn task_row(t: &TaskRecord) -> Value {
    json!({
        "id": t.id.to_string(),
        "state": t.state.as_str(),
        "reason": t.end_reason.map(EndReason::as_str),
        "queue": t.queue,
        "recipient": t.recipient,
        "account": t.account_id,
        "pool": t.pool,
        "attempts": t.attempts,
        "run_at": when(t.run_at),
        "created_at": when(t.created_at),
        "last_error": t.last_error,
    })
}

/// The search page.
pub(super) async fn search(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Query(params): Params,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    let f = filter(&params, PAGE + 1)?;
    let records = console.tasks.list(&caller.namespace, &f).await?;
    let (records, next) = crate::store::sql::page(records, PAGE, |last| last.id.to_string());
    // The same search, one page on: every parameter but the page token kept.
    let mut query: Vec<String> = params
        .iter()
        .filter(|(k, v)| !["page", "done", "done_tag", "ns"].contains(&k.as_str()) && !v.is_empty())
        .map(|(k, v)| format!("{k}={}", super::urlencode(v)))
        .collect();
    query.sort();
    let query = query.join("&");
    Ok(render(
        &headers,
        StatusCode::OK,
        "tasks.html",
        page_context(&caller, &params, "tasks"),
        json!({
            "q": params,
            "query": query,
            "states": STATES,
            "reasons": reason_names(),
            "tasks": records.iter().map(task_row).collect::<Vec<_>>(),
            "next": (!next.is_empty()).then_some(next),
        }),
    ))
}

const TASK_COLUMNS: &[&str] = &[
    "id",
    "state",
    "queue",
    "recipient",
    "pool",
    "account",
    "attempts",
    "run_at",
    "created_at",
    "finished_at",
    "end_reason",
    "end_code",
    "last_error",
];

/// The search's every match as CSV, streamed a page at a time.
pub(super) async fn export(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Query(params): Params,
) -> Result<Response, PageError> {
    let first = filter(&params, EXPORT_PAGE + 1)?;
    let ns = caller.namespace.clone();
    Ok(csv::stream(
        "tasks.csv",
        TASK_COLUMNS,
        first,
        move |f: TaskFilter| {
            let (console, ns) = (console.clone(), ns.clone());
            async move {
                let records = console.tasks.list(&ns, &f).await?;
                let (records, next) =
                    crate::store::sql::page(records, EXPORT_PAGE, |last| last.id.to_string());
                let rows = records
                    .iter()
                    .map(|t| {
                        vec![
                            t.id.to_string(),
                            t.state.as_str().to_owned(),
                            t.queue.clone(),
                            t.recipient.clone(),
                            t.pool.clone().unwrap_or_default(),
                            t.account_id.clone().unwrap_or_default(),
                            t.attempts.to_string(),
                            t.run_at.to_rfc3339(),
                            t.created_at.to_rfc3339(),
                            t.finished_at.map(|t| t.to_rfc3339()).unwrap_or_default(),
                            t.end_reason
                                .map(EndReason::as_str)
                                .unwrap_or_default()
                                .to_owned(),
                            t.end_code.map(|c| c.to_string()).unwrap_or_default(),
                            t.last_error.clone().unwrap_or_default(),
                        ]
                    })
                    .collect();
                let next = records
                    .last()
                    .filter(|_| !next.is_empty())
                    .map(|last| TaskFilter {
                        before_id: Some(last.id),
                        ..f.clone()
                    });
                Ok((rows, next))
            }
        },
    ))
}

fn task_id(id: &str) -> Result<Uuid, PageError> {
    id.parse()
        .map_err(|_| PageError::bad("id", "is not a task id (a UUID)"))
}

/// The trace id of a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`).
fn trace_id(trace_parent: Option<&str>) -> Option<String> {
    let parts: Vec<&str> = trace_parent?.split('-').collect();
    (parts.len() == 4 && parts[1].len() == 32).then(|| parts[1].to_owned())
}

/// What holds a scheduled task, read from its accounts.
async fn holds(console: &Console, ns: &str, t: &TaskRecord) -> Result<Vec<why::Hold>, PageError> {
    let db = console.store().conn().await?;
    let accounts = match (&t.account_id, &t.pool) {
        // A pooled task's account_id is the one of its last lease: the pool decides.
        // Every account of it: one with room among the later ones would hold nothing.
        (_, Some(pool)) => db.accounts().pool_members(ns, pool).await?,
        (Some(id), None) => db.accounts().get(ns, id).await?.into_iter().collect(),
        (None, None) => Vec::new(),
    };
    let serving = db
        .executors()
        .serving(ns, &t.queue, crate::lease::presence::FRESH)
        .await?;
    let recipient_blocked: Vec<String> = db
        .leases()
        .recipient_facts(ns, &[t.recipient.as_str()])
        .await?
        .blocked
        .into_iter()
        .filter(|(_, r)| *r == t.recipient)
        .map(|(account, _)| account)
        .collect();
    let pending = Pending {
        run_at: t.run_at,
        parked: t.parked,
        queue: &t.queue,
        pool: t.pool.as_deref(),
        account: if t.pool.is_some() {
            None
        } else {
            t.account_id.as_deref()
        },
        serving: &serving,
        recipient_blocked: &recipient_blocked,
    };
    Ok(why::holds(&pending, &accounts, console.tasks.clock().now()))
}

/// One task.
pub(super) async fn detail(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(params): Params,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    let ns = caller.namespace.as_str();
    let id = task_id(&id)?;
    let t = console.tasks.get(ns, id).await?;
    let attempts = console.tasks.attempts(ns, id).await?;
    let delivery = console.tasks.deliveries(ns, &[id]).await?.remove(&id);
    let holds = if t.state == TaskState::Scheduled {
        holds(&console, ns, &t).await?
    } else {
        Vec::new()
    };
    let labels: Vec<Value> = t
        .labels
        .iter()
        .map(|(k, v)| json!({ "key": k, "value": v }))
        .collect();
    Ok(render(
        &headers,
        StatusCode::OK,
        "task.html",
        page_context(&caller, &params, "tasks"),
        json!({
            "task": task_row(&t),
            "content": content_summary(&t.content),
            "labels": labels,
            "priority": t.priority,
            "max_attempts": t.max_attempts,
            "expire_at": when_opt(t.expire_at),
            "finished_at": when_opt(t.finished_at),
            "executor": t.executor_id,
            "campaign": t.campaign_id.map(|c| c.to_string()),
            "schedule": t.schedule_id,
            "trace_id": trace_id(t.trace_parent.as_deref()),
            "cancel_outcome": t.cancel_outcome.map(|c| format!("{c:?}")),
            "can_cancel": !t.state.is_terminal(),
            "can_retry": t.state == TaskState::Failed,
            "holds": holds.iter().map(|h| json!({ "kind": h.kind.name(), "detail": h.detail })).collect::<Vec<_>>(),
            "attempts": attempts.iter().map(|a| json!({
                "attempt": a.attempt,
                "executor": a.executor_id,
                "account": a.account,
                "outcome": a.outcome.name(),
                "error": a.error,
                "provider_message_id": a.provider_message_id,
                "retry_after_ms": a.retry_after_ms,
                "leased_at": when(a.leased_at),
                "finished_at": when(a.finished_at),
            })).collect::<Vec<_>>(),
            "delivery": delivery.map(|d| json!({
                "state": format!("{:?}", d.state),
                "provider_message_id": d.provider_message_id,
                "accepted_at": when_opt(d.accepted_at),
                "delivered_at": when_opt(d.delivered_at),
                "read_at": when_opt(d.read_at),
                "failed_at": when_opt(d.failed_at),
                "error_code": d.error_code,
                "error": d.error,
            })),
        }),
    ))
}

/// Cancels a task as CancelTask does (revoking it from its executor when leased).
pub(super) async fn cancel(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    require_admin(&caller)?;
    let id = task_id(&id)?;
    let (task, outcome) = console.tasks.cancel(&caller.namespace, id).await?;
    Ok(done(
        &caller,
        &format!("/console/tasks/{id}"),
        &format!(
            "task {id} is {}: {}",
            task.state.as_str(),
            outcome_text(outcome)
        ),
    ))
}

/// What a cancel's outcome means, for the page that confirms it (a Rust name such as
/// `NotStarted` told an operator little).
fn outcome_text(outcome: CancelOutcome) -> &'static str {
    match outcome {
        CancelOutcome::NotStarted => "it had not been sent",
        CancelOutcome::StoppedBeforeSend => "its executor stopped it before sending",
        CancelOutcome::AlreadySent => "too late, the provider had already accepted it",
        CancelOutcome::SendFailed => "its send had already failed",
        CancelOutcome::Unconfirmed => "its executor has not confirmed yet whether it was sent",
    }
}

/// Re-drives an ended task as RetryTask does.
pub(super) async fn retry(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    require_admin(&caller)?;
    let id = task_id(&id)?;
    let task = console.tasks.retry(&caller.namespace, id, None).await?;
    Ok(done(
        &caller,
        &format!("/console/tasks/{id}"),
        &format!("task {id} is {}", task.state.as_str()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_trace_id_of_a_traceparent() {
        assert_eq!(
            trace_id(Some(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            ))
            .as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        assert_eq!(trace_id(Some("garbage")), None);
        assert_eq!(trace_id(None), None);
    }

    #[test]
    fn a_bad_search_names_its_field() {
        let params = HashMap::from([("state".to_owned(), "pending".to_owned())]);
        let Err(e) = filter(&params, 10) else {
            panic!("accepted a bad state");
        };
        assert!(e.message.starts_with("state:"), "{}", e.message);
        let params = HashMap::from([("from".to_owned(), "yesterday".to_owned())]);
        assert!(filter(&params, 10).is_err());
    }
}
