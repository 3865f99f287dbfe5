//! Policies and edits (issue #16, item 4) on the real binary: a schedule's and a campaign's
//! retry policy reaching their tasks (fixed delays spacing a real retry), UpdateSchedule with
//! a field mask applying from the fire time it names, ListCampaigns pages (cut to what a client
//! accepts when its campaigns are large), and UpdateTask on a SCHEDULED task, refused once
//! leased, and never both winning against a concurrent claim.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use anyhow::{ensure, Context, Result};
use herald_proto::v1::{
    campaign_service_client::CampaignServiceClient, content, retry_policy,
    schedule_service_client::ScheduleServiceClient, task_spec, CampaignRecipient, CampaignSpec,
    Content, CreateCampaignRequest, CreateScheduleRequest, FixedDelays, GetTaskRequest,
    ListAttemptsRequest, ListCampaignsRequest, ListTasksRequest, OutcomeClass, RetryPolicy,
    ScheduleSpec, TaskSpec, TaskState, UpdateScheduleRequest, UpdateTaskRequest,
};
use herald_tests::lease::{result, ScriptedExecutor};
use herald_tests::{
    connect_tasks, create_task, read_every_page, task_spec, unique_id, until, SchedulerProcess,
    TaskSpecExt, TestDb,
};
use prost_types::FieldMask;

fn text(t: &str) -> Option<Content> {
    Some(Content {
        body: Some(content::Body::Text(t.into())),
        ..Default::default()
    })
}

fn minutes(m: i64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: m * 60,
        nanos: 0,
    }
}

/// Fixed delays of 1 m, 5 m and 15 m.
fn one_five_fifteen() -> RetryPolicy {
    RetryPolicy {
        strategy: Some(retry_policy::Strategy::Delays(FixedDelays {
            delays: vec![minutes(1), minutes(5), minutes(15)],
        })),
    }
}

fn mask(paths: &[&str]) -> Option<FieldMask> {
    Some(FieldMask {
        paths: paths.iter().map(|p| (*p).to_string()).collect(),
    })
}

fn body(content: Option<&Content>) -> String {
    match content.and_then(|c| c.body.as_ref()) {
        Some(content::Body::Text(t)) => t.clone(),
        other => format!("{other:?}"),
    }
}

#[tokio::test]
async fn a_schedules_fixed_delays_space_its_tasks_retries() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let queue = unique_id("sched");
    let mut schedules = ScheduleServiceClient::connect(s.grpc_url()).await?;
    schedules
        .create_schedule(CreateScheduleRequest {
            schedule: Some(ScheduleSpec {
                id: "retrying".into(),
                cron: "*/2 * * * * *".into(),
                queue: queue.clone(),
                recipients: vec!["ops@example.com".into()],
                content: text("report"),
                retry_policy: Some(one_five_fifteen()),
                ..Default::default()
            }),
        })
        .await?;
    let mut exec = ScriptedExecutor::connect(&s.grpc_url(), "exec-1", &[&queue], 1).await?;
    let lease = exec.leases(1).await?.remove(0);
    let acks = exec
        .report(vec![result(&lease, OutcomeClass::Transient)])
        .await?;
    ensure!(acks.iter().all(|a| a.accepted), "report refused: {acks:?}");
    let mut tasks = connect_tasks(&s.grpc_url()).await?;
    let task = tasks
        .get_task(GetTaskRequest {
            id: lease.task_id.clone(),
        })
        .await?
        .into_inner();
    assert_eq!(task.retry_policy, Some(one_five_fifteen()));
    assert_eq!(task.state(), TaskState::Scheduled);
    let attempts = tasks
        .list_attempts(ListAttemptsRequest {
            task_id: lease.task_id.clone(),
        })
        .await?
        .into_inner()
        .attempts;
    let finished = attempts
        .first()
        .and_then(|a| a.finished_at)
        .context("the failed attempt is recorded")?;
    let run_at = task.run_at.context("a retry has a due time")?;
    // The first retry waits the first delay exactly: fixed delays have no jitter.
    assert_eq!(
        run_at.seconds - finished.seconds,
        60,
        "{run_at:?} vs {finished:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_campaigns_retry_policy_is_on_every_task() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut campaigns = CampaignServiceClient::connect(s.grpc_url()).await?;
    let created = campaigns
        .create_campaign(CreateCampaignRequest {
            campaign: Some(CampaignSpec {
                name: "retrying".into(),
                queue: "campaign".into(),
                content: text("hello"),
                retry_policy: Some(one_five_fifteen()),
                ..Default::default()
            }),
            recipients: (0..3)
                .map(|i| CampaignRecipient {
                    recipient: format!("user-{i}"),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(
        created.spec.and_then(|s| s.retry_policy),
        Some(one_five_fifteen())
    );
    let mut tasks = connect_tasks(&s.grpc_url()).await?;
    let listed = tasks
        .list_tasks(ListTasksRequest {
            queue: "campaign".into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .tasks;
    assert_eq!(listed.len(), 3);
    for t in listed {
        assert_eq!(t.retry_policy, Some(one_five_fifteen()), "task {}", t.id);
    }
    // A bad policy is refused naming its field, and creates nothing.
    let bad = campaigns
        .create_campaign(CreateCampaignRequest {
            campaign: Some(CampaignSpec {
                queue: "campaign".into(),
                content: text("hello"),
                retry_policy: Some(RetryPolicy {
                    strategy: Some(retry_policy::Strategy::Delays(FixedDelays {
                        delays: vec![],
                    })),
                }),
                ..Default::default()
            }),
            recipients: vec![],
            ..Default::default()
        })
        .await
        .err()
        .context("an empty delay list is refused")?;
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    assert!(
        bad.message()
            .contains("campaign.retry_policy.delays.delays"),
        "{}",
        bad.message()
    );
    let all = campaigns
        .list_campaigns(ListCampaignsRequest::default())
        .await?
        .into_inner()
        .campaigns;
    assert_eq!(all.len(), 1);
    Ok(())
}

#[tokio::test]
async fn update_schedule_applies_from_the_fire_time_it_names() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let queue = unique_id("sched");
    let mut schedules = ScheduleServiceClient::connect(s.grpc_url()).await?;
    schedules
        .create_schedule(CreateScheduleRequest {
            schedule: Some(ScheduleSpec {
                id: "report".into(),
                cron: "*/2 * * * * *".into(),
                queue: queue.clone(),
                recipients: vec!["a@example.com".into()],
                content: text("old"),
                ..Default::default()
            }),
        })
        .await?;
    let conn = db.connect().await?;
    until("a first run", || async {
        Ok(conn
            .query_one("SELECT count(*) FROM herald.schedule_runs", &[])
            .await?
            .get::<_, i64>(0)
            > 0)
    })
    .await?;

    // A bad mask changes nothing.
    let bad = schedules
        .update_schedule(UpdateScheduleRequest {
            schedule: Some(ScheduleSpec {
                id: "report".into(),
                ..Default::default()
            }),
            update_mask: mask(&["id"]),
        })
        .await
        .err()
        .context("id is read-only")?;
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    assert!(bad.message().contains("update_mask"), "{}", bad.message());
    let bad = schedules
        .update_schedule(UpdateScheduleRequest {
            schedule: Some(ScheduleSpec {
                id: "report".into(),
                recipients: vec![],
                ..Default::default()
            }),
            update_mask: mask(&["recipients"]),
        })
        .await
        .err()
        .context("a schedule without recipients is refused")?;
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    assert!(
        bad.message().contains("schedule.recipients"),
        "{}",
        bad.message()
    );

    let updated = schedules
        .update_schedule(UpdateScheduleRequest {
            schedule: Some(ScheduleSpec {
                id: "report".into(),
                content: text("new"),
                recipients: vec!["a@example.com".into(), "b@example.com".into()],
                retry_policy: Some(one_five_fifteen()),
                ..Default::default()
            }),
            update_mask: mask(&["content", "recipients", "retry_policy"]),
        })
        .await?
        .into_inner();
    let from = updated
        .effective_from
        .context("an active schedule names its next fire")?;
    let schedule = updated.schedule.context("the schedule")?;
    assert_eq!(schedule.next_fire_time, Some(from));
    let spec = schedule.spec.context("spec")?;
    assert_eq!(spec.cron, "*/2 * * * * *", "unmasked fields are kept");
    assert_eq!(spec.queue, queue);

    // Every run before `from` has the old content for one recipient; the run at `from` and
    // after it the new content for two, with the new policy.
    until("the run at the effective fire time", || async {
        Ok(conn
            .query_one(
                "SELECT count(*) FROM herald.tasks
                 WHERE schedule_id = 'report' AND extract(epoch FROM fire_time)::bigint = $1",
                &[&from.seconds],
            )
            .await?
            .get::<_, i64>(0)
            == 2)
    })
    .await?;
    let mut tasks = connect_tasks(&s.grpc_url()).await?;
    let listed = tasks
        .list_tasks(ListTasksRequest {
            queue: queue.clone(),
            page_size: 1000,
            ..Default::default()
        })
        .await?
        .into_inner()
        .tasks;
    let mut per_fire: HashMap<String, Vec<String>> = HashMap::new();
    for t in &listed {
        let fire = t
            .labels
            .get("herald.fire_time")
            .cloned()
            .unwrap_or_default();
        per_fire
            .entry(fire)
            .or_default()
            .push(body(t.content.as_ref()));
        let fired_at = chrono::DateTime::parse_from_rfc3339(
            t.labels.get("herald.fire_time").map_or("", String::as_str),
        )?
        .timestamp();
        if fired_at < from.seconds {
            assert_eq!(body(t.content.as_ref()), "old", "task {}", t.id);
            assert_ne!(t.retry_policy, Some(one_five_fifteen()));
        } else {
            assert_eq!(body(t.content.as_ref()), "new", "task {}", t.id);
            assert_eq!(t.retry_policy, Some(one_five_fifteen()));
        }
    }
    ensure!(
        per_fire.values().any(|v| v == &vec!["old".to_string()]),
        "an earlier run kept its old task: {per_fire:?}"
    );
    Ok(())
}

#[tokio::test]
async fn list_campaigns_pages_newest_first() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut campaigns = CampaignServiceClient::connect(s.grpc_url()).await?;
    let mut ids = Vec::new();
    for name in ["first", "second", "third"] {
        ids.push(
            campaigns
                .create_campaign(CreateCampaignRequest {
                    campaign: Some(CampaignSpec {
                        name: name.into(),
                        queue: "campaign".into(),
                        content: text("hi"),
                        ..Default::default()
                    }),
                    recipients: vec![],
                    ..Default::default()
                })
                .await?
                .into_inner()
                .id,
        );
    }
    let first = campaigns
        .list_campaigns(ListCampaignsRequest {
            page_size: 2,
            ..Default::default()
        })
        .await?
        .into_inner();
    let names: Vec<String> = first
        .campaigns
        .iter()
        .map(|c| c.spec.as_ref().map(|s| s.name.clone()).unwrap_or_default())
        .collect();
    assert_eq!(names, vec!["third", "second"]);
    assert!(first.campaigns.iter().all(|c| c.progress.is_some()));
    ensure!(
        !first.next_page_token.is_empty(),
        "a second page is announced"
    );
    let second = campaigns
        .list_campaigns(ListCampaignsRequest {
            page_size: 2,
            page_token: first.next_page_token,
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(
        second
            .campaigns
            .iter()
            .map(|c| c.id.clone())
            .collect::<Vec<_>>(),
        vec![ids[0].clone()]
    );
    assert!(second.next_page_token.is_empty());
    let bad = campaigns
        .list_campaigns(ListCampaignsRequest {
            page_token: "not a token!".into(),
            ..Default::default()
        })
        .await
        .err()
        .context("a forged token is refused")?;
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    assert!(bad.message().contains("page_token"), "{}", bad.message());
    Ok(())
}

#[tokio::test]
async fn a_page_of_large_campaigns_is_cut_to_what_a_client_accepts() -> Result<()> {
    // 100 campaigns of 60 KB of content: one page of all of them would be 6 MB, more than the
    // 4 MiB a gRPC client decodes by default.
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut campaigns = CampaignServiceClient::connect(s.grpc_url()).await?;
    let body = "c".repeat(60_000);
    let mut created = Vec::new();
    for i in 0..100 {
        let campaign = CampaignSpec {
            name: format!("large-{i}"),
            queue: "campaign".into(),
            content: text(&body),
            ..Default::default()
        };
        let id = campaigns
            .create_campaign(CreateCampaignRequest {
                campaign: Some(campaign),
                recipients: vec![],
                ..Default::default()
            })
            .await?
            .into_inner()
            .id;
        created.push(id);
    }
    let (seen, pages) = read_every_page(20, |token| {
        let mut campaigns = campaigns.clone();
        async move {
            let page = campaigns
                .list_campaigns(ListCampaignsRequest {
                    page_size: 100,
                    page_token: token,
                    ..Default::default()
                })
                .await?
                .into_inner();
            let ids = page.campaigns.iter().map(|c| c.id.clone()).collect();
            Ok((ids, page.next_page_token))
        }
    })
    .await?;
    ensure!(pages > 1, "the campaigns did not fit one page");
    created.reverse();
    ensure!(seen == created, "every campaign once, newest first");
    Ok(())
}

#[tokio::test]
async fn update_task_edits_a_scheduled_task_and_is_refused_once_leased() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let queue = unique_id("edit");
    let mut tasks = connect_tasks(&s.grpc_url()).await?;
    let hour = SystemTime::now() + Duration::from_secs(3600);
    let task = create_task(
        &mut tasks,
        task_spec(&queue, "+15550001", "draft").with_run_at(hour),
    )
    .await?;

    let later = SystemTime::now() + Duration::from_secs(7200);
    let edited = tasks
        .update_task(UpdateTaskRequest {
            id: task.id.clone(),
            task: Some(TaskSpec {
                content: text("final"),
                when: Some(task_spec::When::RunAt(later.into())),
                retry_policy: Some(one_five_fifteen()),
                // Not in the mask: ignored.
                recipient: "+15559999".into(),
                ..Default::default()
            }),
            update_mask: mask(&["content", "run_at", "retry_policy"]),
        })
        .await?
        .into_inner();
    assert_eq!(body(edited.content.as_ref()), "final");
    assert_eq!(edited.recipient, "+15550001");
    assert_eq!(
        edited.run_at.map(|t| t.seconds),
        Some(prost_types::Timestamp::from(later).seconds)
    );
    assert_eq!(edited.retry_policy, Some(one_five_fifteen()));

    // Bad input names its field and changes nothing.
    for (patch, paths, field) in [
        (TaskSpec::default(), vec!["recipient"], "update_mask"),
        (TaskSpec::default(), vec![], "update_mask"),
        (
            TaskSpec {
                priority: Some(12),
                ..Default::default()
            },
            vec!["priority"],
            "task.priority",
        ),
        (TaskSpec::default(), vec!["content"], "task.content"),
        (
            TaskSpec {
                labels: [("herald.campaign_id".to_string(), "spoof".to_string())].into(),
                ..Default::default()
            },
            vec!["labels"],
            "task.labels",
        ),
        // A due time named in the mask but not given is refused, not taken as "now" (it sent
        // a task due in two hours at once).
        (TaskSpec::default(), vec!["run_at"], "task.run_at"),
        (TaskSpec::default(), vec!["local_time_zone"], "task.run_at"),
        (
            TaskSpec {
                local_time_zone: "Asia/Tokyo".into(),
                ..Default::default()
            },
            vec!["local_time_zone"],
            "task.",
        ),
    ] {
        let err = tasks
            .update_task(UpdateTaskRequest {
                id: task.id.clone(),
                task: Some(patch),
                update_mask: mask(&paths),
            })
            .await
            .err()
            .context("refused")?;
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{paths:?}");
        assert!(
            err.message().contains(field),
            "{paths:?}: {}",
            err.message()
        );
    }
    let unchanged = tasks
        .get_task(GetTaskRequest {
            id: task.id.clone(),
        })
        .await?
        .into_inner();
    assert_eq!(body(unchanged.content.as_ref()), "final");
    assert_eq!(unchanged.priority, 5);
    assert_eq!(
        unchanged.run_at, edited.run_at,
        "a refused edit moved the due time"
    );

    // Rescheduled to now, it is leased; then an edit is FAILED_PRECONDITION.
    tasks
        .update_task(UpdateTaskRequest {
            id: task.id.clone(),
            task: Some(TaskSpec {
                when: Some(task_spec::When::Delay(prost_types::Duration::default())),
                ..Default::default()
            }),
            update_mask: mask(&["delay"]),
        })
        .await?;
    let mut exec = ScriptedExecutor::connect(&s.grpc_url(), "exec-1", &[&queue], 1).await?;
    let lease = exec.leases(1).await?.remove(0);
    assert_eq!(lease.task_id, task.id);
    let refused = tasks
        .update_task(UpdateTaskRequest {
            id: task.id.clone(),
            task: Some(TaskSpec {
                content: text("too late"),
                ..Default::default()
            }),
            update_mask: mask(&["content"]),
        })
        .await
        .err()
        .context("a leased task cannot be edited")?;
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    exec.report(vec![result(&lease, OutcomeClass::Ok)]).await?;
    let refused = tasks
        .update_task(UpdateTaskRequest {
            id: task.id.clone(),
            task: Some(TaskSpec {
                priority: Some(1),
                ..Default::default()
            }),
            update_mask: mask(&["priority"]),
        })
        .await
        .err()
        .context("an ended task cannot be edited")?;
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    Ok(())
}

#[tokio::test]
async fn an_edit_racing_a_claim_never_both_win() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let queue = unique_id("race");
    let mut tasks = connect_tasks(&s.grpc_url()).await?;
    const N: usize = 200;
    let mut ids = Vec::new();
    for i in 0..N {
        ids.push(
            create_task(
                &mut tasks,
                task_spec(&queue, &format!("+1555{i:04}"), "original"),
            )
            .await?
            .id,
        );
    }
    // The executor claims every task while the edits run.
    let mut exec = ScriptedExecutor::connect(&s.grpc_url(), "exec-1", &[&queue], 0).await?;
    let editor = {
        let url = s.grpc_url();
        let ids = ids.clone();
        tokio::spawn(async move {
            let mut tasks = connect_tasks(&url).await?;
            let mut won = Vec::new();
            for id in ids {
                let r = tasks
                    .update_task(UpdateTaskRequest {
                        id: id.clone(),
                        task: Some(TaskSpec {
                            content: text("edited"),
                            ..Default::default()
                        }),
                        update_mask: mask(&["content"]),
                    })
                    .await;
                match r {
                    Ok(_) => won.push(id),
                    Err(e) if e.code() == tonic::Code::FailedPrecondition => {}
                    Err(e) => return Err(anyhow::Error::from(e)),
                }
            }
            Ok::<_, anyhow::Error>(won)
        })
    };
    exec.credit(N as u32).await?;
    let leases = exec.leases(N).await?;
    let won: std::collections::HashSet<String> = editor.await??.into_iter().collect();
    for l in &leases {
        let sent = body(l.content.as_deref());
        if won.contains(&l.task_id) {
            assert_eq!(
                sent, "edited",
                "an accepted edit is what is leased ({})",
                l.task_id
            );
        } else {
            assert_eq!(
                sent, "original",
                "a refused edit changed nothing ({})",
                l.task_id
            );
        }
    }
    Ok(())
}
