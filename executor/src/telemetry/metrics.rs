//! Every metric the executor exports, named once here with its help text, and the Prometheus
//! text rendering behind `GET /metrics`.

use std::sync::atomic::Ordering;
use std::sync::OnceLock;

use metrics::{describe_counter, describe_gauge, describe_histogram, Counter, Histogram, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::client::Stats;
use crate::senders::OutcomeClass;

/// Counter `{account, class}`: send attempts by sending account (empty for queue-routed
/// leases) and outcome class (ok, rate_limited, transient, permanent, account_unavailable).
pub const SEND_OUTCOMES: &str = "herald_send_outcomes_total";
/// Histogram: seconds from the send attempt's start to its outcome.
pub const SEND_DURATION: &str = "herald_send_duration_seconds";
/// Gauge: leases held (waiting for their sender or sending).
pub const IN_FLIGHT: &str = "herald_executor_in_flight";
/// Histogram: seconds a lease waited for its route's rate limiter and concurrency limit.
pub const RATE_LIMIT_WAIT: &str = "herald_rate_limit_wait_seconds";
/// Gauge: results not yet acknowledged by a scheduler.
pub const RESULTS_UNACKED: &str = "herald_executor_results_unacked";
/// Gauge: 1 while a lease stream is open.
pub const CONNECTED: &str = "herald_executor_connected";
/// Counter `{provider}`: webhook POSTs received from providers (WhatsApp status callbacks and
/// account events), before any check.
pub const CALLBACKS_RECEIVED: &str = "herald_callbacks_received_total";
/// Counter `{provider, reason}`: webhook POSTs refused: `signature` (bad or missing, 401),
/// `payload` (not a webhook body, 400), `unrecorded` (the scheduler did not record the
/// events, 503: the provider delivers them again) or `refused` (the scheduler refused the
/// events as invalid, acknowledged with 200 and dropped, since a redelivery would be refused too).
pub const CALLBACKS_REJECTED: &str = "herald_callbacks_rejected_total";
/// Counter `{provider, field, kind}`: webhook events the scheduler recorded, by the webhook's
/// field (`messages`, `account_update`, `phone_number_quality_update`, …) and kind (`sent`,
/// `delivered`, `read`, `failed`, `inbound`, `standing`, `paused`, `resumed`).
pub const CALLBACKS_APPLIED: &str = "herald_callbacks_applied_total";

const WAIT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide recorder (once; later calls return the same handle).
pub(crate) fn install() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(RATE_LIMIT_WAIT.into()), WAIT_BUCKETS)
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full(SEND_DURATION.into()), WAIT_BUCKETS)
            });
        let recorder = match builder {
            Ok(b) => b.build_recorder(),
            // Only reachable with an empty bucket list, which the constant above is not.
            Err(_) => PrometheusBuilder::new().build_recorder(),
        };
        let handle = recorder.handle();
        // Fails when another recorder is installed (several executors in one test process):
        // the first one's recorder then serves them all.
        let _ = metrics::set_global_recorder(recorder);
        describe_counter!(SEND_OUTCOMES, "Send attempts by account and outcome class.");
        describe_histogram!(SEND_DURATION, Unit::Seconds, "Time one send attempt took.");
        describe_gauge!(
            IN_FLIGHT,
            "Leases held (waiting for their sender or sending)."
        );
        describe_histogram!(
            RATE_LIMIT_WAIT,
            Unit::Seconds,
            "Time a lease waited for its route's rate limiter and concurrency limit."
        );
        describe_gauge!(
            RESULTS_UNACKED,
            "Results not yet acknowledged by a scheduler."
        );
        describe_gauge!(CONNECTED, "1 while a lease stream is open.");
        describe_counter!(CALLBACKS_RECEIVED, "Provider webhook POSTs received.");
        describe_counter!(
            CALLBACKS_REJECTED,
            "Provider webhook POSTs refused (bad signature, bad payload, not recorded)."
        );
        describe_counter!(
            CALLBACKS_APPLIED,
            "Provider webhook events recorded by the scheduler, by field and kind."
        );
        handle
    })
}

/// Renders every metric, after sampling the client's gauges.
pub(crate) fn render(stats: &Stats) -> String {
    let handle = install();
    metrics::gauge!(IN_FLIGHT).set(stats.in_flight.load(Ordering::Relaxed) as f64);
    metrics::gauge!(RESULTS_UNACKED).set(stats.unacked.load(Ordering::Relaxed) as f64);
    metrics::gauge!(CONNECTED).set(stats.connected.load(Ordering::Relaxed) as f64);
    handle.render()
}

/// The send metrics of one sending account (empty: queue-routed), their handles looked up once
/// per account instead of at every send: a lookup builds the labelled key, hashes it and takes
/// a registry shard's lock, which was several per cent of the executor's CPU in the S1 drain.
pub(crate) struct SendMetrics {
    account: String,
    /// One counter per outcome class, in [`class_index`] order, registered at its first use
    /// so that /metrics lists only the classes an account has seen.
    outcomes: [OnceLock<Counter>; CLASSES],
    rate_limit_wait: Histogram,
    send_duration: Histogram,
}

/// `None` (ok) and the four failure classes.
const CLASSES: usize = 5;

impl SendMetrics {
    /// Looks up the handles of `account`'s send metrics.
    pub(crate) fn new(account: &str) -> Self {
        SendMetrics {
            account: account.to_owned(),
            outcomes: Default::default(),
            rate_limit_wait: metrics::histogram!(RATE_LIMIT_WAIT),
            send_duration: metrics::histogram!(SEND_DURATION),
        }
    }

    /// Counts one send attempt's outcome.
    pub(crate) fn outcome(&self, class: Option<OutcomeClass>) {
        let index = class_index(class);
        self.outcomes[index]
            .get_or_init(|| {
                metrics::counter!(SEND_OUTCOMES, "account" => self.account.clone(), "class" => CLASS_LABELS[index])
            })
            .increment(1);
    }

    /// Observes how long a lease waited for its route's limits.
    pub(crate) fn waited(&self, seconds: f64) {
        self.rate_limit_wait.record(seconds);
    }

    /// Observes how long one send attempt took.
    pub(crate) fn sent(&self, seconds: f64) {
        self.send_duration.record(seconds);
    }
}

/// The label value of each outcome class, in [`class_index`] order.
const CLASS_LABELS: [&str; CLASSES] = [
    "ok",
    "rate_limited",
    "transient",
    "permanent",
    "account_unavailable",
];

/// Where an outcome class's counter and label sit in [`SendMetrics::outcomes`] and
/// [`CLASS_LABELS`].
fn class_index(class: Option<OutcomeClass>) -> usize {
    match class {
        None => 0,
        Some(OutcomeClass::RateLimited) => 1,
        Some(OutcomeClass::Transient) => 2,
        Some(OutcomeClass::Permanent) => 3,
        Some(OutcomeClass::AccountUnavailable) => 4,
    }
}
