//! The processes under test: a scheduler on a fresh database, an executor with the `noop`
//! sender, and a sampler of the scheduler's resident memory.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use herald_tests::{ExecutorProcess, SchedulerProcess, TestDb};
use tokio::task::JoinHandle;

use crate::Options;

/// The executor's config: every queue goes to the silent `noop` sender, so the benchmark
/// measures herald, not a sender or its logging.
const NOOP_CONFIG: &str = "[default]\nsender = \"noop\"\n";

/// Per-process log level: warnings only, so per-session info lines do not cost anything.
const LOG_LEVEL: &str = "warn";

/// Starts a scheduler on `db` (it applies the migrations before printing READY).
pub(crate) async fn scheduler(db: &TestDb, opts: &Options) -> Result<SchedulerProcess> {
    SchedulerProcess::builder(db)
        .env("RUST_LOG", LOG_LEVEL)
        .env("HERALD_CLAIM_BATCH", opts.claim_batch.to_string())
        .spawn()
        .await
        .context("starting the scheduler")
}

/// Starts an executor with the `noop` sender, connected to `scheduler`.
pub(crate) async fn executor(
    scheduler: &SchedulerProcess,
    opts: &Options,
) -> Result<ExecutorProcess> {
    ExecutorProcess::builder(&[scheduler.grpc_url()])
        .config_toml(NOOP_CONFIG)
        .env("RUST_LOG", LOG_LEVEL)
        .env("HERALD_MAX_IN_FLIGHT", opts.max_in_flight.to_string())
        .spawn()
        .await
        .context("starting the executor")
}

/// Stops an executor gracefully (it reports what is in flight) and waits for it.
pub(crate) async fn stop_executor(mut executor: ExecutorProcess) -> Result<()> {
    executor.terminate()?;
    match tokio::time::timeout(Duration::from_secs(30), executor.wait()).await {
        Ok(status) => {
            status?;
        }
        Err(_) => executor.kill()?,
    }
    Ok(())
}

/// Samples a process's resident set size every 50 ms and keeps the maximum.
pub(crate) struct RssSampler {
    peak_kib: Arc<AtomicU64>,
    task: JoinHandle<()>,
    pid: u32,
}

impl RssSampler {
    /// Starts sampling `pid`.
    pub(crate) fn start(pid: u32) -> Self {
        let peak_kib = Arc::new(AtomicU64::new(0));
        let peak = peak_kib.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            loop {
                tick.tick().await;
                match status_kib(pid, "VmRSS:") {
                    Some(kib) => {
                        peak.fetch_max(kib, Ordering::Relaxed);
                    }
                    None => return,
                }
            }
        });
        RssSampler {
            peak_kib,
            task,
            pid,
        }
    }

    /// The largest RSS seen so far, in MiB; the kernel's own high-water mark (VmHWM) wins when
    /// it is larger, since it sees peaks between samples.
    pub(crate) fn peak_mib(&self) -> f64 {
        let sampled = self.peak_kib.load(Ordering::Relaxed);
        let hwm = status_kib(self.pid, "VmHWM:").unwrap_or(0);
        sampled.max(hwm) as f64 / 1024.0
    }

    /// The RSS now, in MiB.
    pub(crate) fn current_mib(&self) -> f64 {
        status_kib(self.pid, "VmRSS:").unwrap_or(0) as f64 / 1024.0
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A `kB` field of /proc/<pid>/status.
fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The scheduler's pid, for the RSS sampler.
pub(crate) fn pid(scheduler: &SchedulerProcess) -> Result<u32> {
    scheduler.pid().context("the scheduler has exited")
}

/// What the wait loops ask first, until it says nothing is left: a cheap question, so that
/// asking costs the drain little.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Pending {
    /// A task of the unrouted route due within this horizon is still SCHEDULED, or a task is
    /// LEASED (S1, S3, S4: later tasks wait in the table).
    DueWithin(Duration),
    /// A task is still SCHEDULED or LEASED (S5, S7: every task is due at once, through any
    /// route).
    Any,
}

/// Waits until `expected` tasks are SUCCEEDED (or `limit` passes); returns how long it took.
///
/// Polls a cheap question first ([`Pending`]): probes of partial indexes (a `count(*)` every
/// 50 ms over 150k rows cost PostgreSQL a tenth of a core; S5's `count(*)` every 200 ms took
/// 15 ms a call, 7 % of a core through its drains). Only once nothing is left does it count,
/// once. The probes are still not free during a drain: they step over the index entries of
/// every task leased since the last VACUUM, 3–7 ms a probe in S1 (`pg_stat_statements`).
/// Polled every 20 ms they took 120–400 ms of statement time per S1 drain, from herald's side
/// only (the baseline's drain does not poll); every [`POLL`], 100–200 ms.
pub(crate) async fn wait_succeeded(
    client: &tokio_postgres::Client,
    expected: i64,
    pending: Pending,
    limit: Duration,
) -> Result<Duration> {
    let started = Instant::now();
    // Sent as text at every poll, not prepared once: after five runs of a prepared statement
    // PostgreSQL may keep a generic plan, and for the horizon's `run_at <= now() + $2` that
    // plan was a sequential scan. At 10M future tasks (S4) each poll then scanned the whole
    // table for 1.6-4.3 s, on the cores herald's spread was being measured on
    // (docs/performance.md, S4). Planned with the values at hand, it probes the partial index.
    let probe = match pending {
        Pending::DueWithin(horizon) => format!(
            "SELECT EXISTS (SELECT 1 FROM herald.tasks
                    WHERE state = 'scheduled' AND route = '{}'
                      AND priority = ANY('{{9,8,7,6,5,4,3,2,1,0}}'::smallint[])
                      AND run_at <= now() + {} * interval '1 millisecond')
             OR EXISTS (SELECT 1 FROM herald.tasks WHERE state = 'leased')",
            crate::sql::ROUTE,
            horizon.as_millis()
        ),
        Pending::Any => "SELECT EXISTS (SELECT 1 FROM herald.tasks WHERE state = 'scheduled')
                             OR EXISTS (SELECT 1 FROM herald.tasks WHERE state = 'leased')"
            .to_owned(),
    };
    loop {
        let pending: bool = client.query_one(probe.as_str(), &[]).await?.get(0);
        if !pending {
            // `finished_at IS NOT NULL` lets the planner use the partial `tasks_finished`
            // index, so this stays cheap with millions of unfinished tasks in the table (S4).
            let done: i64 = client
                .query_one(
                    "SELECT count(*) FROM herald.tasks
                     WHERE finished_at IS NOT NULL AND state = 'succeeded'",
                    &[],
                )
                .await?
                .get(0);
            if done >= expected {
                return Ok(started.elapsed());
            }
        }
        if started.elapsed() > limit {
            bail!("tasks still pending after {limit:?} (expected {expected} SUCCEEDED)");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// How often [`wait_succeeded`] asks. The drain rates come from the database's timestamps, so
/// this only bounds how late the benchmark notices the end (the wall-clock figures).
const POLL: Duration = Duration::from_millis(100);
