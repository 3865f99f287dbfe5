//! One lease's worker: wait for the route's sender, send, turn the outcome into an
//! `AttemptResult`.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use futures::FutureExt as _;

use herald_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tower::{Service, ServiceExt};
use tracing::{debug, error, warn, Instrument as _};

use super::inflight::{LeaseKey, SharedPhase};
use crate::senders::{BoxSender, OutcomeClass, SendError, SendReceipt, SendRequest};
use crate::telemetry::metrics::SendMetrics;

/// Longest error text the scheduler keeps.
const MAX_ERROR_BYTES: usize = 4096;

/// A worker's end: the result to report, or `None` when the lease was stopped before sending.
#[derive(Debug)]
pub(crate) struct Done {
    pub(crate) key: LeaseKey,
    pub(crate) result: Option<pb::AttemptResult>,
}

/// What a worker is given.
pub(crate) struct Job {
    pub(crate) key: LeaseKey,
    pub(crate) queue: String,
    /// The request, or the PERMANENT error that stops it before any sender sees it. Boxed:
    /// a send's future holds its job at every level it passes through, and an unboxed request
    /// made that future about 6 KB, copied per lease on the loop that reads every lease
    /// (docs/performance.md).
    pub(crate) request: Result<(BoxSender, Box<SendRequest>), SendError>,
    pub(crate) phase: SharedPhase,
    pub(crate) cancel: CancellationToken,
    /// The sending account (the lease's `account_id`; empty when routed by queue).
    pub(crate) account: String,
    /// That account's send metrics.
    pub(crate) metrics: Arc<SendMetrics>,
    /// The lease's W3C `traceparent`: the send span joins that trace.
    pub(crate) traceparent: String,
    /// Not before: a paced send (the lease's `send_after` from its arrival).
    pub(crate) send_at: Option<tokio::time::Instant>,
}

pub(crate) async fn run(job: Job, done: mpsc::UnboundedSender<Done>) {
    let span = tracing::info_span!(
        "send",
        task_id = %job.key.task_id,
        attempt = job.key.attempt,
        queue = %job.queue,
        account = %job.account,
    );
    crate::telemetry::set_parent_from(&span, &job.traceparent);
    run_in_span(job, done).instrument(span).await;
}

async fn run_in_span(job: Job, done: mpsc::UnboundedSender<Done>) {
    let key = job.key.clone();
    // A sender that panics must not take its lease with it: without this the worker's end is
    // never heard, the lease stays in flight and is extended for as long as the process lives.
    // Whether the message went out is unknown, so nothing is reported: the lease runs out, as
    // when an executor dies mid-send, and the scheduler treats it the same way (an idempotency
    // key on the resend; a WhatsApp send waits for a status callback first).
    let result = match AssertUnwindSafe(send(job)).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => {
            error!(
                panic = panic_message(panic.as_ref()),
                "the sender panicked; the lease is left to run out, unreported"
            );
            None
        }
    };
    if result.is_none() {
        debug!("lease stopped or abandoned before a result; no report");
    }
    // The receiver lives as long as the executor; if it is gone we are exiting anyway.
    let _ = done.send(Done { key, result });
}

async fn send(job: Job) -> Option<pb::AttemptResult> {
    let (mut sender, request) = match job.request {
        Ok(pair) => pair,
        Err(error) => {
            if !job.phase.start_sending() {
                return None;
            }
            warn!(error = %error.message, "lease cannot be sent");
            job.metrics.outcome(Some(error.class));
            return Some(result(&job.key, SystemTime::now(), Err(error)));
        }
    };
    // A paced send waits for its instant, unless the lease is stopped first.
    if let Some(at) = job.send_at {
        tokio::select! {
            biased;
            () = job.cancel.cancelled() => return None,
            () = tokio::time::sleep_until(at) => {}
        }
    }
    // Pending: wait until the route accepts one more send, unless the lease is stopped first.
    let waiting_since = Instant::now();
    let ready = tokio::select! {
        biased;
        () = job.cancel.cancelled() => return None,
        ready = sender.ready() => ready.map(|_| ()),
    };
    if !job.phase.start_sending() {
        return None;
    }
    job.metrics.waited(waiting_since.elapsed().as_secs_f64());
    let started_at = SystemTime::now();
    let started = Instant::now();
    let outcome = match ready {
        Ok(()) => sender.call(*request).await,
        Err(error) => Err(error),
    };
    job.metrics.sent(started.elapsed().as_secs_f64());
    job.metrics.outcome(outcome.as_ref().err().map(|e| e.class));
    match &outcome {
        Ok(receipt) => debug!(provider_message_id = ?receipt.provider_message_id, "sent"),
        Err(error) => {
            warn!(class = %error.class, retry_after = ?error.retry_after, error = %error.message, "send failed")
        }
    }
    Some(result(&job.key, started_at, outcome))
}

/// The text a panic was raised with, when it was a string.
fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(not a string)")
}

fn result(
    key: &LeaseKey,
    started_at: SystemTime,
    outcome: Result<SendReceipt, SendError>,
) -> pb::AttemptResult {
    let mut out = pb::AttemptResult {
        task_id: key.task_id.clone(),
        attempt: key.attempt,
        started_at: Some(started_at.into()),
        ..Default::default()
    };
    match outcome {
        Ok(receipt) => {
            out.set_outcome(pb::OutcomeClass::Ok);
            out.provider_message_id = receipt.provider_message_id.unwrap_or_default();
            // An OK attempt can still have something to say (e.g. WeCom recipients rejected
            // while the others got the message); the wire's error text is where it is kept.
            out.error = truncate(receipt.note.unwrap_or_default(), MAX_ERROR_BYTES);
            // The content was refused and the window-closed fallback went instead: the
            // refusal is the attempt's error, so the task shows why the template was sent.
            if let Some(refusal) = receipt.window_closed {
                out.window_closed_fallback = true;
                out.error = truncate(refusal.message, MAX_ERROR_BYTES);
                out.error_code = refusal.code.unwrap_or_default();
            }
        }
        Err(error) => {
            out.set_outcome(error.class.to_proto());
            if error.class == OutcomeClass::RateLimited {
                out.set_rate_limit_scope(if error.recipient_scoped {
                    pb::RateLimitScope::Recipient
                } else {
                    pb::RateLimitScope::Account
                });
            }
            out.window_closed_fallback = error.window_closed_fallback;
            out.outcome_unknown = error.outcome_unknown;
            out.error = truncate(error.message, MAX_ERROR_BYTES);
            out.error_code = error.code.unwrap_or_default();
            out.retry_after = error
                .retry_after
                .and_then(|d| prost_types::Duration::try_from(d).ok());
        }
    }
    out
}

/// Cuts `s` to at most `max` bytes on a character boundary.
pub(crate) fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future `f` returns, without making one.
    fn future_size<A, B, F>(_f: fn(A, B) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Every lease spawns one of these and the session loop copies it into its task: it was
    /// about 6 KB while the job held its request unboxed (docs/performance.md).
    #[test]
    fn a_send_future_stays_small() {
        let size = future_size(run as fn(_, _) -> _);
        assert!(size <= 2048, "a send's future is {size} bytes");
    }

    /// A sender that panics mid-send: the worker still ends, so the lease leaves the in-flight
    /// table (and is no longer extended), and it reports nothing, since whether the message
    /// went out is unknown. A unit test with a panicking service: no real sender panics on any
    /// input once its panics are fixed, so none can stand in for one.
    #[tokio::test]
    async fn a_panicking_sender_ends_its_worker_without_a_report() {
        use super::super::inflight::InFlight;
        use crate::senders::Content;

        let key = LeaseKey {
            task_id: "task-1".into(),
            attempt: 1,
        };
        let mut inflight = InFlight::default();
        let (phase, cancel) = inflight.insert(key.clone(), tokio::time::Instant::now());
        let panicking: BoxSender =
            tower::util::BoxCloneService::new(tower::service_fn(|_req: SendRequest| async move {
                if true {
                    panic!("a bug in a sender");
                }
                Ok::<SendReceipt, SendError>(SendReceipt::default())
            }));
        let request = SendRequest {
            task_id: key.task_id.clone(),
            attempt: 1,
            queue: "q".into(),
            recipient: "+15550001".into(),
            content: Content::Text("hello".into()),
            idempotency_key: "k".into(),
            labels: Default::default(),
            run_at: None,
            leased_at: None,
            attempts_before: 0,
            max_attempts: 3,
            account_id: String::new(),
            credentials_ref: String::new(),
            window_closed_fallback: None,
        };
        let job = Job {
            key: key.clone(),
            queue: "q".into(),
            request: Ok((panicking, Box::new(request))),
            phase,
            cancel,
            account: String::new(),
            metrics: Arc::new(SendMetrics::new("")),
            traceparent: String::new(),
            send_at: None,
        };
        let (done_tx, mut done_rx) = mpsc::unbounded_channel();
        tokio::spawn(run(job, done_tx));
        let done = done_rx
            .recv()
            .await
            .expect("the worker ended without a Done");
        assert_eq!(done.key, key);
        assert!(
            done.result.is_none(),
            "a panicked send reported {:?}",
            done.result
        );
        assert!(inflight.remove(&done.key), "the lease was no longer held");
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("héllo".into(), 2), "h");
        assert_eq!(truncate("hello".into(), 10), "hello");
    }
}
