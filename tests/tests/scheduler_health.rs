//! The real scheduler binary starts on a fresh database (running its migrations) and reports
//! SERVING on the standard gRPC health service; its storage settings, the storage figures it
//! exports (table sizes, the transaction that holds VACUUM back), and the compactor giving back
//! the space of a hot table left mostly empty.

use anyhow::{bail, ensure, Result};
use herald_proto::v1::scheduler_message;
use herald_tests::lease::ScriptedExecutor;
use herald_tests::metrics::{scrape, series};
use herald_tests::{connect_health, until, ExecutorProcess, SchedulerProcess, TaskSpecExt, TestDb};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::HealthCheckRequest;

#[tokio::test]
async fn scheduler_reports_serving() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut health = connect_health(&scheduler.grpc_url()).await?;

    // The empty service name is the server as a whole, as Kubernetes probes ask it.
    let response = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await?
        .into_inner();
    assert_eq!(response.status(), ServingStatus::Serving);
    Ok(())
}

#[tokio::test]
async fn the_churning_tables_get_their_own_vacuum_settings() -> Result<()> {
    let db = TestDb::new().await?;
    let _scheduler = SchedulerProcess::spawn(&db).await?;
    let conn = db.connect().await?;
    let options = |table: &'static str| {
        let conn = &conn;
        async move {
            let row = conn
                .query_one(
                    "SELECT coalesce(array_to_string(reloptions, ','), '') AS o FROM pg_class
                     WHERE oid = ('herald.' || $1)::regclass",
                    &[&table],
                )
                .await?;
            anyhow::Ok(row.get::<_, String>("o"))
        }
    };
    // Half-empty account pages keep the constant updates of a few rows HOT.
    assert!(options("accounts").await?.contains("fillfactor=50"));
    for table in ["tasks", "attempts", "recipient_sends"] {
        let o = options(table).await?;
        assert!(
            o.contains("autovacuum_vacuum_scale_factor=0.0") && o.contains("cost_delay=0"),
            "{table}: {o}"
        );
    }
    Ok(())
}

/// `herald_table_bytes{table}` as /metrics renders it.
fn table_bytes(body: &str, table: &str) -> Option<f64> {
    series(body, "herald_table_bytes", &format!("table=\"{table}\""))
}

/// `herald_oldest_transaction_seconds` as /metrics renders it.
fn oldest_transaction(body: &str) -> Option<f64> {
    series(body, "herald_oldest_transaction_seconds", "")
}

#[tokio::test]
async fn a_scrape_shows_table_sizes_and_the_transaction_that_holds_vacuum_back() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let conn = db.connect().await?;
    let before = scrape(&scheduler.http_url()).await?;
    for table in [
        "tasks",
        "attempts",
        "recipient_sends",
        "task_history",
        "attempt_history",
    ] {
        ensure!(
            table_bytes(&before, table).is_some(),
            "herald_table_bytes{{table=\"{table}\"}} missing:\n{before}"
        );
    }
    // A partitioned table holds nothing itself: once retention's first pass has made the
    // history's partitions, a size above zero is their sum.
    until("retention to make the history's partitions", || async {
        let partitions: i64 = conn
            .query_one(
                "SELECT count(*) FROM pg_inherits
                 WHERE inhparent = 'herald.task_history'::regclass",
                &[],
            )
            .await?
            .get(0);
        Ok(partitions > 0)
    })
    .await?;
    until(
        "herald_table_bytes{table=\"task_history\"} to be its partitions' sum",
        || async {
            let sized = scrape(&scheduler.http_url()).await?;
            Ok(table_bytes(&sized, "task_history").unwrap_or(0.0) > 0.0)
        },
    )
    .await?;
    let sized = scrape(&scheduler.http_url()).await?;

    // Rows written show in a later scrape: the sizes are read afresh, at most once a second
    // (an open /metrics must not let a flood of scrapes take the pool's connections).
    let tasks_before = table_bytes(&sized, "tasks").unwrap_or(0.0);
    let mut tasks = herald_tests::connect_tasks(&scheduler.grpc_url()).await?;
    for i in 0..20 {
        let spec = herald_tests::task_spec("sized", &format!("+1555100{i:02}"), "hi")
            .with_delay(std::time::Duration::from_secs(3600));
        tasks
            .create_task(herald_proto::v1::CreateTaskRequest { task: Some(spec) })
            .await?;
    }
    until(
        "herald_table_bytes{table=\"tasks\"} to grow with 20 tasks",
        || async {
            let after = scrape(&scheduler.http_url()).await?;
            Ok(table_bytes(&after, "tasks").unwrap_or(0.0) > tasks_before)
        },
    )
    .await?;

    // A transaction holding a snapshot, as a report or an analyst's session would: the gauge
    // counts its age, and drops back once it ends. A second is far longer than any of the
    // scheduler's own transactions while nothing is due.
    let held = db.connect().await?;
    held.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
        .await?;
    until("the held transaction to show as a second old", || async {
        let body = scrape(&scheduler.http_url()).await?;
        Ok(oldest_transaction(&body).is_some_and(|s| s >= 1.0))
    })
    .await?;
    held.batch_execute("COMMIT").await?;
    until("the gauge to drop once the transaction ends", || async {
        let body = scrape(&scheduler.http_url()).await?;
        Ok(oldest_transaction(&body).is_some_and(|s| s < 1.0))
    })
    .await
}

/// Waits until every transaction that began before now and holds a snapshot has ended, in any
/// database: one taken before a delete keeps the deleted rows through a rewrite (another test's
/// CREATE DATABASE holds back every database's horizon while it copies the template).
async fn until_older_snapshots_end(conn: &tokio_postgres::Client) -> Result<()> {
    let now: std::time::SystemTime = conn
        .query_one("SELECT clock_timestamp() AS now", &[])
        .await?
        .get("now");
    until("the snapshots older than the delete to end", || async {
        let older: i64 = conn
            .query_one(
                "SELECT count(*) AS older FROM pg_stat_activity
                 WHERE pid <> pg_backend_pid() AND xact_start < $1
                   AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)",
                &[&now],
            )
            .await?
            .get("older");
        Ok(older == 0)
    })
    .await
}

/// `herald_compactions_total{table, outcome}` as /metrics renders it (labels in any order).
fn compactions(body: &str, table: &str, outcome: &str) -> Option<f64> {
    let (table, outcome) = (
        format!("table=\"{table}\""),
        format!("outcome=\"{outcome}\""),
    );
    body.lines()
        .filter(|l| l.starts_with("herald_compactions_total{"))
        .find(|l| l.contains(&table) && l.contains(&outcome))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.trim().parse().ok())
}

/// A replica whose minimum is 1 MiB rewrites a `herald.tasks` left mostly empty space (20,000
/// tasks gone, 20 still waiting at the end of the file, where VACUUM cannot cut it short), counts
/// the rewrite, and every waiting task is still there.
#[tokio::test]
async fn the_compactor_gives_back_a_tasks_table_left_mostly_empty() -> Result<()> {
    let db = TestDb::new().await?;
    // Makes the tasks; its compactor is off, so only the second replica's can act.
    let maker = SchedulerProcess::builder(&db)
        .env("HERALD_COMPACT_MAX_MIB", "0")
        .spawn()
        .await?;
    let mut tasks = herald_tests::connect_tasks(&maker.grpc_url()).await?;
    let later = std::time::Duration::from_secs(3600);
    for (queue, batches, per_batch) in [("gone", 20, 1_000), ("kept", 1, 20)] {
        for batch in 0..batches {
            let specs = (0..per_batch)
                .map(|i| {
                    herald_tests::task_spec(queue, &format!("+1555{batch:02}{i:04}"), "hi")
                        .with_delay(later)
                })
                .collect();
            tasks
                .create_tasks(herald_proto::v1::CreateTasksRequest {
                    tasks: specs,
                    ..Default::default()
                })
                .await?;
        }
    }
    let conn = db.connect().await?;
    // ANALYZE, so the catalog counts the 20 rows left rather than the 20,020 made.
    conn.batch_execute(
        "DELETE FROM herald.tasks WHERE queue = 'gone';
         ANALYZE herald.tasks;
         SELECT pg_stat_force_next_flush()",
    )
    .await?;
    let size = || async {
        let row = conn
            .query_one(
                "SELECT pg_total_relation_size('herald.tasks') AS bytes",
                &[],
            )
            .await?;
        anyhow::Ok(row.get::<_, i64>("bytes"))
    };
    let before = size().await?;
    until_older_snapshots_end(&conn).await?;

    let compactor = SchedulerProcess::builder(&db)
        .env("HERALD_COMPACT_MIN_MIB", "1")
        .spawn()
        .await?;
    until("the compactor to rewrite herald.tasks", || async {
        let body = scrape(&compactor.http_url()).await?;
        ensure!(
            compactions(&body, "tasks", "held_back").is_none(),
            "the rewrite kept the deleted rows:\n{}",
            compactor.stderr_tail()
        );
        Ok(compactions(&body, "tasks", "compacted") == Some(1.0))
    })
    .await?;
    let after = size().await?;
    ensure!(
        after * 4 < before,
        "herald.tasks went from {before} to {after} bytes"
    );
    let kept: i64 = conn
        .query_one(
            "SELECT count(*) AS kept FROM herald.tasks
             WHERE queue = 'kept' AND state = 'scheduled'",
            &[],
        )
        .await?
        .get("kept");
    ensure!(kept == 20, "{kept} of the 20 waiting tasks are left");
    Ok(())
}

/// Every name health answers for: the server and each herald service it serves.
const SERVED: [&str; 9] = [
    "",
    "herald.v1.TaskService",
    "herald.v1.TemplateService",
    "herald.v1.AccountService",
    "herald.v1.ScheduleService",
    "herald.v1.CampaignService",
    "herald.v1.LeaseService",
    "herald.v1.StatsService",
    "herald.v1.SuppressionService",
];

async fn statuses(url: &str) -> Result<Vec<(&'static str, ServingStatus)>> {
    let mut health = connect_health(url).await?;
    let mut out = Vec::new();
    for service in SERVED {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await?
            .into_inner()
            .status();
        out.push((service, status));
    }
    Ok(out)
}

/// Regression (#14): health reported four of the served services; every one is SERVING
/// together, and NOT_SERVING together once the replica starts shutting down, as `/readyz` is
/// 200 and then 503.
#[tokio::test]
async fn every_served_service_changes_health_together() -> Result<()> {
    let db = TestDb::new().await?;
    let mut scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    let serving: Vec<_> = SERVED
        .iter()
        .map(|s| (*s, ServingStatus::Serving))
        .collect();
    assert_eq!(statuses(&url).await?, serving);
    let readyz = format!("{}/readyz", scheduler.http_url());
    assert_eq!(
        reqwest::get(&readyz).await?.status(),
        reqwest::StatusCode::OK
    );

    // An executor that stays keeps the replica in its shutdown grace period, serving health.
    let mut executor = ScriptedExecutor::connect(&url, "stays", &[], 0).await?;
    scheduler.terminate()?;
    match executor.next().await? {
        scheduler_message::Kind::Drain(_) => {}
        other => bail!("expected Drain, got {other:?}"),
    }
    // Health is set before sessions are told to drain.
    let not_serving: Vec<_> = SERVED
        .iter()
        .map(|s| (*s, ServingStatus::NotServing))
        .collect();
    assert_eq!(statuses(&url).await?, not_serving);
    // The HTTP readiness probe (the chart's with TLS on) says the same.
    assert_eq!(
        reqwest::get(&readyz).await?.status(),
        reqwest::StatusCode::SERVICE_UNAVAILABLE
    );
    Ok(())
}

#[tokio::test]
async fn scheduler_stops_on_sigterm() -> Result<()> {
    let db = TestDb::new().await?;
    let mut scheduler = SchedulerProcess::spawn(&db).await?;
    scheduler.terminate()?;
    let status = scheduler.wait().await?;
    assert!(status.success(), "exit status {status}");
    Ok(())
}

#[tokio::test]
async fn executor_starts_against_a_scheduler() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut executor = ExecutorProcess::builder(&[scheduler.grpc_url()])
        .spawn()
        .await?;
    assert!(executor.http_url().starts_with("http://127.0.0.1:"));
    executor.terminate()?;
    let status = executor.wait().await?;
    assert!(status.success(), "exit status {status}");
    Ok(())
}
