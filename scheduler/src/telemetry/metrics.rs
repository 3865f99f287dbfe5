//! Every metric the scheduler exports, named once here with its help text, and the Prometheus
//! text rendering behind `GET /metrics`.
//!
//! Hot-path rule: recording is a handle lookup and an atomic add. A lease batch looks its
//! histograms up once and observes every lease's lag in one loop, allocating nothing per task;
//! a report batch looks its counters up once per end state and lease count.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{LazyLock, OnceLock};
use std::time::Duration;

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

use crate::low_water::full_walk_spacing;
use crate::recent::Recent;
use crate::store::{Db, Store, StoreError};
use crate::tasks::model::{GrantedLease, TaskState};

/// Gauge `{state, queue}`: live tasks (SCHEDULED, LEASED) by state and queue, refreshed by
/// [`refresh_task_counts`].
pub const TASKS: &str = "herald_tasks";
/// Gauge `{queue}`: scheduled tasks due now and not parked behind a paused campaign: work that
/// should be going out, which `herald_tasks{state="scheduled"}` (future tasks too) cannot tell.
pub const TASKS_DUE: &str = "herald_tasks_due";
/// Histogram: seconds from a task's due time to its lease (`leased_at − run_at`).
pub const TRIGGER_LAG: &str = "herald_trigger_lag_seconds";
/// Histogram: seconds an account-routed task was due but held (the trigger lag of tasks that go
/// out through an account, whose limits are what usually holds them). Not the executor's
/// `herald_rate_limit_wait_seconds`, its own limiter's wait: one name for both mixed two
/// bucket sets and two meanings in any query over both services.
pub const ACCOUNT_HOLD: &str = "herald_account_hold_seconds";
/// Histogram `{state}`: leases a task took, observed when a report ends it.
pub const ATTEMPTS_PER_TASK: &str = "herald_attempts_per_task";
/// Counter `{loop}`: claims made by each kind of executor session claim loop (`main`,
/// `stragglers`; lease/dispatch.rs), empty ones included.
pub const CLAIMS: &str = "herald_claims_total";
/// Counter `{reason}`: calls refused by authentication or authorization: `missing` (no token),
/// `unknown` (a token no entry has), `role` (the token's roles do not allow the service),
/// `client_cert` (a lease stream without the client certificate mutual TLS requires), `rate` (the token's rate limit),
/// `namespace` (a namespace the token may not use), `host` (an anonymous HTTP request under a host
/// name another site could own: DNS rebinding).
pub const AUTH_REFUSED: &str = "herald_auth_refused_total";
/// Counter: leases that ran out before their executor reported (charged attempts).
pub const LEASE_EXPIRIES: &str = "herald_lease_expiries_total";
/// Counter: tasks that passed their deadline unsent and ended EXPIRED.
pub const DEADLINE_EXPIRIES: &str = "herald_deadline_expiries_total";
/// Counter `{state}`: tasks ended by executors' reports or by the sweep (lapsed leases, deadlines).
pub const TASKS_FINISHED: &str = "herald_tasks_finished_total";
/// Gauge `{state}`: database pool connections (`in_use`, `idle`, `max`) and callers `waiting`.
pub const DB_POOL: &str = "herald_db_pool_connections";
/// Gauge: 1 while the database watch reaches a PostgreSQL server that takes writes, else 0
/// (an outage, or a failover before the standby is promoted).
pub const DATABASE_WRITABLE: &str = "herald_database_writable";
/// Counter `{result}`: operator notifications delivered or failed (one per delivery try).
pub const NOTIFICATIONS: &str = "herald_notifications_total";
/// Gauge: notifications waiting in the outbox.
pub const NOTIFICATIONS_PENDING: &str = "herald_notifications_pending";
/// Gauge: an account's business-initiated conversations in the last 24 hours (its messaging
/// tier's use), by namespace and account.
pub const ACCOUNT_TIER_USED: &str = "herald_account_tier_used";
/// Gauge: an account's messaging tier limit (absent without a tier).
pub const ACCOUNT_TIER_LIMIT: &str = "herald_account_tier_limit";
/// Gauge: an account's health score, 0 to 1.
pub const ACCOUNT_HEALTH: &str = "herald_account_health";
/// Gauge: an account's sends today, in its time zone.
pub const ACCOUNT_TODAY: &str = "herald_account_sent_today";
/// Gauge: an account's daily cap today, warm-up included (absent without a cap).
pub const ACCOUNT_TODAY_CAP: &str = "herald_account_daily_cap";
/// Counter `{namespace, schedule_id}`: schedule runs still unfinished `overrun_after` past
/// their fire time.
pub const RUNS_OVERRAN: &str = "herald_schedule_runs_overran_total";
/// Counter: accounts whose in-flight count differed from their leases and was corrected.
pub const SLOTS_RECONCILED: &str = "herald_account_slots_reconciled_total";

/// Counter `{kind}`: provider events (webhooks forwarded by executors) the scheduler recorded,
/// by kind: delivery, standing, availability, inbound.
pub const PROVIDER_EVENTS: &str = "herald_provider_events_total";
/// Counter: of those, events that changed something (the rest repeated an earlier event or
/// named nothing herald knows).
pub const PROVIDER_EVENTS_APPLIED: &str = "herald_provider_events_applied_total";
/// Counter: recipients put on a suppression list by an opt-out reply.
pub const OPT_OUTS: &str = "herald_opt_outs_total";
/// Gauge `{table}`: the size on disk of herald's growing tables, indexes and TOAST included
/// (the history's summed over its partitions), read at each scrape.
pub const TABLE_BYTES: &str = "herald_table_bytes";
/// Gauge: seconds the oldest transaction on herald's database has been open, of those that keep
/// VACUUM from reclaiming dead rows (0 when none is), read at each scrape.
pub const OLDEST_TRANSACTION: &str = "herald_oldest_transaction_seconds";
/// Counter `{table, outcome}`: the compactor's rewrites of a hot table (`compacted`,
/// `held_back`: rewritten but most of its size kept) and those given up waiting for the table's
/// lock (`lock_busy`).
pub const COMPACTIONS: &str = "herald_compactions_total";

/// Seconds; from "on time" to "an hour late".
const LAG_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];
const ATTEMPT_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 7.0, 10.0, 15.0, 20.0, 50.0];

/// How often the task-count gauge is refreshed.
pub const TASK_COUNT_INTERVAL: Duration = Duration::from_secs(15);

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process-wide recorder (once; later calls return the same handle) and describes
/// every metric.
pub fn install() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(TRIGGER_LAG.into()), LAG_BUCKETS)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(ACCOUNT_HOLD.into()), LAG_BUCKETS))
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full(ATTEMPTS_PER_TASK.into()), ATTEMPT_BUCKETS)
            });
        let recorder = match builder {
            Ok(b) => b.build_recorder(),
            // Only reachable with an empty bucket list, which the constants above are not.
            Err(_) => PrometheusBuilder::new().build_recorder(),
        };
        let handle = recorder.handle();
        // Fails when another recorder is installed (an embedding process); /metrics then
        // renders nothing rather than failing.
        let _ = metrics::set_global_recorder(recorder);
        describe();
        handle
    })
}

fn describe() {
    describe_gauge!(TASKS, "Live tasks by state (scheduled, leased) and queue.");
    describe_gauge!(
        TASKS_DUE,
        "Scheduled tasks due now and not parked behind a paused campaign, by queue."
    );
    describe_gauge!(
        ACCOUNT_TIER_USED,
        "Business-initiated conversations an account opened in the last 24 hours."
    );
    describe_gauge!(ACCOUNT_TIER_LIMIT, "An account's messaging tier limit.");
    describe_gauge!(ACCOUNT_HEALTH, "An account's health score, 0 to 1.");
    describe_gauge!(ACCOUNT_TODAY, "An account's sends today, in its time zone.");
    describe_gauge!(
        ACCOUNT_TODAY_CAP,
        "An account's daily cap today, its warm-up ramp included."
    );
    describe_histogram!(
        TRIGGER_LAG,
        Unit::Seconds,
        "Time from a task's due time to its lease."
    );
    describe_histogram!(
        ACCOUNT_HOLD,
        Unit::Seconds,
        "Time account-routed tasks were due but held (mostly by account limits) before a lease."
    );
    describe_histogram!(
        ATTEMPTS_PER_TASK,
        "Leases a task took, observed when it ends by a report."
    );
    describe_counter!(
        CLAIMS,
        "Claims of due tasks by the session claim loop that made them (main, stragglers)."
    );
    describe_counter!(
        LEASE_EXPIRIES,
        "Leases that ran out before the executor reported."
    );
    describe_counter!(
        DEADLINE_EXPIRIES,
        "Tasks that passed their deadline unsent (EXPIRED)."
    );
    describe_counter!(
        TASKS_FINISHED,
        "Tasks ended by executors' reports or by the sweep, by state."
    );
    describe_gauge!(
        DB_POOL,
        "Database pool connections by state (in_use, idle, max) and callers waiting."
    );
    describe_gauge!(
        DATABASE_WRITABLE,
        "1 while the database watch reaches a PostgreSQL server that takes writes, else 0."
    );
    describe_counter!(
        NOTIFICATIONS,
        "Notification webhook deliveries by result (delivered, failed)."
    );
    describe_counter!(
        RUNS_OVERRAN,
        "Schedule runs still unfinished overrun_after past their fire time, by schedule."
    );
    describe_counter!(
        SLOTS_RECONCILED,
        "Accounts whose in-flight count differed from the leases they hold and was corrected."
    );
    describe_counter!(
        PROVIDER_EVENTS,
        "Provider webhook events recorded by the scheduler, by kind."
    );
    describe_counter!(
        PROVIDER_EVENTS_APPLIED,
        "Provider webhook events that changed something (not repeats, not unknown messages)."
    );
    describe_counter!(
        OPT_OUTS,
        "Recipients put on a suppression list by an opt-out reply."
    );
    describe_gauge!(
        NOTIFICATIONS_PENDING,
        "Notifications waiting in the outbox."
    );
    describe_gauge!(
        TABLE_BYTES,
        Unit::Bytes,
        "Size on disk of herald's growing tables, indexes and TOAST included."
    );
    describe_counter!(
        COMPACTIONS,
        "Rewrites of a hot table left mostly empty space, by table and outcome."
    );
    describe_gauge!(
        OLDEST_TRANSACTION,
        Unit::Seconds,
        "Age of the oldest open transaction on herald's database that holds VACUUM back."
    );
}

/// Counts a schedule run found unfinished past its overrun deadline.
pub fn run_overran(namespace: &str, schedule_id: &str) {
    metrics::counter!(RUNS_OVERRAN, "namespace" => namespace.to_owned(), "schedule_id" => schedule_id.to_owned())
        .increment(1);
}

/// Renders every metric in the Prometheus text format, after sampling the pool and the storage
/// figures and recounting live tasks when their count is older than a second.
pub async fn render(store: &Store) -> String {
    let handle = install();
    refresh_live_counts(store, SCRAPE_FRESHNESS).await;
    // Read at most once a second however often /metrics is scraped: unless protected, anyone
    // who reaches the port may scrape it.
    static STORAGE: Recent<()> = Recent::new(SCRAPE_FRESHNESS);
    STORAGE
        .get(|| async {
            if let Err(e) = refresh_storage(store).await {
                tracing::warn!(error = %e, "cannot read table sizes or transaction ages for metrics");
            }
        })
        .await;
    let status = store.pool_status();
    let in_use = status.size.saturating_sub(status.available);
    metrics::gauge!(DB_POOL, "state" => "in_use").set(in_use as f64);
    metrics::gauge!(DB_POOL, "state" => "idle").set(status.available as f64);
    metrics::gauge!(DB_POOL, "state" => "max").set(status.max_size as f64);
    metrics::gauge!(DB_POOL, "state" => "waiting").set(status.waiting as f64);
    handle.render()
}

/// Observes a granted batch: trigger lag for each lease and, for account-routed ones, the time
/// held. One histogram lookup per batch; no allocation per lease.
pub fn leases_granted(leases: &[GrantedLease]) {
    let lag = metrics::histogram!(TRIGGER_LAG);
    let held = metrics::histogram!(ACCOUNT_HOLD);
    for l in leases {
        let seconds = (l.leased_at - l.run_at).num_milliseconds().max(0) as f64 / 1000.0;
        lag.record(seconds);
        if l.account_id.is_some() {
            held.record(seconds);
        }
    }
}

/// Observes the tasks a report batch ended, each with the number of leases it took: one
/// handle lookup per end state in the batch, not one per task (the lookups hash the key and
/// took a few per cent of the scheduler's CPU in the S1 drain).
pub fn tasks_finished(finished: &[(TaskState, i32)]) {
    let mut by_state: BTreeMap<&'static str, BTreeMap<i32, usize>> = BTreeMap::new();
    for (state, leases) in finished {
        let Some(state) = end_state_name(*state) else {
            continue;
        };
        *by_state
            .entry(state)
            .or_default()
            .entry((*leases).max(0))
            .or_default() += 1;
    }
    for (state, by_leases) in by_state {
        let ended = u64::try_from(by_leases.values().sum::<usize>()).unwrap_or(u64::MAX);
        metrics::counter!(TASKS_FINISHED, "state" => state).increment(ended);
        // A report past the task's deadline ends it EXPIRED: its deadline passed unsent, as
        // the sweep's are.
        if state == "expired" {
            metrics::counter!(DEADLINE_EXPIRIES).increment(ended);
        }
        let attempts = metrics::histogram!(ATTEMPTS_PER_TASK, "state" => state);
        for (leases, n) in by_leases {
            attempts.record_many(f64::from(leases), n);
        }
    }
}

/// Counts one recorded batch of provider events: each by its kind, and how many applied.
pub fn provider_events<'a>(kinds: impl IntoIterator<Item = &'a str>, applied: u32) {
    for kind in kinds {
        metrics::counter!(PROVIDER_EVENTS, "kind" => kind.to_owned()).increment(1);
    }
    metrics::counter!(PROVIDER_EVENTS_APPLIED).increment(u64::from(applied));
}

/// Counts a recipient put on a suppression list by an opt-out reply.
pub fn opted_out() {
    metrics::counter!(OPT_OUTS).increment(1);
}

/// Counts a sweep's lapsed leases, the tasks it ended (`ended`, by state: a lapsed last
/// attempt, a lease past the task's deadline, a send a status proved) and the scheduled tasks
/// whose deadline passed: all of them end tasks as reports do, and a crash-looping executor
/// whose tasks run out of attempts this way must show in the failures.
pub fn swept(leases_expired: u64, ended: &[(TaskState, u64)], deadlines_passed: u64) {
    if leases_expired > 0 {
        metrics::counter!(LEASE_EXPIRIES).increment(leases_expired);
    }
    for (state, n) in ended {
        if let Some(state) = end_state_name(*state) {
            metrics::counter!(TASKS_FINISHED, "state" => state).increment(*n);
            if state == "expired" {
                metrics::counter!(DEADLINE_EXPIRIES).increment(*n);
            }
        }
    }
    if deadlines_passed > 0 {
        metrics::counter!(DEADLINE_EXPIRIES).increment(deadlines_passed);
        metrics::counter!(TASKS_FINISHED, "state" => "expired").increment(deadlines_passed);
    }
}

/// The label of an end state; None for a live one.
fn end_state_name(state: TaskState) -> Option<&'static str> {
    match state {
        TaskState::Succeeded => Some("succeeded"),
        TaskState::Failed => Some("failed"),
        TaskState::Cancelled => Some("cancelled"),
        TaskState::Expired => Some("expired"),
        _ => None,
    }
}

async fn live_task_counts(
    store: &Store,
) -> Result<Vec<crate::store::notifications::LiveCount>, StoreError> {
    store.conn().await?.notifications().live_task_counts().await
}

/// Whether the warning that other roles' transactions are out of sight was logged.
static WARNED_OUT_OF_SIGHT: AtomicBool = AtomicBool::new(false);

/// Sets [`TABLE_BYTES`] and [`OLDEST_TRANSACTION`]. Both are cheap whatever the tables hold
/// (file sizes and the server's list of sessions), so every scrape reads them afresh: a
/// transaction left open shows within one scrape.
async fn refresh_storage(store: &Store) -> Result<(), StoreError> {
    let conn = store.conn().await?;
    for (table, bytes) in conn.storage().table_sizes().await? {
        metrics::gauge!(TABLE_BYTES, "table" => table).set(bytes as f64);
    }
    let oldest = conn.storage().oldest_transaction().await?;
    metrics::gauge!(OLDEST_TRANSACTION).set(oldest.seconds);
    if !oldest.sees_every_role && !WARNED_OUT_OF_SIGHT.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "herald's database role is not a member of pg_read_all_stats: \
             herald_oldest_transaction_seconds sees only its own role's transactions \
             (docs/operations.md)"
        );
    }
    Ok(())
}

/// Counts one of the compactor's rewrites of `table` (or one given up), by `outcome`.
pub fn compacted(table: &str, outcome: &'static str) {
    metrics::counter!(COMPACTIONS, "table" => table.to_owned(), "outcome" => outcome).increment(1);
}

/// Counts accounts whose in-flight count the reconciler corrected.
pub fn slots_reconciled(n: u64) {
    metrics::counter!(SLOTS_RECONCILED).increment(n);
}

/// Sets the account gauges from the accounts' current figures.
async fn refresh_account_gauges(store: &Store) -> Result<(), crate::store::StoreError> {
    use crate::store::Db;
    for a in store.conn().await?.accounts().gauges().await? {
        let labels = [("namespace", a.namespace), ("account", a.id)];
        metrics::gauge!(ACCOUNT_TIER_USED, &labels).set(f64::from(a.tier_used));
        metrics::gauge!(ACCOUNT_HEALTH, &labels).set(a.health);
        metrics::gauge!(ACCOUNT_TODAY, &labels).set(f64::from(a.today_count));
        if let Some(limit) = a.tier_limit {
            metrics::gauge!(ACCOUNT_TIER_LIMIT, &labels).set(f64::from(limit));
        }
        if let Some(cap) = a.today_cap {
            metrics::gauge!(ACCOUNT_TODAY_CAP, &labels).set(f64::from(cap));
        }
    }
    Ok(())
}

/// Refreshes [`TASKS`] and the account gauges every `every` (by default
/// [`TASK_COUNT_INTERVAL`]) until `stop`, or every twenty times as long as the last count took
/// when that is longer.
///
/// Cost: one `GROUP BY state, queue` over live tasks only (SCHEDULED and LEASED, reached through
/// the partial indexes on those states while few tasks are live); finished tasks are counted by
/// [`TASKS_FINISHED`] instead. With a million live tasks that is about a third of a second of
/// one backend every 15 s per replica; with ten million, about three seconds every minute. It
/// runs without parallel workers (`herald.live_task_counts`), so it never takes every core from
/// the claims (docs/performance.md, S4).
///
/// While a transaction anywhere on the database holds an old snapshot, those partial indexes
/// keep an entry for every task that passed through the live states since, and the count visits
/// each one (S6 in docs/performance.md: 1.6 M buffers a count after minutes of it). Spacing the
/// counts by their own duration keeps the gauge to a twentieth of one connection's time then,
/// at the price of a staler gauge.
pub async fn refresh_task_counts(store: Store, every: Duration, stop: CancellationToken) {
    loop {
        let took = refresh_live_counts(&store, Duration::ZERO).await;
        if let Err(e) = refresh_account_gauges(&store).await {
            tracing::warn!(error = %e, "cannot read account figures for metrics");
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(full_walk_spacing(every, took)) => {}
        }
    }
}

/// How old the live task counts may be when /metrics is scraped: a scrape recounts when they
/// are older (or older than twenty times the last count's duration, as for the periodic
/// refresh), so tasks created since the last periodic refresh show at once.
const SCRAPE_FRESHNESS: Duration = Duration::from_secs(1);

/// The live counts' bookkeeping: the (state, queue) series set last time (a queue that
/// empties must read 0, not its last value), when they were counted and how long that took.
#[derive(Default)]
struct LiveCounts {
    seen: HashSet<(String, String)>,
    counted_at: Option<std::time::Instant>,
    took: Duration,
}

static LIVE_COUNTS: LazyLock<tokio::sync::Mutex<LiveCounts>> = LazyLock::new(Default::default);

/// Sets [`TASKS`] from a fresh count unless the last one is younger than `fresh_for`, or than
/// twenty times its own duration. One count at a time: concurrent scrapes wait for it and use
/// it. Returns how long the last count took.
async fn refresh_live_counts(store: &Store, fresh_for: Duration) -> Duration {
    let mut live = LIVE_COUNTS.lock().await;
    let fresh_for = if fresh_for.is_zero() {
        fresh_for
    } else {
        full_walk_spacing(fresh_for, live.took)
    };
    if live.counted_at.is_some_and(|at| at.elapsed() < fresh_for) {
        return live.took;
    }
    let started = std::time::Instant::now();
    let rows = match live_task_counts(store).await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(error = %e, "cannot count tasks for metrics");
            return live.took;
        }
    };
    live.took = started.elapsed();
    let now: HashSet<(String, String)> = rows
        .iter()
        .map(|r| (r.state.clone(), r.queue.clone()))
        .collect();
    for (state, queue) in live.seen.difference(&now) {
        metrics::gauge!(TASKS, "state" => state.clone(), "queue" => queue.clone()).set(0.0);
        if state == "scheduled" {
            metrics::gauge!(TASKS_DUE, "queue" => queue.clone()).set(0.0);
        }
    }
    // Present from the first scrape: a state no queue has a live task in reads 0 under the
    // empty queue label (0 adds nothing to a sum over queues).
    for state in ["scheduled", "leased"] {
        let empty = !now.iter().any(|(s, _)| s == state);
        if empty {
            metrics::gauge!(TASKS, "state" => state, "queue" => "").set(0.0);
        }
    }
    if !now.iter().any(|(s, _)| s == "scheduled") {
        metrics::gauge!(TASKS_DUE, "queue" => "").set(0.0);
    }
    for r in rows {
        if r.state == "scheduled" {
            metrics::gauge!(TASKS_DUE, "queue" => r.queue.clone()).set(r.due as f64);
        }
        metrics::gauge!(TASKS, "state" => r.state, "queue" => r.queue).set(r.tasks as f64);
    }
    live.seen = now;
    live.counted_at = Some(std::time::Instant::now());
    live.took
}
