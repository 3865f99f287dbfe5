//! Logs (text or JSON on stderr) and OpenTelemetry traces over OTLP, set up the same way by
//! both services, and the W3C trace-context parsing both use to join one trace.
//!
//! Each service keeps what is its own in its `telemetry` module: the scheduler continues a
//! caller's trace and records lease grants, the executor parents its `send` span on the lease.

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

/// Installs the global subscriber: text or JSON logs on stderr filtered by `RUST_LOG` (default
/// `info`), and the OpenTelemetry layer (herald's spans at info and above, whatever `RUST_LOG`) when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (standard
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
            // Only herald's own spans, at info and above: library internals (h2, tonic) would
            // drown them. Its own filter, not RUST_LOG's: quieting the logs (RUST_LOG=warn)
            // must not switch off the spans every trace is made of.
            .with_filter(tracing_subscriber::filter::filter_fn(|m| {
                m.target().starts_with("herald") && *m.level() <= tracing::Level::INFO
            }))
    });
    // Ignored when a subscriber is already installed (tests embedding a service).
    let _ = tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
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

/// Whether [`init`] set up span export.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
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

/// Parses a `traceparent` (stored with a task, or carried on a lease) into a context to parent
/// spans on; None unless it is valid.
pub fn context_from_traceparent(traceparent: &str) -> Option<opentelemetry::Context> {
    let mut carrier = HashMap::with_capacity(1);
    carrier.insert("traceparent".to_string(), traceparent.to_string());
    context_from_carrier(&carrier)
}

/// Extracts the W3C trace context from `traceparent`/`tracestate` entries; None unless valid.
pub fn context_from_carrier(carrier: &HashMap<String, String>) -> Option<opentelemetry::Context> {
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
