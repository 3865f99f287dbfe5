//! The operator's dashboard, served on the HTTP listener under `/dashboard`: one HTML page with
//! plain JavaScript and inline SVG (built into the binary, no build step, nothing fetched from
//! elsewhere) reading the JSON endpoints below.
//!
//! - `GET /dashboard/api/overview?tz=Zone`: today's counts by state, sends and failures per
//!   minute over the last hour, success by account and trigger lag.
//! - `GET /dashboard/api/failures?tz=&queue=&account=&outcome=&cursor=`: the failure list.
//! - `POST /dashboard/api/tasks/{id}/retry`: re-drives a failed task, as RetryTask does.
//!
//! Every figure comes from the same store functions as StatsService, so the page and the API
//! cannot disagree. Access is checked in front of these routes ([`crate::auth::http_admin`]):
//! an admin token, as a bearer header or the password of the browser's Basic prompt; the page
//! shows the token's default namespace. The retry endpoint also requires an
//! `x-herald-dashboard` header, which a cross-site form cannot send, so another site open in an
//! operator's browser cannot re-drive tasks through it.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use herald_proto::v1 as pb;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::auth::Caller;
use crate::error::Error;
use crate::rules::name_problem as queue_name_problem;
use crate::stats::{
    decode_failure_token, encode_failure_token, time_zone_or_utc, time_zone_problem, FailureFilter,
    FailureRecord, GroupBy, Window, WindowSpec, DEFAULT_FAILURE_PAGE,
};
use crate::store::{Db, StoreError};
use crate::tasks::model::{content_of, Outcome};
use crate::tasks::Tasks;

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const STYLE_CSS: &str = include_str!("assets/style.css");

/// The header the retry endpoint requires (see the module docs for why).
pub const CSRF_HEADER: &str = "x-herald-dashboard";

/// How many minutes the sends-per-minute chart shows.
const CHART_MINUTES: i64 = 60;

/// Routes of the dashboard, to merge into the HTTP listener's router.
pub fn router(tasks: Tasks) -> Router {
    Router::new()
        .route(
            "/dashboard",
            get(|| async { Redirect::permanent("/dashboard/") }),
        )
        .route("/dashboard/", get(index))
        .route("/dashboard/app.js", get(app_js))
        .route("/dashboard/style.css", get(style_css))
        .route("/dashboard/api/overview", get(overview))
        .route("/dashboard/api/failures", get(failures))
        .route("/dashboard/api/tasks/{id}/retry", post(retry))
        .with_state(tasks)
}

async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

async fn app_js() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

async fn style_css() -> Response {
    asset("text/css; charset=utf-8", STYLE_CSS)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            // The page is small and changes with the binary; always fetching it keeps an open tab
            // consistent with the endpoints after an upgrade.
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// An error answered as JSON: `{"error": ..., "field": ...}`.
struct ApiError {
    status: StatusCode,
    message: String,
    field: Option<&'static str>,
}

impl ApiError {
    fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            field: Some(field),
        }
    }

    fn status(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            field: None,
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        if e.is_unavailable() {
            tracing::warn!(error = %e, "dashboard: database unavailable");
            ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "database unavailable")
        } else {
            tracing::error!(error = %e, "dashboard: store failure");
            ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
        }
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        match e {
            Error::Store(e) => e.into(),
            Error::NotFound(what) => {
                ApiError::status(StatusCode::NOT_FOUND, format!("{what} not found"))
            }
            Error::FailedPrecondition(m) => ApiError::status(StatusCode::CONFLICT, m),
            Error::InvalidArgument(v) => {
                ApiError::status(StatusCode::BAD_REQUEST, crate::error::describe(&v))
            }
            other => ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({ "error": self.message, "field": self.field })),
        )
            .into_response()
    }
}

type Params = Query<HashMap<String, String>>;

/// The `tz` parameter, validated like StatsService's `window.time_zone`.
fn time_zone(params: &HashMap<String, String>) -> Result<String, ApiError> {
    let tz = params.get("tz").map(String::as_str).unwrap_or("");
    match time_zone_problem(tz) {
        Some(problem) => Err(ApiError::invalid("tz", format!("tz {problem}"))),
        None => Ok(time_zone_or_utc(tz)),
    }
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

fn window_json(w: &Window) -> Value {
    json!({ "start": rfc3339(w.start), "end": rfc3339(w.end), "time_zone": w.time_zone })
}

async fn overview(
    State(tasks): State<Tasks>,
    Extension(caller): Extension<Caller>,
    Query(params): Params,
) -> Result<Json<Value>, ApiError> {
    let ns = caller.namespace.as_str();
    let tz = time_zone(&params)?;
    let db = tasks.store().conn().await?;
    let stats = db.stats();
    let today = stats.resolve_window(&WindowSpec::Today, &tz).await?;
    let counts = stats.count_tasks(ns, &today, None).await?;
    let lag = stats.trigger_lag(ns, &today, None).await?;
    let (delivery, latency) = stats.delivery_stats(ns, &today, None).await?;
    let accounts = stats
        .success_rates(ns, &today, GroupBy::Account, None)
        .await?;

    // The chart's hour, aligned to whole minutes so every bar covers a full minute but the
    // current one.
    let now = stats
        .resolve_window(&WindowSpec::Last(60_000), &tz)
        .await?
        .end;
    let current_minute = now.duration_trunc(TimeDelta::minutes(1)).unwrap_or(now);
    let chart = Window {
        start: current_minute - TimeDelta::minutes(CHART_MINUTES - 1),
        end: now,
        time_zone: tz.clone(),
    };
    let minutes = stats
        .success_rates(ns, &chart, GroupBy::Minute, None)
        .await?;
    let by_minute: HashMap<DateTime<Utc>, (i64, i64)> = minutes
        .iter()
        .filter_map(|m| m.bucket.map(|b| (b, (m.ok, m.failed()))))
        .collect();
    let per_minute: Vec<Value> = (0..CHART_MINUTES)
        .map(|i| {
            let minute = chart.start + TimeDelta::minutes(i);
            let (sent, failed) = by_minute.get(&minute).copied().unwrap_or((0, 0));
            json!({ "minute": rfc3339(minute), "sent": sent, "failed": failed })
        })
        .collect();

    Ok(Json(json!({
        "namespace": ns,
        "today": window_json(&today),
        "now": rfc3339(now),
        "counts": {
            "scheduled": counts.scheduled,
            "leased": counts.leased,
            "succeeded": counts.succeeded,
            "failed": counts.failed,
            "cancelled": counts.cancelled,
            "expired": counts.expired,
            // Why tasks ended today, by the database's reason names (exhausted, suppressed...).
            "reasons": counts
                .by_reason
                .iter()
                .map(|(r, n)| (r.as_str().to_string(), json!(n)))
                .collect::<serde_json::Map<String, Value>>(),
        },
        // How far today's accepted messages got, by the providers' reports.
        "delivery": {
            "accepted": delivery.accepted,
            "delivered": delivery.delivered,
            "read": delivery.read,
            "failed_after_acceptance": delivery.failed_after_acceptance,
            "latency_count": latency.count,
            "p50_ms": latency.p50_ms,
            "p95_ms": latency.p95_ms,
            "p99_ms": latency.p99_ms,
        },
        "lag": {
            "count": lag.overall.count,
            "p50_ms": lag.overall.p50_ms,
            "p90_ms": lag.overall.p90_ms,
            "p99_ms": lag.overall.p99_ms,
            "max_ms": lag.overall.max_ms,
        },
        "accounts": accounts.iter().map(|a| json!({
            "account": a.key,
            "attempts": a.attempts,
            "succeeded": a.ok,
            "failed": a.failed(),
            "success_rate": a.success_rate(),
        })).collect::<Vec<_>>(),
        "per_minute": per_minute,
    })))
}

/// A name filter (queue or account) from the query string.
fn name_param(
    params: &HashMap<String, String>,
    field: &'static str,
) -> Result<Option<String>, ApiError> {
    match params
        .get(field)
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
    {
        None => Ok(None),
        Some(name) => match queue_name_problem(name) {
            Some(problem) => Err(ApiError::invalid(field, format!("{field} {problem}"))),
            None => Ok(Some(name.to_string())),
        },
    }
}

/// The outcome filter, by its wire name without the prefix (`PERMANENT`).
fn outcome_param(params: &HashMap<String, String>) -> Result<Option<Outcome>, ApiError> {
    let Some(name) = params.get("outcome").filter(|s| !s.is_empty()) else {
        return Ok(None);
    };
    match Outcome::from_name(&name.to_uppercase()) {
        Some(o) => Ok(Some(o)),
        None => Err(ApiError::invalid(
            "outcome",
            "outcome must be OK, RATE_LIMITED, TRANSIENT, PERMANENT, ACCOUNT_UNAVAILABLE or \
             LEASE_EXPIRED",
        )),
    }
}

fn outcome_name(o: Option<Outcome>) -> &'static str {
    match o {
        None => "",
        Some(o) => o.name(),
    }
}

/// What the message said, in one line for the table.
pub(super) fn content_summary(bytes: &[u8]) -> String {
    match content_of(bytes).and_then(|c| c.body) {
        Some(pb::content::Body::Text(text)) => text,
        Some(pb::content::Body::Template(t)) => {
            let vars: Vec<String> = t
                .variables
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            format!(
                "template {} [{}] {}",
                t.template_id,
                t.language,
                vars.join(", ")
            )
        }
        Some(pb::content::Body::Markdown(text)) => text,
        Some(pb::content::Body::Media(m)) => {
            let kind = m.kind().as_str_name();
            let source = match m.source {
                Some(pb::media::Source::Link(link)) => link,
                Some(pb::media::Source::MediaId(id)) => format!("media id {id}"),
                None => String::new(),
            };
            format!("{kind} {source} {}", m.caption)
        }
        // The other bodies by name: the table shows one line.
        Some(other) => herald_proto::content::body_name(&other).to_owned(),
        None => "(content unreadable)".to_string(),
    }
}

fn failure_json(f: &FailureRecord) -> Value {
    json!({
        "task_id": f.id.to_string(),
        "queue": f.queue,
        "recipient": f.recipient,
        "template_id": f.template_id,
        "content": content_summary(&f.content),
        "labels": f.labels,
        "state": f.state.as_str(),
        "outcome": outcome_name(f.outcome),
        "error": f.error,
        "account": f.account,
        "attempts": f.attempts,
        "finished_at": rfc3339(f.finished_at),
    })
}

async fn failures(
    State(tasks): State<Tasks>,
    Extension(caller): Extension<Caller>,
    Query(params): Params,
) -> Result<Json<Value>, ApiError> {
    let ns = caller.namespace.as_str();
    let tz = time_zone(&params)?;
    let after = match params.get("cursor").filter(|s| !s.is_empty()) {
        None => None,
        Some(c) => Some(
            decode_failure_token(c)
                .ok_or_else(|| ApiError::invalid("cursor", "cursor is not one this page gave"))?,
        ),
    };
    let filter = FailureFilter {
        queue: name_param(&params, "queue")?,
        account: name_param(&params, "account")?,
        outcome: outcome_param(&params)?,
        template_id: params.get("template").filter(|s| !s.is_empty()).cloned(),
        after,
        limit: i64::from(DEFAULT_FAILURE_PAGE),
    };
    let db = tasks.store().conn().await?;
    let today = db.stats().resolve_window(&WindowSpec::Today, &tz).await?;
    let probe = FailureFilter {
        limit: filter.limit + 1,
        ..filter.clone()
    };
    let rows = db.stats().list_failures(ns, &today, &probe).await?;
    let (rows, next) = crate::store::sql::page(rows, filter.limit, |last| {
        encode_failure_token(last.finished_at, last.id)
    });
    let next = (!next.is_empty()).then_some(next);
    Ok(Json(json!({
        "today": window_json(&today),
        "failures": rows.iter().map(failure_json).collect::<Vec<_>>(),
        "next_cursor": next,
    })))
}

async fn retry(
    State(tasks): State<Tasks>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    if !headers.contains_key(CSRF_HEADER) {
        return Err(ApiError::status(
            StatusCode::FORBIDDEN,
            format!("the {CSRF_HEADER} header is required"),
        ));
    }
    let id: Uuid = id
        .parse()
        .map_err(|_| ApiError::invalid("id", "id is not a task id (a UUID)"))?;
    let ns = caller.namespace.as_str();
    // The same domain call as RetryTask: one definition of what re-driving means.
    let task = tasks.retry(ns, id, None).await?;
    Ok(Json(
        json!({ "task_id": id.to_string(), "state": task.state.as_str() }),
    ))
}
