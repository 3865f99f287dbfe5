//! StatsService over gRPC on the real scheduler binary, against rows seeded directly in SQL with
//! chosen timestamps (the database's clock is the only clock the statistics read, so seeding
//! relative to its `now()` is the injectable clock): today's counts in several time zones across
//! UTC midnight, success rates grouped three ways, trigger-lag percentiles, send durations, and
//! the failure list's paging and filters, and its pages cut to what a client accepts.

use std::collections::BTreeSet;
use std::fmt::Debug;

use anyhow::{bail, ensure, Context, Result};
use chrono::{DateTime, Duration, DurationRound, NaiveTime, TimeZone, Utc};
use herald_proto::v1::stats_service_client::StatsServiceClient;
use herald_proto::v1::{
    content, Content, CountTasksRequest, ListFailuresRequest, OutcomeClass, SendDurationsRequest,
    StatsGroupBy, StatsWindow, SuccessRatesRequest, TaskState, TemplateContent, TriggerLagRequest,
};
use herald_tests::metrics::{scrape, series};
use herald_tests::{read_every_page, SchedulerProcess, TaskSpecExt, TestDb};
use prost::Message;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_types::StatusExt;
use uuid::Uuid;

/// A task row to seed; fields left at their defaults are what a plain text task has.
#[derive(Debug, Clone)]
struct Seed {
    queue: &'static str,
    state: &'static str,
    run_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    leased_at: Option<DateTime<Utc>>,
    template: Option<&'static str>,
    account: Option<&'static str>,
    cancel_outcome: Option<i16>,
    last_error: Option<&'static str>,
    /// Attempts: (account, outcome code, finished_at, started_at, error).
    attempts: Vec<SeedAttempt>,
}

#[derive(Debug, Clone)]
struct SeedAttempt {
    account: Option<&'static str>,
    outcome: i16,
    finished_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    error: Option<&'static str>,
}

impl Seed {
    fn new(queue: &'static str, state: &'static str, run_at: DateTime<Utc>) -> Self {
        Seed {
            queue,
            state,
            run_at,
            finished_at: None,
            leased_at: None,
            template: None,
            account: None,
            cancel_outcome: None,
            last_error: None,
            attempts: Vec::new(),
        }
    }

    fn finished(mut self, at: DateTime<Utc>) -> Self {
        self.finished_at = Some(at);
        self
    }

    fn template(mut self, id: &'static str) -> Self {
        self.template = Some(id);
        self
    }

    fn attempt(mut self, account: Option<&'static str>, outcome: i16, at: DateTime<Utc>) -> Self {
        self.attempts.push(SeedAttempt {
            account,
            outcome,
            finished_at: at,
            started_at: None,
            error: (outcome != 1).then_some("seeded failure"),
        });
        self
    }
}

fn content_bytes(template: Option<&str>) -> Vec<u8> {
    let body = match template {
        Some(id) => content::Body::Template(TemplateContent {
            template_id: id.to_string(),
            language: "en".into(),
            ..Default::default()
        }),
        None => content::Body::Text("hello".into()),
    };
    Content {
        body: Some(body),
        ..Default::default()
    }
    .encode_to_vec()
}

async fn seed(db: &tokio_postgres::Client, seeds: &[Seed]) -> Result<Vec<Uuid>> {
    let mut ids = Vec::new();
    for s in seeds {
        let id = Uuid::now_v7();
        let lease_count = s.attempts.len() as i32;
        let charged = s.attempts.iter().filter(|a| a.outcome != 5).count() as i32;
        db.execute(
            "INSERT INTO herald.tasks (id, queue, recipient, content, template_id, labels, state,
                 priority, run_at, max_attempts, backoff_initial_ms, backoff_max_ms,
                 backoff_multiplier, backoff_jitter, route, account_id, leased_at, lease_count,
                 attempts, finished_at, cancel_outcome, last_error)
             VALUES ($1, $2, '+15550100', $3, $4, '{\"team\": \"ops\"}', $5::text::herald.task_state,
                 5, $6, 10, 1000, 60000, 2.0, 0.0, 'default/', $7, $8, $9, $10, $11, $12, $13)",
            &[
                &id,
                &s.queue,
                &content_bytes(s.template),
                &s.template,
                &s.state,
                &s.run_at,
                &s.account,
                &s.leased_at,
                &lease_count,
                &charged,
                &s.finished_at,
                &s.cancel_outcome,
                &s.last_error,
            ],
        )
        .await
        .context("seeding a task")?;
        for (i, a) in s.attempts.iter().enumerate() {
            db.execute(
                "INSERT INTO herald.attempts (task_id, attempt, executor_id, account, outcome,
                     error, leased_at, started_at, finished_at)
                 VALUES ($1, $2, 'seed', $3, $4, $5, $6, $7, $6)",
                &[
                    &id,
                    &(i as i32 + 1),
                    &a.account,
                    &a.outcome,
                    &a.error,
                    &a.finished_at,
                    &a.started_at,
                ],
            )
            .await
            .context("seeding an attempt")?;
        }
        ids.push(id);
    }
    Ok(ids)
}

async fn db_now(db: &tokio_postgres::Client) -> Result<DateTime<Utc>> {
    Ok(db.query_one("SELECT now()", &[]).await?.get(0))
}

async fn stack() -> Result<(TestDb, SchedulerProcess, StatsServiceClient<Channel>)> {
    let db = TestDb::new().await?;
    // Starting the scheduler applies the migrations the seeds need; no executor connects, so
    // seeded scheduled tasks stay as they are.
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let client = StatsServiceClient::connect(scheduler.grpc_url()).await?;
    Ok((db, scheduler, client))
}

fn ts(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: t.timestamp_subsec_nanos() as i32,
    }
}

fn from_ts(t: Option<&prost_types::Timestamp>) -> Result<DateTime<Utc>> {
    let t = t.context("timestamp missing")?;
    DateTime::from_timestamp(t.seconds, t.nanos as u32).context("timestamp out of range")
}

fn range(start: DateTime<Utc>, end: DateTime<Utc>) -> Option<StatsWindow> {
    Some(StatsWindow {
        start: Some(ts(start)),
        end: Some(ts(end)),
        ..Default::default()
    })
}

fn today_in(zone: &str) -> Option<StatsWindow> {
    Some(StatsWindow {
        time_zone: zone.into(),
        ..Default::default()
    })
}

/// Today's bounds in `zone` at `now`, computed here with chrono-tz, independently of the
/// server (which asks PostgreSQL).
fn day_bounds(zone: &str, now: DateTime<Utc>) -> Result<(DateTime<Utc>, DateTime<Utc>)> {
    let tz: chrono_tz::Tz = zone.parse().map_err(|e| anyhow::anyhow!("{e}"))?;
    let date = now.with_timezone(&tz).date_naive();
    let midnight = |d: chrono::NaiveDate| {
        tz.from_local_datetime(&d.and_time(NaiveTime::MIN))
            .earliest()
            .map(|t| t.with_timezone(&Utc))
            .context("local midnight does not exist")
    };
    let next = date.succ_opt().context("no next day")?;
    Ok((midnight(date)?, midnight(next)?))
}

fn violated_fields(status: &Status) -> Result<Vec<String>> {
    let bad_request = status
        .get_details_bad_request()
        .with_context(|| format!("no google.rpc.BadRequest details on {status:?}"))?;
    Ok(bad_request
        .field_violations
        .into_iter()
        .map(|v| v.field)
        .collect())
}

fn expect_invalid<T: Debug>(result: Result<tonic::Response<T>, Status>, field: &str) -> Result<()> {
    match result {
        Ok(r) => bail!(
            "expected INVALID_ARGUMENT on {field}, got {:?}",
            r.into_inner()
        ),
        Err(status) if status.code() == Code::InvalidArgument => {
            let fields = violated_fields(&status)?;
            ensure!(fields == [field], "expected field {field}, got {fields:?}");
            Ok(())
        }
        Err(status) => bail!("expected INVALID_ARGUMENT, got {status:?}"),
    }
}

#[tokio::test]
async fn counts_today_follow_the_time_zone_across_utc_midnight() -> Result<()> {
    let (db, _scheduler, mut stats) = stack().await?;
    let pg = db.connect().await?;
    let now = db_now(&pg).await?;
    let zones = ["UTC", "Asia/Tokyo", "America/Los_Angeles"];

    // Instants a minute either side of every boundary that matters: the UTC midnights before
    // and after now (one of them falls inside Tokyo's and Los Angeles' today, splitting what a
    // UTC day would count together) and each zone's own day boundaries.
    let utc_midnight = now.duration_trunc(Duration::days(1))?;
    let mut boundaries = vec![utc_midnight, utc_midnight + Duration::days(1)];
    for zone in zones {
        let (start, end) = day_bounds(zone, now)?;
        boundaries.extend([start, end]);
    }
    let instants: BTreeSet<DateTime<Utc>> = boundaries
        .iter()
        .flat_map(|b| [*b - Duration::minutes(1), *b + Duration::minutes(1)])
        .collect();
    let mut seeds = Vec::new();
    for at in &instants {
        // One ended task placed by finished_at, and one scheduled and one leased task placed
        // by run_at (the two live states are counted through different indexes).
        seeds.push(Seed::new("counts", "succeeded", *at - Duration::hours(1)).finished(*at));
        seeds.push(Seed::new("counts", "scheduled", *at));
        let mut leased = Seed::new("counts", "leased", *at);
        leased.leased_at = Some(*at);
        seeds.push(leased);
    }
    // Another queue, to check the queue filter.
    seeds.push(Seed::new("other", "failed", now).finished(now));
    seed(&pg, &seeds).await?;

    let mut per_zone = Vec::new();
    for zone in zones {
        let (start, end) = day_bounds(zone, now)?;
        let expected = instants
            .iter()
            .filter(|t| **t >= start && **t < end)
            .count() as i64;
        let counts = stats
            .count_tasks(CountTasksRequest {
                window: today_in(zone),
                queue: "counts".into(),
            })
            .await?
            .into_inner();
        ensure!(
            from_ts(counts.start.as_ref())? == start && from_ts(counts.end.as_ref())? == end,
            "{zone}: window {:?}..{:?}, expected {start}..{end}",
            counts.start,
            counts.end
        );
        ensure!(
            counts.succeeded == expected
                && counts.scheduled == expected
                && counts.leased == expected,
            "{zone}: expected {expected} succeeded, scheduled and leased, got {counts:?}"
        );
        ensure!(counts.failed == 0, "queue filter ignored: {counts:?}");
        per_zone.push((zone, expected));
    }
    // The UTC midnight inside Tokyo's today has both its sides there; UTC puts them on two days.
    let midnight_in_tokyo = {
        let (start, end) = day_bounds("Asia/Tokyo", now)?;
        [utc_midnight, utc_midnight + Duration::days(1)]
            .into_iter()
            .find(|m| *m > start && *m < end)
            .context("no UTC midnight inside Tokyo's today")?
    };
    let (utc_start, utc_end) = day_bounds("UTC", now)?;
    let sides_in_utc = [
        midnight_in_tokyo - Duration::minutes(1),
        midnight_in_tokyo + Duration::minutes(1),
    ]
    .iter()
    .filter(|t| **t >= utc_start && **t < utc_end)
    .count();
    ensure!(sides_in_utc == 1, "the split midnight was not split in UTC");

    // Every queue, and an explicit window.
    let all = stats
        .count_tasks(CountTasksRequest {
            window: range(now - Duration::seconds(1), now + Duration::seconds(1)),
            queue: String::new(),
        })
        .await?
        .into_inner();
    ensure!(all.failed == 1, "explicit window: {all:?}");
    println!("today's counts per zone: {per_zone:?}");
    Ok(())
}

#[tokio::test]
async fn success_rates_group_by_account_template_and_hour() -> Result<()> {
    let (db, _scheduler, stats) = stack().await?;
    let pg = db.connect().await?;
    let now = db_now(&pg).await?;
    let base = now.duration_trunc(Duration::hours(1))? - Duration::hours(5);
    let h = |hours: i64, minutes: i64| base + Duration::hours(hours) + Duration::minutes(minutes);

    seed(
        &pg,
        &[
            // Account a1, template t1: OK after one TRANSIENT, in hours 0 and 1.
            Seed::new("rates", "succeeded", base)
                .template("t1")
                .attempt(Some("a1"), 3, h(0, 10))
                .attempt(Some("a1"), 1, h(1, 10))
                .finished(h(1, 10)),
            Seed::new("rates", "succeeded", base)
                .template("t1")
                .attempt(Some("a1"), 1, h(1, 20))
                .finished(h(1, 20)),
            // Account a2, template t2: PERMANENT in hour 2.
            Seed::new("rates", "failed", base)
                .template("t2")
                .attempt(Some("a2"), 4, h(2, 30))
                .finished(h(2, 30)),
            // Routed by queue alone (no account), plain text: OK in hour 2.
            Seed::new("rates", "succeeded", base)
                .attempt(None, 1, h(2, 40))
                .finished(h(2, 40)),
            // Outside the window: not counted.
            Seed::new("rates", "succeeded", base)
                .attempt(Some("a1"), 1, h(4, 0))
                .finished(h(4, 0)),
        ],
    )
    .await?;
    let window = range(base, h(3, 0));
    let rates = |group: StatsGroupBy, window: Option<StatsWindow>| {
        let mut stats = stats.clone();
        async move {
            Ok::<_, anyhow::Error>(
                stats
                    .success_rates(SuccessRatesRequest {
                        window,
                        group_by: group as i32,
                        queue: String::new(),
                    })
                    .await?
                    .into_inner()
                    .rates,
            )
        }
    };

    let by_account: Vec<_> = rates(StatsGroupBy::Account, window.clone())
        .await?
        .into_iter()
        .map(|r| (r.key, r.attempts, r.succeeded, r.transient, r.permanent))
        .collect();
    ensure!(
        by_account
            == vec![
                ("a1".to_string(), 3, 2, 1, 0),
                ("".to_string(), 1, 1, 0, 0),
                ("a2".to_string(), 1, 0, 0, 1),
            ],
        "by account: {by_account:?}"
    );

    let by_template = rates(StatsGroupBy::Template, window.clone()).await?;
    let t1 = by_template
        .iter()
        .find(|r| r.key == "t1")
        .context("no t1 entry")?;
    ensure!(
        t1.attempts == 3 && t1.succeeded == 2 && t1.failed == 1,
        "t1: {t1:?}"
    );
    ensure!(
        (t1.success_rate - 2.0 / 3.0).abs() < 1e-9,
        "t1 rate {}",
        t1.success_rate
    );
    let keys: BTreeSet<_> = by_template.iter().map(|r| r.key.as_str()).collect();
    ensure!(
        keys == BTreeSet::from(["", "t1", "t2"]),
        "templates: {keys:?}"
    );

    let by_hour: Vec<_> = rates(StatsGroupBy::Hour, window.clone())
        .await?
        .into_iter()
        .map(|r| Ok((from_ts(r.bucket_start.as_ref())?, r.attempts, r.succeeded)))
        .collect::<Result<_>>()?;
    ensure!(
        by_hour == vec![(h(0, 0), 1, 0), (h(1, 0), 2, 2), (h(2, 0), 2, 1)],
        "by hour: {by_hour:?}"
    );

    // Hours align in the window's zone: India is UTC+5:30, so its hours start at :30 UTC.
    let india = rates(
        StatsGroupBy::Hour,
        Some(StatsWindow {
            time_zone: "Asia/Kolkata".into(),
            ..window.clone().context("window")?
        }),
    )
    .await?;
    ensure!(!india.is_empty(), "no hourly buckets in Asia/Kolkata");
    for r in &india {
        let start = from_ts(r.bucket_start.as_ref())?;
        ensure!(
            start.timestamp() % 3600 == 1800,
            "bucket {start} not at :30"
        );
    }
    Ok(())
}

#[tokio::test]
async fn trigger_lag_percentiles_and_send_durations() -> Result<()> {
    let (db, _scheduler, mut stats) = stack().await?;
    let pg = db.connect().await?;
    let now = db_now(&pg).await?;
    let due = now - Duration::hours(2);

    // Lags of 1..=100 seconds: odd ones in queue lag-a, even ones in lag-b.
    let mut seeds = Vec::new();
    for i in 1..=100i64 {
        let queue = if i % 2 == 1 { "lag-a" } else { "lag-b" };
        let leased = due + Duration::seconds(i);
        let mut s = Seed::new(queue, "succeeded", due).finished(leased + Duration::seconds(1));
        s.leased_at = Some(leased);
        seeds.push(s);
    }
    // Not measured: a task waiting for a retry (its run_at belongs to the next lease), and one
    // cancelled before its latest due time was leased.
    let mut waiting = Seed::new("lag-a", "scheduled", now + Duration::hours(1));
    waiting.leased_at = Some(due + Duration::hours(1));
    let mut cancelled = Seed::new("lag-a", "cancelled", due).finished(now);
    cancelled.leased_at = Some(due + Duration::hours(1));
    cancelled.cancel_outcome = Some(1);
    seeds.extend([waiting, cancelled]);
    // Send durations: 200 ms and 400 ms for (sends, t1); 1 s for (sends, text).
    for (ms, template) in [(200, Some("t1")), (400, Some("t1")), (1000, None)] {
        let finished = now - Duration::minutes(10);
        let mut s = Seed::new("sends", "succeeded", due).finished(finished);
        s.template = template;
        s.attempts.push(SeedAttempt {
            account: Some("a1"),
            outcome: 1,
            finished_at: finished,
            started_at: Some(finished - Duration::milliseconds(ms)),
            error: None,
        });
        seeds.push(s);
    }
    seed(&pg, &seeds).await?;

    let lag = stats
        .trigger_lag(TriggerLagRequest {
            window: range(due, now),
            queue: String::new(),
            by_queue: true,
        })
        .await?
        .into_inner();
    let overall = lag.overall.context("no overall lag")?;
    let secs = |d: Option<prost_types::Duration>| {
        d.map(|d| d.seconds as f64 + f64::from(d.nanos) / 1e9)
            .unwrap_or(-1.0)
    };
    // percentile_cont interpolates: p50 of 1..=100 is 50.5, p90 is 90.1, p99 is 99.01.
    ensure!(overall.count == 100, "count: {overall:?}");
    for (name, got, want) in [
        ("p50", secs(overall.p50), 50.5),
        ("p90", secs(overall.p90), 90.1),
        ("p99", secs(overall.p99), 99.01),
        ("max", secs(overall.max), 100.0),
    ] {
        ensure!(
            (got - want).abs() < 1e-3,
            "{name}: {got} s, expected {want} s"
        );
    }
    let queues: Vec<_> = lag
        .queues
        .iter()
        .map(|q| (q.queue.as_str(), q.count, secs(q.max)))
        .collect();
    ensure!(
        queues == vec![("lag-a", 50, 99.0), ("lag-b", 50, 100.0)],
        "per queue: {queues:?}"
    );
    let only_a = stats
        .trigger_lag(TriggerLagRequest {
            window: range(due, now),
            queue: "lag-a".into(),
            by_queue: false,
        })
        .await?
        .into_inner();
    ensure!(
        only_a.overall.as_ref().map(|o| o.count) == Some(50) && only_a.queues.is_empty(),
        "queue filter: {only_a:?}"
    );

    let durations = stats
        .send_durations(SendDurationsRequest {
            window: range(due, now),
            queue: "sends".into(),
        })
        .await?
        .into_inner()
        .durations;
    let got: Vec<_> = durations
        .iter()
        .map(|d| {
            (
                d.template_id.as_str(),
                d.count,
                secs(d.average),
                secs(d.max),
            )
        })
        .collect();
    ensure!(
        got == vec![("", 1, 1.0, 1.0), ("t1", 2, 0.3, 0.4)],
        "durations: {got:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_page_of_large_failures_is_cut_to_what_a_client_accepts() -> Result<()> {
    // 100 failed tasks of 60 KB of content: one page of all of them would be 6 MB, more than
    // the 4 MiB a gRPC client decodes by default.
    let (db, _scheduler, stats) = stack().await?;
    let pg = db.connect().await?;
    let now = db_now(&pg).await?;
    let seeds: Vec<Seed> = (0..100)
        .map(|i| {
            let ended = now - Duration::seconds(i + 1);
            Seed::new("large", "failed", now - Duration::hours(1))
                .attempt(Some("a1"), 4, ended)
                .finished(ended)
        })
        .collect();
    let ids = seed(&pg, &seeds).await?;
    let large = Content {
        body: Some(content::Body::Text("f".repeat(60_000))),
        ..Default::default()
    }
    .encode_to_vec();
    pg.execute(
        "UPDATE herald.tasks SET content = $1 WHERE id = ANY($2)",
        &[&large, &ids],
    )
    .await?;
    let window = range(now - Duration::hours(2), now + Duration::seconds(1));
    let (seen, pages) = read_every_page(20, |token| {
        let mut stats = stats.clone();
        let window = window.clone();
        async move {
            let page = stats
                .list_failures(ListFailuresRequest {
                    window,
                    page_size: 100,
                    page_token: token,
                    ..Default::default()
                })
                .await?
                .into_inner();
            let ids = page.failures.iter().map(|f| f.task_id.clone()).collect();
            Ok((ids, page.next_page_token))
        }
    })
    .await?;
    ensure!(pages > 1, "the failures did not fit one page");
    let expected: Vec<String> = ids.iter().map(Uuid::to_string).collect();
    ensure!(
        seen == expected,
        "every failure once, most recently ended first"
    );
    Ok(())
}

#[tokio::test]
async fn failure_list_pages_and_filters() -> Result<()> {
    let (db, _scheduler, mut stats) = stack().await?;
    let pg = db.connect().await?;
    let now = db_now(&pg).await?;
    let at = |minutes: i64| now - Duration::minutes(minutes);

    let mut seeds = Vec::new();
    // Seven failures, ended a minute apart: queue f1 through a1 (PERMANENT, template t1) for
    // the first four, queue f2 through a2 (TRANSIENT) for the next three.
    for i in 1..=7 {
        let (queue, account, outcome) = if i <= 4 {
            ("f1", "a1", 4)
        } else {
            ("f2", "a2", 3)
        };
        let mut s = Seed::new(queue, "failed", at(100))
            .attempt(Some(account), outcome, at(i))
            .finished(at(i));
        if i <= 4 {
            s = s.template("t1");
        }
        seeds.push(s);
    }
    // An expired task that never had an attempt, and a success (not a failure).
    let mut expired = Seed::new("f1", "expired", at(100)).finished(at(20));
    expired.last_error = None;
    seeds.push(expired);
    seeds.push(
        Seed::new("f1", "succeeded", at(100))
            .attempt(Some("a1"), 1, at(30))
            .finished(at(30)),
    );
    let ids = seed(&pg, &seeds).await?;

    let list = |req: ListFailuresRequest| {
        let mut stats = stats.clone();
        async move { Ok::<_, anyhow::Error>(stats.list_failures(req).await?.into_inner()) }
    };
    let window = range(now - Duration::hours(3), now + Duration::seconds(1));

    // Paging: 8 failures in pages of 3, newest first, none twice.
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = list(ListFailuresRequest {
            window: window.clone(),
            page_size: 3,
            page_token: token.clone(),
            ..Default::default()
        })
        .await?;
        pages += 1;
        seen.extend(page.failures.iter().map(|f| f.task_id.clone()));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
        ensure!(pages < 10, "paging does not end");
    }
    let mut expected: Vec<String> = ids[..7].iter().map(Uuid::to_string).collect();
    expected.push(ids[7].to_string());
    ensure!(
        seen == expected,
        "pages ({pages}) gave {seen:?}, expected {expected:?}"
    );
    // A list whose last page is full ends there: no token pointing at an empty page.
    let first_half = list(ListFailuresRequest {
        window: window.clone(),
        page_size: 4,
        ..Default::default()
    })
    .await?;
    ensure!(first_half.failures.len() == 4 && !first_half.next_page_token.is_empty());
    let last_half = list(ListFailuresRequest {
        window: window.clone(),
        page_size: 4,
        page_token: first_half.next_page_token,
        ..Default::default()
    })
    .await?;
    ensure!(
        last_half.failures.len() == 4 && last_half.next_page_token.is_empty(),
        "the last full page ({} failures) points to another: {:?}",
        last_half.failures.len(),
        last_half.next_page_token
    );

    // Each entry traces back to its input.
    let first = list(ListFailuresRequest {
        window: window.clone(),
        page_size: 1,
        ..Default::default()
    })
    .await?
    .failures
    .into_iter()
    .next()
    .context("no failure")?;
    ensure!(
        first.queue == "f1"
            && first.account_id == "a1"
            && first.outcome == OutcomeClass::Permanent as i32
            && first.state == TaskState::Failed as i32
            && first.error == "seeded failure"
            && first.template_id == "t1"
            && first.attempts == 1
            && first.labels.get("team").map(String::as_str) == Some("ops")
            && first.recipient == "+15550100",
        "entry: {first:?}"
    );
    ensure!(
        matches!(
            first.content.and_then(|c| c.body),
            Some(content::Body::Template(t)) if t.template_id == "t1"
        ),
        "content not returned"
    );

    // Filters.
    for (name, req, want) in [
        (
            "queue",
            ListFailuresRequest {
                queue: "f2".into(),
                ..Default::default()
            },
            3,
        ),
        (
            "account",
            ListFailuresRequest {
                account_id: "a1".into(),
                ..Default::default()
            },
            4,
        ),
        (
            "outcome",
            ListFailuresRequest {
                outcome: OutcomeClass::Transient as i32,
                ..Default::default()
            },
            3,
        ),
        (
            "template",
            ListFailuresRequest {
                template_id: "t1".into(),
                ..Default::default()
            },
            4,
        ),
        (
            "queue and outcome",
            ListFailuresRequest {
                queue: "f1".into(),
                outcome: OutcomeClass::Transient as i32,
                ..Default::default()
            },
            0,
        ),
    ] {
        let got = list(ListFailuresRequest {
            window: window.clone(),
            ..req
        })
        .await?
        .failures
        .len();
        ensure!(got == want, "filter {name}: {got} entries, expected {want}");
    }
    let expired_entry = list(ListFailuresRequest {
        window: window.clone(),
        queue: "f1".into(),
        ..Default::default()
    })
    .await?
    .failures
    .into_iter()
    .find(|f| f.state == TaskState::Expired as i32)
    .context("expired task missing")?;
    ensure!(
        expired_entry.outcome == OutcomeClass::Unspecified as i32,
        "expired entry: {expired_entry:?}"
    );

    expect_invalid(
        stats
            .list_failures(ListFailuresRequest {
                page_token: "garbage".into(),
                ..Default::default()
            })
            .await,
        "page_token",
    )?;
    expect_invalid(
        stats
            .list_failures(ListFailuresRequest {
                page_size: 501,
                ..Default::default()
            })
            .await,
        "page_size",
    )?;
    Ok(())
}

#[tokio::test]
async fn invalid_requests_name_the_field() -> Result<()> {
    let (_db, _scheduler, mut stats) = stack().await?;
    expect_invalid(
        stats
            .count_tasks(CountTasksRequest {
                window: today_in("Mars/Olympus_Mons"),
                queue: String::new(),
            })
            .await,
        "window.time_zone",
    )?;
    expect_invalid(
        stats
            .success_rates(SuccessRatesRequest {
                window: None,
                group_by: StatsGroupBy::Unspecified as i32,
                queue: String::new(),
            })
            .await,
        "group_by",
    )?;
    let now = Utc::now();
    expect_invalid(
        stats
            .trigger_lag(TriggerLagRequest {
                window: range(now, now - Duration::hours(1)),
                ..Default::default()
            })
            .await,
        "window.end",
    )?;
    expect_invalid(
        stats
            .send_durations(SendDurationsRequest {
                window: None,
                queue: "Not A Queue".into(),
            })
            .await,
        "queue",
    )?;
    Ok(())
}

/// The live-task gauge as /metrics renders it: the value of `herald_tasks{state,queue}`.
fn live_gauge(body: &str, state: &str, queue: &str) -> Option<f64> {
    series(
        body,
        "herald_tasks",
        &format!("state=\"{state}\",queue=\"{queue}\""),
    )
}

#[tokio::test]
async fn the_live_task_gauge_is_present_from_the_first_scrape_and_counts_new_tasks_at_once(
) -> Result<()> {
    let db = TestDb::new().await?;
    // No periodic refresh during the test: what a scrape shows, the scrape counted.
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_METRICS_REFRESH", "1h")
        .spawn()
        .await?;
    let first = scrape(&scheduler.http_url()).await?;
    for state in ["scheduled", "leased"] {
        ensure!(
            live_gauge(&first, state, "") == Some(0.0),
            "herald_tasks{{state=\"{state}\"}} missing from the first scrape:\n{first}"
        );
    }

    let mut tasks = herald_tests::connect_tasks(&scheduler.grpc_url()).await?;
    for i in 0..3 {
        let spec = herald_tests::task_spec("gauged", &format!("+1555000{i}"), "hi")
            .with_delay(std::time::Duration::from_secs(3600));
        tasks
            .create_task(herald_proto::v1::CreateTaskRequest { task: Some(spec) })
            .await?;
    }
    // A scrape recounts once the last count is a second old; the periodic refresh is an hour
    // away, so only the scrapes can count them.
    herald_tests::until("a scrape to count the three new tasks", || async {
        let body = scrape(&scheduler.http_url()).await?;
        Ok(live_gauge(&body, "scheduled", "gauged") == Some(3.0))
    })
    .await?;

    // Leased tasks are counted through another index than scheduled ones (migration 31).
    let spec = herald_tests::task_spec("gauged-now", "+15550009", "hi");
    tasks
        .create_task(herald_proto::v1::CreateTaskRequest { task: Some(spec) })
        .await?;
    let mut exec = herald_tests::lease::ScriptedExecutor::connect(
        &scheduler.grpc_url(),
        "gauge-reader",
        &["gauged-now"],
        1,
    )
    .await?;
    exec.leases(1).await?;
    // Due now with no executor serving its queue: the one task due, which the three tasks an
    // hour away are not.
    let spec = herald_tests::task_spec("unserved", "+15550010", "hi");
    tasks
        .create_task(herald_proto::v1::CreateTaskRequest { task: Some(spec) })
        .await?;
    let due =
        |body: &str, queue: &str| series(body, "herald_tasks_due", &format!("queue=\"{queue}\""));
    herald_tests::until("a scrape to count the leased and the due task", || async {
        let body = scrape(&scheduler.http_url()).await?;
        Ok(live_gauge(&body, "leased", "gauged-now") == Some(1.0)
            && live_gauge(&body, "scheduled", "gauged") == Some(3.0)
            && due(&body, "unserved") == Some(1.0)
            && due(&body, "gauged") == Some(0.0))
    })
    .await
}

/// Each service records its per-task metrics once per batch (scheduler) or per account
/// (executor) rather than per task; what they add up to must not change: every finished task
/// and every send attempt is counted once, under its own state, class and lease count.
#[tokio::test]
async fn the_outcome_metrics_count_every_finished_task_and_send_attempt() -> Result<()> {
    use herald_proto::v1::{retry_policy, CreateTasksRequest, ExponentialBackoff, RetryPolicy};

    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::builder(&db).spawn().await?;
    // Every first attempt on `retried` answers TRANSIENT; its retry succeeds.
    let executor = herald_tests::ExecutorProcess::builder(&[scheduler.grpc_url()])
        .config_toml(
            "[queues.once]\nsender = \"noop\"\n\
             [queues.retried]\nsender = \"noop\"\nfail_first_attempts = 1.0\n",
        )
        .spawn()
        .await?;
    let quick_retry = RetryPolicy {
        strategy: Some(retry_policy::Strategy::Exponential(ExponentialBackoff {
            initial: Some(prost_types::Duration {
                seconds: 0,
                nanos: 100_000_000,
            }),
            ..Default::default()
        })),
    };
    let specs = (0..5)
        .map(|i| {
            let queue = if i < 3 { "once" } else { "retried" };
            let mut spec = herald_tests::task_spec(queue, &format!("+1555100{i}"), "hi");
            spec.retry_policy = Some(quick_retry.clone());
            spec
        })
        .collect();
    let mut tasks = herald_tests::connect_tasks(&scheduler.grpc_url()).await?;
    tasks
        .create_tasks(CreateTasksRequest {
            tasks: specs,
            ..Default::default()
        })
        .await?;

    let client = db.connect().await?;
    herald_tests::until("all five tasks to succeed", || async {
        let succeeded: i64 = client
            .query_one(
                "SELECT count(*) FROM herald.task_records WHERE state = 'succeeded'",
                &[],
            )
            .await?
            .get(0);
        Ok(succeeded == 5)
    })
    .await?;

    let scheduler_body = scrape(&scheduler.http_url()).await?;
    let succeeded = r#"state="succeeded""#;
    ensure!(
        series(&scheduler_body, "herald_tasks_finished_total", succeeded) == Some(5.0),
        "five tasks finished:\n{scheduler_body}"
    );
    // Three tasks took one lease, two took two.
    ensure!(
        series(&scheduler_body, "herald_attempts_per_task_count", succeeded) == Some(5.0)
            && series(&scheduler_body, "herald_attempts_per_task_sum", succeeded) == Some(7.0),
        "leases per task observed once per task:\n{scheduler_body}"
    );

    // The executor reports its sends before the scheduler ends the tasks, so it has counted
    // all seven by now.
    let executor_body = scrape(&executor.http_url()).await?;
    let outcomes = "herald_send_outcomes_total";
    ensure!(
        series(&executor_body, outcomes, r#"account="",class="ok""#) == Some(5.0)
            && series(&executor_body, outcomes, r#"account="",class="transient""#) == Some(2.0),
        "five sends ok and two transient:\n{executor_body}"
    );
    ensure!(
        series(&executor_body, "herald_send_duration_seconds_count", "") == Some(7.0),
        "seven send durations:\n{executor_body}"
    );
    Ok(())
}

/// Tasks the sweep ends count among the finished ones as report-ended tasks do: a last attempt
/// whose lease lapsed (FAILED: an executor that crash-loops shows in the failures) and a task
/// whose deadline passed while it waited (EXPIRED, a deadline expiry too).
#[tokio::test]
async fn tasks_the_sweep_ends_are_counted_as_finished() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_LEASE_TTL", "1s")
        .spawn()
        .await?;
    let url = scheduler.grpc_url();
    let mut tasks = herald_tests::connect_tasks(&url).await?;
    let mut last = herald_tests::task_spec("once", "+15551000001", "hi");
    last.max_attempts = Some(1);
    herald_tests::create_task(&mut tasks, last).await?;
    // An executor that takes the lease and never reports on it.
    let mut silent =
        herald_tests::lease::ScriptedExecutor::connect(&url, "silent", &["once"], 1).await?;
    silent.leases(1).await?;
    // A task no executor serves, whose deadline passes while it waits.
    let mut late = herald_tests::task_spec("nobody", "+15551000002", "hi");
    let deadline = std::time::SystemTime::now() + std::time::Duration::from_secs(2);
    late.expire_at = Some(deadline.into());
    herald_tests::create_task(&mut tasks, late).await?;

    let client = db.connect().await?;
    herald_tests::until("the sweep to end both tasks", || async {
        let ended: i64 = client
            .query_one(
                "SELECT count(*) FROM herald.task_records
                 WHERE (queue = 'once' AND state = 'failed')
                    OR (queue = 'nobody' AND state = 'expired')",
                &[],
            )
            .await?
            .get(0);
        Ok(ended == 2)
    })
    .await?;
    let body = scrape(&scheduler.http_url()).await?;
    ensure!(
        series(&body, "herald_tasks_finished_total", r#"state="failed""#) == Some(1.0)
            && series(&body, "herald_tasks_finished_total", r#"state="expired""#) == Some(1.0)
            && series(&body, "herald_deadline_expiries_total", "") == Some(1.0),
        "the swept tasks are counted:\n{body}"
    );
    Ok(())
}
