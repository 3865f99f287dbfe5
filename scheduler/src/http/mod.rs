//! The HTTP listener: liveness, readiness, metrics, the dashboard and the operator's console,
//! behind the token check.

pub mod console;
pub mod dashboard;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::Router;

use tokio_util::sync::CancellationToken;

use crate::auth::http_admin::{require_admin, HttpAuth};
use crate::db_watch::DatabaseReachable;
use crate::store::Store;
use crate::tasks::Tasks;

/// What readiness follows: the replica's gRPC health, so that the HTTP probe (the chart's, with
/// TLS on) and the gRPC one never disagree.
#[derive(Debug, Clone)]
pub struct Readiness {
    /// Cancelled once the replica starts draining on SIGTERM.
    pub draining: CancellationToken,
    /// The database watch's verdict (`db_watch`).
    pub database: DatabaseReachable,
}

/// Routes of the HTTP listener; everything but the probes (and `/metrics` unless `auth` says
/// otherwise) requires an admin or viewer token, and writes an admin one.
pub fn router(
    tasks: Tasks,
    console: console::Console,
    auth: HttpAuth,
    readiness: Readiness,
) -> Router {
    let store = tasks.store().clone();
    Router::new()
        .route("/readyz", get(ready))
        .with_state(readiness)
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .with_state(store.clone())
        .merge(dashboard::router(tasks))
        .merge(console::router(console))
        .layer(axum::middleware::from_fn_with_state(auth, require_admin))
        .layer(axum::middleware::map_response(protective_headers))
}

/// Headers on every answer of the listener. No other site may frame its pages: a framed
/// console, logged in by the browser, would take the operator's clicks on its actions as the
/// console's own (the same-origin check cannot tell). Nor may a browser guess a type other
/// than the one sent, so an export or an error text is never run as a page.
async fn protective_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("frame-ancestors 'none'"),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
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

/// Ready as gRPC health is SERVING: not while the replica drains, nor while the database watch
/// finds the database unreachable. Reads two flags, so a flood of probes (the port is open to
/// anyone who reaches it) costs the database nothing.
async fn ready(State(readiness): State<Readiness>) -> (StatusCode, &'static str) {
    if readiness.draining.is_cancelled() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining")
    } else if !readiness.database.is_up() {
        (StatusCode::SERVICE_UNAVAILABLE, "database unavailable")
    } else {
        (StatusCode::OK, "ready")
    }
}
