//! The failover suite: real binaries on a real highly available PostgreSQL (pg_auto_failover:
//! monitor, primary, synchronous standby; [`HaCluster`]), with `DATABASE_URL` naming both
//! nodes, through
//! - a planned switchover mid-run;
//! - the primary SIGKILLed (keeper, server and backends: a machine dying) mid-run with 5,000
//!   tasks, a schedule firing every second and a campaign, on two scheduler replicas, with a
//!   client creating tasks during the outage;
//! - a failover while an executor is also SIGKILLed.
//!
//! Every run ends with the fault suite's check, over every task the database holds (the
//! schedule's and the campaign's included): none stuck leased, none lost (each that succeeded
//! reached the provider, and the provider saw no key the database does not hold), and each
//! repeat carries the same idempotency key and is explained by an attempt whose outcome never
//! reached the database. The runs also print the time from promotion (the moment the new
//! primary first took writes, on its clock) to the first lease it granted: `FAILOVER-SUMMARY`
//! lines, copied into docs/operations.md. That time is measured, not asserted; the assertion is
//! that leases are granted again at all.
//!
//! Each run expects the monitor to promote exactly once (the fault's). When a run fails on a
//! formation promoted more than once, pg_auto_failover failed over again on its own (a busy
//! machine's missed health checks) from a primary that was still asynchronous, which loses
//! commits it acknowledged whatever herald does: the run is void, says so, and runs once more
//! on a new formation ([`on_a_formation`]). The summary line names the promotions.
//!
//! The tests skip (saying so) when pg_auto_failover is not installed and `HERALD_REQUIRE_HA` is
//! unset; `script/test` installs it and sets it.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use chrono::{DateTime, Utc};
use herald_proto::v1::{
    campaign_service_client::CampaignServiceClient, content, retry_policy,
    schedule_service_client::ScheduleServiceClient, task_service_client::TaskServiceClient,
    AddRecipientsRequest, CampaignRecipient, CampaignSpec, Content, CreateCampaignRequest,
    CreateScheduleRequest, CreateTasksRequest, FixedDelays, MisfirePolicy, PauseScheduleRequest,
    RetryPolicy, ScheduleSpec, TaskSpec,
};
use herald_tests::{
    connect_tasks, task_spec, unique_id, ExecutorProcess, FakeProvider, Gate, HaCluster,
    ProviderMode, SchedulerProcess, TaskSpecExt, TestDb,
};
use tonic::transport::Channel;

const QUEUE: &str = "failover";
/// Upper bound for one run to finish; only a hang ever reaches it.
const RUN_WAIT: Duration = Duration::from_secs(240);
/// Lease TTL of the suite's schedulers: shorter than a failover, so leases whose outcome was
/// lost come back soon, but not so short that a busy machine's slow reports expire leases after
/// it (2 s did: thousands of repeats, all explained, and runs twice as long).
const LEASE_TTL: &str = "5s";
/// The webhook sender's signing key (the fake provider does not check signatures).
const SECRET: &str = "whsec_YW4gZXhhbXBsZSBzaWduaW5nIGtleSBvZiAzMiBiISE=";

async fn spawn_scheduler(
    cluster: &HaCluster,
    placeholder: &TestDb,
    name: &str,
) -> Result<SchedulerProcess> {
    SchedulerProcess::builder(placeholder)
        .env("DATABASE_URL", cluster.url())
        .env("HERALD_LEASE_TTL", LEASE_TTL)
        .name(name)
        .spawn()
        .await
}

async fn spawn_executor(
    endpoints: &[String],
    provider: &FakeProvider,
    id: &str,
) -> Result<ExecutorProcess> {
    ExecutorProcess::builder(endpoints)
        .config_toml(format!(
            "[queues.{QUEUE}]\nsender = \"webhook\"\nurl = \"{}/send\"\nsecret = \"{SECRET}\"\n",
            provider.url()
        ))
        .env("HERALD_EXECUTOR_ID", id)
        .env("HERALD_SHUTDOWN_GRACE", "2s")
        .name(id)
        .spawn()
        .await
}

/// How many formations one fault test may use: a second only when the first voided the run
/// ([`on_a_formation`]).
const FORMATIONS: usize = 2;

/// Runs `scenario` on a new formation. A failure on a formation the monitor promoted more than
/// once says nothing about herald: pg_auto_failover failed over again on its own, from a
/// primary just promoted and still asynchronous, which loses commits it acknowledged by design
/// ([`HaCluster::promotions`]). Such a run is void and runs once more on a new formation,
/// saying so on stderr. Any other failure is the test's, with the promotions named.
async fn on_a_formation(scenario: impl AsyncFn(&mut HaCluster) -> Result<()>) -> Result<()> {
    let mut formation = 1;
    loop {
        let Some(mut cluster) = HaCluster::start().await? else {
            return Ok(());
        };
        let Err(error) = scenario(&mut cluster).await else {
            return Ok(());
        };
        let promotions = cluster.promotions().await.unwrap_or_default();
        if promotions.len() > 1 && formation < FORMATIONS {
            eprintln!(
                "VOID RUN: the monitor promoted {} times ({promotions:?}); a failover from an \
                 asynchronous primary loses acknowledged commits, so the run says nothing \
                 about herald. Running it again on a new formation. It failed with: {error:#}",
                promotions.len()
            );
            formation += 1;
            continue;
        }
        return Err(error.context(format!("promotions the monitor ordered: {promotions:?}")));
    }
}

/// A fast fixed retry, and attempts enough that no fault here can use them up.
fn fault_spec(key: &str) -> TaskSpec {
    let mut spec = task_spec(QUEUE, "+15550100", "failover run")
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

/// Creates `n` keyed tasks in batches of 500. A batch refused as UNAVAILABLE (the database
/// is failing over; a commit may be in doubt) is sent again with the same keys, as a client
/// should: the keys make the repeat harmless.
async fn create_run(tasks: &mut TaskServiceClient<Channel>, n: usize) -> Result<usize> {
    let prefix = unique_id("k");
    let keys: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
    let mut refused = 0;
    for chunk in keys.chunks(500) {
        let deadline = tokio::time::Instant::now() + RUN_WAIT;
        loop {
            let specs = chunk.iter().map(|k| fault_spec(k)).collect();
            match tasks
                .create_tasks(CreateTasksRequest {
                    tasks: specs,
                    ..Default::default()
                })
                .await
            {
                Ok(_) => break,
                Err(s) if s.code() == tonic::Code::Unavailable => {
                    refused += 1;
                    ensure!(
                        tokio::time::Instant::now() < deadline,
                        "CreateTasks unavailable for {RUN_WAIT:?}: {s:?}"
                    );
                    // A client's retry pause, not synchronisation.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(s) => return Err(s).context("CreateTasks"),
            }
        }
    }
    Ok(refused)
}

/// Waits until nothing is leased, nothing due is waiting, and the campaign (if any) has sent
/// to every recipient. Reads through a new connection each time: the test's own connections
/// do not survive a failover either.
async fn settle(cluster: &HaCluster, campaign: Option<(uuid::Uuid, i64)>) -> Result<()> {
    let deadline = tokio::time::Instant::now() + RUN_WAIT;
    loop {
        let done = async {
            let conn = cluster.connect().await?;
            let open: i64 = conn
                .query_one(
                    // A scheduled task already due is a retry waiting its short backoff, or
                    // one not leased yet: the run is not over. Schedule runs created ahead of
                    // their fire time are not due yet; those of a paused schedule are open
                    // all the same: the materialiser made them up to half a second ahead,
                    // before the pause, and they will fire.
                    "SELECT count(*) AS n FROM herald.tasks t
                     WHERE t.state = 'leased'
                        OR (t.state = 'scheduled'
                            AND (t.run_at <= now()
                                 OR t.schedule_id IN (SELECT s.id FROM herald.schedules s
                                                      WHERE s.paused)))",
                    &[],
                )
                .await?
                .get("n");
            let campaign_left = match campaign {
                Some((id, recipients)) => {
                    let sent: i64 = conn
                        .query_one(
                            "SELECT count(*) AS n FROM herald.tasks
                             WHERE campaign_id = $1 AND state = 'succeeded'",
                            &[&id],
                        )
                        .await?
                        .get("n");
                    recipients - sent
                }
                None => 0,
            };
            anyhow::Ok((open, campaign_left))
        }
        .await;
        match done {
            Ok((0, 0)) => return Ok(()),
            Ok((open, left)) => ensure!(
                tokio::time::Instant::now() < deadline,
                "{open} tasks still leased or due, {left} campaign recipients unsent"
            ),
            // The cluster may still be failing over.
            Err(e) => ensure!(
                tokio::time::Instant::now() < deadline,
                "the cluster never came back: {e:#}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The figures of one run.
#[derive(Debug, Default)]
struct Summary {
    tasks: usize,
    succeeded: usize,
    not_due: usize,
    leased: usize,
    lost: usize,
    phantom: usize,
    repeats: usize,
    unexplained: usize,
    unreported_attempts: i64,
    promotion_to_first_lease: Option<f64>,
    promotions: usize,
    /// A few of the unexplained repeats, for the failure's message.
    unexplained_sample: Vec<String>,
}

/// Checks the suite's invariants over every task stored, and prints the run's summary line.
async fn check(
    cluster: &HaCluster,
    provider: &FakeProvider,
    fault: &str,
    promoted_at: DateTime<Utc>,
) -> Result<Summary> {
    let conn = cluster.connect().await?;
    let rows = conn
        .query(
            // The provider-facing key: the client's idempotency key, else the task id.
            "SELECT COALESCE(t.idempotency_key, t.id::text) AS key, t.state::text AS state,
                    t.state = 'scheduled' AND t.run_at > now() AS not_due,
                    count(a.task_id) FILTER (WHERE a.outcome IN (3, 6)) AS unreported
             FROM herald.tasks t LEFT JOIN herald.attempts a ON a.task_id = t.id
             GROUP BY t.id",
            &[],
        )
        .await?;
    let accepted: HashMap<String, usize> = provider.accepted();
    let mut summary = Summary {
        tasks: rows.len(),
        ..Summary::default()
    };
    let mut known = std::collections::HashSet::new();
    for row in &rows {
        let key: String = row.get("key");
        let state: String = row.get("state");
        let not_due: bool = row.get("not_due");
        let unreported: i64 = row.get("unreported");
        summary.unreported_attempts += unreported;
        match state.as_str() {
            "succeeded" => summary.succeeded += 1,
            "leased" => summary.leased += 1,
            _ if not_due => summary.not_due += 1,
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
                let line = format!(
                    "key {key} accepted {n} times under attempts {:?}, {unreported} unreported",
                    provider.accepted_attempts(&key)
                );
                eprintln!("unexplained repeat: {line}");
                if summary.unexplained_sample.len() < 3 {
                    summary.unexplained_sample.push(line);
                }
            }
        }
        known.insert(key);
    }
    summary.phantom = accepted.keys().filter(|k| !known.contains(*k)).count();
    summary.promotions = cluster.promotions().await?.len();
    if summary.unexplained > 0 {
        explain(&conn, &accepted).await?;
        for event in cluster.events().await? {
            eprintln!("monitor: {event}");
        }
    }
    summary.promotion_to_first_lease = conn
        .query_one(
            "SELECT extract(epoch FROM min(l) - $1)::float8 AS seconds FROM (
                 SELECT leased_at AS l FROM herald.tasks WHERE leased_at >= $1
                 UNION ALL SELECT leased_at FROM herald.attempts WHERE leased_at >= $1) x",
            &[&promoted_at],
        )
        .await?
        .get("seconds");
    println!(
        "FAILOVER-SUMMARY fault=\"{fault}\" tasks={} succeeded={} not_yet_due={} \
         stuck_leased={} lost={} repeated_deliveries={} unexplained_repeats={} \
         unreported_attempts={} promotion_to_first_lease_s={} promotions={}",
        summary.tasks,
        summary.succeeded,
        summary.not_due,
        summary.leased,
        summary.lost,
        summary.repeats,
        summary.unexplained,
        summary.unreported_attempts,
        summary
            .promotion_to_first_lease
            .map_or("none".to_owned(), |s| format!("{s:.2}")),
        summary.promotions,
    );
    ensure!(summary.leased == 0, "tasks stuck leased: {summary:?}");
    ensure!(summary.lost == 0, "tasks lost: {summary:?}");
    ensure!(
        summary.phantom == 0,
        "the provider saw keys the database does not hold (a create acknowledged and lost?): \
         {summary:?}"
    );
    ensure!(summary.unexplained == 0, "unexplained repeats: {summary:?}");
    ensure!(
        summary.succeeded + summary.not_due == summary.tasks,
        "not every task succeeded: {summary:?}"
    );
    if summary.promotion_to_first_lease.is_none() {
        let row = conn
            .query_one(
                "SELECT min(leased_at)::text, max(leased_at)::text,
                        (SELECT max(leased_at)::text FROM herald.attempts), now()::text
                 FROM herald.tasks",
                &[],
            )
            .await?;
        anyhow::bail!(
            "no lease was granted after the promotion at {promoted_at}: leases from {:?} to \
             {:?}, attempts' latest {:?}, now {:?}; {summary:?}",
            row.get::<_, Option<String>>(0),
            row.get::<_, Option<String>>(1),
            row.get::<_, Option<String>>(2),
            row.get::<_, Option<String>>(3),
        );
    }
    Ok(summary)
}

/// Prints the history of a few tasks whose repeats no attempt explains, to debug a failure.
async fn explain(conn: &tokio_postgres::Client, accepted: &HashMap<String, usize>) -> Result<()> {
    let rows = conn
        .query(
            "SELECT COALESCE(t.idempotency_key, t.id::text) AS key, t.lease_count, t.attempts,
                    t.state::text AS state, t.executor_id,
                    (SELECT string_agg(format('#%s %s outcome=%s at %s', a.attempt, a.executor_id,
                                              a.outcome, a.leased_at), '; ' ORDER BY a.attempt)
                     FROM herald.attempts a WHERE a.task_id = t.id) AS history
             FROM herald.tasks t",
            &[],
        )
        .await?;
    let mut shown = 0;
    for row in &rows {
        let key: String = row.get("key");
        let n = accepted.get(&key).copied().unwrap_or(0);
        let history: Option<String> = row.get("history");
        if n > 1 && shown < 5 {
            shown += 1;
            eprintln!(
                "key {key}: accepted {n}, lease_count {}, attempts {}, state {}, executor {:?}, \
                 history: {}",
                row.get::<_, i32>("lease_count"),
                row.get::<_, i32>("attempts"),
                row.get::<_, String>("state"),
                row.get::<_, Option<String>>("executor_id"),
                history.unwrap_or_default()
            );
        }
    }
    Ok(())
}

/// A run whose sends are held at the provider from a third of it on (taken, not yet
/// answered) until `gate` opens: one scheduler on `cluster`, an executor per name in
/// `executors`, and `total` keyed tasks created.
struct HeldRun {
    _placeholder: TestDb,
    scheduler: SchedulerProcess,
    provider: FakeProvider,
    gate: Gate,
    executors: Vec<ExecutorProcess>,
}

impl HeldRun {
    async fn start(cluster: &HaCluster, total: usize, executors: &[&str]) -> Result<Self> {
        let placeholder = TestDb::new().await?;
        let scheduler = spawn_scheduler(cluster, &placeholder, "scheduler").await?;
        let provider = FakeProvider::start().await?;
        let gate = Gate::new();
        provider.set_mode(ProviderMode::HoldAfter(total / 3, gate.clone()));
        let endpoints = [scheduler.grpc_url()];
        let mut spawned = Vec::new();
        for name in executors {
            spawned.push(spawn_executor(&endpoints, &provider, name).await?);
        }
        let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
        create_run(&mut tasks, total).await?;
        provider.wait_for_accepted(total / 3, RUN_WAIT).await?;
        Ok(Self {
            _placeholder: placeholder,
            scheduler,
            provider,
            gate,
            executors: spawned,
        })
    }

    /// Answers every send from now on, the held ones first.
    fn let_go(&self) {
        self.provider.set_mode(ProviderMode::Accept);
        self.gate.release();
    }
}

#[tokio::test]
async fn a_planned_switchover_mid_run_loses_nothing() -> Result<()> {
    const TOTAL: usize = 2_000;
    on_a_formation(async |cluster: &mut HaCluster| {
        // The held sends keep the executors' slots full, so the rest of the run is leased by
        // the new primary however long the old one takes to drain.
        let run = HeldRun::start(cluster, TOTAL, &["one", "two"]).await?;
        let old = cluster.primary().await?;
        let promotion = cluster.watch_promotion(&cluster.other(&old)?)?;
        let (new, promoted_at) = tokio::join!(cluster.switchover(), async {
            let promoted_at = promotion.await;
            run.let_go();
            promoted_at
        });
        let (new, promoted_at) = (new?, promoted_at??);
        ensure!(new != old, "the switchover kept {old} primary");
        settle(cluster, None).await?;
        let summary = check(cluster, &run.provider, "planned switchover", promoted_at).await?;
        ensure!(summary.tasks == TOTAL, "{} tasks stored", summary.tasks);
        Ok(())
    })
    .await
}

/// A schedule firing every second to two recipients, catching up what a failover misses.
fn every_second(id: &str) -> ScheduleSpec {
    ScheduleSpec {
        id: id.into(),
        cron: "* * * * * *".into(),
        time_zone: "UTC".into(),
        misfire: MisfirePolicy::CatchUp as i32,
        queue: QUEUE.into(),
        recipients: vec!["ops-a".into(), "ops-b".into()],
        content: Some(Content {
            body: Some(content::Body::Text("heartbeat".into())),
            ..Default::default()
        }),
        max_attempts: Some(100),
        ..Default::default()
    }
}

/// Fire time (epoch seconds) → tasks of each run of schedule `id`.
async fn schedule_runs(cluster: &HaCluster, id: &str) -> Result<BTreeMap<i64, i64>> {
    let conn = cluster.connect().await?;
    let rows = conn
        .query(
            "SELECT extract(epoch FROM r.fire_time)::bigint AS fire_time,
                    (SELECT count(*) FROM herald.tasks t
                     WHERE t.schedule_id = r.schedule_id AND t.fire_time = r.fire_time) AS tasks
             FROM herald.schedule_runs r WHERE r.schedule_id = $1",
            &[&id],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get("fire_time"), r.get("tasks")))
        .collect())
}

#[tokio::test]
async fn the_primary_sigkilled_with_five_thousand_tasks_a_schedule_and_a_campaign_loses_nothing(
) -> Result<()> {
    const TOTAL: usize = 5_000;
    const DURING: usize = 500;
    const RECIPIENTS: usize = 500;
    on_a_formation(async |cluster: &mut HaCluster| {
        let placeholder = TestDb::new().await?;
        // Two replicas: the materialiser's leadership (a session advisory lock) and every LISTEN
        // registration die with the primary and must be taken again on the new one.
        let a = spawn_scheduler(cluster, &placeholder, "scheduler-a").await?;
        let b = spawn_scheduler(cluster, &placeholder, "scheduler-b").await?;
        let provider = FakeProvider::start().await?;
        provider.set_mode(ProviderMode::AcceptSlowly(Duration::from_millis(5)));
        let _one = spawn_executor(&[a.grpc_url(), b.grpc_url()], &provider, "one").await?;
        let _two = spawn_executor(&[b.grpc_url(), a.grpc_url()], &provider, "two").await?;

        let mut schedules = ScheduleServiceClient::connect(a.grpc_url()).await?;
        schedules
            .create_schedule(CreateScheduleRequest {
                schedule: Some(every_second("heartbeat")),
            })
            .await?;
        let mut campaigns = CampaignServiceClient::connect(b.grpc_url()).await?;
        let campaign_id = campaigns
            .create_campaign(CreateCampaignRequest {
                campaign: Some(CampaignSpec {
                    name: "failover".into(),
                    queue: QUEUE.into(),
                    content: Some(Content {
                        body: Some(content::Body::Text("announcement".into())),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                recipients: vec![],
                ..Default::default()
            })
            .await?
            .into_inner()
            .id;
        let recipients: Vec<CampaignRecipient> = (0..RECIPIENTS)
            .map(|i| CampaignRecipient {
                recipient: format!("member-{i}"),
                ..Default::default()
            })
            .collect();
        campaigns
            .add_recipients(AddRecipientsRequest {
                campaign_id: campaign_id.clone(),
                recipients,
            })
            .await?;
        let mut tasks = connect_tasks(&a.grpc_url()).await?;
        create_run(&mut tasks, TOTAL).await?;

        provider.wait_for_accepted(TOTAL / 3, RUN_WAIT).await?;
        let promotion = cluster.watch_promotion(&cluster.other(&cluster.primary().await?)?)?;
        let killed_at = Utc::now();
        cluster.kill_primary().await?;
        // A client keeps creating through the outage, retrying refused batches with their keys.
        let mut creator = connect_tasks(&b.grpc_url()).await?;
        let creating = tokio::spawn(async move { create_run(&mut creator, DURING).await });
        let promoted_at = promotion.await??;
        let refused = creating.await??;

        // The schedule fires on the new primary (a replica took the leadership again) before it
        // is paused, so the run set is final.
        let resumed = promoted_at.timestamp() + 2;
        let deadline = tokio::time::Instant::now() + RUN_WAIT;
        while !schedule_runs(cluster, "heartbeat")
            .await
            .is_ok_and(|r| r.keys().any(|t| *t >= resumed))
        {
            ensure!(
                tokio::time::Instant::now() < deadline,
                "the schedule never fired after the failover"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        schedules
            .pause_schedule(PauseScheduleRequest {
                id: "heartbeat".into(),
            })
            .await?;
        let campaign: uuid::Uuid = campaign_id.parse()?;
        settle(cluster, Some((campaign, RECIPIENTS as i64))).await?;
        let summary = check(
            cluster,
            &provider,
            "primary SIGKILL (5,000 tasks, schedule, campaign)",
            promoted_at,
        )
        .await?;
        println!(
            "FAILOVER-TIMING kill_to_promotion_s={:.2} creates_refused_and_retried={refused}",
            (promoted_at - killed_at).num_milliseconds() as f64 / 1000.0
        );
        // What an operator sees once it is over: both replicas serving, the database writable.
        for replica in [&a, &b] {
            let metrics = herald_tests::metrics::scrape(&replica.http_url()).await?;
            ensure!(
                herald_tests::metrics::series(&metrics, "herald_database_writable", "")
                    == Some(1.0),
                "a replica does not see a writable database after the failover"
            );
            let mut health = herald_tests::connect_health(&replica.grpc_url()).await?;
            let status = health
                .check(tonic_health::pb::HealthCheckRequest {
                    service: String::new(),
                })
                .await?
                .into_inner()
                .status();
            ensure!(
                status == tonic_health::pb::health_check_response::ServingStatus::Serving,
                "a replica's health is {status:?} after the failover"
            );
        }

        // Each fire time once, none missed across the failover, each run with both recipients.
        let runs = schedule_runs(cluster, "heartbeat").await?;
        let times: Vec<i64> = runs.keys().copied().collect();
        ensure!(
            times.windows(2).all(|w| w[1] - w[0] == 1),
            "a fire time was missed: {times:?}"
        );
        ensure!(runs.values().all(|n| *n == 2), "runs: {runs:?}");
        let conn = cluster.connect().await?;
        let keyed: i64 = conn
            .query_one(
                "SELECT count(*) AS n FROM herald.tasks
             WHERE schedule_id IS NULL AND campaign_id IS NULL",
                &[],
            )
            .await?
            .get("n");
        ensure!(
            keyed == (TOTAL + DURING) as i64,
            "{keyed} client tasks stored, {} created",
            TOTAL + DURING
        );
        ensure!(summary.tasks >= TOTAL + DURING + RECIPIENTS, "{summary:?}");
        Ok(())
    })
    .await
}

#[tokio::test]
async fn a_failover_while_an_executor_is_killed_loses_nothing() -> Result<()> {
    const TOTAL: usize = 1_000;
    on_a_formation(async |cluster: &mut HaCluster| {
        // The kills land between the provider's acceptance of the held sends and their stored
        // reports, and the rest of the run is leased by the new primary, however fast a busy
        // or an idle machine gets through the first third (sends answered after 20 ms let a
        // whole run finish before the kill).
        let mut run = HeldRun::start(cluster, TOTAL, &["steady", "victim"]).await?;
        let promotion = cluster.watch_promotion(&cluster.other(&cluster.primary().await?)?)?;
        let victim = run.executors.last_mut().context("no victim")?;
        victim.kill()?;
        cluster.kill_primary().await?;
        victim.wait().await?;
        let promoted_at = promotion.await??;
        run.let_go();
        let endpoints = [run.scheduler.grpc_url()];
        let _replacement = spawn_executor(&endpoints, &run.provider, "replacement").await?;
        settle(cluster, None).await?;
        let summary = check(
            cluster,
            &run.provider,
            "primary SIGKILL + executor SIGKILL",
            promoted_at,
        )
        .await?;
        ensure!(summary.tasks == TOTAL, "{} tasks stored", summary.tasks);
        Ok(())
    })
    .await
}
