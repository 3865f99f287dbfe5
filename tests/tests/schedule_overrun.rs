//! A run that overruns (issue #16, item 8) on the real binary: a schedule run still unfinished
//! `overrun_after` past its fire time raises one `schedule.run_overran` notification, counts
//! `herald_schedule_runs_overran_total` and shows `overran_at` on the run; a run whose tasks
//! finished in time raises nothing.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use herald_proto::v1::{
    content, schedule_service_client::ScheduleServiceClient, scheduler_message, Content,
    CreateScheduleRequest, ListScheduleRunsRequest, OutcomeClass, ScheduleSpec,
};
use herald_tests::lease::{result, ScriptedExecutor};
use herald_tests::{unique_id, SchedulerProcess, TestDb, WebhookReceiver};

fn every_two_seconds(id: &str, queue: &str, overrun_after: i64) -> ScheduleSpec {
    ScheduleSpec {
        id: id.into(),
        cron: "*/2 * * * * *".into(),
        queue: queue.into(),
        recipients: vec!["ops@example.com".into()],
        content: Some(Content {
            body: Some(content::Body::Text("report".into())),
            ..Default::default()
        }),
        overrun_after: Some(prost_types::Duration {
            seconds: overrun_after,
            nanos: 0,
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn an_unfinished_run_raises_one_notification_a_metric_and_a_mark() -> Result<()> {
    let notify = WebhookReceiver::start().await?;
    let db = TestDb::new().await?;
    let s = SchedulerProcess::builder(&db)
        .env("HERALD_NOTIFY_URL", format!("{}/notify", notify.url()))
        .spawn()
        .await?;
    let slow_queue = unique_id("slow");
    let fast_queue = unique_id("fast");
    // Every task of `fast` is sent at once; nobody serves `slow`.
    let mut exec = ScriptedExecutor::connect(&s.grpc_url(), "exec-1", &[&fast_queue], 10).await?;
    let sender = tokio::spawn(async move {
        loop {
            if let scheduler_message::Kind::Leases(batch) =
                exec.next_within(Duration::from_secs(120)).await?
            {
                let n = batch.leases.len() as u32;
                exec.send(herald_proto::v1::executor_message::Kind::Report(
                    herald_proto::v1::ReportBatch {
                        results: batch
                            .leases
                            .iter()
                            .map(|l| result(l, OutcomeClass::Ok))
                            .collect(),
                    },
                ))
                .await?;
                exec.credit(n).await?;
            }
        }
        #[allow(unreachable_code)]
        Ok::<_, anyhow::Error>(())
    });
    let mut schedules = ScheduleServiceClient::connect(s.grpc_url()).await?;
    for spec in [
        every_two_seconds("slow", &slow_queue, 1),
        every_two_seconds("fast", &fast_queue, 3),
    ] {
        schedules
            .create_schedule(CreateScheduleRequest {
                schedule: Some(spec),
            })
            .await?;
    }
    let requests = notify.wait_for_requests(1, Duration::from_secs(30)).await?;
    let first: serde_json::Value = serde_json::from_slice(&requests[0].body)?;
    assert_eq!(first["type"], "schedule.run_overran", "{first}");
    assert_eq!(first["data"]["schedule_id"], "slow", "{first}");
    assert_eq!(first["data"]["live_tasks"], 1, "{first}");
    assert_eq!(first["data"]["overrun_after_seconds"], 1, "{first}");
    let fire_time = first["data"]["fire_time"]
        .as_str()
        .context("fire_time")?
        .to_string();

    // Wait until a run of `fast` was checked (its deadline passed and was cleared).
    let conn = db.connect().await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let checked: i64 = conn
            .query_one(
                "SELECT count(*) FROM herald.schedule_runs
                 WHERE schedule_id = 'fast' AND overrun_deadline IS NULL AND kind = 'fired'",
                &[],
            )
            .await?
            .get(0);
        if checked >= 2 {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "fast's runs were never checked"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all: Vec<serde_json::Value> = notify
        .requests()
        .iter()
        .map(|r| serde_json::from_slice(&r.body))
        .collect::<Result<_, _>>()?;
    assert!(
        all.iter().all(|n| n["data"]["schedule_id"] == "slow"),
        "a run finished in time raised nothing: {all:?}"
    );
    let same_run = all
        .iter()
        .filter(|n| n["data"]["fire_time"] == fire_time.as_str())
        .count();
    assert_eq!(same_run, 1, "one notification per run");

    let runs = schedules
        .list_schedule_runs(ListScheduleRunsRequest {
            id: "slow".into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .runs;
    assert!(runs.iter().any(|r| r.overran_at.is_some()), "{runs:?}");
    let metrics = herald_tests::metrics::scrape(&s.http_url()).await?;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("herald_schedule_runs_overran_total") && l.contains("\"slow\""))
        .context("the overrun counter is exported")?;
    assert!(!line.contains("\"fast\""));
    sender.abort();
    Ok(())
}
