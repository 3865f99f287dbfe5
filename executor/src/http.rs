//! The executor's HTTP endpoint: `/healthz` and a first `/metrics`.

use std::sync::atomic::Ordering;
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

/// Prometheus text format. A placeholder until the metrics module lands: a few gauges only.
async fn metrics(State(stats): State<Arc<Stats>>) -> String {
    format!(
        "# HELP herald_executor_leases_in_flight Leases held (pending or sending).\n\
         # TYPE herald_executor_leases_in_flight gauge\n\
         herald_executor_leases_in_flight {}\n\
         # HELP herald_executor_results_unacked Results not yet acknowledged by a scheduler.\n\
         # TYPE herald_executor_results_unacked gauge\n\
         herald_executor_results_unacked {}\n\
         # HELP herald_executor_connected 1 while a lease stream is open.\n\
         # TYPE herald_executor_connected gauge\n\
         herald_executor_connected {}\n",
        stats.in_flight.load(Ordering::Relaxed),
        stats.unacked.load(Ordering::Relaxed),
        stats.connected.load(Ordering::Relaxed),
    )
}
