//! Telemetry: logs and OTLP traces (set up by `herald_process::telemetry`, shared with the scheduler)
//! and the Prometheus metrics ([`metrics`]).
//!
//! Each lease carries the `traceparent` of the CreateTask that made its task; the `send` span
//! is its child, so the send joins the trace that began at the scheduler.

pub mod metrics;

pub use herald_process::telemetry::TelemetryGuard;

/// The service name on exported spans.
const SERVICE_NAME: &str = "herald-executor";

/// Installs logging and, when configured, trace export; see [`herald_process::telemetry::init`].
pub fn init(log_format: &str) -> TelemetryGuard {
    herald_process::telemetry::init(log_format, SERVICE_NAME)
}

/// Makes `span` a child of the lease's `traceparent`, when spans are exported and it is valid.
pub(crate) fn set_parent_from(span: &tracing::Span, traceparent: &str) {
    if traceparent.is_empty() || !herald_process::telemetry::exporting() {
        return;
    }
    if let Some(parent) = herald_process::telemetry::context_from_traceparent(traceparent) {
        herald_process::telemetry::set_parent(span, parent);
    }
}
