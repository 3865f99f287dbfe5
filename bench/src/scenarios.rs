//! The four scenarios. Each starts from a fresh database with its own scheduler (and executor),
//! so one scenario's leftovers cannot slow the next.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use herald_proto::v1::{task_spec, CreateTasksRequest, TaskSpec};
use herald_proto::SenderKind;
use herald_tests::{connect_tasks, task_spec, TestDb};
use tokio_postgres::Client;

use crate::cpu::CpuMeter;
use crate::pairs::{self, Side};
use crate::report::Report;
use crate::sql::{self, percentiles, QUEUE};
use crate::stack::{self, Pending, RssSampler};
use crate::Options;

/// Longest any scenario may wait for its tasks.
const WAIT_LIMIT: Duration = Duration::from_secs(600);
/// S1's target: the drain at 80 % of the same-run plain-SQL drain (#18).
const S1_TARGET: f64 = 0.8;
/// S2's target: creates at 60 % of the same-run `COPY` (#18).
const S2_TARGET: f64 = 0.6;

/// Creates `n` tasks through CreateTasks from `clients` concurrent clients, `batch` per call;
/// `when(i)` sets task i's due time (None: due now). Returns the elapsed time.
async fn create_via_api(
    url: &str,
    n: usize,
    clients: usize,
    batch: usize,
    when: Arc<dyn Fn(usize) -> Option<task_spec::When> + Send + Sync>,
) -> Result<Duration> {
    let clients = clients.max(1);
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        conns.push(connect_tasks(url).await?);
    }
    let started = Instant::now();
    let mut handles = Vec::with_capacity(clients);
    for (c, mut client) in conns.into_iter().enumerate() {
        let when = when.clone();
        handles.push(tokio::spawn(async move {
            // Client c takes batches c, c + clients, c + 2 * clients, ...
            let mut first = c * batch;
            while first < n {
                let last = (first + batch).min(n);
                let tasks: Vec<TaskSpec> = (first..last)
                    .map(|i| {
                        let mut spec =
                            task_spec(QUEUE, &format!("recipient-{i}"), "benchmark message");
                        spec.when = when(i);
                        spec
                    })
                    .collect();
                client
                    .create_tasks(CreateTasksRequest {
                        tasks,
                        ..Default::default()
                    })
                    .await
                    .context("CreateTasks")?;
                first += clients * batch;
            }
            anyhow::Ok(())
        }));
    }
    for h in handles {
        h.await??;
    }
    Ok(started.elapsed())
}

/// S1: tasks due now, created before the executor connects; tasks/s until all SUCCEEDED,
/// against the plain-SQL drain, in interleaved pairs. Returns herald's rate in the median pair.
pub(crate) async fn drain(opts: &Options, report: &mut Report) -> Result<f64> {
    let pairs = pairs::measure(
        opts.pairs,
        async || drain_herald(opts).await,
        async || drain_baseline(opts).await,
    )
    .await?;
    Ok(pairs::add(
        report,
        "S1 drain",
        "tasks/s",
        S1_TARGET,
        &format!(
            "S1: {} tasks; herald claims {} at a time, the baseline's {} workers {} at a time",
            opts.drain_tasks, opts.claim_batch, opts.baseline_workers, opts.baseline_batch
        ),
        &pairs,
    ))
}

/// S1's baseline: the plain-SQL drain, on a database of its own of the same cluster and schema.
async fn drain_baseline(opts: &Options) -> Result<Side> {
    let n = opts.drain_tasks;
    let base_db = TestDb::new().await?;
    drop(stack::scheduler(&base_db, opts).await?); // applies the migrations
    let base = sql::connect(base_db.url()).await?;
    sql::copy_tasks(&base, n, Duration::ZERO).await?;
    base.batch_execute("VACUUM ANALYZE herald.tasks").await?;
    let base_cpu = CpuMeter::new(&base, None).await?;
    let base_before = base_cpu.read(None)?;
    let rate = sql::baseline_drain(
        base_db.url(),
        opts.baseline_workers,
        i64::from(opts.baseline_batch),
        n,
    )
    .await?;
    let base_spent = base_cpu.read(None)?.since(base_before);
    Ok(Side {
        rate,
        note: format!(
            "{rate:.0} tasks/s (PostgreSQL CPU {:.2} core-s)",
            base_spent.postgres
        ),
        rows: Vec::new(),
    })
}

/// S1's herald side: the tasks created through CreateTasks, then drained by an executor.
async fn drain_herald(opts: &Options) -> Result<Side> {
    let n = opts.drain_tasks;
    let db = TestDb::new().await?;
    let scheduler = stack::scheduler(&db, opts).await?;
    let rss = RssSampler::start(stack::pid(&scheduler)?);
    create_via_api(&scheduler.grpc_url(), n, 4, 1000, Arc::new(|_| None)).await?;
    let client = db.connect().await?;
    client.batch_execute("VACUUM ANALYZE herald.tasks").await?;

    let cpu = CpuMeter::new(&client, Some(stack::pid(&scheduler)?)).await?;
    let cpu_before = cpu.read(None)?;
    let started = Instant::now();
    let executor = stack::executor(&scheduler, opts).await?;
    let spawn = started.elapsed();
    stack::wait_succeeded(
        &client,
        n as i64,
        Pending::DueWithin(Duration::ZERO),
        WAIT_LIMIT,
    )
    .await?;
    let wall = started.elapsed();
    let spent = cpu.read(executor.pid())?.since(cpu_before);
    // The drain itself, on the database clock: first grant to last completion.
    let window: f64 = client
        .query_one(
            "SELECT extract(epoch FROM max(finished_at) - min(leased_at))::float8
             FROM herald.tasks",
            &[],
        )
        .await?
        .get(0);
    stack::stop_executor(executor).await?;
    let rate = n as f64 / window;
    Ok(Side {
        rate,
        note: format!(
            "{rate:.0} tasks/s, drained in {window:.2} s (database clock; executor started in \
             {spawn:.2?}, wall {wall:.2?}; {})",
            spent.describe()
        ),
        rows: vec![
            (
                "tasks/s incl. executor start".into(),
                n as f64 / wall.as_secs_f64(),
                String::new(),
                None,
            ),
            (
                "scheduler peak RSS (MiB)".into(),
                rss.peak_mib(),
                "< 150 MiB".into(),
                Some(rss.peak_mib() < 150.0),
            ),
        ],
    })
}

/// S2: tasks/s through CreateTasks batches from concurrent clients, against COPY, in
/// interleaved pairs.
pub(crate) async fn enqueue(opts: &Options, report: &mut Report) -> Result<()> {
    let pairs = pairs::measure(
        opts.pairs,
        async || enqueue_herald(opts).await,
        async || enqueue_baseline(opts).await,
    )
    .await?;
    pairs::add(
        report,
        "S2 enqueue",
        "tasks/s",
        S2_TARGET,
        &format!(
            "S2: {} tasks by {} clients in batches of {}; the baseline {} concurrent COPYs",
            opts.enqueue_tasks, opts.enqueue_clients, opts.enqueue_batch, opts.enqueue_clients
        ),
        &pairs,
    );
    Ok(())
}

/// S2's baseline: concurrent `COPY` of the same number of tasks.
async fn enqueue_baseline(opts: &Options) -> Result<Side> {
    let base_db = TestDb::new().await?;
    drop(stack::scheduler(&base_db, opts).await?);
    let base = sql::connect(base_db.url()).await?;
    let base_cpu = CpuMeter::new(&base, None).await?;
    let base_before = base_cpu.read(None)?;
    let rate = sql::baseline_copy(base_db.url(), opts.enqueue_clients, opts.enqueue_tasks).await?;
    let base_spent = base_cpu.read(None)?.since(base_before);
    Ok(Side {
        rate,
        note: format!("{rate:.0} tasks/s ({})", base_spent.describe()),
        rows: Vec::new(),
    })
}

/// S2's herald side: the tasks through CreateTasks, due in an hour.
async fn enqueue_herald(opts: &Options) -> Result<Side> {
    let n = opts.enqueue_tasks;
    let db = TestDb::new().await?;
    let scheduler = stack::scheduler(&db, opts).await?;
    let rss = RssSampler::start(stack::pid(&scheduler)?);
    let conn = sql::connect(db.url()).await?;
    let cpu = CpuMeter::new(&conn, Some(stack::pid(&scheduler)?)).await?;
    let before = cpu.read(None)?;
    // Due in an hour: nothing is dispatched meanwhile, only the create path is measured.
    let when = Arc::new(|_| {
        Some(task_spec::When::Delay(prost_types::Duration {
            seconds: 3600,
            nanos: 0,
        }))
    });
    let elapsed = create_via_api(
        &scheduler.grpc_url(),
        n,
        opts.enqueue_clients,
        opts.enqueue_batch,
        when,
    )
    .await?;
    let spent = cpu.read(None)?.since(before);
    let rate = n as f64 / elapsed.as_secs_f64();
    Ok(Side {
        rate,
        note: format!("{rate:.0} tasks/s in {elapsed:.2?} ({})", spent.describe()),
        rows: vec![(
            "scheduler peak RSS (MiB)".into(),
            rss.peak_mib(),
            "< 150 MiB".into(),
            Some(rss.peak_mib() < 150.0),
        )],
    })
}

/// Lateness of the lease grant and of the send start against run_at, in ms, for every task
/// created at or after `since` (database clock) that succeeded: (grant, send start).
async fn lateness(client: &Client, since: SystemTime) -> Result<(Vec<f64>, Vec<f64>)> {
    let rows = client
        .query(
            "SELECT extract(epoch FROM a.leased_at - t.run_at)::float8 * 1000,
                    extract(epoch FROM a.started_at - t.run_at)::float8 * 1000
             FROM herald.tasks t
             JOIN herald.attempts a ON a.task_id = t.id AND a.attempt = t.lease_count
             WHERE t.finished_at IS NOT NULL AND t.state = 'succeeded' AND t.created_at >= $1",
            &[&since],
        )
        .await?;
    let grant = rows.iter().map(|r| r.get::<_, f64>(0)).collect();
    let start = rows
        .iter()
        .filter_map(|r| r.get::<_, Option<f64>>(1))
        .collect();
    Ok((grant, start))
}

/// Creates `n` tasks spread evenly over `window`, starting `lead` from now, through the API.
async fn spread(url: &str, n: usize, lead: Duration, window: Duration) -> Result<()> {
    let first = SystemTime::now() + lead;
    let step = window.as_secs_f64() / n.max(1) as f64;
    let when = Arc::new(move |i: usize| {
        let at = first + Duration::from_secs_f64(step * i as f64);
        Some(task_spec::When::RunAt(at.into()))
    });
    create_via_api(url, n, 1, 1000, when).await?;
    Ok(())
}

/// Adds the lateness rows of one precision run.
fn lateness_rows(report: &mut Report, scenario: &str, grant: Vec<f64>, start: Vec<f64>) {
    let early =
        grant.iter().filter(|g| **g < 0.0).count() + start.iter().filter(|s| **s < 0.0).count();
    let (g50, g99, gmax) = percentiles(grant);
    let (s50, s99, smax) = percentiles(start);
    report.add(scenario, "grant lateness p50 (ms)", g50, "", None);
    report.add(
        scenario,
        "grant lateness p99 (ms)",
        g99,
        "<= 10 ms",
        Some(g99 <= 10.0),
    );
    report.add(
        scenario,
        "grant lateness max (ms)",
        gmax,
        "<= 50 ms",
        Some(gmax <= 50.0),
    );
    report.add(scenario, "send-start lateness p50 (ms)", s50, "", None);
    report.add(
        scenario,
        "send-start lateness p99 (ms)",
        s99,
        "<= 10 ms",
        Some(s99 <= 10.0),
    );
    report.add(
        scenario,
        "send-start lateness max (ms)",
        smax,
        "<= 50 ms",
        Some(smax <= 50.0),
    );
    report.add(scenario, "fired early", early as f64, "0", Some(early == 0));
}

/// S3: tasks spread over a window, the executor idle and waiting; lateness and early fires.
pub(crate) async fn precision(opts: &Options, report: &mut Report) -> Result<()> {
    let n = opts.precision_tasks;
    let db = TestDb::new().await?;
    let scheduler = stack::scheduler(&db, opts).await?;
    let executor = stack::executor(&scheduler, opts).await?;
    // Let the executor's session settle into its idle sleep before the first task is due.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let since = db_now(&db.connect().await?).await?;
    spread(
        &scheduler.grpc_url(),
        n,
        Duration::from_secs(2),
        opts.precision_window,
    )
    .await?;
    let client = db.connect().await?;
    stack::wait_succeeded(
        &client,
        n as i64,
        Pending::DueWithin(opts.precision_window + Duration::from_secs(5)),
        opts.precision_window + WAIT_LIMIT,
    )
    .await?;
    let (grant, start) = lateness(&client, since).await?;
    lateness_rows(report, "S3 precision", grant, start);
    report.note(format!(
        "S3: {n} tasks over {:?}, created 2 s ahead of the first",
        opts.precision_window
    ));
    stack::stop_executor(executor).await?;
    Ok(())
}

/// S4: with 1M and 10M future tasks in the table: the claim statement's latency (timed
/// directly, rolled back), an end-to-end drain of due tasks, grant lateness, scheduler RSS.
pub(crate) async fn scale(opts: &Options, report: &mut Report) -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = stack::scheduler(&db, opts).await?;
    let rss = RssSampler::start(stack::pid(&scheduler)?);
    let client = db.connect().await?;
    let claim = client
        .prepare(&herald_scheduler::store::leases::claim::CLAIM_DUE_SQL)
        .await
        .context("preparing herald's claim")?;
    let mut filled = 0u64;
    let mut claim_p50 = Vec::new();
    for &size in &opts.scale_sizes {
        let started = Instant::now();
        sql::fill_future(&client, filled, size).await?;
        filled = filled.max(size);
        client.batch_execute("VACUUM ANALYZE herald.tasks").await?;
        report.note(format!(
            "S4: table filled to {size} future tasks in {:.1?} (INSERT ... SELECT generate_series, then VACUUM ANALYZE)",
            started.elapsed()
        ));
        let label = human(size);
        let scenario = format!("S4 scale {label}");

        // The claim statement alone (claim_due.sql, the statement a claim runs when the
        // namespace has no accounts), on due tasks among the future ones; each probe is rolled
        // back so every probe sees the same table. Its parameters follow store/claim.rs: the
        // smoke test fails if they change.
        sql::copy_tasks(&client, opts.scale_due, Duration::from_millis(0)).await?;
        client.batch_execute("ANALYZE herald.tasks").await?;
        let mut samples = Vec::with_capacity(opts.scale_probes);
        for _ in 0..opts.scale_probes {
            client.batch_execute("BEGIN").await?;
            let t = Instant::now();
            let rows = client
                .query(
                    &claim,
                    &[
                        &None::<Vec<String>>,
                        &i64::from(opts.claim_batch),
                        &"probe",
                        &30_000i64,
                        &sql::ROUTE,
                        &None::<Vec<Option<chrono::DateTime<chrono::Utc>>>>,
                    ],
                )
                .await?;
            samples.push(t.elapsed().as_secs_f64() * 1000.0);
            client.batch_execute("ROLLBACK").await?;
            anyhow::ensure!(!rows.is_empty(), "the claim probe found no due task");
        }
        let (p50, p99, _) = percentiles(samples);
        claim_p50.push(p50);
        report.add(
            &scenario,
            &format!("claim of {} due (ms) p50", opts.claim_batch),
            p50,
            "",
            None,
        );
        report.add(
            &scenario,
            &format!("claim of {} due (ms) p99", opts.claim_batch),
            p99,
            "",
            None,
        );

        // End to end: the executor drains the due tasks.
        let started = Instant::now();
        let executor = stack::executor(&scheduler, opts).await?;
        stack::wait_succeeded(
            &client,
            opts.scale_due as i64,
            Pending::DueWithin(Duration::ZERO),
            WAIT_LIMIT,
        )
        .await?;
        let window: f64 = client
            .query_one(
                "SELECT extract(epoch FROM max(finished_at) - min(leased_at))::float8
                 FROM herald.tasks WHERE finished_at IS NOT NULL",
                &[],
            )
            .await?
            .get(0);
        report.add(
            &scenario,
            "drain of due tasks (tasks/s)",
            opts.scale_due as f64 / window,
            "",
            None,
        );
        report.note(format!(
            "S4 {label}: {} due tasks drained in {window:.2} s (wall {:.2?})",
            opts.scale_due,
            started.elapsed()
        ));
        // Precision with the big table: a short spread while the executor waits.
        let before = opts.scale_due as i64;
        let spread_n = (opts.precision_tasks / 4).max(10);
        let since = db_now(&client).await?;
        spread(
            &scheduler.grpc_url(),
            spread_n,
            Duration::from_secs(1),
            Duration::from_secs(2),
        )
        .await?;
        stack::wait_succeeded(
            &client,
            before + spread_n as i64,
            Pending::DueWithin(Duration::from_secs(10)),
            WAIT_LIMIT,
        )
        .await?;
        // Only the spread: the drained tasks' lateness is queueing behind each other.
        let (grant, _) = lateness(&client, since).await?;
        let (_, g99, gmax) = percentiles(grant);
        report.add(
            &scenario,
            "grant lateness p99 (ms)",
            g99,
            "<= 10 ms",
            Some(g99 <= 10.0),
        );
        report.add(
            &scenario,
            "grant lateness max (ms)",
            gmax,
            "<= 50 ms",
            Some(gmax <= 50.0),
        );
        stack::stop_executor(executor).await?;
        // Forget this size's finished tasks so the next size starts from the same state.
        client
            .batch_execute("DELETE FROM herald.attempts; DELETE FROM herald.tasks WHERE finished_at IS NOT NULL")
            .await?;
        report.add(
            &scenario,
            "scheduler peak RSS (MiB)",
            rss.peak_mib(),
            "< 150 MiB",
            Some(rss.peak_mib() < 150.0),
        );
        report.note(format!(
            "S4 {label}: scheduler RSS now {:.1} MiB",
            rss.current_mib()
        ));
    }
    if let (Some(first), Some(last)) = (claim_p50.first(), claim_p50.last()) {
        if claim_p50.len() > 1 {
            let ratio = last / first;
            report.add(
                "S4 scale",
                &format!(
                    "claim p50 at {} / at {}",
                    human(*opts.scale_sizes.last().unwrap_or(&0)),
                    human(*opts.scale_sizes.first().unwrap_or(&0))
                ),
                ratio,
                "<= 2x",
                Some(ratio <= 2.0),
            );
        }
    }
    Ok(())
}

/// The database's clock now.
async fn db_now(client: &Client) -> Result<SystemTime> {
    Ok(client.query_one("SELECT now()", &[]).await?.get(0))
}

/// 1000000 → "1M", 100000 → "100k".
fn human(n: u64) -> String {
    if n >= 1_000_000 && n.is_multiple_of(1_000_000) {
        format!("{}M", n / 1_000_000)
    } else if n >= 1_000 && n.is_multiple_of(1_000) {
        format!("{}k", n / 1_000)
    } else {
        n.to_string()
    }
}

/// Accounts in S5's pool.
const S5_ACCOUNTS: usize = 100;

/// S5: the same drain as S1, once by queue and once through a pool of 100 accounts whose every
/// limit is switched on (rate and burst, daily cap, in-flight cap with a high-priority reserve,
/// per-recipient spacing), set high enough that the executor, not the limits, bounds the drain:
/// the difference is what checking and reserving the limits costs. Target: at least 2/3 of the
/// unrouted rate, in interleaved pairs.
pub(crate) async fn accounts(opts: &Options, report: &mut Report) -> Result<()> {
    let n = opts.drain_tasks;
    let pairs = pairs::measure(
        opts.pairs,
        async || routed_drain(opts, n, S5_ACCOUNTS, false).await,
        async || routed_drain(opts, n, 0, false).await,
    )
    .await?;
    pairs::add(
        report,
        "S5 100 accounts",
        "tasks/s (vs. the same drain by queue)",
        2.0 / 3.0,
        &format!(
            "S5: {n} tasks through {S5_ACCOUNTS} accounts with every limit on, against the same \
             drain by queue"
        ),
        &pairs,
    );
    Ok(())
}

/// S7: S5's drain through 100 accounts, once with S5's limits and once with each account also
/// on a warm-up ramp (in its first days, its cap still far above the run), human-like gaps of
/// 1-2 ms and the 100K messaging tier: what the careful-sending limits add to the claim. Every
/// limit is set so that it holds without binding, as in S5. Target: at least 60 % of S5's
/// rate, in interleaved pairs.
pub(crate) async fn careful_pacing(opts: &Options, report: &mut Report) -> Result<()> {
    let n = opts.drain_tasks;
    let pairs = pairs::measure(
        opts.pairs,
        async || routed_drain(opts, n, S5_ACCOUNTS, true).await,
        async || routed_drain(opts, n, S5_ACCOUNTS, false).await,
    )
    .await?;
    pairs::add(
        report,
        "S7 careful pacing",
        "tasks/s (vs. S5's drain without warm-up, gaps, tiers)",
        0.6,
        &format!(
            "S7: {n} tasks through {S5_ACCOUNTS} accounts with warm-up, gaps and tiers as well, \
             against S5's limits alone"
        ),
        &pairs,
    );
    Ok(())
}

/// Drains `n` tasks due now, through a pool of `accounts` accounts (0: by queue), with the
/// careful-sending limits too when `careful`: tasks/s on the database clock, and in the note the
/// CPU the stack spent from the executor's start to the last task's success.
async fn routed_drain(opts: &Options, n: usize, accounts: usize, careful: bool) -> Result<Side> {
    use herald_proto::v1::account_service_client::AccountServiceClient;
    use herald_proto::v1::{Account, AccountLimits, CreateAccountRequest, MessagingTier};
    use herald_proto::v1::{SendGaps, WarmUp};

    let db = TestDb::new().await?;
    let scheduler = stack::scheduler(&db, opts).await?;
    let mut config = String::from("[default]\nsender = \"noop\"\n");
    let pool = if accounts > 0 {
        let mut admin = AccountServiceClient::new(
            tonic::transport::Channel::from_shared(scheduler.grpc_url())?
                .connect()
                .await?,
        );
        let per_account = n.checked_div(accounts).unwrap_or(n).max(1) as i32;
        for i in 0..accounts {
            let id = format!("acct-{i:03}");
            admin
                .create_account(CreateAccountRequest {
                    account: Some(Account {
                        id: id.clone(),
                        sender_kind: SenderKind::Noop.as_str().into(),
                        pool: "bench".into(),
                        limits: Some(AccountLimits {
                            rate_per_second: 5_000.0,
                            burst: Some(5_000),
                            daily_cap: Some(per_account * 10),
                            max_in_flight: Some(1_000),
                            high_priority_reserve: 0.1,
                            recipient_interval: Some(prost_types::Duration {
                                seconds: 6,
                                nanos: 0,
                            }),
                            warm_up: careful.then(|| WarmUp {
                                initial: Some(per_account * 10),
                                step: Some(per_account),
                                ..Default::default()
                            }),
                            gaps: careful.then_some(SendGaps {
                                min: Some(prost_types::Duration {
                                    seconds: 0,
                                    nanos: 1_000_000,
                                }),
                                max: Some(prost_types::Duration {
                                    seconds: 0,
                                    nanos: 2_000_000,
                                }),
                            }),
                            messaging_tier: if careful {
                                MessagingTier::Limit100k as i32
                            } else {
                                0
                            },
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                })
                .await
                .context("CreateAccount")?;
            config.push_str(&format!("[accounts.{id}]\nsender = \"noop\"\n"));
        }
        "bench".to_string()
    } else {
        String::new()
    };
    let mut client = connect_tasks(&scheduler.grpc_url()).await?;
    for first in (0..n).step_by(1000) {
        let tasks: Vec<TaskSpec> = (first..(first + 1000).min(n))
            .map(|i| TaskSpec {
                pool: pool.clone(),
                ..task_spec(QUEUE, &format!("recipient-{i}"), "benchmark message")
            })
            .collect();
        client
            .create_tasks(CreateTasksRequest {
                tasks,
                ..Default::default()
            })
            .await
            .context("CreateTasks")?;
    }
    let conn = db.connect().await?;
    conn.batch_execute("VACUUM ANALYZE herald.tasks").await?;

    let cpu = CpuMeter::new(&conn, Some(stack::pid(&scheduler)?)).await?;
    let cpu_before = cpu.read(None)?;
    let executor = herald_tests::ExecutorProcess::builder(&[scheduler.grpc_url()])
        .config_toml(config)
        .env("RUST_LOG", "warn")
        .env("HERALD_MAX_IN_FLIGHT", opts.max_in_flight.to_string())
        .spawn()
        .await
        .context("starting the executor")?;
    stack::wait_succeeded(&conn, n as i64, Pending::Any, WAIT_LIMIT).await?;
    let spent = cpu.read(executor.pid())?.since(cpu_before);
    let window: f64 = conn
        .query_one(
            "SELECT extract(epoch FROM max(finished_at) - min(leased_at))::float8
             FROM herald.tasks",
            &[],
        )
        .await?
        .get(0);
    stack::stop_executor(executor).await?;
    let rate = n as f64 / window;
    Ok(Side {
        rate,
        note: format!("{rate:.0} tasks/s ({})", spent.describe()),
        rows: Vec::new(),
    })
}
