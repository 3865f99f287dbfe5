//! The executor's HTTP endpoint: `/healthz` and `/metrics`.

use std::sync::Arc;

use axum::extract::State;
use axum::routing::get;
use axum::Router;

use crate::client::Stats;

/// The router.
pub(crate) fn router(stats: Arc<Stats>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .with_state(stats)
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
