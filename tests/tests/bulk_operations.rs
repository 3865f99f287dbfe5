//! Bulk operations by filter (issue #16, item 5) on the real binary: a dry run's count equals
//! what the operation then changes; a campaign's pending tasks cancelled in batches with
//! nothing leased after it is done, and a leased one revoked as CancelTask revokes it; the
//! operation resuming after the scheduler is SIGKILLed between batches; retry and reschedule;
//! the same filters on ListTasks; bad filters refused naming the field.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use herald_proto::v1::{
    campaign_service_client::CampaignServiceClient, content, scheduler_message,
    start_bulk_operation_request, task_service_client::TaskServiceClient, AddRecipientsRequest,
    BulkAction, BulkOperation, BulkOperationState, CampaignRecipient, CampaignSpec, Content,
    CreateCampaignRequest, GetBulkOperationRequest, ListBulkOperationsRequest, ListTasksRequest,
    OutcomeClass, RevokeResult, StartBulkOperationRequest, TaskFilter, TaskState,
};
use herald_tests::lease::{lease_ref, ScriptedExecutor};
use herald_tests::{
    connect_tasks, create_task, task_spec, unique_id, SchedulerProcess, TaskSpecExt, TestDb,
};
use tonic::transport::Channel;

async fn campaign_with(url: &str, queue: &str, n: usize, start_in: Duration) -> Result<String> {
    let mut c = CampaignServiceClient::connect(url.to_owned()).await?;
    let start = std::time::SystemTime::now() + start_in;
    let id = c
        .create_campaign(CreateCampaignRequest {
            campaign: Some(CampaignSpec {
                name: "bulk".into(),
                queue: queue.into(),
                content: Some(Content {
                    body: Some(content::Body::Text("offer".into())),
                    ..Default::default()
                }),
                start_at: Some(start.into()),
                ..Default::default()
            }),
            recipients: vec![],
            ..Default::default()
        })
        .await?
        .into_inner()
        .id;
    let all: Vec<CampaignRecipient> = (0..n)
        .map(|i| CampaignRecipient {
            recipient: format!("+1555{i:06}"),
            ..Default::default()
        })
        .collect();
    for chunk in all.chunks(1_000) {
        c.add_recipients(AddRecipientsRequest {
            campaign_id: id.clone(),
            recipients: chunk.to_vec(),
        })
        .await?;
    }
    Ok(id)
}

fn cancel(filter: TaskFilter, dry_run: bool) -> StartBulkOperationRequest {
    StartBulkOperationRequest {
        action: BulkAction::Cancel as i32,
        filter: Some(filter),
        dry_run,
        reschedule: None,
    }
}

/// Polls GetBulkOperation until `done` holds for it, and returns it.
async fn wait_for(
    tasks: &mut TaskServiceClient<Channel>,
    id: &str,
    mut done: impl FnMut(&BulkOperation) -> bool,
) -> Result<BulkOperation> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let op = tasks
            .get_bulk_operation(GetBulkOperationRequest { id: id.into() })
            .await?
            .into_inner();
        if done(&op) {
            return Ok(op);
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "timed out; the operation is at {op:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn count_state(db: &TestDb, campaign: &str, state: &str) -> Result<i64> {
    let c = db.connect().await?;
    Ok(c.query_one(
        "SELECT count(*) FROM herald.tasks WHERE campaign_id = $1::text::uuid AND state::text = $2",
        &[&campaign, &state],
    )
    .await?
    .get(0))
}

#[tokio::test]
async fn a_campaigns_pending_tasks_are_cancelled_in_batches_after_a_dry_run() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::builder(&db)
        .env("HERALD_BULK_BATCH_SIZE", "700")
        .spawn()
        .await?;
    let queue = unique_id("bulk");
    const N: usize = 10_000;
    // Due now: the executor holds one lease while the operation runs.
    let campaign = campaign_with(&s.grpc_url(), &queue, N, Duration::ZERO).await?;
    let other = campaign_with(&s.grpc_url(), &queue, 50, Duration::ZERO).await?;
    let mut exec = ScriptedExecutor::connect(&s.grpc_url(), "exec-1", &[&queue], 1).await?;
    let held = exec.leases(1).await?.remove(0);
    let mut tasks = connect_tasks(&s.grpc_url()).await?;
    let filter = TaskFilter {
        campaign_id: campaign.clone(),
        ..Default::default()
    };
    let dry = tasks
        .start_bulk_operation(cancel(filter.clone(), true))
        .await?
        .into_inner();
    let held_in_campaign = i64::from(count_state(&db, &campaign, "leased").await? == 1);
    assert_eq!(
        dry.matched, N as i64,
        "every live task of the campaign, leased ones too"
    );
    assert!(dry.operation.is_none(), "a dry run stores nothing");
    assert_eq!(count_state(&db, &campaign, "cancelled").await?, 0);
    let started = tasks
        .start_bulk_operation(cancel(filter.clone(), false))
        .await?
        .into_inner();
    assert_eq!(started.matched, dry.matched);
    let op = started.operation.context("an operation")?;
    assert_eq!(
        op.filter.as_ref().map(|f| f.states.clone()),
        Some(vec![TaskState::Scheduled as i32, TaskState::Leased as i32]),
        "the states are narrowed to the action's"
    );
    // The held lease, if it is the campaign's, is revoked exactly as CancelTask revokes it.
    if held_in_campaign == 1 {
        let revoke = loop {
            match exec.next().await? {
                scheduler_message::Kind::Revoke(r) => break r,
                scheduler_message::Kind::Leases(_) => continue,
                other => anyhow::bail!("expected a revoke, got {other:?}"),
            }
        };
        assert_eq!(
            revoke.lease.as_ref().map(|l| l.task_id.clone()),
            Some(held.task_id.clone())
        );
        exec.revoke_ack(lease_ref(&held), RevokeResult::StoppedBeforeSend)
            .await?;
    }
    let done = wait_for(&mut tasks, &op.id, |o| {
        o.state() == BulkOperationState::Done
    })
    .await?;
    assert_eq!(
        done.changed, dry.matched,
        "the dry run's count is what was changed"
    );
    assert_eq!(done.processed, dry.matched);
    assert!(done.finished_at.is_some());
    assert_eq!(count_state(&db, &campaign, "cancelled").await?, N as i64);
    // Nothing of the campaign is leased after it returns; the other campaign is untouched.
    exec.credit(100).await?;
    let leases = exec
        .leases(if held_in_campaign == 1 { 50 } else { 49 })
        .await?;
    let c = db.connect().await?;
    for l in &leases {
        let in_campaign: bool = c
            .query_one(
                "SELECT campaign_id = $2::text::uuid FROM herald.tasks WHERE id = $1::text::uuid",
                &[&l.task_id, &campaign],
            )
            .await?
            .get(0);
        assert!(
            !in_campaign,
            "a cancelled campaign's task was leased: {}",
            l.task_id
        );
    }
    assert_eq!(count_state(&db, &other, "cancelled").await?, 0);
    // ListTasks takes the same filter.
    let listed = tasks
        .list_tasks(ListTasksRequest {
            filter: Some(TaskFilter {
                campaign_id: campaign.clone(),
                states: vec![TaskState::Cancelled as i32],
                ..Default::default()
            }),
            page_size: 1000,
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(listed.tasks.len(), 1000);
    assert!(!listed.next_page_token.is_empty());
    let ops = tasks
        .list_bulk_operations(ListBulkOperationsRequest::default())
        .await?
        .into_inner()
        .operations;
    assert_eq!(
        ops.iter().map(|o| o.id.clone()).collect::<Vec<_>>(),
        vec![op.id]
    );
    Ok(())
}

#[tokio::test]
async fn an_operation_resumes_after_the_scheduler_is_killed_between_batches() -> Result<()> {
    let db = TestDb::new().await?;
    // Small, slow batches: the kill lands while the operation is part way.
    let spawn = || {
        SchedulerProcess::builder(&db)
            .env("HERALD_BULK_BATCH_SIZE", "20")
            .env("HERALD_BULK_BATCH_PAUSE", "200ms")
            .spawn()
    };
    let mut s = spawn().await?;
    let queue = unique_id("bulk");
    let campaign = campaign_with(&s.grpc_url(), &queue, 400, Duration::from_secs(3600)).await?;
    let mut tasks = connect_tasks(&s.grpc_url()).await?;
    let filter = TaskFilter {
        campaign_id: campaign.clone(),
        ..Default::default()
    };
    let dry = tasks
        .start_bulk_operation(cancel(filter.clone(), true))
        .await?
        .into_inner();
    assert_eq!(dry.matched, 400);
    let op = tasks
        .start_bulk_operation(cancel(filter, false))
        .await?
        .into_inner()
        .operation
        .context("an operation")?;
    // Progress is visible while it runs.
    let part = wait_for(&mut tasks, &op.id, |o| o.processed >= 40).await?;
    assert_eq!(part.state(), BulkOperationState::Running);
    s.kill()?;
    s.wait().await?;
    let c = db.connect().await?;
    let (processed, state): (i64, String) = {
        let r = c
            .query_one(
                "SELECT processed, state FROM herald.bulk_operations WHERE id = $1::text::uuid",
                &[&op.id],
            )
            .await?;
        (r.get("processed"), r.get("state"))
    };
    ensure!(
        state == "running" && processed < 400,
        "the kill should land part way: {state} after {processed}"
    );
    // Every committed batch's tasks are cancelled and counted, no more.
    assert_eq!(count_state(&db, &campaign, "cancelled").await?, processed);

    let s = spawn().await?;
    let mut tasks = connect_tasks(&s.grpc_url()).await?;
    let done = wait_for(&mut tasks, &op.id, |o| {
        o.state() == BulkOperationState::Done
    })
    .await?;
    assert_eq!(done.changed, dry.matched);
    assert_eq!(count_state(&db, &campaign, "cancelled").await?, 400);
    assert_eq!(count_state(&db, &campaign, "scheduled").await?, 0);
    Ok(())
}

#[tokio::test]
async fn retry_and_reschedule_by_filter() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::builder(&db)
        .env("HERALD_BULK_BATCH_SIZE", "7")
        .spawn()
        .await?;
    let queue = unique_id("bulk");
    let mut tasks = connect_tasks(&s.grpc_url()).await?;
    for i in 0..30 {
        create_task(
            &mut tasks,
            task_spec(&queue, &format!("+1555{i:04}"), "x").with_max_attempts(1),
        )
        .await?;
    }
    // Fail all 30.
    let mut exec = ScriptedExecutor::connect(&s.grpc_url(), "exec-1", &[&queue], 30).await?;
    let leases = exec.leases(30).await?;
    exec.report_each(&leases, OutcomeClass::Permanent).await?;
    let failed = TaskFilter {
        queue: queue.clone(),
        states: vec![TaskState::Failed as i32],
        ..Default::default()
    };
    let retry = |dry_run| StartBulkOperationRequest {
        action: BulkAction::Retry as i32,
        filter: Some(failed.clone()),
        dry_run,
        reschedule: None,
    };
    let dry = tasks.start_bulk_operation(retry(true)).await?.into_inner();
    assert_eq!(dry.matched, 30);
    let op = tasks
        .start_bulk_operation(retry(false))
        .await?
        .into_inner()
        .operation
        .context("op")?;
    let done = wait_for(&mut tasks, &op.id, |o| {
        o.state() == BulkOperationState::Done
    })
    .await?;
    assert_eq!(done.changed, 30);
    // Re-driven: leased again (and left leased: RESCHEDULE does not touch them).
    exec.credit(30).await?;
    let again = exec.leases(30).await?;
    assert!(again.iter().all(|l| l.attempt == 2));

    // Reschedule the queue's SCHEDULED tasks a day ahead, by run_at.
    for i in 0..30 {
        create_task(
            &mut tasks,
            task_spec(&queue, &format!("+1666{i:04}"), "y").with_delay(Duration::from_secs(60)),
        )
        .await?;
    }
    let tomorrow = std::time::SystemTime::now() + Duration::from_secs(86_400);
    let scheduled = TaskFilter {
        queue: queue.clone(),
        ..Default::default()
    };
    let resched = |dry_run| StartBulkOperationRequest {
        action: BulkAction::Reschedule as i32,
        filter: Some(scheduled.clone()),
        dry_run,
        reschedule: Some(start_bulk_operation_request::Reschedule::RunAt(
            tomorrow.into(),
        )),
    };
    let dry = tasks
        .start_bulk_operation(resched(true))
        .await?
        .into_inner();
    assert_eq!(dry.matched, 30, "the 30 leased ones are not SCHEDULED");
    let started = tasks
        .start_bulk_operation(resched(false))
        .await?
        .into_inner();
    assert_eq!(started.matched, 30);
    let op = started.operation.context("op")?;
    let done = wait_for(&mut tasks, &op.id, |o| {
        o.state() == BulkOperationState::Done
    })
    .await?;
    assert_eq!(done.changed, 30);
    let day_ahead = tasks
        .list_tasks(ListTasksRequest {
            filter: Some(TaskFilter {
                queue: queue.clone(),
                run_after: Some((tomorrow - Duration::from_secs(1)).into()),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await?
        .into_inner()
        .tasks;
    assert_eq!(day_ahead.len(), 30);

    // Bad requests name their field and store nothing.
    for (req, field) in [
        (
            StartBulkOperationRequest {
                action: BulkAction::Cancel as i32,
                filter: Some(TaskFilter {
                    states: vec![TaskState::Scheduled as i32],
                    ..Default::default()
                }),
                ..Default::default()
            },
            "filter",
        ),
        (
            StartBulkOperationRequest {
                action: BulkAction::Cancel as i32,
                filter: Some(TaskFilter {
                    queue: queue.clone(),
                    states: vec![TaskState::Succeeded as i32],
                    ..Default::default()
                }),
                ..Default::default()
            },
            "filter.states",
        ),
        (
            StartBulkOperationRequest {
                action: BulkAction::Reschedule as i32,
                filter: Some(scheduled.clone()),
                ..Default::default()
            },
            "run_at",
        ),
        (
            StartBulkOperationRequest {
                action: BulkAction::Cancel as i32,
                filter: Some(TaskFilter {
                    campaign_id: "nope".into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            "filter.campaign_id",
        ),
        (StartBulkOperationRequest::default(), "action"),
        // A shift of exactly i64::MIN milliseconds, and nanos of i32::MIN: each once passed the
        // range checks (abs() wraps them to themselves) and failed every batch of the
        // operation, and of every operation queued behind it, for ever.
        (shifted(-9_223_372_036_854_775, -808_000_000), "shift"),
        (shifted(0, i32::MIN), "shift"),
    ] {
        let err = tasks
            .start_bulk_operation(req)
            .await
            .err()
            .context("refused")?;
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{field}");
        assert!(err.message().contains(field), "{field}: {}", err.message());
    }
    let ops = tasks
        .list_bulk_operations(ListBulkOperationsRequest::default())
        .await?
        .into_inner()
        .operations;
    assert_eq!(ops.len(), 2, "refused requests store nothing");
    // A page token goes on only in the namespace it was made in: elsewhere it would page
    // through another namespace's operations from an arbitrary point.
    let first = tasks
        .list_bulk_operations(ListBulkOperationsRequest {
            page_size: 1,
            ..Default::default()
        })
        .await?
        .into_inner();
    let token = first.next_page_token;
    assert!(!token.is_empty(), "two operations fit a page of one");
    let mut elsewhere = tonic::Request::new(ListBulkOperationsRequest {
        page_token: token.clone(),
        ..Default::default()
    });
    elsewhere
        .metadata_mut()
        .insert("x-herald-namespace", "another".parse()?);
    let err = tasks
        .list_bulk_operations(elsewhere)
        .await
        .err()
        .context("a token from another namespace was taken")?;
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("page_token"), "{}", err.message());
    let rest = tasks
        .list_bulk_operations(ListBulkOperationsRequest {
            page_token: token,
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(rest.operations.len(), 1, "the second operation");
    assert_ne!(rest.operations[0].id, first.operations[0].id);
    Ok(())
}

/// A bulk reschedule leaves where they are the tasks it would move to or past their expiry
/// (they would end EXPIRED unsent) or more than 366 days ahead (CreateTask and UpdateTask
/// refuse both), and counts only the tasks it moved.
#[tokio::test]
async fn a_reschedule_leaves_a_task_it_would_push_past_its_expiry_or_the_year() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let queue = unique_id("later");
    let mut tasks = connect_tasks(&s.grpc_url()).await?;
    let now = std::time::SystemTime::now();
    let expiring = create_task(
        &mut tasks,
        task_spec(&queue, "+15550001", "x")
            .with_delay(Duration::from_secs(600))
            .with_expire_at(now + Duration::from_secs(3600)),
    )
    .await?;
    let far = create_task(
        &mut tasks,
        task_spec(&queue, "+15550002", "x").with_delay(Duration::from_secs(300 * 86_400)),
    )
    .await?;
    let movable = create_task(
        &mut tasks,
        task_spec(&queue, "+15550003", "x").with_delay(Duration::from_secs(600)),
    )
    .await?;
    let started = tasks
        .start_bulk_operation(StartBulkOperationRequest {
            action: BulkAction::Reschedule as i32,
            filter: Some(TaskFilter {
                queue: queue.clone(),
                ..Default::default()
            }),
            dry_run: false,
            reschedule: Some(start_bulk_operation_request::Reschedule::Shift(
                prost_types::Duration {
                    seconds: 100 * 86_400,
                    nanos: 0,
                },
            )),
        })
        .await?
        .into_inner();
    let op = started.operation.context("op")?;
    let done = wait_for(&mut tasks, &op.id, |o| {
        o.state() == BulkOperationState::Done
    })
    .await?;
    assert_eq!((done.matched, done.changed), (3, 1), "{done:?}");
    for (task, moved) in [(&expiring, false), (&far, false), (&movable, true)] {
        let now = tasks
            .get_task(herald_proto::v1::GetTaskRequest {
                id: task.id.clone(),
            })
            .await?
            .into_inner();
        assert_eq!(now.state(), TaskState::Scheduled);
        assert_eq!(now.run_at != task.run_at, moved, "{}", task.recipient);
    }
    Ok(())
}

/// A bulk retry racing a cancel: the retry's transaction has brought a campaign's failed tasks
/// back and is still open (held on a later task) when CancelCampaign comes. The cancel waits
/// for it and cancels what it brought back, instead of those tasks committing live in a
/// cancelled campaign and being sent.
#[tokio::test]
async fn a_bulk_retry_racing_a_campaign_cancel_leaves_nothing_of_the_campaign_to_send() -> Result<()>
{
    use herald_proto::v1::CancelCampaignRequest;
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let queue = unique_id("race");
    let cancelled = campaign_with(&s.grpc_url(), &queue, 3, Duration::ZERO).await?;
    // Made later, so its task comes last in the retry's id order.
    let last = campaign_with(&s.grpc_url(), &queue, 1, Duration::ZERO).await?;
    let mut exec = ScriptedExecutor::connect(&s.grpc_url(), "exec-1", &[&queue], 4).await?;
    let leases = exec.leases(4).await?;
    exec.report_each(&leases, OutcomeClass::Permanent).await?;
    let sql = db.connect().await?;
    sql.execute(
        "UPDATE herald.campaigns SET state = 'finished' WHERE id = $1::text::uuid",
        &[&last],
    )
    .await?;

    // The retry is held on the last campaign's row (reopening it), after the first campaign's
    // three tasks were brought back in its transaction.
    let mut blocker = db.connect().await?;
    let blocker_pid: i32 = blocker
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get(0);
    let hold = blocker.transaction().await?;
    hold.execute(
        "SELECT 1 FROM herald.campaigns WHERE id = $1::text::uuid FOR UPDATE",
        &[&last],
    )
    .await?;
    let mut tasks = connect_tasks(&s.grpc_url()).await?;
    let op = tasks
        .start_bulk_operation(StartBulkOperationRequest {
            action: BulkAction::Retry as i32,
            filter: Some(TaskFilter {
                queue: queue.clone(),
                states: vec![TaskState::Failed as i32],
                ..Default::default()
            }),
            dry_run: false,
            reschedule: None,
        })
        .await?
        .into_inner()
        .operation
        .context("an operation")?;
    herald_tests::accounts::until_blocked_by(&sql, blocker_pid, "the retry to reach the last task")
        .await?;
    let cancel = tokio::spawn({
        let mut c = CampaignServiceClient::connect(s.grpc_url()).await?;
        let id = cancelled.clone();
        async move { c.cancel_campaign(CancelCampaignRequest { id }).await }
    });
    // The cancel has finished, or waits on a lock the retry holds.
    herald_tests::until("the cancel to finish or wait", || async {
        if cancel.is_finished() {
            return Ok(true);
        }
        let waiting: i64 = sql
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .await?
            .get(0);
        Ok(waiting >= 2)
    })
    .await?;
    hold.commit().await?;
    wait_for(&mut tasks, &op.id, |o| {
        o.state() == BulkOperationState::Done
    })
    .await?;
    cancel.await??;
    assert_eq!(
        count_state(&db, &cancelled, "scheduled").await?,
        0,
        "tasks of the cancelled campaign were left to send"
    );
    assert_eq!(count_state(&db, &cancelled, "cancelled").await?, 3);
    assert_eq!(count_state(&db, &last, "scheduled").await?, 1);
    Ok(())
}

/// A reschedule of the queue's scheduled tasks by `seconds` and `nanos`.
fn shifted(seconds: i64, nanos: i32) -> StartBulkOperationRequest {
    StartBulkOperationRequest {
        action: BulkAction::Reschedule as i32,
        filter: Some(TaskFilter {
            queue: "q".into(),
            states: vec![TaskState::Scheduled as i32],
            ..Default::default()
        }),
        reschedule: Some(start_bulk_operation_request::Reschedule::Shift(
            prost_types::Duration { seconds, nanos },
        )),
        ..Default::default()
    }
}
