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
    csv, done, page_context, param, render, require_admin, urlencode, when, when_opt, Console,
    PageError, Params,
};
use crate::auth::Caller;
use crate::campaigns::model::FailureReason;
use crate::campaigns::{CampaignState, CampaignView};
use crate::tasks::model::Outcome;

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

fn campaign_json(c: &CampaignView) -> Value {
    let p = &c.progress;
    let total = p.live + p.succeeded + p.failed + p.cancelled + p.expired;
    json!({
        "id": c.record.id.to_string(),
        "name": c.spec.name,
        "queue": c.spec.queue,
        "pool": c.record.pool,
        "state": state_name(c.state),
        "recipients": c.record.recipient_count,
        // Delivered and read counts join these when campaigns report them.
        "queued": p.live,
        "sent": p.succeeded,
        "failed": p.failed,
        "cancelled": p.cancelled,
        "expired": p.expired,
        "sent_pct": pct(p.succeeded, total),
        "failed_pct": pct(p.failed, total),
        "done_pct": pct(total - p.live, total),
        "eta": when_opt(c.estimated_finish),
        "created_at": when(c.record.created_at),
    })
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
    Ok(render(
        &headers,
        StatusCode::OK,
        "campaigns.html",
        page_context(&caller, &params, "campaigns"),
        json!({
            "campaigns": views.iter().map(campaign_json).collect::<Vec<_>>(),
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

/// A reason's name in links: the outcome's name (`PERMANENT`, or `NONE`).
fn outcome_param(o: Option<Outcome>) -> &'static str {
    o.map_or("NONE", |o| o.name())
}

fn reason_json(id: Uuid, r: &FailureReason) -> Value {
    json!({
        "outcome": outcome_param(r.outcome),
        "error": r.error,
        "tasks": r.tasks,
        "retry": format!(
            "/console/campaigns/{id}/retry?outcome={}&error={}",
            outcome_param(r.outcome),
            urlencode(&r.error)
        ),
    })
}

/// One campaign with its failures grouped by reason.
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
    Ok(render(
        &headers,
        StatusCode::OK,
        "campaign.html",
        page_context(&caller, &params, "campaigns"),
        json!({
            "campaign": campaign_json(&view),
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
        &["outcome", "error", "tasks"],
        (),
        move |()| {
            let (console, ns) = (console.clone(), ns.clone());
            async move {
                let reasons = console.campaigns.failure_reasons(&ns, id, REASONS).await?;
                let rows = reasons
                    .iter()
                    .map(|r| {
                        vec![
                            outcome_param(r.outcome).to_owned(),
                            r.error.clone(),
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

/// The reason named by `outcome` and `error`, with its current count.
async fn reason(
    console: &Console,
    ns: &str,
    id: Uuid,
    params: &HashMap<String, String>,
) -> Result<FailureReason, PageError> {
    let outcome = match params.get("outcome").map(String::as_str) {
        Some("NONE") => None,
        Some(name) => Some(Outcome::from_name(name).ok_or_else(|| {
            PageError::bad(
                "outcome",
                "is not an attempt outcome (PERMANENT, TRANSIENT, …)",
            )
        })?),
        None => return Err(PageError::bad("outcome", "is required")),
    };
    let error = params.get("error").cloned().unwrap_or_default();
    let reasons = console.campaigns.failure_reasons(ns, id, REASONS).await?;
    Ok(reasons
        .into_iter()
        .find(|r| r.outcome == outcome && r.error == error)
        .unwrap_or(FailureReason {
            outcome,
            error,
            tasks: 0,
        }))
}

/// Asks before retrying: how many failed tasks of this reason there are now.
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
    let r = reason(&console, ns, id, &params).await?;
    Ok(render(
        &headers,
        StatusCode::OK,
        "campaign_retry.html",
        page_context(&caller, &params, "campaigns"),
        json!({
            "campaign": campaign_json(&view),
            "reason": reason_json(id, &r),
        }),
    ))
}

/// Retries every failed task of the reason, as RetryTask does for each.
pub(super) async fn retry(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Form(form): Form<HashMap<String, String>>,
) -> Result<Response, PageError> {
    require_admin(&caller)?;
    let id = campaign_id(&id)?;
    let ns = caller.namespace.as_str();
    let r = reason(&console, ns, id, &form).await?;
    let retried = console
        .campaigns
        .retry_failed(ns, id, &r, |n| {
            tracing::info!(campaign_id = %id, retried = n, "console: retrying failed tasks");
        })
        .await?;
    Ok(done(
        &caller,
        &format!("/console/campaigns/{id}"),
        &format!("campaign {id}: {retried} failed tasks retried"),
    ))
}
