//! S6, the soak: steady mixed traffic for a while, with a transaction held open on the database
//! through the middle of it, as a report, a backup or an analyst's session would. It shows what
//! hours of traffic do to the hot tables and what a long transaction (which stops VACUUM from
//! reclaiming anything newer than its snapshot) does to throughput, lateness and size.
//!
//! Three phases: *before* (one unit), *during* (two units, the transaction held), *after* (two
//! units). Tasks are created all along at a fixed rate, each due within a second of its
//! creation; a fifth fail their first attempt (the `noop` sender's `fail_first_attempts`) and
//! succeed when retried. Finished tasks are pruned a minute after they end, so without the held
//! transaction the tables reach a steady size. Figures per phase: throughput (tasks finished,
//! from the scheduler's `herald_tasks_finished_total`), grant lateness p99 (interpolated from
//! the scheduler's `herald_trigger_lag_seconds` buckets, as Prometheus' histogram_quantile
//! does: cheap enough not to disturb what it measures), and at the phase's end the size of
//! `herald.tasks` and `herald.attempts` and their history with indexes, the age of the oldest
//! transaction, and the tasks waiting (SCHEDULED, from `herald_tasks`): a backlog is live rows
//! in that size, which no VACUUM gives back; and the hot tables the scheduler's compactor
//! rewrote within the phase (`herald_compactions_total`), which is how the space the held
//! transaction left comes back after it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use herald_proto::v1::{retry_policy, task_spec, CreateTasksRequest, ExponentialBackoff};
use herald_proto::v1::{RetryPolicy, TaskSpec};
use herald_tests::{connect_tasks, task_spec, ExecutorProcess, SchedulerProcess, TestDb};

use crate::report::Report;
use crate::sql::QUEUE;
use crate::Options;

/// Create rate when S1 did not run in the same invocation (half of S1's rate is the default).
const FALLBACK_RATE: f64 = 5_000.0;

/// How often the creators send a batch.
const TICK: Duration = Duration::from_millis(100);

/// At most this long of traffic before the first phase.
const WARM_UP: Duration = Duration::from_secs(5);

/// Concurrent creating clients.
const CREATORS: usize = 2;

/// How often the soak scrapes the scheduler within a phase, for its worst stretch.
const SAMPLE: Duration = Duration::from_secs(1);

/// The stretch, in samples, whose lateness p99 is reported at its worst: a pause of a second or
/// two (a rewrite, a lock) shows there even when the phase's p99 hides it, since creates wait
/// too and few tasks fall due meanwhile.
const WORST_WINDOW: usize = 10;

/// One phase's figures.
#[derive(Debug, Clone)]
struct Phase {
    throughput: f64,
    lateness_p99_ms: f64,
    /// The lateness p99 of the phase's worst [`WORST_WINDOW`] samples.
    worst_window_p99_ms: f64,
    size_mib: f64,
    oldest_transaction_s: f64,
    waiting: f64,
    rewrites: f64,
    /// The scrape as the phase ended, where the next one begins.
    last: Scrape,
}

/// The tables whose sizes (`herald_table_bytes`) the soak adds up: the hot tasks and attempts
/// and their history.
const SIZED: [&str; 4] = ["tasks", "attempts", "task_history", "attempt_history"];

/// What the scheduler's /metrics says at one instant: tasks finished, the trigger-lag
/// histogram's cumulative bucket counts by upper bound (seconds; +Inf last), the size of the
/// [`SIZED`] tables, the age of the oldest transaction holding VACUUM back, the tasks waiting
/// (SCHEDULED, the live-task gauge: a backlog is live rows in the size, not bloat), and the
/// tables the compactor has rewritten (`herald_compactions_total`, outcome `compacted`).
#[derive(Debug, Clone, Default)]
struct Scrape {
    finished: f64,
    lag_buckets: BTreeMap<u64, f64>,
    table_bytes: f64,
    oldest_transaction_s: f64,
    waiting: f64,
    compacted: f64,
}

/// Runs S6. `s1_rate` is S1's herald drain rate from this run, if it ran.
pub(crate) async fn soak(opts: &Options, s1_rate: Option<f64>, report: &mut Report) -> Result<()> {
    let rate = opts
        .soak_rate
        .or(s1_rate.map(|r| r / 2.0))
        .unwrap_or(FALLBACK_RATE);
    let unit = opts.soak_unit;
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::builder(&db)
        .env("RUST_LOG", "warn")
        .env("HERALD_CLAIM_BATCH", opts.claim_batch.to_string())
        .env("HERALD_TASK_RETENTION", "1m")
        .env("HERALD_RETENTION_INTERVAL", "5s")
        // Finished tasks leave the hot table at once (by default), into 10-second partitions:
        // the minute's retention is then six partitions, dropped whole as they age out.
        .env(
            "HERALD_HISTORY_AFTER",
            format!("{}s", opts.soak_history_after.as_secs()),
        )
        .env("HERALD_HISTORY_PARTITION", "10s")
        .spawn()
        .await
        .context("starting the scheduler")?;
    let executor = ExecutorProcess::builder(&[scheduler.grpc_url()])
        .config_toml("[default]\nsender = \"noop\"\nfail_first_attempts = 0.2\n")
        // Errors only: every planned failure logs a warning, a thousand lines a second.
        .env("RUST_LOG", "error")
        .env("HERALD_MAX_IN_FLIGHT", opts.max_in_flight.to_string())
        .spawn()
        .await
        .context("starting the executor")?;
    let metrics_url = format!("{}/metrics", scheduler.http_url());

    let stop = Arc::new(AtomicBool::new(false));
    let created = Arc::new(AtomicU64::new(0));
    let mut creators = Vec::new();
    for c in 0..CREATORS {
        creators.push(tokio::spawn(create_steadily(
            scheduler.grpc_url(),
            rate / CREATORS as f64,
            c,
            stop.clone(),
            created.clone(),
        )));
    }

    let started = Instant::now();
    // Let the first tasks come due and the flow settle before measuring.
    tokio::time::sleep(unit.min(WARM_UP)).await;
    let first = scrape(&metrics_url).await?;
    let before = phase(&sample_phase(&metrics_url, first, unit).await?, unit);
    let before_end = before.last.clone();

    // A snapshot held open: REPEATABLE READ takes it at the first statement and keeps it.
    let (holder, holder_conn) = tokio_postgres::connect(db.url(), tokio_postgres::NoTls).await?;
    let holder_task = tokio::spawn(holder_conn);
    holder
        .batch_execute(
            "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM herald.accounts;",
        )
        .await
        .context("opening the held transaction")?;
    let during = phase(
        &sample_phase(&metrics_url, before_end, unit * 2).await?,
        unit * 2,
    );
    holder.batch_execute("COMMIT").await?;
    drop(holder);
    holder_task.abort();

    let after = phase(
        &sample_phase(&metrics_url, during.last.clone(), unit * 2).await?,
        unit * 2,
    );

    stop.store(true, Ordering::Relaxed);
    for c in creators {
        c.await??;
    }
    let offered = created.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    add_rows(report, rate, offered, &before, &during, &after);
    report.note(format!(
        "S6: {:.0} s per phase unit (before 1, held 2, after 2), {rate:.0} creates/s asked, \
         {offered:.0}/s made; a fifth retried once; finished tasks pruned after 1 min \
         (HERALD_HISTORY_AFTER {} s: under a minute, they move into the history first)",
        unit.as_secs_f64(),
        opts.soak_history_after.as_secs()
    ));
    crate::stack::stop_executor(executor).await?;
    Ok(())
}

/// Creates tasks at `rate` per second until `stop`, each due within a second, in one batch per
/// tick; client `c` of [`CREATORS`].
async fn create_steadily(
    url: String,
    rate: f64,
    c: usize,
    stop: Arc<AtomicBool>,
    created: Arc<AtomicU64>,
) -> Result<()> {
    let mut tasks = connect_tasks(&url).await?;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let per_tick = (rate * TICK.as_secs_f64()).round().max(1.0) as usize;
    let mut n: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let now = SystemTime::now();
        for chunk_start in (0..per_tick).step_by(1000) {
            let specs: Vec<TaskSpec> = (chunk_start..per_tick.min(chunk_start + 1000))
                .map(|i| {
                    n += 1;
                    // Due times spread over the next second, the same way every run.
                    let offset = Duration::from_millis((n * 7919 + i as u64) % 1000);
                    let mut spec = task_spec(QUEUE, &format!("soak-{c}-{n}"), "soak message");
                    spec.when = Some(task_spec::When::RunAt((now + offset).into()));
                    spec.retry_policy = Some(RetryPolicy {
                        strategy: Some(retry_policy::Strategy::Exponential(ExponentialBackoff {
                            initial: Some(prost_types::Duration {
                                seconds: 0,
                                nanos: 200_000_000,
                            }),
                            ..Default::default()
                        })),
                    });
                    spec
                })
                .collect();
            let count = specs.len() as u64;
            tasks
                .create_tasks(CreateTasksRequest {
                    tasks: specs,
                    ..Default::default()
                })
                .await
                .context("CreateTasks")?;
            created.fetch_add(count, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// Scrapes the scheduler every [`SAMPLE`] for `length`, after `first` (scraped as the phase
/// began), the last scrape as it ends: the phase's scrapes in order, `first` included.
async fn sample_phase(url: &str, first: Scrape, length: Duration) -> Result<Vec<Scrape>> {
    let end = tokio::time::Instant::now() + length;
    let mut scrapes = vec![first];
    loop {
        let next = tokio::time::Instant::now() + SAMPLE;
        if next >= end {
            tokio::time::sleep_until(end).await;
            scrapes.push(scrape(url).await?);
            return Ok(scrapes);
        }
        tokio::time::sleep_until(next).await;
        scrapes.push(scrape(url).await?);
    }
}

/// The figures of a phase from its scrapes (at least two: as it began and as it ended); the
/// size, the oldest transaction and the tasks waiting as it ends, and the compactor's rewrites
/// within it.
fn phase(scrapes: &[Scrape], length: Duration) -> Phase {
    let none = Scrape::default();
    let from = scrapes.first().unwrap_or(&none);
    let to = scrapes.last().unwrap_or(&none);
    Phase {
        throughput: (to.finished - from.finished) / length.as_secs_f64(),
        lateness_p99_ms: quantile(&lag_deltas(from, to), 0.99) * 1000.0,
        worst_window_p99_ms: worst_window_p99_ms(scrapes, WORST_WINDOW),
        size_mib: to.table_bytes / (1024.0 * 1024.0),
        oldest_transaction_s: to.oldest_transaction_s,
        waiting: to.waiting,
        rewrites: to.compacted - from.compacted,
        last: to.clone(),
    }
}

/// The grant-lateness histogram's counts between two scrapes.
fn lag_deltas(from: &Scrape, to: &Scrape) -> BTreeMap<u64, f64> {
    to.lag_buckets
        .iter()
        .map(|(le, n)| (*le, n - from.lag_buckets.get(le).copied().unwrap_or(0.0)))
        .collect()
}

/// The highest grant-lateness p99, in ms, of any `window` consecutive intervals between
/// `scrapes` (of the whole span when there are fewer); NaN when no grant fell in any.
fn worst_window_p99_ms(scrapes: &[Scrape], window: usize) -> f64 {
    let intervals = scrapes.len().saturating_sub(1);
    if intervals == 0 {
        return f64::NAN;
    }
    let k = window.clamp(1, intervals);
    scrapes
        .windows(k + 1)
        .filter_map(|w| {
            let (first, last) = (w.first()?, w.last()?);
            let p99 = quantile(&lag_deltas(first, last), 0.99);
            p99.is_finite().then_some(p99 * 1000.0)
        })
        .reduce(f64::max)
        .unwrap_or(f64::NAN)
}

/// The q-quantile of a cumulative histogram (upper bound in microseconds → count), by linear
/// interpolation inside the bucket it falls in; the last finite bound if it falls in +Inf.
fn quantile(buckets: &BTreeMap<u64, f64>, q: f64) -> f64 {
    let Some(total) = buckets.values().copied().reduce(f64::max) else {
        return f64::NAN;
    };
    if total <= 0.0 {
        return f64::NAN;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for (le, count) in buckets {
        let upper = *le as f64 / 1e6;
        if *count >= rank {
            if *le == u64::MAX {
                return lower;
            }
            let share = if *count > below {
                (rank - below) / (count - below)
            } else {
                0.0
            };
            return lower + (upper - lower) * share;
        }
        (lower, below) = (upper, *count);
    }
    lower
}

/// Reads a [`Scrape`] from the scheduler's /metrics.
async fn scrape(url: &str) -> Result<Scrape> {
    let body = reqwest::get(url)
        .await
        .context("scraping the scheduler")?
        .error_for_status()?
        .text()
        .await?;
    Ok(parse_scrape(&body))
}

/// The [`Scrape`] in a /metrics text.
fn parse_scrape(body: &str) -> Scrape {
    let mut out = Scrape::default();
    for line in body.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        if series.starts_with("herald_tasks_finished_total") {
            out.finished += value;
        } else if series.starts_with("herald_tasks{") && series.contains("state=\"scheduled\"") {
            out.waiting += value;
        } else if series.starts_with("herald_compactions_total{")
            && series.contains("outcome=\"compacted\"")
        {
            out.compacted += value;
        } else if series == "herald_oldest_transaction_seconds" {
            out.oldest_transaction_s = value;
        } else if let Some(table) = series
            .strip_prefix("herald_table_bytes{table=\"")
            .and_then(|t| t.strip_suffix("\"}"))
        {
            if SIZED.contains(&table) {
                out.table_bytes += value;
            }
        } else if let Some(labels) = series.strip_prefix("herald_trigger_lag_seconds_bucket{") {
            let le = labels
                .split(',')
                .find_map(|l| l.trim_end_matches('}').strip_prefix("le=\""))
                .map(|v| v.trim_end_matches('"'));
            let bound = match le {
                Some("+Inf") => u64::MAX,
                Some(v) => (v.parse::<f64>().unwrap_or(f64::INFINITY) * 1e6) as u64,
                None => continue,
            };
            *out.lag_buckets.entry(bound).or_default() += value;
        }
    }
    out
}

fn add_rows(report: &mut Report, rate: f64, offered: f64, b: &Phase, d: &Phase, a: &Phase) {
    const S: &str = "S6 soak";
    report.add(S, "creates/s (asked)", rate, "", None);
    report.add(S, "creates/s (made)", offered, "", None);
    for (name, p) in [("before", b), ("held", d), ("after", a)] {
        report.add(
            S,
            &format!("throughput {name} (tasks/s)"),
            p.throughput,
            "",
            None,
        );
    }
    let kept = d.throughput / b.throughput;
    report.add(
        S,
        "throughput held / before",
        kept,
        ">= 0.7",
        Some(kept >= 0.7),
    );
    for (name, p) in [("before", b), ("held", d), ("after", a)] {
        report.add(
            S,
            &format!("grant lateness p99 {name} (ms)"),
            p.lateness_p99_ms,
            "<= 20 ms",
            Some(p.lateness_p99_ms <= 20.0),
        );
    }
    // Not a target: where in a phase its lateness went, a pause the phase's p99 can hide.
    for (name, p) in [("before", b), ("held", d), ("after", a)] {
        report.add(
            S,
            &format!("grant lateness p99, worst {WORST_WINDOW} s, {name} (ms)"),
            p.worst_window_p99_ms,
            "",
            None,
        );
    }
    for (name, p) in [("before", b), ("held", d), ("after", a)] {
        report.add(
            S,
            &format!("tasks+attempts size {name} (MiB)"),
            p.size_mib,
            "",
            None,
        );
    }
    // The held transaction's age as the held phase ends, as herald_oldest_transaction_seconds
    // (what the alert reads) shows it; about zero at the other phases' ends.
    for (name, p) in [("before", b), ("held", d), ("after", a)] {
        report.add(
            S,
            &format!("oldest transaction at the end, {name} (s)"),
            p.oldest_transaction_s,
            "",
            None,
        );
    }
    // Tasks due or not yet due and not leased, as each phase ends: a backlog is live rows the
    // size holds, which no VACUUM can give back (the live-task gauge, recounted every few
    // seconds, longer when a count takes long).
    for (name, p) in [("before", b), ("held", d), ("after", a)] {
        report.add(
            S,
            &format!("tasks waiting at the end, {name}"),
            p.waiting,
            "",
            None,
        );
    }
    // Hot tables the compactor rewrote within each phase: once the hold is over, the space it
    // left is given back only by such a rewrite (docs/operations.md, "Giving back space").
    for (name, p) in [("before", b), ("held", d), ("after", a)] {
        report.add(
            S,
            &format!("tables rewritten by the compactor, {name}"),
            p.rewrites,
            "",
            None,
        );
    }
    let grown = a.size_mib / b.size_mib;
    report.add(
        S,
        "size after / before",
        grown,
        "<= 1.5",
        Some(grown <= 1.5),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_inside_the_bucket() {
        // 100 observations: 50 under 5 ms, 40 more under 10 ms, 10 more under 25 ms.
        let buckets: BTreeMap<u64, f64> = [
            (5_000, 50.0),
            (10_000, 90.0),
            (25_000, 100.0),
            (u64::MAX, 100.0),
        ]
        .into();
        assert!((quantile(&buckets, 0.5) - 0.005).abs() < 1e-9);
        // The 99th falls 9/10 of the way through the 10-25 ms bucket.
        assert!((quantile(&buckets, 0.99) - 0.0235).abs() < 1e-9);
        assert!(quantile(&BTreeMap::new(), 0.99).is_nan());
    }

    /// A scrape whose histogram has `fast` grants under 5 ms and `slow` ones under 2.5 s.
    fn lag(fast: f64, slow: f64) -> Scrape {
        Scrape {
            lag_buckets: [
                (5_000, fast),
                (2_500_000, fast + slow),
                (u64::MAX, fast + slow),
            ]
            .into(),
            ..Scrape::default()
        }
    }

    #[test]
    fn the_worst_stretch_shows_a_pause_the_whole_phase_hides() {
        // Twenty one-second samples of 1,000 fast grants each; one second's 100 come late.
        let mut scrapes = vec![lag(0.0, 0.0)];
        let (mut fast, mut slow) = (0.0, 0.0);
        for second in 0..20 {
            if second == 12 {
                slow += 100.0;
            } else {
                fast += 1_000.0;
            }
            scrapes.push(lag(fast, slow));
        }
        let whole = quantile(&lag_deltas(&scrapes[0], &scrapes[20]), 0.99) * 1000.0;
        assert!(whole < 5.0, "the phase's p99 {whole} ms");
        let worst = worst_window_p99_ms(&scrapes, 10);
        // Past the soak's 20 ms target (the p99 falls 9/100 into the late bucket: about 230 ms).
        assert!(worst > 200.0, "the worst ten seconds' p99 {worst} ms");
        // Fewer samples than the window: the whole span.
        assert_eq!(worst_window_p99_ms(&scrapes[..3], 10), {
            quantile(&lag_deltas(&scrapes[0], &scrapes[2]), 0.99) * 1000.0
        });
        assert!(worst_window_p99_ms(&scrapes[..1], 10).is_nan());
    }

    #[test]
    fn a_scrape_sums_the_waiting_tasks_the_sized_tables_and_the_rewrites() {
        let body = "\
herald_tasks{state=\"scheduled\",queue=\"a\"} 7
herald_tasks{queue=\"b\",state=\"scheduled\"} 5
herald_tasks{state=\"leased\",queue=\"a\"} 100
herald_tasks_finished_total{state=\"succeeded\"} 40
herald_table_bytes{table=\"tasks\"} 1000
herald_table_bytes{table=\"recipient_sends\"} 9999
herald_table_bytes{table=\"attempt_history\"} 24
herald_oldest_transaction_seconds 3.5
herald_compactions_total{table=\"tasks\",outcome=\"compacted\"} 2
herald_compactions_total{outcome=\"compacted\",table=\"attempts\"} 1
herald_compactions_total{table=\"tasks\",outcome=\"lock_busy\"} 4
";
        let s = parse_scrape(body);
        assert_eq!(s.waiting, 12.0);
        assert_eq!(s.finished, 40.0);
        assert_eq!(s.table_bytes, 1024.0);
        assert_eq!(s.oldest_transaction_s, 3.5);
        assert_eq!(s.compacted, 3.0);
    }
}
