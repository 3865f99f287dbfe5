//! The campaign pages: the list with progress and finish estimate; one campaign with its
//! failures grouped by how they failed; pause, resume, cancel; retry every failed task of one
//! reason, after a page that shows how many that is.

use std::collections::HashMap;

use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Extension;
use serde_json::{json, Value};
use uuid::Uuid;

use super::{
    csv, done, page_context, param, render, require_admin, when, when_opt, Console, PageError,
    Params,
};
use crate::auth::Caller;
use crate::campaigns::model::FailureReason;
use crate::campaigns::{CampaignState, CampaignView};
use crate::tasks::bulk;
use crate::tasks::model::EndReason;
use herald_proto::v1 as pb;

/// Campaigns per page (each reads its progress: one index-only GROUP BY).
const PAGE: i64 = 25;
/// Failure groups shown on a campaign's page.
const REASONS: i64 = 50;

fn state_name(s: CampaignState) -> &'static str {
    match s {
        CampaignState::Active => "active",
        CampaignState::Paused => "paused",
        CampaignState::Cancelled => "cancelled",
        CampaignState::Finished => "finished",
    }
}

/// A share of the total, for the progress bar.
fn pct(n: i64, total: i64) -> f64 {
    if total <= 0 {
        0.0
    } else {
        (n as f64 * 1000.0 / total as f64).round() / 10.0
    }
}

fn campaign_json(c: &CampaignView, sends: Option<&Vec<i64>>) -> Value {
    let p = &c.progress;
    let total = p.live + p.succeeded + p.failed + p.cancelled + p.expired;
    json!({
        "id": c.record.id.to_string(),
        "name": c.spec.name,
        "queue": c.spec.queue,
        "pool": c.record.pool,
        "state": state_name(c.state),
        "recipients": c.record.recipient_count,
        "adding_audience": c.record.audience.pending,
        "audience_error": c.record.audience.error,
        "queued": p.live,
        "sent": p.succeeded,
        "delivered": p.delivery.delivered,
        "read": p.delivery.read,
        "failed_after_acceptance": p.delivery.failed_after_acceptance,
        "failed": p.failed,
        "cancelled": p.cancelled,
        "expired": p.expired,
        "sent_pct": pct(p.succeeded, total),
        "failed_pct": pct(p.failed, total),
        "done_pct": pct(total - p.live, total),
        "eta": when_opt(c.estimated_finish),
        "created_at": when(c.record.created_at),
        "sparkline": sends.map(|s| sparkline(s)),
    })
}

/// A campaign's failed tasks counted by why they ended (codes folded together), largest
/// first; nothing to read when none failed.
async fn failed_by_reason(
    console: &Console,
    ns: &str,
    c: &CampaignView,
) -> Result<Value, PageError> {
    if c.progress.failed == 0 {
        return Ok(json!([]));
    }
    let groups = console
        .campaigns
        .failure_reasons(ns, c.record.id, REASONS)
        .await?;
    let mut by_reason: Vec<(&'static str, i64)> = Vec::new();
    for g in &groups {
        let name = reason_name(g.end_reason);
        match by_reason.iter_mut().find(|(n, _)| *n == name) {
            Some((_, tasks)) => *tasks += g.tasks,
            None => by_reason.push((name, g.tasks)),
        }
    }
    by_reason.sort_by_key(|(_, tasks)| std::cmp::Reverse(*tasks));
    Ok(json!(by_reason
        .iter()
        .map(|(reason, tasks)| json!({"reason": reason, "tasks": tasks}))
        .collect::<Vec<_>>()))
}

/// Sparkline buckets: the last hour in 5-minute steps.
const SPARK_INTERVALS: i32 = 12;
/// One sparkline step.
const SPARK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(300);

/// An inline SVG polyline's points and a text summary of sends per interval (`sends[0]` the
/// latest), oldest left, scaled to the busiest interval.
fn sparkline(sends: &[i64]) -> Value {
    let peak = sends.iter().copied().max().unwrap_or(0).max(1) as f64;
    let n = sends.len().max(2) - 1;
    let points: Vec<String> = sends
        .iter()
        .rev()
        .enumerate()
        .map(|(i, v)| {
            let x = i as f64 * 100.0 / n as f64;
            let y = 20.0 - (*v as f64 / peak) * 18.0 - 1.0;
            format!("{x:.1},{y:.1}")
        })
        .collect();
    json!({
        "points": points.join(" "),
        "total": sends.iter().sum::<i64>(),
        "peak": sends.iter().copied().max().unwrap_or(0),
        "latest": sends.first().copied().unwrap_or(0),
    })
}

/// Sends per interval of the campaigns on a page (one bounded, index-only query).
async fn sends_of(
    console: &Console,
    views: &[CampaignView],
) -> Result<HashMap<Uuid, Vec<i64>>, PageError> {
    let ids: Vec<Uuid> = views.iter().map(|c| c.record.id).collect();
    let mut sends = console
        .campaigns
        .sends_per_interval(&ids, SPARK_INTERVALS, SPARK_INTERVAL)
        .await?;
    for id in ids {
        sends
            .entry(id)
            .or_insert_with(|| vec![0; SPARK_INTERVALS as usize]);
    }
    Ok(sends)
}

fn campaign_id(id: &str) -> Result<Uuid, PageError> {
    id.parse()
        .map_err(|_| PageError::bad("id", "is not a campaign id (a UUID)"))
}

/// The campaign list, newest first.
pub(super) async fn list(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Query(params): Params,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    let before = param(&params, "page").map(campaign_id).transpose()?;
    let views = console
        .campaigns
        .list(&caller.namespace, &[], before, PAGE + 1)
        .await?;
    let (views, next) = crate::store::sql::page(views, PAGE, |last| last.record.id.to_string());
    let sends = sends_of(&console, &views).await?;
    let mut campaigns = Vec::with_capacity(views.len());
    for c in &views {
        let mut row = campaign_json(c, sends.get(&c.record.id));
        row["failed_by_reason"] = failed_by_reason(&console, &caller.namespace, c).await?;
        campaigns.push(row);
    }
    Ok(render(
        &headers,
        StatusCode::OK,
        "campaigns.html",
        page_context(&caller, &params, "campaigns"),
        json!({
            "campaigns": campaigns,
            "next": (!next.is_empty()).then_some(next),
        }),
    ))
}

const CAMPAIGN_COLUMNS: &[&str] = &[
    "id",
    "name",
    "state",
    "recipients",
    "queued",
    "sent",
    "delivered",
    "read",
    "failed",
    "cancelled",
    "expired",
    "estimated_finish",
    "created_at",
];

/// Every campaign as CSV, streamed a page at a time.
pub(super) async fn export(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
) -> Response {
    let ns = caller.namespace.clone();
    csv::stream(
        "campaigns.csv",
        CAMPAIGN_COLUMNS,
        None::<Uuid>,
        move |before: Option<Uuid>| {
            let (console, ns) = (console.clone(), ns.clone());
            async move {
                let views = console.campaigns.list(&ns, &[], before, PAGE + 1).await?;
                let (views, next) =
                    crate::store::sql::page(views, PAGE, |last| last.record.id.to_string());
                let rows = views
                    .iter()
                    .map(|c| {
                        let p = &c.progress;
                        vec![
                            c.record.id.to_string(),
                            c.spec.name.clone(),
                            state_name(c.state).to_owned(),
                            c.record.recipient_count.to_string(),
                            p.live.to_string(),
                            p.succeeded.to_string(),
                            p.delivery.delivered.to_string(),
                            p.delivery.read.to_string(),
                            p.failed.to_string(),
                            p.cancelled.to_string(),
                            p.expired.to_string(),
                            c.estimated_finish
                                .map(|t| t.to_rfc3339())
                                .unwrap_or_default(),
                            c.record.created_at.to_rfc3339(),
                        ]
                    })
                    .collect();
                let next = views
                    .last()
                    .filter(|_| !next.is_empty())
                    .map(|last| Some(last.record.id));
                Ok((rows, next))
            }
        },
    )
}

/// A reason's name in links and CSV: the end reason's name (`exhausted`, …), or `unknown` for
/// tasks that failed before reasons were recorded.
fn reason_name(r: Option<EndReason>) -> &'static str {
    r.map_or("unknown", EndReason::as_str)
}

fn reason_json(id: Uuid, r: &FailureReason) -> Value {
    json!({
        "reason": reason_name(r.end_reason),
        "code": r.end_code,
        "example": r.example,
        "tasks": r.tasks,
        "retry": format!(
            "/console/campaigns/{id}/retry?reason={}",
            reason_name(r.end_reason)
        ),
        "tasks_link": format!(
            "/console/tasks?campaign={id}&state=failed&reason={}",
            reason_name(r.end_reason)
        ),
    })
}

/// One campaign with its failures grouped by reason and provider code.
pub(super) async fn detail(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(params): Params,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    let id = campaign_id(&id)?;
    let ns = caller.namespace.as_str();
    let view = console.campaigns.get(ns, id).await?;
    let reasons = console.campaigns.failure_reasons(ns, id, REASONS).await?;
    let sends = sends_of(&console, std::slice::from_ref(&view)).await?;
    Ok(render(
        &headers,
        StatusCode::OK,
        "campaign.html",
        page_context(&caller, &params, "campaigns"),
        json!({
            "campaign": campaign_json(&view, sends.get(&id)),
            "reasons": reasons.iter().map(|r| reason_json(id, r)).collect::<Vec<_>>(),
        }),
    ))
}

/// A campaign's failure groups as CSV (at most [`REASONS`] groups: one bounded query).
pub(super) async fn export_failures(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    let id = campaign_id(&id)?;
    let ns = caller.namespace.clone();
    // Checked before the stream starts, so a wrong id is a 404 and not an empty file.
    console.campaigns.get(&ns, id).await?;
    Ok(csv::stream(
        "campaign-failures.csv",
        &["end_reason", "provider_code", "example_error", "tasks"],
        (),
        move |()| {
            let (console, ns) = (console.clone(), ns.clone());
            async move {
                let reasons = console.campaigns.failure_reasons(&ns, id, REASONS).await?;
                let rows = reasons
                    .iter()
                    .map(|r| {
                        vec![
                            reason_name(r.end_reason).to_owned(),
                            // Empty as on the page ("–"): 0 is no code, not a code 0.
                            if r.end_code == 0 {
                                String::new()
                            } else {
                                r.end_code.to_string()
                            },
                            r.example.clone(),
                            r.tasks.to_string(),
                        ]
                    })
                    .collect();
                Ok((rows, None))
            }
        },
    ))
}

/// Pauses, resumes (`action=pause|resume`) or cancels (`action=cancel`) a campaign.
pub(super) async fn set_state(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Form(form): Form<HashMap<String, String>>,
) -> Result<Response, PageError> {
    require_admin(&caller)?;
    let id = campaign_id(&id)?;
    let ns = caller.namespace.as_str();
    let message = match param(&form, "action") {
        Some("pause") => {
            console.campaigns.set_paused(ns, id, true).await?;
            format!("campaign {id} paused")
        }
        Some("resume") => {
            console.campaigns.set_paused(ns, id, false).await?;
            format!("campaign {id} resumed")
        }
        Some("cancel") => {
            let s = console.campaigns.cancel(ns, id).await?;
            format!(
                "campaign {id} cancelled: {} scheduled tasks cancelled, {} revoked",
                s.cancelled_scheduled, s.revoked
            )
        }
        _ => return Err(PageError::bad("action", "must be pause, resume or cancel")),
    };
    Ok(done(&caller, &format!("/console/campaigns/{id}"), &message))
}

/// The bulk retry of a campaign's failed tasks that ended for `reason` (a name from
/// [`reason_name`]), as StartBulkOperation takes it.
fn retry_request(
    id: Uuid,
    params: &HashMap<String, String>,
    dry_run: bool,
) -> Result<(EndReason, bulk::Request), PageError> {
    let name = param(params, "reason").ok_or_else(|| PageError::bad("reason", "is required"))?;
    let reason = EndReason::parse(name)
        .ok_or_else(|| PageError::bad("reason", "is not an end reason (exhausted, …)"))?;
    let request = bulk::Request {
        action: bulk::Action::Retry,
        filter: pb::TaskFilter {
            campaign_id: id.to_string(),
            states: vec![pb::TaskState::Failed as i32],
            end_reasons: vec![crate::api::convert::tasks::end_reason(reason) as i32],
            ..Default::default()
        },
        target: None,
        dry_run,
    };
    Ok((reason, request))
}

/// Asks before cancelling, a step that cannot be undone and touches every queued task: how
/// many are queued and how many were sent. The cancel itself is the state form's POST.
pub(super) async fn cancel_confirm(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(params): Params,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    let id = campaign_id(&id)?;
    let view = console.campaigns.get(caller.namespace.as_str(), id).await?;
    Ok(render(
        &headers,
        StatusCode::OK,
        "campaign_cancel.html",
        page_context(&caller, &params, "campaigns"),
        json!({ "campaign": campaign_json(&view, None) }),
    ))
}

/// A cancelled campaign's failed tasks cannot be retried (retry_task.sql): the retry is refused
/// with why, rather than counted, confirmed and reported as started while it changes nothing.
fn refuse_retry_if_cancelled(view: &CampaignView) -> Result<(), PageError> {
    if view.state == CampaignState::Cancelled {
        return Err(PageError::new(
            StatusCode::CONFLICT,
            format!(
                "campaign {} was cancelled: none of its tasks is sent any more, so none can be retried",
                view.record.id
            ),
        ));
    }
    Ok(())
}

/// Asks before retrying: how many failed tasks of this reason there are now (the bulk
/// operation's dry run).
pub(super) async fn retry_confirm(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(params): Params,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    let id = campaign_id(&id)?;
    let ns = caller.namespace.as_str();
    let view = console.campaigns.get(ns, id).await?;
    refuse_retry_if_cancelled(&view)?;
    let (reason, request) = retry_request(id, &params, true)?;
    let counted = console.tasks.start_bulk(ns, request).await?;
    Ok(render(
        &headers,
        StatusCode::OK,
        "campaign_retry.html",
        page_context(&caller, &params, "campaigns"),
        json!({
            "campaign": campaign_json(&view, None),
            "reason": reason.as_str(),
            "tasks": counted.matched,
        }),
    ))
}

/// Retries every failed task of the reason as a bulk operation (in batches, resumable), and
/// shows its progress.
pub(super) async fn retry(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Form(form): Form<HashMap<String, String>>,
) -> Result<Response, PageError> {
    require_admin(&caller)?;
    let id = campaign_id(&id)?;
    let ns = caller.namespace.as_str();
    refuse_retry_if_cancelled(&console.campaigns.get(ns, id).await?)?;
    let (reason, request) = retry_request(id, &form, false)?;
    let started = console.tasks.start_bulk(ns, request).await?;
    let op = started
        .operation
        .ok_or_else(|| PageError::bad("reason", "the retry was not started"))?;
    tracing::info!(campaign_id = %id, reason = reason.as_str(), operation = %op.id,
        matched = started.matched, "console: retrying failed tasks");
    Ok(done(
        &caller,
        &format!("/console/bulk/{}", op.id),
        &format!(
            "campaign {id}: retrying {} failed tasks ({})",
            started.matched,
            reason.as_str()
        ),
    ))
}
