//! The schedule pages: the list with the next fire time in each schedule's own zone and its
//! last runs; one schedule with a preview of its next 10 fires; pause, resume and run now.

use std::collections::HashMap;

use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Extension;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use super::{
    csv, done, page_context, param, render, require_admin, urlencode, when, Console, PageError,
    Params,
};
use crate::auth::Caller;
use crate::rules;
use crate::schedule::model::{RunRecord, ScheduleRecord};

/// Schedules per page (each reads its last runs).
const PAGE: i64 = 25;
/// Runs shown per schedule in the list.
const LIST_RUNS: i64 = 3;
/// Runs shown on a schedule's page.
const DETAIL_RUNS: i64 = 20;
/// Fire times previewed.
const PREVIEW: usize = 10;

/// `t` in the schedule's zone (`2026-03-29 02:30 CEST (Europe/Paris)`), UTC when the zone does
/// not parse.
fn local(t: DateTime<Utc>, zone: &str) -> String {
    match zone.parse::<chrono_tz::Tz>() {
        Ok(tz) => format!(
            "{} ({zone})",
            t.with_timezone(&tz).format("%Y-%m-%d %H:%M:%S %Z")
        ),
        Err(_) => when(t),
    }
}

fn run_json(r: &RunRecord, zone: &str) -> Value {
    json!({
        "fire_time": local(r.fire_time, zone),
        "kind": r.kind,
        "tasks": r.task_count,
        "created_at": when(r.created_at),
        "fanning_out": r.fanning_out,
        "error": r.error,
    })
}

fn schedule_json(s: &ScheduleRecord, runs: &[RunRecord]) -> Value {
    json!({
        "id": s.id,
        "cron": s.cron,
        "zone": s.time_zone,
        "state": if s.paused { "paused" } else { "active" },
        "next": s.next_fire_at.filter(|_| !s.paused).map(|t| local(t, &s.time_zone)),
        "last": s.last_fire_at.map(|t| local(t, &s.time_zone)),
        "overlap": s.overlap,
        "misfire": s.misfire,
        "runs": runs.iter().map(|r| run_json(r, &s.time_zone)).collect::<Vec<_>>(),
    })
}

/// The schedule list, by id.
pub(super) async fn list(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Query(params): Params,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    let ns = caller.namespace.as_str();
    let after = param(&params, "after").unwrap_or("");
    if !after.is_empty() {
        rules::name("after", after)?;
    }
    let records = console.schedules.list(ns, after, PAGE + 1).await?;
    let (records, next) = crate::store::sql::page(records, PAGE, |last| urlencode(&last.id));
    let mut rows = Vec::with_capacity(records.len());
    for s in &records {
        let runs = console.schedules.runs(ns, &s.id, None, LIST_RUNS).await?;
        rows.push(schedule_json(s, &runs));
    }
    Ok(render(
        &headers,
        StatusCode::OK,
        "schedules.html",
        page_context(&caller, &params, "schedules"),
        json!({
            "schedules": rows,
            "next": (!next.is_empty()).then_some(next),
        }),
    ))
}

/// Every schedule as CSV, streamed a page at a time.
pub(super) async fn export(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
) -> Response {
    let ns = caller.namespace.clone();
    csv::stream(
        "schedules.csv",
        &[
            "id",
            "cron",
            "time_zone",
            "state",
            "next_fire_time",
            "last_fire_time",
        ],
        String::new(),
        move |after: String| {
            let (console, ns) = (console.clone(), ns.clone());
            async move {
                let records = console.schedules.list(&ns, &after, PAGE + 1).await?;
                let (records, next) =
                    crate::store::sql::page(records, PAGE, |last| last.id.clone());
                let rows = records
                    .iter()
                    .map(|s| {
                        vec![
                            s.id.clone(),
                            s.cron.clone(),
                            s.time_zone.clone(),
                            if s.paused { "paused" } else { "active" }.to_owned(),
                            s.next_fire_at
                                .filter(|_| !s.paused)
                                .map(|t| t.to_rfc3339())
                                .unwrap_or_default(),
                            s.last_fire_at.map(|t| t.to_rfc3339()).unwrap_or_default(),
                        ]
                    })
                    .collect();
                Ok((rows, (!next.is_empty()).then_some(next)))
            }
        },
    )
}

/// One schedule: its next fires and its runs.
pub(super) async fn detail(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Query(params): Params,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    rules::name("id", &id)?;
    let ns = caller.namespace.as_str();
    let s = console.schedules.get(ns, &id).await?;
    let runs = console.schedules.runs(ns, &id, None, DETAIL_RUNS).await?;
    let preview = console
        .schedules
        .fire_times(ns, &id)
        .await?
        .preview(console.schedules.clock().now(), PREVIEW);
    Ok(render(
        &headers,
        StatusCode::OK,
        "schedule.html",
        page_context(&caller, &params, "schedules"),
        json!({
            "schedule": schedule_json(&s, &runs),
            "preview": preview.iter().map(|t| local(*t, &s.time_zone)).collect::<Vec<_>>(),
        }),
    ))
}

/// Runs a schedule once now (RunScheduleNow).
pub(super) async fn run_now(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    require_admin(&caller)?;
    rules::name("id", &id)?;
    let run = console.schedules.run_now(&caller.namespace, &id).await?;
    let what = if run.fanning_out {
        "its recipients are being added".to_owned()
    } else {
        format!("{} task(s) created", run.task_count)
    };
    Ok(done(
        &caller,
        &format!("/console/schedules/{}", urlencode(&id)),
        &format!("schedule {id} run now: {what}"),
    ))
}

/// Pauses or resumes a schedule (`action=pause|resume`).
pub(super) async fn set_state(
    State(console): State<Console>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    Form(form): Form<HashMap<String, String>>,
) -> Result<Response, PageError> {
    require_admin(&caller)?;
    rules::name("id", &id)?;
    let paused = match param(&form, "action") {
        Some("pause") => true,
        Some("resume") => false,
        _ => return Err(PageError::bad("action", "must be pause or resume")),
    };
    console
        .schedules
        .set_paused(&caller.namespace, &id, paused)
        .await?;
    let word = if paused { "paused" } else { "resumed" };
    Ok(done(
        &caller,
        &format!("/console/schedules/{}", urlencode(&id)),
        &format!("schedule {id} {word}"),
    ))
}
