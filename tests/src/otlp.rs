//! A small OTLP trace receiver: speaks OTLP over HTTP/protobuf (`POST /v1/traces`, the body an
//! `ExportTraceServiceRequest`) and records every span with its service name, so tests can
//! assert on trace ids and parent links. Point a process at it with
//! `OTEL_EXPORTER_OTLP_ENDPOINT=<receiver.url()>`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// One received span, flattened.
#[derive(Debug, Clone)]
pub struct RecordedSpan {
    /// `service.name` of the resource that sent it.
    pub service: String,
    /// Span name.
    pub name: String,
    /// Trace id, hex.
    pub trace_id: String,
    /// Span id, hex.
    pub span_id: String,
    /// Parent span id, hex; empty for a root span.
    pub parent_span_id: String,
    /// String and integer attributes, as text.
    pub attributes: Vec<(String, String)>,
}

impl RecordedSpan {
    /// An attribute's value as text.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Stops when dropped.
#[derive(Debug)]
pub struct OtlpReceiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<RecordedSpan>>>,
    count: watch::Sender<usize>,
    server: JoinHandle<()>,
}

#[derive(Clone)]
struct Shared {
    spans: Arc<Mutex<Vec<RecordedSpan>>>,
    count: watch::Sender<usize>,
}

impl OtlpReceiver {
    /// Starts the receiver on an ephemeral loopback port.
    pub async fn start() -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the OTLP receiver")?;
        let addr = listener.local_addr()?;
        let shared = Shared {
            spans: Arc::new(Mutex::new(Vec::new())),
            count: watch::Sender::new(0),
        };
        let router = axum::Router::new()
            .route("/v1/traces", axum::routing::post(export))
            .with_state(shared.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(Self {
            addr,
            spans: shared.spans,
            count: shared.count,
            server,
        })
    }

    /// The endpoint for `OTEL_EXPORTER_OTLP_ENDPOINT` (the exporter appends `/v1/traces`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<RecordedSpan> {
        self.spans.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Waits until the received spans satisfy `done` and returns them; fails after `timeout`
    /// listing what arrived. Woken by each export, never by polling.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        done: impl Fn(&[RecordedSpan]) -> bool,
    ) -> Result<Vec<RecordedSpan>> {
        let mut count = self.count.subscribe();
        let result = tokio::time::timeout(timeout, async {
            loop {
                let spans = self.spans();
                if done(&spans) {
                    return Ok(spans);
                }
                if count.changed().await.is_err() {
                    anyhow::bail!("OTLP receiver stopped");
                }
            }
        })
        .await;
        match result {
            Ok(r) => r,
            Err(_) => {
                let names: Vec<String> = self
                    .spans()
                    .iter()
                    .map(|s| format!("{}:{}", s.service, s.name))
                    .collect();
                anyhow::bail!("spans not complete within {timeout:?}; got {names:?}")
            }
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn export(State(shared): State<Shared>, body: Bytes) -> (StatusCode, Vec<u8>) {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return (StatusCode::BAD_REQUEST, Vec::new());
    };
    let mut received = Vec::new();
    for rs in request.resource_spans {
        let service = rs
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
            .and_then(|a| a.value.as_ref())
            .and_then(|v| text(v.value.as_ref()))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for span in ss.spans {
                received.push(RecordedSpan {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent_span_id: hex::encode(&span.parent_span_id),
                    attributes: span
                        .attributes
                        .iter()
                        .filter_map(|a| {
                            let v = text(a.value.as_ref()?.value.as_ref())?;
                            Some((a.key.clone(), v))
                        })
                        .collect(),
                });
            }
        }
    }
    let n = received.len();
    shared
        .spans
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .extend(received);
    shared.count.send_modify(|c| *c += n);
    (
        StatusCode::OK,
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
}

fn text(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        Value::BoolValue(b) => Some(b.to_string()),
        Value::DoubleValue(d) => Some(d.to_string()),
        _ => None,
    }
}
