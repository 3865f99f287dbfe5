//! Telemetry: logs and OTLP traces (set up by `herald_process::telemetry`, shared with the executor),
//! the Prometheus metrics ([`metrics`]) and the operator notification webhook ([`notify`]).
//!
//! One trace runs from CreateTask through the lease to the send: CreateTask continues the
//! caller's W3C `traceparent` (gRPC metadata) or starts a root span, stores its own
//! `traceparent` with the task (`tasks.trace_parent`), and the lease carries it to the
//! executor. The scheduler's `lease.grant` span and the executor's `send` span are children of
//! the CreateTask span. Tasks a schedule run or a campaign makes carry the `traceparent` of a
//! span standing for that run or page instead (`tasks::origin_trace`).

pub mod metrics;
pub mod notify;

use std::collections::HashMap;

pub use herald_process::telemetry::{
    context_from_traceparent, init, set_parent, traceparent, TelemetryGuard,
};

/// The W3C trace context a caller sent in gRPC metadata, if it is valid.
pub fn remote_parent(metadata: &tonic::metadata::MetadataMap) -> Option<opentelemetry::Context> {
    let traceparent = metadata.get("traceparent")?.to_str().ok()?;
    let mut carrier = HashMap::with_capacity(2);
    carrier.insert("traceparent".to_string(), traceparent.to_string());
    if let Some(state) = metadata.get("tracestate").and_then(|v| v.to_str().ok()) {
        carrier.insert("tracestate".to_string(), state.to_string());
    }
    herald_process::telemetry::context_from_carrier(&carrier)
}

/// Records a `lease.grant` span per lease of a granted batch, each a child of the CreateTask
/// span stored with its task. Does nothing unless spans are exported.
pub fn lease_grant_spans(leases: &[crate::tasks::model::GrantedLease], executor_id: &str) {
    if !herald_process::telemetry::exporting() {
        return;
    }
    for l in leases {
        let Some(parent) = l.trace_parent.as_deref().and_then(context_from_traceparent) else {
            continue;
        };
        let span = tracing::info_span!(
            "lease.grant",
            task_id = %l.task_id,
            attempt = l.attempt,
            queue = %l.queue,
            account = l.account_id.as_deref().unwrap_or(""),
            executor_id,
        );
        set_parent(&span, parent);
        // The span ends here: a grant is an instant, its children live in the executor.
    }
}

/// Continues the caller's trace in `span` when the request carries a valid `traceparent`, and
/// returns the `traceparent` to store with the task: `span`'s own when spans are exported,
/// else the caller's as it came (so a later tracing set-up can still join it), else None.
pub fn adopt_remote_parent(
    span: &tracing::Span,
    metadata: &tonic::metadata::MetadataMap,
) -> Option<String> {
    if let Some(parent) = remote_parent(metadata) {
        set_parent(span, parent);
    }
    traceparent(span).or_else(|| {
        metadata
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .filter(|v| context_from_traceparent(v).is_some())
            .map(str::to_owned)
    })
}
