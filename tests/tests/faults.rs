//! The fault suite: real binaries, real PostgreSQL, real gRPC, with faults injected mid-run —
//! executors SIGKILLed, a scheduler replica SIGKILLed or drained, PostgreSQL stopped and
//! started, a provider that times out or throttles, the network between an executor and its
//! scheduler cut for longer than the lease TTL, an executor's first endpoint behind a dead
//! link; and replicas racing on the same background work (lease sweeping, retention).
//!
//! Every run ends with the same check ([`settle_and_check`]):
//! - every task created is terminal (here: SUCCEEDED) or still scheduled; none is stuck LEASED;
//! - nothing is lost: every task that succeeded reached the provider, and the provider saw no
//!   key that was never created;
//! - each idempotency key was accepted by the provider once, except where an attempt's outcome
//!   never reached the database (the lease expired after a crash or cut, or the send timed
//!   out after the provider took it). Those repeats carry the same key, are counted, and each
//!   must be explained by such an attempt.
//!
//! Each run prints one `FAULT-SUMMARY` line (copied into docs/reliability.md); see them with
//! `cargo nextest run -p herald-tests --test faults --success-output immediate`.
//!
//! Synchronisation is by events: provider counters and health Watch streams are awaited,
//! process exits are waited for, and where the event is a database state (every task settled,
//! a victim holding leases, leases expired behind a cut, rows pruned) a loop re-reads it until
//! it holds, bounded only to fail a hang. No assertion is about time.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use herald_proto::v1::{
    retry_policy, task_service_client::TaskServiceClient, CreateTaskRequest, CreateTasksRequest,
    FixedDelays, RetryPolicy, TaskSpec,
};
use herald_tests::lease::ScriptedExecutor;
use herald_tests::{
    connect_health, connect_tasks, task_spec, unique_id, ExecutorBuilder, ExecutorProcess,
    FakeProvider, Gate, PgCluster, ProviderMode, SchedulerProcess, TaskSpecExt, TcpProxy, TestDb,
};
use tokio_stream::StreamExt;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::HealthCheckRequest;

const QUEUE: &str = "faults";
/// Upper bound for one run to finish; only a hang ever reaches it.
const RUN_WAIT: Duration = Duration::from_secs(240);
/// Upper bound for one awaited event.
const EVENT_WAIT: Duration = Duration::from_secs(60);
/// Lease TTL of the suite's schedulers: short, so crashed executors' work comes back soon.
const LEASE_TTL: &str = "2s";
/// The webhook sender's signing key (the fake provider does not check signatures).
const SECRET: &str = "whsec_YW4gZXhhbXBsZSBzaWduaW5nIGtleSBvZiAzMiBiISE=";

/// Executor configuration sending queue `faults` to `provider`, with extra queue settings.
fn provider_config(provider: &FakeProvider, extra: &str) -> String {
    format!(
        "[queues.{QUEUE}]\nsender = \"webhook\"\nurl = \"{}/send\"\nsecret = \"{SECRET}\"\n{extra}",
        provider.url()
    )
}

/// An executor named `id` sending queue `faults` to `provider`, not yet started.
fn executor(
    endpoints: &[String],
    provider: &FakeProvider,
    id: &str,
    extra: &str,
) -> ExecutorBuilder {
    ExecutorProcess::builder(endpoints)
        .config_toml(provider_config(provider, extra))
        .env("HERALD_EXECUTOR_ID", id)
        .env("HERALD_SHUTDOWN_GRACE", "2s")
        .name(id)
}

async fn spawn_executor(
    endpoints: &[String],
    provider: &FakeProvider,
    id: &str,
    extra: &str,
) -> Result<ExecutorProcess> {
    executor(endpoints, provider, id, extra).spawn().await
}

/// A fast fixed retry, and attempts enough that no fault here can use them up.
fn fault_spec(key: &str) -> TaskSpec {
    let mut spec = task_spec(QUEUE, "+15550100", "fault run")
        .with_idempotency_key(key)
        .with_max_attempts(100);
    spec.retry_policy = Some(RetryPolicy {
        strategy: Some(retry_policy::Strategy::Delays(FixedDelays {
            delays: vec![prost_types::Duration {
                seconds: 0,
                nanos: 100_000_000,
            }],
        })),
    });
    spec
}

/// Creates `n` tasks in batches, each with its own idempotency key; returns the keys.
async fn create_run(
    tasks: &mut TaskServiceClient<Channel>,
    n: usize,
    keys: &mut Vec<String>,
) -> Result<()> {
    let prefix = unique_id("k");
    let start = keys.len();
    let new: Vec<String> = (start..start + n)
        .map(|i| format!("{prefix}-{i}"))
        .collect();
    for chunk in new.chunks(500) {
        let specs = chunk.iter().map(|k| fault_spec(k)).collect();
        tasks
            .create_tasks(CreateTasksRequest {
                tasks: specs,
                ..Default::default()
            })
            .await
            .context("CreateTasks")?;
    }
    keys.extend(new);
    Ok(())
}

/// The figures of one run.
#[derive(Debug, Default)]
struct Summary {
    tasks: usize,
    succeeded: i64,
    failed: i64,
    scheduled: i64,
    leased: i64,
    lost: usize,
    phantom: usize,
    repeats: usize,
    unexplained: usize,
    unreported_attempts: i64,
}

/// Waits until no task is leased or scheduled, then checks the suite's invariants and prints the
/// run's summary line.
async fn settle_and_check(
    conn: &tokio_postgres::Client,
    provider: &FakeProvider,
    keys: &[String],
    fault: &str,
    faults: usize,
) -> Result<Summary> {
    settle(conn, provider, keys).await?;
    check(conn, provider, keys, fault, faults).await
}

/// Waits until every key reached the provider and no task is leased or scheduled any more.
async fn settle(
    conn: &tokio_postgres::Client,
    provider: &FakeProvider,
    keys: &[String],
) -> Result<()> {
    provider.wait_for_distinct(keys.len(), RUN_WAIT).await?;
    let deadline = tokio::time::Instant::now() + RUN_WAIT;
    loop {
        let open: i64 = conn
            .query_one(
                // Every task of the suite is due at once, so a scheduled one is a retry
                // waiting its (short) backoff: the run is not over yet.
                "SELECT count(*) FROM herald.tasks WHERE state IN ('leased', 'scheduled')",
                &[],
            )
            .await?
            .get(0);
        if open == 0 {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "{open} tasks still leased or scheduled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Checks the suite's invariants on a settled run and prints its summary line.
async fn check(
    conn: &tokio_postgres::Client,
    provider: &FakeProvider,
    keys: &[String],
    fault: &str,
    faults: usize,
) -> Result<Summary> {
    let rows = conn
        .query(
            "SELECT t.idempotency_key, t.state::text,
                    count(a.task_id) FILTER (WHERE a.outcome IN (3, 6))
             FROM herald.tasks t LEFT JOIN herald.attempts a ON a.task_id = t.id
             GROUP BY t.id",
            &[],
        )
        .await?;
    let accepted = provider.accepted();
    let mut summary = Summary {
        tasks: keys.len(),
        ..Summary::default()
    };
    ensure!(rows.len() == keys.len(), "{} tasks stored", rows.len());
    let mut known = std::collections::HashSet::new();
    for row in &rows {
        let key: String = row.get(0);
        let state: String = row.get(1);
        let unreported: i64 = row.get(2);
        summary.unreported_attempts += unreported;
        match state.as_str() {
            "succeeded" => summary.succeeded += 1,
            "failed" => summary.failed += 1,
            "scheduled" => summary.scheduled += 1,
            "leased" => summary.leased += 1,
            _ => {}
        }
        let n = accepted.get(&key).copied().unwrap_or(0);
        if state == "succeeded" && n == 0 {
            summary.lost += 1;
        }
        if n > 1 {
            summary.repeats += n - 1;
            if (n - 1) as i64 > unreported {
                summary.unexplained += 1;
                eprintln!("unexplained repeat: key {key} accepted {n} times, {unreported} unreported attempts");
            }
        }
        known.insert(key);
    }
    summary.phantom = accepted.keys().filter(|k| !known.contains(*k)).count();
    println!(
        "FAULT-SUMMARY fault=\"{fault}\" tasks={} faults_injected={faults} succeeded={} failed={} \
         still_scheduled={} stuck_leased={} lost={} repeated_deliveries={} \
         unexplained_repeats={} unreported_attempts={}",
        summary.tasks,
        summary.succeeded,
        summary.failed,
        summary.scheduled,
        summary.leased,
        summary.lost,
        summary.repeats,
        summary.unexplained,
        summary.unreported_attempts,
    );
    ensure!(summary.leased == 0, "tasks stuck leased: {summary:?}");
    ensure!(summary.lost == 0, "tasks lost: {summary:?}");
    ensure!(
        summary.phantom == 0,
        "provider saw unknown keys: {summary:?}"
    );
    ensure!(summary.unexplained == 0, "unexplained repeats: {summary:?}");
    ensure!(
        summary.succeeded as usize == keys.len(),
        "not every task succeeded: {summary:?}"
    );
    Ok(summary)
}

/// The database clock: lease times are stamped with it.
async fn db_now(conn: &tokio_postgres::Client) -> Result<std::time::SystemTime> {
    Ok(conn.query_one("SELECT herald.now()", &[]).await?.get(0))
}

/// Waits until `executor` holds at least one lease granted after `since`: leases of an earlier
/// process with the same id, not yet expired, do not count.
async fn holding_leases(
    conn: &tokio_postgres::Client,
    executor: &str,
    since: std::time::SystemTime,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + EVENT_WAIT;
    loop {
        let held: i64 = conn
            .query_one(
                "SELECT count(*) FROM herald.tasks
                 WHERE state = 'leased' AND executor_id = $1 AND leased_at > $2",
                &[&executor, &since],
            )
            .await?
            .get(0);
        if held > 0 {
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "{executor} never held a lease"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn an_executor_sigkilled_twenty_times_during_five_thousand_tasks_loses_nothing() -> Result<()>
{
    const TOTAL: usize = 5_000;
    const KILLS: usize = 20;
    /// Acceptances answered at once between one kill and the hold before the next.
    const STEP: usize = 100;
    /// Both executors' credit. Each round takes at most `STEP` plus both credits of fresh
    /// tasks, so 20 rounds leave well over a thousand for the victim's last life: it always
    /// finds work to lease, however fast the steady executor runs while the test is not looking.
    const IN_FLIGHT: &str = "32";
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_LEASE_TTL", LEASE_TTL)
        .spawn()
        .await?;
    let provider = FakeProvider::start().await?;
    // After each round's acceptances every answer is held: the victim is killed holding sends
    // the provider took but that were never reported, and it cannot run out of work first.
    let mut gate = Gate::new();
    provider.set_mode(ProviderMode::HoldAfter(STEP, gate.clone()));
    let endpoints = [scheduler.grpc_url()];
    let spawn = |id: &'static str| {
        executor(&endpoints, &provider, id, "")
            .env("HERALD_MAX_IN_FLIGHT", IN_FLIGHT)
            .spawn()
    };
    let conn = db.connect().await?;
    let _steady = spawn("steady").await?;
    let mut life_began = db_now(&conn).await?;
    let mut victim = spawn("victim").await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let mut keys = Vec::new();
    create_run(&mut tasks, TOTAL, &mut keys).await?;

    let mut hold_after = STEP;
    for kill in 1..=KILLS {
        provider
            .wait_for_accepted(hold_after, RUN_WAIT)
            .await
            .with_context(|| format!("before kill {kill}"))?;
        holding_leases(&conn, "victim", life_began)
            .await
            .with_context(|| format!("before kill {kill}"))?;
        victim.kill()?;
        victim.wait().await?;
        life_began = db_now(&conn).await?;
        // The next hold is armed before this one lets go, so no round runs unbounded.
        hold_after = provider.accepted_total() + STEP;
        let next = Gate::new();
        provider.set_mode(ProviderMode::HoldAfter(hold_after, next.clone()));
        std::mem::replace(&mut gate, next).release();
        victim = spawn("victim").await?;
    }
    provider.set_mode(ProviderMode::Accept);
    gate.release();
    settle_and_check(&conn, &provider, &keys, "executor SIGKILL", KILLS).await?;
    Ok(())
}

#[tokio::test]
async fn one_of_two_schedulers_sigkilled_mid_run_loses_nothing() -> Result<()> {
    const TOTAL: usize = 2_000;
    let db = TestDb::new().await?;
    let mut a = SchedulerProcess::builder(&db)
        .env("HERALD_LEASE_TTL", LEASE_TTL)
        .name("scheduler-a")
        .spawn()
        .await?;
    let b = SchedulerProcess::builder(&db)
        .env("HERALD_LEASE_TTL", LEASE_TTL)
        .name("scheduler-b")
        .spawn()
        .await?;
    let provider = FakeProvider::start().await?;
    provider.set_mode(ProviderMode::AcceptSlowly(Duration::from_millis(20)));
    // One executor starts on each replica; both know both.
    let _one = spawn_executor(&[a.grpc_url(), b.grpc_url()], &provider, "one", "").await?;
    let _two = spawn_executor(&[b.grpc_url(), a.grpc_url()], &provider, "two", "").await?;
    let mut tasks = connect_tasks(&b.grpc_url()).await?;
    let mut keys = Vec::new();
    create_run(&mut tasks, TOTAL, &mut keys).await?;

    provider.wait_for_accepted(TOTAL / 3, RUN_WAIT).await?;
    a.kill()?;
    a.wait().await?;
    let conn = db.connect().await?;
    settle_and_check(&conn, &provider, &keys, "scheduler SIGKILL (1 of 2)", 1).await?;
    Ok(())
}

#[tokio::test]
async fn a_draining_scheduler_sends_its_executors_to_the_other_replica_at_once() -> Result<()> {
    const TOTAL: usize = 50;
    let db = TestDb::new().await?;
    // A long grace and a long TTL: replica A can only exit early because its executor left on
    // Drain, and the held sends can only succeed on B through their original leases.
    let mut a = SchedulerProcess::builder(&db)
        .env("HERALD_SHUTDOWN_GRACE", "10m")
        .name("scheduler-a")
        .spawn()
        .await?;
    let b = SchedulerProcess::builder(&db)
        .name("scheduler-b")
        .spawn()
        .await?;
    let provider = FakeProvider::start().await?;
    let gate = Gate::new();
    provider.set_mode(ProviderMode::AcceptAndHold(gate.clone()));
    let _executor = spawn_executor(&[a.grpc_url(), b.grpc_url()], &provider, "mover", "").await?;
    let mut tasks = connect_tasks(&b.grpc_url()).await?;
    let mut keys = Vec::new();
    create_run(&mut tasks, TOTAL, &mut keys).await?;
    // Every task is leased through A and held mid-send.
    provider.wait_for_accepted(TOTAL, EVENT_WAIT).await?;

    a.terminate()?;
    let status = a.wait().await?;
    ensure!(status.success(), "replica A exited with {status}");
    gate.release();

    let conn = db.connect().await?;
    settle_and_check(&conn, &provider, &keys, "scheduler drain (SIGTERM)", 1).await?;
    // Each task took one lease and one attempt: the reports made on B were accepted under the
    // leases A granted.
    let row = conn
        .query_one(
            "SELECT count(*) FILTER (WHERE lease_count <> 1),
                    (SELECT count(*) FROM herald.attempts WHERE outcome <> 1)
             FROM herald.tasks",
            &[],
        )
        .await?;
    let (released, failed_attempts): (i64, i64) = (row.get(0), row.get(1));
    ensure!(released == 0, "{released} tasks were leased twice");
    ensure!(failed_attempts == 0, "{failed_attempts} attempts not OK");
    Ok(())
}

/// Opens a health Watch stream on `service`.
async fn watch_health(
    url: &str,
    service: &str,
) -> Result<tonic::Streaming<tonic_health::pb::HealthCheckResponse>> {
    let mut health = connect_health(url).await?;
    Ok(health
        .watch(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await?
        .into_inner())
}

/// Reads a Watch stream until it reports `want`.
async fn until_status(
    stream: &mut tonic::Streaming<tonic_health::pb::HealthCheckResponse>,
    want: ServingStatus,
) -> Result<()> {
    tokio::time::timeout(EVENT_WAIT, async {
        while let Some(update) = stream.next().await {
            if update?.status() == want {
                return Ok(());
            }
        }
        anyhow::bail!("health stream ended before {want:?}")
    })
    .await
    .with_context(|| format!("no {want:?} within {EVENT_WAIT:?}"))?
}

#[tokio::test]
async fn postgres_restarted_mid_run_turns_health_not_serving_and_everything_recovers() -> Result<()>
{
    const BEFORE: usize = 1_000;
    const AFTER: usize = 200;
    // A cluster of this test's own: the shared one serves other tests and must stay up.
    let cluster = PgCluster::start().await?;
    let placeholder = TestDb::new().await?;
    let scheduler = SchedulerProcess::builder(&placeholder)
        .env("DATABASE_URL", cluster.url())
        .env("HERALD_LEASE_TTL", LEASE_TTL)
        .spawn()
        .await?;
    let provider = FakeProvider::start().await?;
    provider.set_mode(ProviderMode::AcceptSlowly(Duration::from_millis(10)));
    let executor = spawn_executor(&[scheduler.grpc_url()], &provider, "survivor", "").await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let mut keys = Vec::new();
    create_run(&mut tasks, BEFORE, &mut keys).await?;

    let services = [
        "",
        "herald.v1.TaskService",
        "herald.v1.LeaseService",
        "herald.v1.StatsService",
        "herald.v1.AccountService",
    ];
    let mut watches = Vec::new();
    for service in services {
        let mut stream = watch_health(&scheduler.grpc_url(), service).await?;
        until_status(&mut stream, ServingStatus::Serving).await?;
        watches.push(stream);
    }

    provider.wait_for_accepted(BEFORE / 3, RUN_WAIT).await?;
    cluster.stop().await?;
    for (service, stream) in services.iter().zip(watches.iter_mut()) {
        until_status(stream, ServingStatus::NotServing)
            .await
            .with_context(|| format!("service {service:?}"))?;
    }
    let http = reqwest::Client::new();
    // The probe's answer is reused for a second (a flood of probes costs one connection).
    let readyz = format!("{}/readyz", scheduler.http_url());
    herald_tests::until("readyz to answer 503 during the outage", || async {
        Ok(http.get(&readyz).send().await?.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE)
    })
    .await?;
    let refused = tasks
        .create_task(CreateTaskRequest {
            task: Some(fault_spec(&unique_id("outage"))),
        })
        .await
        .err()
        .context("CreateTask succeeded without a database")?;
    ensure!(
        refused.code() == tonic::Code::Unavailable,
        "CreateTask during the outage answered {refused:?}"
    );
    // A new lease stream is refused, so an executor would try another replica at once.
    let stream_refused = ScriptedExecutor::connect_once(&scheduler.grpc_url(), "latecomer", &[], 1)
        .await
        .err()
        .context("a lease stream opened without a database")?;
    let stream_status = stream_refused
        .chain()
        .find_map(|e| e.downcast_ref::<tonic::Status>())
        .with_context(|| format!("not a gRPC status: {stream_refused:#}"))?;
    ensure!(
        stream_status.code() == tonic::Code::Unavailable,
        "Lease during the outage answered {stream_status:?}"
    );
    // Both processes are still up and answering.
    let executor_health = http
        .get(format!("{}/healthz", executor.http_url()))
        .send()
        .await?;
    ensure!(
        executor_health.status().is_success(),
        "executor not healthy"
    );
    let scheduler_live = http
        .get(format!("{}/healthz", scheduler.http_url()))
        .send()
        .await?;
    ensure!(scheduler_live.status().is_success(), "scheduler not live");

    cluster.resume().await?;
    for (service, stream) in services.iter().zip(watches.iter_mut()) {
        until_status(stream, ServingStatus::Serving)
            .await
            .with_context(|| format!("service {service:?}"))?;
    }
    herald_tests::until("readyz to answer 200 after the outage", || async {
        Ok(http.get(&readyz).send().await?.status().is_success())
    })
    .await?;
    // Leases flow again, to the executor that lived through the outage.
    create_run(&mut tasks, AFTER, &mut keys).await?;
    let conn = cluster.connect().await?;
    settle_and_check(&conn, &provider, &keys, "PostgreSQL restart", 1).await?;
    Ok(())
}

#[tokio::test]
async fn provider_timeouts_are_retried_with_the_same_key() -> Result<()> {
    const TOTAL: usize = 500;
    const SLOW: usize = 150;
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_LEASE_TTL", LEASE_TTL)
        .spawn()
        .await?;
    let provider = FakeProvider::start().await?;
    // The provider takes each message but answers after the sender has given up.
    provider.set_mode(ProviderMode::AcceptSlowly(Duration::from_secs(2)));
    let _executor = spawn_executor(
        &[scheduler.grpc_url()],
        &provider,
        "patient",
        "timeout = \"300ms\"\n",
    )
    .await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let mut keys = Vec::new();
    create_run(&mut tasks, TOTAL, &mut keys).await?;
    provider.wait_for_accepted(SLOW, RUN_WAIT).await?;
    provider.set_mode(ProviderMode::Accept);

    let conn = db.connect().await?;
    settle(&conn, &provider, &keys).await?;
    // Every TRANSIENT attempt here is a send the sender gave up on.
    let timeouts: i64 = conn
        .query_one(
            "SELECT count(*) FROM herald.attempts WHERE outcome = 3",
            &[],
        )
        .await?
        .get(0);
    ensure!(timeouts > 0, "no send timed out");
    check(
        &conn,
        &provider,
        &keys,
        "provider timeout",
        usize::try_from(timeouts)?,
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_provider_429_storm_delays_but_never_duplicates() -> Result<()> {
    const TOTAL: usize = 500;
    const STORM: usize = 1_500;
    let db = TestDb::new().await?;
    // Nothing crashes here, so the suite's short TTL would only let a loaded machine expire
    // leases mid-send and turn them into (explained) repeats that this test is not about.
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_LEASE_TTL", "30s")
        .spawn()
        .await?;
    let provider = FakeProvider::start().await?;
    provider.set_mode(ProviderMode::Throttle(1));
    let _executor = spawn_executor(&[scheduler.grpc_url()], &provider, "throttled", "").await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let mut keys = Vec::new();
    create_run(&mut tasks, TOTAL, &mut keys).await?;
    provider.wait_for_rejected(STORM, RUN_WAIT).await?;
    provider.set_mode(ProviderMode::Accept);

    let conn = db.connect().await?;
    let rejected = provider.rejected_total();
    let summary = settle_and_check(&conn, &provider, &keys, "provider 429 storm", rejected).await?;
    ensure!(summary.repeats == 0, "a 429 is not a delivery: {summary:?}");
    let rate_limited: i64 = conn
        .query_one(
            "SELECT count(*) FROM herald.attempts WHERE outcome = 2",
            &[],
        )
        .await?
        .get(0);
    ensure!(rate_limited > 0, "no attempt recorded RATE_LIMITED");
    Ok(())
}

#[tokio::test]
async fn a_network_cut_longer_than_the_lease_ttl_loses_nothing() -> Result<()> {
    const TOTAL: usize = 1_000;
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_LEASE_TTL", LEASE_TTL)
        .env("HERALD_HEARTBEAT_INTERVAL", "1s")
        .spawn()
        .await?;
    let proxy = TcpProxy::start(scheduler.grpc_addr()).await?;
    let provider = FakeProvider::start().await?;
    // The cut-off executor's first sends are held at the provider: it surely holds leases
    // (and sends the provider took) when the network goes.
    let gate = Gate::new();
    provider.set_mode(ProviderMode::AcceptAndHold(gate.clone()));
    let _cut_off = spawn_executor(&[proxy.url()], &provider, "cut-off", "").await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let mut keys = Vec::new();
    create_run(&mut tasks, TOTAL, &mut keys).await?;
    provider.wait_for_accepted(1, EVENT_WAIT).await?;
    proxy.cut();
    provider.set_mode(ProviderMode::AcceptSlowly(Duration::from_millis(5)));
    let _direct = spawn_executor(&[scheduler.grpc_url()], &provider, "direct", "").await?;

    // The cut lasts until the scheduler has taken back the cut-off executor's leases: past
    // their TTL, without a report or an extension getting through.
    let conn = db.connect().await?;
    let deadline = tokio::time::Instant::now() + EVENT_WAIT;
    loop {
        let expired: i64 = conn
            .query_one(
                "SELECT count(*) FROM herald.attempts
                 WHERE outcome = 6 AND executor_id = 'cut-off'",
                &[],
            )
            .await?
            .get(0);
        if expired > 0 {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the cut-off executor's leases never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The held sends finish during the cut; their reports can only arrive late.
    gate.release();
    provider.wait_for_distinct(TOTAL, RUN_WAIT).await?;
    proxy.restore();

    settle_and_check(&conn, &provider, &keys, "network cut > lease TTL", 1).await?;
    Ok(())
}

#[tokio::test]
async fn three_replicas_sweep_and_prune_the_same_rows_once() -> Result<()> {
    const TOTAL: usize = 300;
    let db = TestDb::new().await?;
    let mut replicas = Vec::new();
    for name in ["replica-1", "replica-2", "replica-3"] {
        replicas.push(
            SchedulerProcess::builder(&db)
                .env("HERALD_LEASE_TTL", "1s")
                .name(name)
                .spawn()
                .await?,
        );
    }
    let endpoints: Vec<String> = replicas.iter().map(|r| r.grpc_url()).collect();
    let provider = FakeProvider::start().await?;
    let gate = Gate::new();
    provider.set_mode(ProviderMode::AcceptAndHold(gate.clone()));
    let mut doomed = spawn_executor(&endpoints, &provider, "doomed", "").await?;
    let mut tasks = connect_tasks(&endpoints[1]).await?;
    let mut keys = Vec::new();
    create_run(&mut tasks, TOTAL, &mut keys).await?;
    // The doomed executor dies holding sends the provider took: every replica's sweeper then
    // races for the same expired leases.
    provider.wait_for_accepted(1, EVENT_WAIT).await?;
    doomed.kill()?;
    doomed.wait().await?;
    gate.release();
    provider.set_mode(ProviderMode::Accept);
    let _survivor = spawn_executor(&endpoints, &provider, "survivor", "").await?;

    let conn = db.connect().await?;
    settle_and_check(
        &conn,
        &provider,
        &keys,
        "3 replicas sweeping, executor SIGKILL",
        1,
    )
    .await?;
    // Each expiry was charged once: a task's attempt counter equals its attempt rows (the
    // rows are unique per attempt, so a second sweeper would show as a counter ahead of them).
    let row = conn
        .query_one(
            "SELECT count(*) FILTER (WHERE t.attempts <> (SELECT count(*) FROM herald.attempts a
                                                          WHERE a.task_id = t.id)),
                    (SELECT count(*) FROM herald.attempts WHERE outcome = 6)
             FROM herald.tasks t",
            &[],
        )
        .await?;
    let (miscounted, expired): (i64, i64) = (row.get(0), row.get(1));
    ensure!(
        miscounted == 0,
        "{miscounted} tasks charged twice for one expiry"
    );
    ensure!(expired > 0, "no lease expired");

    // Retention on three more replicas, all pruning at once: every finished task goes once,
    // with its attempts, and its idempotency key stays for its own retention.
    for name in ["pruner-1", "pruner-2", "pruner-3"] {
        replicas.push(
            SchedulerProcess::builder(&db)
                .env("HERALD_TASK_RETENTION", "1s")
                .env("HERALD_RETENTION_INTERVAL", "1s")
                .name(name)
                .spawn()
                .await?,
        );
    }
    let deadline = tokio::time::Instant::now() + EVENT_WAIT;
    loop {
        let left: i64 = conn
            .query_one("SELECT count(*) FROM herald.tasks", &[])
            .await?
            .get(0);
        if left == 0 {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "{left} tasks never pruned"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let row = conn
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE forget_after IS NULL),
                    (SELECT count(*) FROM herald.attempts)
             FROM herald.idempotency_keys",
            &[],
        )
        .await?;
    let (kept, unset, attempts): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    ensure!(kept == TOTAL as i64, "{kept} idempotency keys kept");
    ensure!(unset == 0, "{unset} keys without a retention deadline");
    ensure!(attempts == 0, "{attempts} attempts of pruned tasks left");
    Ok(())
}

#[tokio::test]
async fn an_executor_moves_on_from_an_endpoint_behind_a_dead_link() -> Result<()> {
    const TOTAL: usize = 20;
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_LEASE_TTL", LEASE_TTL)
        .spawn()
        .await?;
    // The first endpoint accepts TCP connections and then never answers: the executor must
    // give up on it by itself and take the second.
    let proxy = TcpProxy::start(scheduler.grpc_addr()).await?;
    proxy.cut();
    let provider = FakeProvider::start().await?;
    let _executor = spawn_executor(
        &[proxy.url(), scheduler.grpc_url()],
        &provider,
        "stranded",
        "",
    )
    .await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let mut keys = Vec::new();
    create_run(&mut tasks, TOTAL, &mut keys).await?;
    let conn = db.connect().await?;
    settle_and_check(&conn, &provider, &keys, "first endpoint partitioned", 1).await?;
    Ok(())
}
