//! A scriptable HTTP endpoint: records every request and answers from a queue of responses.
//!
//! Used directly as the target of the webhook sender, and as the base of provider fakes.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::body::Body;
use axum::extract::State;
use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::loopback_tls::LoopbackTls;

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// The HTTP method.
    pub method: Method,
    /// The path and query, as sent.
    pub path: String,
    /// Every header, as sent.
    pub headers: HeaderMap,
    /// The full body.
    pub body: Bytes,
    /// When the request arrived (before any scripted delay or hold).
    pub received_at: Instant,
}

impl RecordedRequest {
    /// The value of header `name`, if present and valid UTF-8.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }

    /// The body as UTF-8, lossily.
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Releases responses held with [`Response::hold_until`]. Cloning shares the same gate.
#[derive(Debug, Clone)]
pub struct Gate {
    released: Arc<watch::Sender<bool>>,
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        Self {
            released: Arc::new(watch::Sender::new(false)),
        }
    }

    /// Opens the gate: every response waiting on it (and any later one) is sent.
    pub fn release(&self) {
        self.released.send_replace(true);
    }

    /// Resolves once the gate is open.
    pub(crate) async fn wait(&self) {
        let mut released = self.released.subscribe();
        // Err means the sender is gone, which cannot happen while `self` holds it.
        let _ = released.wait_for(|open| *open).await;
    }
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

/// One scripted answer.
#[derive(Debug, Clone)]
pub struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Bytes,
    delay: Option<Duration>,
    gate: Option<Gate>,
}

impl Response {
    /// An empty response with status `status`.
    pub fn status(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: Bytes::new(),
            delay: None,
            gate: None,
        }
    }

    /// `200 OK`, the default answer.
    pub fn ok() -> Self {
        Self::status(200)
    }

    /// Adds a response header (for example `retry-after`).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    /// Answers only after `delay`: a slow provider, for timeout tests.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    /// Answers only once `gate` is released: holds a send in flight (for example to cancel a
    /// task mid-send) for exactly as long as the test needs.
    pub fn hold_until(mut self, gate: &Gate) -> Self {
        self.gate = Some(gate.clone());
        self
    }

    fn into_http(self) -> axum::response::Response {
        let mut builder = http::Response::builder()
            .status(StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR));
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        builder.body(Body::from(self.body)).unwrap_or_else(|error| {
            let mut response = axum::response::Response::new(Body::from(error.to_string()));
            *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            response
        })
    }
}

#[derive(Debug)]
struct Shared {
    requests: Mutex<Vec<RecordedRequest>>,
    script: Mutex<VecDeque<Response>>,
    fallback: Mutex<Response>,
    /// The number of recorded requests; waiters subscribe instead of polling.
    count: watch::Sender<usize>,
}

/// Locks a mutex, recovering the data if a panicking test poisoned it.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An HTTP server on `127.0.0.1:<ephemeral>` that records requests and answers from a script.
/// Stops when dropped.
#[derive(Debug)]
pub struct WebhookReceiver {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: JoinHandle<()>,
    /// Set when it serves https.
    tls: Option<LoopbackTls>,
}

impl WebhookReceiver {
    /// Starts the receiver; it answers 200 to everything until scripted otherwise.
    pub async fn start() -> Result<Self> {
        Self::start_with(None).await
    }

    /// Starts the receiver serving https with a certificate from a throwaway CA
    /// ([`Self::ca_file`]), as an endpoint herald reaches through its outbound guard must.
    pub async fn start_https() -> Result<Self> {
        Self::start_with(Some(LoopbackTls::new("webhook receiver")?)).await
    }

    async fn start_with(tls: Option<LoopbackTls>) -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the webhook receiver")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            requests: Mutex::new(Vec::new()),
            script: Mutex::new(VecDeque::new()),
            fallback: Mutex::new(Response::ok()),
            count: watch::Sender::new(0),
        });
        let router = axum::Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&shared));
        let server = match &tls {
            None => tokio::spawn(async move {
                let _ = axum::serve(listener, router).await;
            }),
            Some(tls) => tls.serve(
                listener,
                hyper::service::service_fn(move |request: hyper::Request<_>| {
                    let router = router.clone();
                    async move {
                        use tower::ServiceExt;
                        router.oneshot(request.map(axum::body::Body::new)).await
                    }
                }),
            ),
        };
        Ok(Self {
            addr,
            shared,
            server,
            tls,
        })
    }

    /// The base URL, as `http://127.0.0.1:PORT` (`https://` from [`Self::start_https`]); any
    /// path is accepted.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// `https://localhost:PORT`: a name that resolves to loopback (https receivers).
    pub fn url_by_name(&self) -> String {
        format!("https://localhost:{}", self.addr.port())
    }

    /// The PEM file of the CA that signed an https receiver's certificate.
    pub fn ca_file(&self) -> Option<&std::path::Path> {
        self.tls.as_ref().map(LoopbackTls::ca_file)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Queues answers for the next requests, in order; when they run out the default answer
    /// (200 unless changed with [`Self::set_default`]) is used.
    pub fn respond_with(&self, responses: Vec<Response>) {
        lock(&self.shared.script).extend(responses);
    }

    /// Changes the answer used when the script is empty.
    pub fn set_default(&self, response: Response) {
        *lock(&self.shared.fallback) = response;
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.requests).clone()
    }

    /// Waits until at least `n` requests have arrived and returns them all; fails after
    /// `timeout` saying how many came.
    pub async fn wait_for_requests(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<RecordedRequest>> {
        let mut count = self.shared.count.subscribe();
        let arrived = tokio::time::timeout(timeout, async {
            count.wait_for(|count| *count >= n).await.map(|_| ())
        })
        .await;
        match arrived {
            Ok(Ok(())) => Ok(self.requests()),
            Ok(Err(_)) => anyhow::bail!("webhook receiver stopped"),
            Err(_) => anyhow::bail!(
                "expected {n} webhook requests within {timeout:?}, got {}",
                *self.shared.count.borrow()
            ),
        }
    }

    /// How many requests arrived per `webhook-id` header: more than one for an id means the
    /// same message was delivered more than once (which the receiver may deduplicate).
    pub fn deliveries_by_webhook_id(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for request in lock(&self.shared.requests).iter() {
            if let Some(id) = request.header("webhook-id") {
                *counts.entry(id.to_owned()).or_insert(0) += 1;
            }
        }
        counts
    }
}

impl Drop for WebhookReceiver {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    request: axum::extract::Request,
) -> axum::response::Response {
    let received_at = Instant::now();
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let recorded = RecordedRequest {
        method: parts.method,
        path: parts
            .uri
            .path_and_query()
            .map(|pq| pq.as_str().to_owned())
            .unwrap_or_default(),
        headers: parts.headers,
        body,
        received_at,
    };
    let response = {
        let next = lock(&shared.script).pop_front();
        next.unwrap_or_else(|| lock(&shared.fallback).clone())
    };
    {
        let mut requests = lock(&shared.requests);
        requests.push(recorded);
        // Counted only after the request is visible, so a woken waiter finds it.
        shared.count.send_replace(requests.len());
    }
    if let Some(gate) = &response.gate {
        gate.wait().await;
    }
    if let Some(delay) = response.delay {
        tokio::time::sleep(delay).await;
    }
    response.into_http()
}
