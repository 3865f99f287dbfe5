//! herald-bench: measures herald end to end on one machine and, in the same run and on the same
//! PostgreSQL cluster, what plain SQL achieves for the same work, so every figure can be read as
//! a fraction of what the database allows here.
//!
//! Scenarios (see `docs/performance.md`):
//! - **S1 drain**: tasks due now, created before the executor connects; tasks/s until all are
//!   SUCCEEDED. Baseline: claim with `FOR UPDATE SKIP LOCKED` and complete in large batches.
//! - **S2 enqueue**: tasks/s through `CreateTasks` from concurrent clients. Baseline: `COPY`.
//! - **S3 precision**: tasks spread over a window with the executor idle and waiting; lateness
//!   of the lease grant and of the send start against `run_at`, and how many fired early.
//! - **S4 scale**: claim latency and scheduler RSS with many future tasks in the table.
//! - **S5 accounts**: the S1 drain through a pool of 100 accounts with every limit on, against
//!   the same drain by queue (limits may cost at most a third).
//! - **S6 soak**: steady mixed traffic with a transaction held open through the middle;
//!   throughput, grant lateness and table size before, during and after it.
//! - **S7 careful pacing**: S5's drain with each account also on a warm-up ramp, human-like gaps
//!   and a messaging tier, against S5's drain without them (they may cost at most 40 %).
//!
//! S1, S2, S5 and S7 measure herald and their baseline in several pairs, alternating which side
//! goes first, and report the pair with the median fraction (`pairs`): one pair's fraction
//! moves with the machine's speed of the moment.
//!
//! Every scenario gets a fresh database ([`herald_tests::TestDb`]) and its own scheduler and
//! executor processes (the real release binaries, the executor with the `noop` sender).
//! The drains' notes say how much CPU each cost PostgreSQL, the scheduler and the executor
//! (`cpu`), which is where a drain's time goes once the machine's cores are all busy.

mod cpu;
mod pairs;
mod report;
mod scenarios;
mod soak;
mod sql;
mod stack;

use std::time::Duration;

use anyhow::Result;

pub use report::{Report, Row};

/// Which scenarios to run and how big.
#[derive(Debug, Clone)]
pub struct Options {
    /// Run S1 (and its baseline).
    pub s1: bool,
    /// Run S2 (and its baseline).
    pub s2: bool,
    /// Run S3.
    pub s3: bool,
    /// Run S4.
    pub s4: bool,
    /// Run S5 (100 accounts with every limit on, against the same drain by queue).
    pub s5: bool,
    /// Run S6 (the soak).
    pub s6: bool,
    /// Run S7 (S5 plus warm-up, gaps and tiers, against S5's drain).
    pub s7: bool,
    /// S1: tasks to drain.
    pub drain_tasks: usize,
    /// S2: tasks to create.
    pub enqueue_tasks: usize,
    /// S2: concurrent clients.
    pub enqueue_clients: usize,
    /// S2: tasks per CreateTasks call (at most 1000).
    pub enqueue_batch: usize,
    /// S3: tasks spread over the window.
    pub precision_tasks: usize,
    /// S3: the window.
    pub precision_window: Duration,
    /// S4: table sizes (future tasks), ascending.
    pub scale_sizes: Vec<u64>,
    /// S4: due tasks drained at each size.
    pub scale_due: usize,
    /// S4: how many times the claim statement is timed at each size.
    pub scale_probes: usize,
    /// The executor's credit (HERALD_MAX_IN_FLIGHT).
    pub max_in_flight: u32,
    /// The scheduler's claim batch (HERALD_CLAIM_BATCH); S4 times the claim statement at it.
    pub claim_batch: u32,
    /// Plain-SQL baseline: concurrent drain workers.
    pub baseline_workers: usize,
    /// Plain-SQL baseline: tasks each worker claims at a time (512, as #18 fixes it; its two
    /// workers drain slower at 1,024, docs/performance.md).
    pub baseline_batch: u32,
    /// S6: the phase unit (before: one unit; the held transaction: two; after: two); 150 s in
    /// a full run, so the soak takes twelve and a half minutes.
    pub soak_unit: Duration,
    /// S1, S2, S5 and S7: pairs of herald and its baseline, measured in alternating order; the
    /// pair with the median fraction is reported (`pairs`).
    pub pairs: usize,
    /// S6: creates per second; None for half of S1's rate in the same run (5,000 without S1).
    pub soak_rate: Option<f64>,
    /// S6: how long a finished task stays in the hot table before it moves into the history
    /// (zero: at once, the default).
    pub soak_history_after: Duration,
}

impl Options {
    /// The sizes the issue asks for: 50k drain, 200k enqueue, 2,000 tasks over 20 s, 1M and 10M.
    pub fn full() -> Self {
        Options {
            s1: true,
            s2: true,
            s3: true,
            s4: true,
            s5: true,
            s6: true,
            s7: true,
            drain_tasks: 50_000,
            enqueue_tasks: 200_000,
            enqueue_clients: 4,
            enqueue_batch: 1_000,
            precision_tasks: 2_000,
            precision_window: Duration::from_secs(20),
            scale_sizes: vec![1_000_000, 10_000_000],
            scale_due: 20_000,
            scale_probes: 50,
            max_in_flight: 2_048,
            claim_batch: herald_scheduler::config::DEFAULT_CLAIM_BATCH,
            baseline_workers: 2,
            baseline_batch: 512,
            soak_unit: Duration::from_secs(150),
            pairs: 5,
            soak_rate: None,
            soak_history_after: Duration::ZERO,
        }
    }

    /// Small sizes that run in seconds: for a smoke test or a first look (figures are noisy).
    pub fn quick() -> Self {
        Options {
            drain_tasks: 2_000,
            enqueue_tasks: 4_000,
            precision_tasks: 100,
            precision_window: Duration::from_secs(2),
            scale_sizes: vec![10_000, 100_000],
            scale_due: 1_000,
            scale_probes: 10,
            soak_unit: Duration::from_secs(4),
            pairs: 1,
            ..Self::full()
        }
    }
}

/// Runs the selected scenarios and returns the report.
pub async fn run(opts: &Options) -> Result<Report> {
    let mut report = Report::new(opts);
    let mut s1_rate = None;
    if opts.s1 {
        s1_rate = Some(scenarios::drain(opts, &mut report).await?);
    }
    if opts.s2 {
        scenarios::enqueue(opts, &mut report).await?;
    }
    if opts.s3 {
        scenarios::precision(opts, &mut report).await?;
    }
    if opts.s4 {
        scenarios::scale(opts, &mut report).await?;
    }
    if opts.s5 {
        scenarios::accounts(opts, &mut report).await?;
    }
    if opts.s6 {
        soak::soak(opts, s1_rate, &mut report).await?;
    }
    if opts.s7 {
        scenarios::careful_pacing(opts, &mut report).await?;
    }
    Ok(report)
}
