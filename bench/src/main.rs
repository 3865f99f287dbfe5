//! `herald-bench`: runs herald's benchmark scenarios and prints the results table.
//!
//! Run it through `script/bench`, which builds the release binaries, starts a private
//! PostgreSQL cluster tuned for the run, and points `HERALD_BIN_DIR` / `HERALD_TEST_PG_URL` at
//! them.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use herald_bench::{run, Options};

/// herald's benchmark: S1 drain, S2 enqueue, S3 precision, S4 scale, S5 accounts, S6 soak, S7
/// careful pacing, with same-run baselines.
#[derive(Parser, Debug)]
#[command(name = "herald-bench")]
struct Cli {
    /// Scenarios to run, comma-separated: s1, s2, s3, s4, s5, s6, s7 (default all).
    #[arg(long, value_delimiter = ',', default_value = "s1,s2,s3,s4,s5,s6,s7")]
    scenarios: Vec<String>,
    /// Small sizes that finish in seconds (figures are only indicative).
    #[arg(long)]
    quick: bool,
    /// S4 table sizes, comma-separated, e.g. `1m,10m` or `100k` (default 1m,10m).
    #[arg(long, value_delimiter = ',')]
    scale: Vec<String>,
    /// S1: tasks to drain.
    #[arg(long)]
    drain_tasks: Option<usize>,
    /// S2: tasks to create.
    #[arg(long)]
    enqueue_tasks: Option<usize>,
    /// S2: concurrent clients.
    #[arg(long)]
    enqueue_clients: Option<usize>,
    /// S3: tasks spread over the window.
    #[arg(long)]
    precision_tasks: Option<usize>,
    /// S3: the window, in seconds.
    #[arg(long)]
    precision_window: Option<u64>,
    /// The executor's credit (HERALD_MAX_IN_FLIGHT).
    #[arg(long)]
    max_in_flight: Option<u32>,
    /// The scheduler's claim batch (HERALD_CLAIM_BATCH).
    #[arg(long)]
    claim_batch: Option<u32>,
    /// Plain-SQL drain baseline: concurrent workers.
    #[arg(long)]
    baseline_workers: Option<usize>,
    /// Plain-SQL drain baseline: tasks each worker claims at a time.
    #[arg(long)]
    baseline_batch: Option<u32>,
    /// S6: seconds per phase unit (before 1, held transaction 2, after 2; default 150).
    #[arg(long)]
    soak_unit: Option<u64>,
    /// S6: creates per second (default: half of S1's rate when S1 runs too, else 5000).
    #[arg(long)]
    soak_rate: Option<f64>,
    /// S6: seconds a finished task stays in the hot table before it moves into the history
    /// (HERALD_HISTORY_AFTER; default 0: at once). A delay past the minute's retention moves
    /// nothing: retention then deletes finished tasks from the hot table, as without a history.
    #[arg(long)]
    soak_history_after: Option<u64>,
    /// S1, S2, S5, S7: pairs of herald and its baseline, in alternating order; the pair with
    /// the median fraction is reported (default 5, 1 with --quick).
    #[arg(long)]
    pairs: Option<usize>,
    /// Where to write the JSON results.
    #[arg(long, default_value = "target/bench/results.json")]
    out: PathBuf,
}

fn size(s: &str) -> Result<u64> {
    let s = s.trim().to_ascii_lowercase();
    let (digits, factor) = match s.chars().last() {
        Some('m') => (&s[..s.len() - 1], 1_000_000),
        Some('k') => (&s[..s.len() - 1], 1_000),
        _ => (s.as_str(), 1),
    };
    let n: u64 = digits
        .parse()
        .with_context(|| format!("bad size {s:?}: expected e.g. 100k, 1m, 10m"))?;
    Ok(n * factor)
}

fn options(cli: &Cli) -> Result<Options> {
    let mut o = if cli.quick {
        Options::quick()
    } else {
        Options::full()
    };
    o.s1 = false;
    o.s2 = false;
    o.s3 = false;
    o.s4 = false;
    o.s5 = false;
    o.s6 = false;
    o.s7 = false;
    for s in &cli.scenarios {
        match s.trim().to_ascii_lowercase().as_str() {
            "s1" => o.s1 = true,
            "s2" => o.s2 = true,
            "s3" => o.s3 = true,
            "s4" => o.s4 = true,
            "s5" => o.s5 = true,
            "s6" => o.s6 = true,
            "s7" => o.s7 = true,
            other => bail!("unknown scenario {other:?} (expected s1 to s7)"),
        }
    }
    if !cli.scale.is_empty() {
        let mut sizes = cli
            .scale
            .iter()
            .map(|s| size(s))
            .collect::<Result<Vec<_>>>()?;
        sizes.sort_unstable();
        o.scale_sizes = sizes;
    }
    if let Some(v) = cli.drain_tasks {
        o.drain_tasks = v;
    }
    if let Some(v) = cli.enqueue_tasks {
        o.enqueue_tasks = v;
    }
    if let Some(v) = cli.enqueue_clients {
        o.enqueue_clients = v.max(1);
    }
    if let Some(v) = cli.precision_tasks {
        o.precision_tasks = v;
    }
    if let Some(v) = cli.precision_window {
        o.precision_window = Duration::from_secs(v);
    }
    if let Some(v) = cli.max_in_flight {
        o.max_in_flight = v;
    }
    if let Some(v) = cli.baseline_workers {
        o.baseline_workers = v.max(1);
    }
    if let Some(v) = cli.soak_unit {
        o.soak_unit = std::time::Duration::from_secs(v.max(1));
    }
    if cli.soak_rate.is_some() {
        o.soak_rate = cli.soak_rate;
    }
    if let Some(v) = cli.soak_history_after {
        o.soak_history_after = std::time::Duration::from_secs(v);
    }
    if let Some(v) = cli.pairs {
        o.pairs = v.max(1);
    }
    if let Some(v) = cli.claim_batch {
        o.claim_batch = v;
    }
    if let Some(v) = cli.baseline_batch {
        o.baseline_batch = v;
    }
    Ok(o)
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let opts = options(&cli)?;
    if std::env::var_os("HERALD_BIN_DIR").is_none() {
        bail!("set HERALD_BIN_DIR to the folder of the release binaries, or run script/bench");
    }
    let mut report = run(&opts).await?;
    if let Ok(load) = std::fs::read_to_string("/proc/loadavg") {
        report
            .notes
            .push(format!("load average at the end: {}", load.trim()));
    }
    let table = report.table();
    println!("{table}");
    if let Some(dir) = cli.out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&cli.out, serde_json::to_string_pretty(&report.to_json())?)
        .with_context(|| format!("writing {}", cli.out.display()))?;
    eprintln!("[bench] results written to {}", cli.out.display());
    Ok(())
}
