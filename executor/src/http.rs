//! The executor's HTTP endpoint: `/healthz` (the process answers), `/readyz` (it holds a lease
//! session, or held one moments ago) and `/metrics`.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

use crate::client::Stats;

/// How long after its lease session ended an executor still counts as ready: a scheduler's
/// restart or a move to another replica takes seconds, and taking every executor out of its
/// Service meanwhile would turn away Meta's webhooks for nothing.
pub(crate) const READY_GRACE: Duration = Duration::from_secs(30);

/// The router.
pub(crate) fn router(stats: Arc<Stats>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(stats)
}

/// 200 while a lease session is open or was within [`READY_GRACE`]; 503 before the first one
/// and after a longer loss of every scheduler.
async fn readyz(State(stats): State<Arc<Stats>>) -> (StatusCode, &'static str) {
    if stats.ready(READY_GRACE) {
        (StatusCode::OK, "ready")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "no lease session with a scheduler",
        )
    }
}

/// Prometheus text exposition of every metric in `telemetry::metrics`.
async fn metrics(State(stats): State<Arc<Stats>>) -> impl axum::response::IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::telemetry::metrics::render(&stats),
    )
}
