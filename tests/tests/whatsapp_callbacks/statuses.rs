//! Status webhooks on a task's message: delivered, read, late failures, order and repeats, and a
//! batch held while the scheduler was down.

use super::*;

#[tokio::test]
async fn delivered_and_read_show_on_the_task_with_their_times() -> Result<()> {
    let mut stack = Stack::start().await?;
    stack.fake.plan_callbacks(
        "16505550002",
        CallbackPlan::after(&[Callback::Sent, Callback::Delivered, Callback::Read]),
    );
    let task = stack.send("16505550002").await?;
    // The webhooks may come before the executor's own report: wait for both.
    let task = stack
        .wait_task(&task.id, |t| {
            state(t) == DeliveryState::Read && t.state() == TaskState::Succeeded
        })
        .await?;
    let delivery = task.delivery.clone().context("delivery")?;
    assert!(delivery.provider_message_id.starts_with("wamid."));
    assert!(delivery.accepted_at.is_some());
    assert_eq!(
        delivery.delivered_at.map(|t| t.seconds),
        Some(1_750_000_000)
    );
    assert_eq!(delivery.read_at.map(|t| t.seconds), Some(1_750_000_000));
    assert_eq!(delivery.failed_at, None);
    assert_eq!(task.state(), TaskState::Succeeded);
    // The send carried the fencing token for Meta to echo.
    let sent = stack.fake.requests();
    assert_eq!(
        sent[0].body["biz_opaque_callback_data"],
        format!("{}/1", task.id)
    );
    stack.fake.wait_posted(3, WAIT).await?;
    let applied = counter(
        &stack.executor,
        "herald_callbacks_applied_total",
        &["field=\"messages\"", "kind=\"read\""],
    )
    .await?;
    assert_eq!(applied, 1.0);
    Ok(())
}

/// The send's own report records the message accepted when it arrives; Meta's `sent` status
/// coming after it says when Meta took the message, earlier: `accepted_at` is the earlier of
/// the two, so the accepted-to-delivered latency is not understated.
#[tokio::test]
async fn accepted_at_is_metas_sent_time_when_its_status_comes_after_the_report() -> Result<()> {
    let mut stack = Stack::start().await?;
    let task = stack.send("16505550009").await?;
    let delivery = task.delivery.clone().context("the report's delivery")?;
    let reported = delivery.accepted_at.context("accepted_at")?;
    ensure!(reported.seconds > 1_750_000_000, "{reported:?}");
    let sent = status_of(&task, &delivery.provider_message_id, Callback::Sent);
    ensure!(
        stack
            .fake
            .post_webhook(&webhook_body(WABA, "messages", sent))
            .await?
            == 200,
        "webhook refused"
    );
    let task = stack
        .wait_task(&task.id, |t| {
            t.delivery
                .as_ref()
                .and_then(|d| d.accepted_at.as_ref())
                .is_some_and(|at| at.seconds == 1_750_000_000)
        })
        .await?;
    assert_eq!(task.state(), TaskState::Succeeded);
    Ok(())
}

#[tokio::test]
async fn out_of_order_and_repeated_statuses_keep_the_furthest_state() -> Result<()> {
    let mut stack = Stack::start().await?;
    use Callback::*;
    stack.fake.plan_callbacks(
        "16505550003",
        CallbackPlan::after(&[Read, Delivered, Read, Delivered, Sent]),
    );
    // Read without delivered (Meta may skip it when both happen at once).
    stack
        .fake
        .plan_callbacks("16505550004", CallbackPlan::after(&[Read, Read]));
    let shuffled = stack.send("16505550003").await?;
    let read_only = stack.send("16505550004").await?;
    stack.fake.wait_posted(7, WAIT).await?;
    assert!(
        stack.fake.posted().iter().all(|(status, _)| *status == 200),
        "{:?}",
        stack.fake.posted()
    );

    let task = stack.task(&shuffled.id).await?;
    let delivery = task.delivery.clone().context("delivery")?;
    assert_eq!(delivery.state(), DeliveryState::Read, "{delivery:?}");
    assert!(delivery.delivered_at.is_some() && delivery.read_at.is_some());
    let task = stack.task(&read_only.id).await?;
    let delivery = task.delivery.clone().context("delivery")?;
    assert_eq!(delivery.state(), DeliveryState::Read);
    assert_eq!(delivery.delivered_at, None);
    // Each (wamid, status) once.
    let rows: i64 = stack
        .db
        .connect()
        .await?
        .query_one(
            "SELECT count(*) AS n FROM herald.delivery_events WHERE task_id = $1::text::uuid",
            &[&shuffled.id],
        )
        .await?
        .get("n");
    assert_eq!(rows, 3, "accepted, delivered, read");
    Ok(())
}

#[tokio::test]
async fn statuses_that_come_before_the_sends_report_are_matched() -> Result<()> {
    let mut stack = Stack::start().await?;
    // Posted and recorded before the fake answers the send: the scheduler does not know the
    // wamid yet, and this one carries no callback data either.
    stack.fake.plan_callbacks(
        "16505550005",
        CallbackPlan {
            statuses: vec![Callback::Delivered],
            before_response: true,
            with_callback_data: false,
        },
    );
    // A failure that beats the report: the task must not stay SUCCEEDED.
    stack.fake.plan_callbacks(
        "16505550006",
        CallbackPlan {
            statuses: vec![Callback::Failed(131026)],
            before_response: true,
            with_callback_data: true,
        },
    );
    let early = stack.send("16505550005").await?;
    let task = stack
        .wait_task(&early.id, |t| state(t) == DeliveryState::Delivered)
        .await?;
    assert_eq!(task.state(), TaskState::Succeeded);
    assert!(stack.fake.posted().iter().all(|(status, _)| *status == 200));

    let id = stack
        .tasks
        .create_task(CreateTaskRequest {
            task: Some(TaskSpec {
                pool: "wa".into(),
                ..task_spec("orders", "16505550006", "hello")
            }),
        })
        .await?
        .into_inner()
        .task
        .context("task")?
        .id;
    let failed = wait_for_task_state(&mut stack.tasks, &id, TaskState::Failed, WAIT).await?;
    assert!(
        failed.last_error.contains("131026"),
        "{}",
        failed.last_error
    );
    assert_eq!(state(&failed), DeliveryState::FailedAfterAcceptance);
    Ok(())
}

#[tokio::test]
async fn a_late_failure_ends_the_task_failed_with_the_code() -> Result<()> {
    let mut stack = Stack::start().await?;
    stack.fake.plan_callbacks(
        "16505550007",
        CallbackPlan::after(&[Callback::Sent, Callback::Failed(131047)]),
    );
    let task = stack.send("16505550007").await?;
    // SUCCEEDED first (the send was accepted), then FAILED when the webhook says so.
    let task = stack
        .wait_task(&task.id, |t| t.state() == TaskState::Failed)
        .await?;
    assert!(task.last_error.contains("131047"), "{}", task.last_error);
    assert_eq!(
        (task.end_reason(), task.end_code),
        (EndReason::FailedAfterAcceptance, 131047)
    );
    let delivery = task.delivery.clone().context("delivery")?;
    assert_eq!(delivery.state(), DeliveryState::FailedAfterAcceptance);
    assert_eq!(delivery.error_code, 131047);
    assert!(
        delivery.error.contains("Re-engagement"),
        "{}",
        delivery.error
    );
    assert!(delivery.failed_at.is_some() && delivery.accepted_at.is_some());
    // It ended when the failure came, not when its send seemed to succeed: failure reports
    // place it then.
    let ended_later: bool = stack
        .db
        .connect()
        .await?
        .query_one(
            "SELECT t.finished_at > a.finished_at AS later
             FROM herald.tasks t JOIN herald.attempts a ON a.task_id = t.id
             WHERE t.id::text = $1",
            &[&task.id],
        )
        .await?
        .get("later");
    assert!(ended_later, "finished_at is still the send's");
    // A late delivered (out of order) cannot revive it.
    let late = status_of(&task, &delivery.provider_message_id, Callback::Delivered);
    let body = webhook_body(WABA, "messages", late);
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    let task = stack.task(&task.id).await?;
    assert_eq!(task.state(), TaskState::Failed);
    assert_eq!(state(&task), DeliveryState::FailedAfterAcceptance);

    Ok(())
}

/// A late failure Meta asks to be retried later (131049, the per-user marketing limit, comes
/// only by webhook) does not end a task with attempts left: it is scheduled again no sooner
/// than the recipient's back-off, and that recipient is left alone on the account, as the
/// send's own answer would. Without attempts left it ends FAILED as before.
#[tokio::test]
async fn a_late_failure_worth_retrying_schedules_the_task_again_while_attempts_last() -> Result<()>
{
    let mut stack = Stack::start().await?;
    stack.fake.plan_callbacks(
        "16505550011",
        CallbackPlan::after(&[Callback::Failed(131049)]),
    );
    let limited = stack.create("16505550011").await?;
    let limited = stack
        .wait_task(&limited, |t| {
            t.state() == TaskState::Scheduled && t.attempts == 1
        })
        .await?;
    assert!(
        limited.last_error.contains("131049") && limited.last_error.contains("trying again"),
        "{}",
        limited.last_error
    );
    let c = stack.db.connect().await?;
    let (wait, blocked): (f64, bool) = {
        let r = c
            .query_one(
                "SELECT extract(epoch FROM t.run_at - herald.now())::float8 AS wait,
                        s.blocked_until > herald.now() AS blocked
                 FROM herald.tasks t
                 JOIN herald.recipient_sends s
                   ON s.account_id = 'wa-1' AND s.recipient = ltrim(t.recipient, '+')
                 WHERE t.id = $1::text::uuid",
                &[&limited.id],
            )
            .await?;
        (r.get("wait"), r.get("blocked"))
    };
    assert!(
        wait > 3_000.0,
        "due again in {wait} s, before the recipient's back-off"
    );
    assert!(blocked, "131049 did not back the recipient off");

    // With its one attempt spent, the same failure ends the task.
    stack.fake.plan_callbacks(
        "16505550014",
        CallbackPlan::after(&[Callback::Failed(131049)]),
    );
    let spec = TaskSpec {
        pool: "wa".into(),
        max_attempts: Some(1),
        ..task_spec("orders", "16505550014", "Your order has shipped")
    };
    let last = create_task(&mut stack.tasks, spec).await?.id;
    let last = stack
        .wait_task(&last, |t| t.state() == TaskState::Failed)
        .await?;
    assert_eq!(state(&last), DeliveryState::FailedAfterAcceptance);
    Ok(())
}

/// A late temporary failure (131000) is sent again after the retry policy's delay, and the new
/// message's delivery is what the task shows.
#[tokio::test]
async fn a_late_temporary_failure_is_sent_again_and_the_new_message_delivered() -> Result<()> {
    let mut stack = Stack::start().await?;
    let recipient = "16505550015";
    stack.fake.plan_callbacks_once(
        recipient,
        CallbackPlan::after(&[Callback::Sent, Callback::Failed(131000)]),
    );
    stack.fake.plan_callbacks(
        recipient,
        CallbackPlan::after(&[Callback::Sent, Callback::Delivered]),
    );
    let id = stack.create(recipient).await?;
    let task = stack
        .wait_task(&id, |t| {
            t.attempts == 2
                && t.state() == TaskState::Succeeded
                && state(t) == DeliveryState::Delivered
        })
        .await?;
    let sent: Vec<_> = stack
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.body["to"] == recipient)
        .collect();
    assert_eq!(sent.len(), 2, "sent once more after the late failure");
    assert_ne!(stack.wamid(&task)?, "", "{task:?}");
    Ok(())
}

#[tokio::test]
async fn a_task_retried_after_a_late_failure_is_judged_by_its_new_message_only() -> Result<()> {
    let mut stack = Stack::start().await?;
    let recipient = "16505550013";
    stack.fake.plan_callbacks(
        recipient,
        CallbackPlan::after(&[Callback::Sent, Callback::Failed(131047)]),
    );
    let task = stack.send(recipient).await?;
    let failed = stack
        .wait_task(&task.id, |t| t.state() == TaskState::Failed)
        .await?;
    let first = stack.wamid(&failed)?;
    // Retried: the new message is accepted and delivered. The first message's failure must
    // neither end the task again nor stand for its delivery.
    stack.fake.plan_callbacks(
        recipient,
        CallbackPlan::after(&[Callback::Sent, Callback::Delivered]),
    );
    stack
        .tasks
        .retry_task(RetryTaskRequest {
            id: task.id.clone(),
            ..Default::default()
        })
        .await?;
    // The webhooks may come before the executor's own report: wait for both (a delivery
    // already DELIVERED while the task was still LEASED failed this test once).
    let retried = stack
        .wait_task(&task.id, |t| {
            state(t) == DeliveryState::Delivered && t.state() == TaskState::Succeeded
        })
        .await?;
    assert_eq!(retried.state(), TaskState::Succeeded);
    assert_ne!(
        stack.wamid(&retried)?,
        first,
        "the delivery shows the old message"
    );
    Ok(())
}

#[tokio::test]
async fn a_read_without_delivered_marks_the_task_read_and_counts_as_delivered() -> Result<()> {
    let mut stack = Stack::start().await?;
    let recipient = "16505550012";
    stack
        .fake
        .plan_callbacks(recipient, CallbackPlan::after(&[Callback::Read]));
    let id = stack
        .tasks
        .create_task(CreateTaskRequest {
            task: Some(TaskSpec {
                pool: "wa".into(),
                ..task_spec("read-only", recipient, "Your order has shipped")
            }),
        })
        .await?
        .into_inner()
        .task
        .context("task")?
        .id;
    // The webhook may come before the executor's own report: wait for both.
    let task = stack
        .wait_task(&id, |t| {
            state(t) == DeliveryState::Read && t.state() == TaskState::Succeeded
        })
        .await?;
    let delivery = task.delivery.context("delivery")?;
    // Meta never said delivered: no delivered time is made up, the read time is the one known.
    assert_eq!(delivery.delivered_at, None);
    assert_eq!(delivery.read_at.map(|t| t.seconds), Some(1_750_000_000));
    let mut stats = StatsServiceClient::connect(stack.scheduler.grpc_url()).await?;
    let answer = stats
        .delivery_stats(DeliveryStatsRequest {
            window: None,
            queue: "read-only".into(),
        })
        .await?
        .into_inner();
    assert_eq!(
        answer.counts,
        Some(DeliveryCounts {
            accepted: 1,
            delivered: 1,
            read: 1,
            failed_after_acceptance: 0,
        })
    );
    // Without a delivered time there is no delivery latency to measure.
    assert_eq!(answer.latency.map(|l| l.count), Some(0));
    Ok(())
}

#[tokio::test]
async fn a_batch_posted_while_the_scheduler_is_down_is_applied_after_it_returns() -> Result<()> {
    let mut stack = Stack::start().await?;
    let task = stack.send("16505550008").await?;
    let task = stack
        .wait_task(&task.id, |t| state(t) == DeliveryState::Accepted)
        .await?;
    let wamid = stack.wamid(&task)?;
    let addr = stack.scheduler.grpc_addr().to_owned();
    stack.scheduler.kill()?;
    stack.scheduler.wait().await?;

    // Meta's batch: a delivered and a read, in one webhook.
    let mut value = status_of(&task, &wamid, Callback::Delivered);
    let read = status_of(&task, &wamid, Callback::Read);
    let statuses = value["statuses"].as_array_mut().context("statuses")?;
    statuses.push(read["statuses"][0].clone());
    let body = webhook_body(WABA, "messages", value);
    let answer = stack.fake.post_webhook(&body).await?;
    assert!(
        (500..600).contains(&answer),
        "answered {answer} while the scheduler was down"
    );

    // The scheduler comes back on the same address; Meta delivers the batch again.
    stack.scheduler = SchedulerProcess::builder(&stack.db)
        .env("HERALD_GRPC_ADDR", &addr)
        .spawn()
        .await?;
    assert_eq!(stack.fake.redeliver().await?, vec![200]);
    let task = stack.task(&task.id).await?;
    assert_eq!(state(&task), DeliveryState::Read, "{task:?}");
    assert!(task.delivery.context("delivery")?.delivered_at.is_some());
    // Recorded once: the refused post left nothing, and Meta repeating the batch adds nothing.
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    let rows: i64 = stack
        .db
        .connect()
        .await?
        .query_one(
            "SELECT count(*) AS n FROM herald.delivery_events WHERE provider_message_id = $1",
            &[&wamid],
        )
        .await?
        .get("n");
    assert_eq!(rows, 3, "accepted, delivered and read, once each");
    let unrecorded = counter(
        &stack.executor,
        "herald_callbacks_rejected_total",
        &["reason=\"unrecorded\""],
    )
    .await?;
    assert_eq!(unrecorded, 1.0);
    Ok(())
}

/// A paused or cancelled campaign sends nothing, also when a late failure worth retrying (or a
/// retry by hand) would bring one of its ended tasks back: pausing and cancelling touch only
/// live tasks. A cancelled campaign's task ends FAILED and cannot be retried; a paused one's
/// comes back parked until the campaign resumes.
#[tokio::test]
async fn a_paused_or_cancelled_campaign_sends_nothing_when_a_late_failure_or_a_retry_revives_a_task(
) -> Result<()> {
    use herald_proto::v1::{CancelCampaignRequest, PauseCampaignRequest};
    let mut stack = Stack::start().await?;
    let mut campaigns = CampaignServiceClient::connect(stack.scheduler.grpc_url()).await?;
    let start = |name: &str, recipient: &str| {
        let request = CreateCampaignRequest {
            campaign: Some(CampaignSpec {
                name: name.into(),
                queue: name.into(),
                pool: "wa".into(),
                content: Some(Content {
                    body: Some(content::Body::Text("Spring sale".into())),
                    ..Default::default()
                }),
                ..CampaignSpec::default()
            }),
            recipients: vec![CampaignRecipient {
                recipient: recipient.into(),
                ..CampaignRecipient::default()
            }],
            ..Default::default()
        };
        let mut campaigns = campaigns.clone();
        async move { anyhow::Ok(campaigns.create_campaign(request).await?.into_inner()) }
    };
    let cancelled = start("cancelled", "16505550061").await?;
    let paused = start("paused", "16505550062").await?;
    let task_of = |queue: &'static str| {
        let mut tasks = stack.tasks.clone();
        async move {
            let listed = tasks
                .list_tasks(ListTasksRequest {
                    queue: queue.into(),
                    ..Default::default()
                })
                .await?
                .into_inner()
                .tasks;
            listed.into_iter().next().context("the campaign's task")
        }
    };
    let cancelled_task = task_of("cancelled").await?;
    let paused_task = task_of("paused").await?;
    for task in [&cancelled_task, &paused_task] {
        stack
            .wait_task(&task.id, |t| t.state() == TaskState::Succeeded)
            .await?;
    }
    campaigns
        .cancel_campaign(CancelCampaignRequest {
            id: cancelled.id.clone(),
        })
        .await?;
    campaigns
        .pause_campaign(PauseCampaignRequest {
            id: paused.id.clone(),
        })
        .await?;
    for task in [&cancelled_task, &paused_task] {
        let task = stack.task(&task.id).await?;
        let failed = status_of(&task, &stack.wamid(&task)?, Callback::Failed(131000));
        let body = webhook_body(WABA, "messages", failed);
        assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    }
    let ended = stack
        .wait_task(&cancelled_task.id, |t| t.state() == TaskState::Failed)
        .await?;
    assert_eq!(ended.attempts, 1);
    let revived = stack
        .wait_task(&paused_task.id, |t| t.state() == TaskState::Scheduled)
        .await?;
    let route = |id: String| {
        let db = &stack.db;
        async move {
            anyhow::Ok(
                db.connect()
                    .await?
                    .query_one(
                        "SELECT route FROM herald.tasks WHERE id = $1::text::uuid",
                        &[&id],
                    )
                    .await?
                    .get::<_, String>(0),
            )
        }
    };
    let parked = route(revived.id.clone()).await?;
    assert!(parked.starts_with("paused:"), "{parked}");

    // By hand: a cancelled campaign's task is not retried, and says why.
    let refused = stack
        .tasks
        .retry_task(RetryTaskRequest {
            id: cancelled_task.id.clone(),
            ..Default::default()
        })
        .await
        .err()
        .context("retried a cancelled campaign's task")?;
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(refused.message().contains("cancelled"), "{refused:?}");
    assert_eq!(
        stack.task(&cancelled_task.id).await?.state(),
        TaskState::Failed
    );
    Ok(())
}

/// Meta redelivers a webhook for up to seven days: a failure told more than a day after the
/// send ends the task rather than sending its message days late.
#[tokio::test]
async fn a_late_failure_told_a_day_after_the_send_ends_the_task() -> Result<()> {
    let mut stack = Stack::start().await?;
    let task = stack.send("16505550016").await?;
    assert_eq!(task.state(), TaskState::Succeeded);
    stack.advance_clock("25 hours").await?;
    let failed = status_of(&task, &stack.wamid(&task)?, Callback::Failed(131000));
    let body = webhook_body(WABA, "messages", failed);
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    let ended = stack
        .wait_task(&task.id, |t| t.state() == TaskState::Failed)
        .await?;
    assert_eq!(ended.attempts, 1);
    assert_eq!(ended.end_reason(), EndReason::FailedAfterAcceptance);
    Ok(())
}
