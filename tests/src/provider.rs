//! A fake message provider that counts deliveries per idempotency key, for the fault suite.
//!
//! It is the target of the executor's webhook sender (which sends the task's provider-facing
//! key as `Idempotency-Key`). Every request is either *accepted* (the provider took the message:
//! a real provider would have delivered it) or *rejected* (429: nothing was delivered). The
//! suite's invariant is about acceptances: each key accepted once, repeats only where an
//! attempt's outcome never reached the scheduler.
//!
//! The answer is switched at run time ([`ProviderMode`]); waiters subscribe to counters instead
//! of polling.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context, Result};
use axum::extract::State;
use http::{HeaderMap, StatusCode};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::Gate;

/// How the provider answers the next requests.
#[derive(Debug, Clone)]
pub enum ProviderMode {
    /// Accept at once with 200.
    Accept,
    /// Accept (the message counts as delivered), but answer only after this delay: with a
    /// delay longer than the sender's timeout, the executor reports a TRANSIENT timeout for a
    /// message the provider did take.
    AcceptSlowly(Duration),
    /// Accept, but hold the answer until the gate opens: keeps sends in flight on purpose.
    AcceptAndHold(Gate),
    /// Reject with 429 and `Retry-After` (whole seconds): nothing is delivered.
    Throttle(u64),
    /// Accept; answer at once until this many acceptances in all, then hold each answer until
    /// the gate opens: stops a run part way without racing it from the test.
    HoldAfter(usize, Gate),
}

#[derive(Debug, Default)]
struct Counts {
    /// The `herald-attempt` header (the lease's fencing token) of each acceptance, per key:
    /// how many times each key was accepted, and under which tokens.
    accepted: HashMap<String, Vec<String>>,
    /// Rejections per key.
    rejected: HashMap<String, usize>,
}

#[derive(Debug)]
struct Shared {
    counts: Mutex<Counts>,
    mode: Mutex<ProviderMode>,
    /// Number of distinct keys accepted at least once.
    distinct: watch::Sender<usize>,
    /// Total acceptances, repeats included.
    accepted_total: watch::Sender<usize>,
    /// Total rejections.
    rejected_total: watch::Sender<usize>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The fake provider on `127.0.0.1:<ephemeral>`; stops when dropped.
#[derive(Debug)]
pub struct FakeProvider {
    addr: SocketAddr,
    shared: Arc<Shared>,
    server: JoinHandle<()>,
}

impl FakeProvider {
    /// Starts the provider, accepting everything.
    pub async fn start() -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the fake provider")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            counts: Mutex::new(Counts::default()),
            mode: Mutex::new(ProviderMode::Accept),
            distinct: watch::Sender::new(0),
            accepted_total: watch::Sender::new(0),
            rejected_total: watch::Sender::new(0),
        });
        let router = axum::Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&shared));
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(Self {
            addr,
            shared,
            server,
        })
    }

    /// The base URL, as `http://127.0.0.1:PORT`; any path is accepted.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Changes how the following requests are answered.
    pub fn set_mode(&self, mode: ProviderMode) {
        *lock(&self.shared.mode) = mode;
    }

    /// Acceptances per key so far.
    pub fn accepted(&self) -> HashMap<String, usize> {
        lock(&self.shared.counts)
            .accepted
            .iter()
            .map(|(key, attempts)| (key.clone(), attempts.len()))
            .collect()
    }

    /// The fencing tokens (`herald-attempt`) that `key` was accepted under, in order: two
    /// alike mean one grant reached the provider twice, or a grant was forgotten and made
    /// again under the same token.
    pub fn accepted_attempts(&self, key: &str) -> Vec<String> {
        lock(&self.shared.counts)
            .accepted
            .get(key)
            .cloned()
            .unwrap_or_default()
    }

    /// Total rejections so far.
    pub fn rejected_total(&self) -> usize {
        *self.shared.rejected_total.borrow()
    }

    /// Total acceptances so far, repeats included.
    pub fn accepted_total(&self) -> usize {
        *self.shared.accepted_total.borrow()
    }

    /// Waits until at least `n` distinct keys were accepted.
    pub async fn wait_for_distinct(&self, n: usize, timeout: Duration) -> Result<()> {
        wait_for(&self.shared.distinct, n, timeout, "distinct keys accepted").await
    }

    /// Waits until at least `n` acceptances (repeats included) happened.
    pub async fn wait_for_accepted(&self, n: usize, timeout: Duration) -> Result<()> {
        wait_for(&self.shared.accepted_total, n, timeout, "acceptances").await
    }

    /// Waits until at least `n` requests were rejected.
    pub async fn wait_for_rejected(&self, n: usize, timeout: Duration) -> Result<()> {
        wait_for(&self.shared.rejected_total, n, timeout, "rejections").await
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn wait_for(
    counter: &watch::Sender<usize>,
    n: usize,
    timeout: Duration,
    what: &str,
) -> Result<()> {
    let mut rx = counter.subscribe();
    let reached = tokio::time::timeout(timeout, async {
        rx.wait_for(|c| *c >= n).await.map(|_| ())
    })
    .await;
    match reached {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(_)) => anyhow::bail!("fake provider stopped"),
        Err(_) => anyhow::bail!(
            "expected {n} {what} within {timeout:?}, got {}",
            *counter.borrow()
        ),
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
) -> (StatusCode, [(&'static str, String); 1], &'static str) {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let mode = lock(&shared.mode).clone();
    if let ProviderMode::Throttle(seconds) = mode {
        let mut counts = lock(&shared.counts);
        *counts.rejected.entry(key).or_insert(0) += 1;
        shared.rejected_total.send_modify(|c| *c += 1);
        drop(counts);
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", seconds.to_string())],
            "slow down",
        );
    }
    let attempt = headers
        .get("herald-attempt")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("?")
        .to_owned();
    let total = {
        // Counted under the lock so the watched totals never go backwards.
        let mut counts = lock(&shared.counts);
        counts.accepted.entry(key).or_default().push(attempt);
        shared.distinct.send_replace(counts.accepted.len());
        shared.accepted_total.send_modify(|c| *c += 1);
        *shared.accepted_total.borrow()
    };
    match mode {
        ProviderMode::AcceptSlowly(delay) => tokio::time::sleep(delay).await,
        ProviderMode::AcceptAndHold(gate) => gate.wait().await,
        ProviderMode::HoldAfter(n, gate) if total > n => gate.wait().await,
        ProviderMode::Accept | ProviderMode::Throttle(_) | ProviderMode::HoldAfter(..) => {}
    }
    (
        StatusCode::OK,
        [("content-type", "text/plain".into())],
        "ok",
    )
}
