//! Telemetry: logs (text or JSON), OpenTelemetry traces over OTLP when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set, the Prometheus metrics ([`metrics`]) and the operator
//! notification webhook ([`notify`]).
//!
//! One trace runs from CreateTask through the lease to the send: CreateTask continues the
//! caller's W3C `traceparent` (gRPC metadata) or starts a root span, stores its own
//! `traceparent` with the task (`tasks.trace_parent`), and the lease carries it to the
//! executor. The scheduler's `lease.grant` span and the executor's `send` span are children of
//! the CreateTask span.

pub mod metrics;
pub mod notify;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Whether spans are exported: per-lease trace work is skipped when they are not.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Keeps the trace exporter alive; dropping it flushes the spans not yet exported.
#[must_use = "dropping the guard shuts the trace exporter down"]
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            // Exports what the batch processor still holds; bounded by the exporter's timeout.
            if let Err(e) = provider.shutdown() {
                eprintln!("cannot flush traces: {e}");
            }
        }
    }
}

/// Installs the global subscriber: `RUST_LOG` filter (default `info`), text or JSON logs on
/// stderr, and the OpenTelemetry layer when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (standard
/// `OTEL_*` variables such as `OTEL_BSP_SCHEDULE_DELAY` apply). Call once, early.
pub fn init(log_format: &str, service_name: &'static str) -> TelemetryGuard {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = if log_format.eq_ignore_ascii_case("json") {
        fmt.json().boxed()
    } else {
        fmt.boxed()
    };
    let (provider, otel_error) = match otlp_provider(service_name) {
        Ok(p) => (p, None),
        Err(e) => (None, Some(e)),
    };
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer(service_name))
            // Only herald's own spans: library internals (h2, tonic) would drown them.
            .with_filter(tracing_subscriber::filter::filter_fn(|m| {
                m.target().starts_with("herald")
            }))
    });
    // Ignored when a subscriber is already installed (tests embedding the scheduler).
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .try_init();
    if let Some(e) = otel_error {
        tracing::warn!(error = %e, "cannot set up the OTLP trace exporter; traces are off");
    } else if provider.is_some() {
        EXPORTING.store(true, Ordering::Relaxed);
        tracing::info!("exporting traces over OTLP");
    }
    TelemetryGuard { provider }
}

fn otlp_provider(
    service_name: &'static str,
) -> Result<Option<SdkTracerProvider>, opentelemetry_otlp::ExporterBuildError> {
    if std::env::var_os("OTEL_EXPORTER_OTLP_ENDPOINT").is_none()
        && std::env::var_os("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none()
    {
        return Ok(None);
    }
    use opentelemetry_otlp::WithExportConfig as _;
    // HTTP/protobuf; the endpoint and headers come from the standard OTEL_* variables.
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .build()?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service_name)
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    Ok(Some(provider))
}

/// The W3C trace context a caller sent in gRPC metadata, if it is valid.
pub fn remote_parent(metadata: &tonic::metadata::MetadataMap) -> Option<opentelemetry::Context> {
    let traceparent = metadata.get("traceparent")?.to_str().ok()?;
    let mut carrier = HashMap::with_capacity(2);
    carrier.insert("traceparent".to_string(), traceparent.to_string());
    if let Some(state) = metadata.get("tracestate").and_then(|v| v.to_str().ok()) {
        carrier.insert("tracestate".to_string(), state.to_string());
    }
    parse(&carrier)
}

/// Parses a stored `traceparent` into a context to parent spans on.
pub fn context_from_traceparent(traceparent: &str) -> Option<opentelemetry::Context> {
    let mut carrier = HashMap::with_capacity(1);
    carrier.insert("traceparent".to_string(), traceparent.to_string());
    parse(&carrier)
}

fn parse(carrier: &HashMap<String, String>) -> Option<opentelemetry::Context> {
    let cx = TraceContextPropagator::new().extract(carrier);
    cx.span().span_context().is_valid().then_some(cx)
}

/// Makes `span` a child of `parent` (no-op when tracing is off).
pub fn set_parent(span: &tracing::Span, parent: opentelemetry::Context) {
    // Fails only if the span has already started; ours are fresh.
    let _ = span.set_parent(parent);
}

/// The `traceparent` header value naming `span`, when spans are exported.
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::with_capacity(2);
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove("traceparent")
}

/// Records a `lease.grant` span per lease of a granted batch, each a child of the CreateTask
/// span stored with its task. Does nothing unless spans are exported.
pub fn lease_grant_spans(leases: &[crate::model::GrantedLease], executor_id: &str) {
    if !EXPORTING.load(Ordering::Relaxed) {
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
