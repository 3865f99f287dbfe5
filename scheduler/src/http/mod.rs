//! The HTTP listener: liveness, readiness, metrics, the dashboard and the operator's console,
//! behind the token check.

pub mod console;
pub mod dashboard;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

use crate::auth::http_admin::{require_admin, HttpAuth};
use crate::store::Store;
use crate::tasks::Tasks;

/// Routes of the HTTP listener; everything but the probes (and `/metrics` unless `auth` says
/// otherwise) requires an admin or viewer token, and writes an admin one.
pub fn router(tasks: Tasks, console: console::Console, auth: HttpAuth) -> Router {
    let store = tasks.store().clone();
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .with_state(store.clone())
        .merge(dashboard::router(tasks))
        .merge(console::router(console))
        .layer(axum::middleware::from_fn_with_state(auth, require_admin))
}

/// Prometheus text exposition of every metric in [`crate::telemetry::metrics`].
async fn metrics(State(store): State<Store>) -> impl axum::response::IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::telemetry::metrics::render(&store).await,
    )
}

/// Ready while the database answers.
async fn ready(State(store): State<Store>) -> (StatusCode, &'static str) {
    match store.ping().await {
        Ok(()) => (StatusCode::OK, "ready"),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "database unavailable"),
    }
}
