//! The HTTP side: liveness, readiness.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

use crate::store::Store;

/// Routes of the HTTP listener.
pub fn router(store: Store) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .with_state(store.clone())
        .merge(crate::dashboard::router(store))
}

/// Prometheus text exposition of every metric in [`crate::telemetry::metrics`].
async fn metrics(State(store): State<Store>) -> impl axum::response::IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::telemetry::metrics::render(&store),
    )
}

/// Ready while the database answers.
async fn ready(State(store): State<Store>) -> (StatusCode, &'static str) {
    match store.ping().await {
        Ok(()) => (StatusCode::OK, "ready"),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "database unavailable"),
    }
}
