//! The duplicate content guard (issue #16, item 7) on the real binaries: per queue (the
//! scheduler's configuration) and per campaign, a task to the same recipient with the same
//! rendered content due within the window ends CANCELLED (end reason DUPLICATE_CONTENT, error `duplicate content`) and is never
//! leased; different content, another recipient or a due time outside the window pass; and two
//! scheduler replicas creating the same message at once let exactly one through.

use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use herald_proto::v1::{
    campaign_service_client::CampaignServiceClient, content, CampaignRecipient, CampaignSpec,
    Content, CreateCampaignRequest, EndReason, ListTasksRequest, TaskState,
};
use herald_tests::lease::ScriptedExecutor;
use herald_tests::{
    connect_tasks, create_task, task_spec, unique_id, SchedulerProcess, TaskSpecExt, TestDb,
};

const DUPLICATE: &str = "duplicate content";

#[tokio::test]
async fn a_queues_window_ends_the_second_identical_message() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::builder(&db)
        .env("HERALD_DUPLICATE_CONTENT_WINDOWS", "alerts=10m, other=1s")
        .spawn()
        .await?;
    let mut tasks = connect_tasks(&s.grpc_url()).await?;
    let first = create_task(&mut tasks, task_spec("alerts", "+15550001", "disk full")).await?;
    assert_eq!(first.state(), TaskState::Scheduled);
    let second = create_task(&mut tasks, task_spec("alerts", "+15550001", "disk full")).await?;
    assert_eq!(second.state(), TaskState::Cancelled, "{second:?}");
    assert_eq!(
        second.end_reason(),
        EndReason::DuplicateContent,
        "{second:?}"
    );
    assert_eq!(second.last_error, DUPLICATE);
    // Not the same message: another text, another recipient, or due outside the window.
    let other_text = create_task(&mut tasks, task_spec("alerts", "+15550001", "disk ok")).await?;
    let other_recipient =
        create_task(&mut tasks, task_spec("alerts", "+15550002", "disk full")).await?;
    let later = create_task(
        &mut tasks,
        task_spec("alerts", "+15550001", "disk full")
            .with_run_at(SystemTime::now() + Duration::from_secs(3600)),
    )
    .await?;
    // Another queue without a window.
    let unguarded = create_task(&mut tasks, task_spec("plain", "+15550001", "disk full")).await?;
    for t in [&other_text, &other_recipient, &later, &unguarded] {
        assert_eq!(t.state(), TaskState::Scheduled, "{t:?}");
    }
    // A task's own window guards a queue without one; guarded tasks are compared with guarded
    // tasks only, so the first of these passes and the second is the duplicate.
    let own = || {
        let mut spec = task_spec("plain", "+15550001", "backup done");
        spec.duplicate_window = Some(prost_types::Duration {
            seconds: 600,
            nanos: 0,
        });
        spec
    };
    assert_eq!(
        create_task(&mut tasks, own()).await?.state(),
        TaskState::Scheduled
    );
    assert_eq!(
        create_task(&mut tasks, own()).await?.state(),
        TaskState::Cancelled
    );
    // A bad window names its field.
    let mut bad = task_spec("plain", "+15550001", "x");
    bad.duplicate_window = Some(prost_types::Duration {
        seconds: 0,
        nanos: 1,
    });
    let err = tasks
        .create_task(herald_proto::v1::CreateTaskRequest { task: Some(bad) })
        .await
        .err()
        .context("refused")?;
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("task.duplicate_window"),
        "{}",
        err.message()
    );

    // The duplicate is never leased: the executor gets exactly the first one of "alerts".
    let mut exec = ScriptedExecutor::connect(&s.grpc_url(), "exec-1", &["alerts"], 10).await?;
    let leases = exec.leases(3).await?;
    let ids: Vec<&str> = leases.iter().map(|l| l.task_id.as_str()).collect();
    assert!(
        !ids.contains(&second.id.as_str()),
        "the duplicate was leased"
    );
    assert!(ids.contains(&first.id.as_str()));
    // A misconfigured window stops the binary with a clear message.
    let refused = SchedulerProcess::builder(&db)
        .env("HERALD_DUPLICATE_CONTENT_WINDOWS", "alerts")
        .spawn()
        .await;
    let message = match refused {
        Ok(_) => anyhow::bail!("a bad HERALD_DUPLICATE_CONTENT_WINDOWS was accepted"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        message.contains("HERALD_DUPLICATE_CONTENT_WINDOWS"),
        "{message}"
    );
    Ok(())
}

#[tokio::test]
async fn a_campaigns_window_skips_recipients_who_already_have_the_message() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let queue = unique_id("promo");
    let campaigns = CampaignServiceClient::connect(s.grpc_url()).await?;
    // The same campaign launched twice, with overlapping recipients.
    let launch = |recipients: std::ops::Range<usize>| {
        let queue = queue.clone();
        let mut campaigns = campaigns.clone();
        async move {
            Ok::<_, anyhow::Error>(
                campaigns
                    .create_campaign(CreateCampaignRequest {
                        campaign: Some(CampaignSpec {
                            name: "spring".into(),
                            queue,
                            content: Some(Content {
                                body: Some(content::Body::Text("spring offer".into())),
                                ..Default::default()
                            }),
                            duplicate_window: Some(prost_types::Duration {
                                seconds: 600,
                                nanos: 0,
                            }),
                            ..Default::default()
                        }),
                        recipients: recipients
                            .map(|i| CampaignRecipient {
                                recipient: format!("user-{i}"),
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    })
                    .await?
                    .into_inner(),
            )
        }
    };
    let first = launch(0..3).await?;
    assert_eq!(first.progress.context("progress")?.scheduled, 3);
    let second = launch(1..5).await?;
    let progress = second.progress.context("progress")?;
    assert_eq!(progress.cancelled, 2, "{progress:?}");
    assert_eq!(progress.scheduled, 2, "{progress:?}");
    let mut tasks = connect_tasks(&s.grpc_url()).await?;
    let mut failed: Vec<(String, String)> = tasks
        .list_tasks(ListTasksRequest {
            states: vec![TaskState::Cancelled as i32],
            end_reasons: vec![EndReason::DuplicateContent as i32],
            queue: queue.clone(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .tasks
        .into_iter()
        .map(|t| (t.recipient, t.last_error))
        .collect();
    failed.sort();
    assert_eq!(
        failed,
        vec![
            ("user-1".to_string(), DUPLICATE.to_string()),
            ("user-2".to_string(), DUPLICATE.to_string())
        ]
    );
    Ok(())
}

#[tokio::test]
async fn two_replicas_creating_the_same_message_at_once_let_one_through() -> Result<()> {
    let db = TestDb::new().await?;
    let a = SchedulerProcess::builder(&db)
        .env("HERALD_DUPLICATE_CONTENT_WINDOWS", "alerts=10m")
        .spawn()
        .await?;
    let b = SchedulerProcess::builder(&db)
        .env("HERALD_DUPLICATE_CONTENT_WINDOWS", "alerts=10m")
        .spawn()
        .await?;
    const EACH: usize = 20;
    let mut creators = Vec::new();
    for url in [a.grpc_url(), b.grpc_url()] {
        for _ in 0..EACH {
            let url = url.clone();
            creators.push(tokio::spawn(async move {
                let mut tasks = connect_tasks(&url).await?;
                create_task(&mut tasks, task_spec("alerts", "+15550001", "disk full")).await
            }));
        }
    }
    let mut scheduled = 0;
    for c in creators {
        let t = c.await??;
        match t.state() {
            TaskState::Scheduled => scheduled += 1,
            TaskState::Cancelled => assert_eq!(t.last_error, DUPLICATE),
            other => anyhow::bail!("unexpected state {other:?}"),
        }
    }
    assert_eq!(
        scheduled,
        1,
        "exactly one of {} identical messages goes out",
        2 * EACH
    );
    Ok(())
}
