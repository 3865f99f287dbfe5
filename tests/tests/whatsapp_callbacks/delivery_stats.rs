//! Delivery statistics and campaign progress from the status webhooks.

use super::*;

/// A status of `task`'s message stamped `seconds_after` whole seconds after its acceptance
/// (WhatsApp's timestamps are whole seconds: the first whole second after the acceptance, plus
/// `seconds_after`).
fn status_after(task: &Task, status: Callback, seconds_after: i64) -> Result<serde_json::Value> {
    let delivery = task.delivery.as_ref().context("no delivery")?;
    let accepted = delivery.accepted_at.as_ref().context("not accepted")?;
    let mut value = status_of(task, &delivery.provider_message_id, status);
    value["statuses"][0]["timestamp"] = json!((accepted.seconds + 1 + seconds_after).to_string());
    Ok(value)
}

#[tokio::test]
async fn delivery_stats_and_campaign_progress_count_each_state_and_time_delivery() -> Result<()> {
    let mut stack = Stack::start().await?;
    let url = stack.scheduler.grpc_url();
    let recipients = ["16505550041", "16505550042", "16505550043", "16505550044"];
    let mut campaigns = CampaignServiceClient::connect(url.clone()).await?;
    let campaign = campaigns
        .create_campaign(CreateCampaignRequest {
            campaign: Some(CampaignSpec {
                name: "numbers".into(),
                queue: "numbers".into(),
                pool: "wa".into(),
                content: Some(Content {
                    body: Some(content::Body::Text("Spring sale".into())),
                    ..Default::default()
                }),
                ..CampaignSpec::default()
            }),
            recipients: recipients
                .iter()
                .map(|r| CampaignRecipient {
                    recipient: (*r).into(),
                    ..CampaignRecipient::default()
                })
                .collect(),
            ..Default::default()
        })
        .await?
        .into_inner();
    // Every message accepted by its send's answer (no status is planned).
    let listed = stack
        .tasks
        .list_tasks(ListTasksRequest {
            queue: "numbers".into(),
            ..ListTasksRequest::default()
        })
        .await?
        .into_inner()
        .tasks;
    let mut tasks = Vec::new();
    for r in recipients {
        let id = listed
            .iter()
            .find(|t| t.recipient == r)
            .context("campaign task")?
            .id
            .clone();
        tasks.push(
            stack
                .wait_task(&id, |t| state(t) == DeliveryState::Accepted)
                .await?,
        );
    }

    // Delivered 10, 20 and 60 s after acceptance (the first also read), the last one failed.
    let posts = [
        status_after(&tasks[0], Callback::Delivered, 10)?,
        status_after(&tasks[0], Callback::Read, 15)?,
        status_after(&tasks[1], Callback::Delivered, 20)?,
        status_after(&tasks[2], Callback::Delivered, 60)?,
        status_after(&tasks[3], Callback::Failed(131026), 5)?,
        // A repeat: recorded once, not applied again.
        status_after(&tasks[1], Callback::Delivered, 20)?,
    ];
    for value in posts {
        assert_eq!(
            stack
                .fake
                .post_webhook(&webhook_body(WABA, "messages", value))
                .await?,
            200
        );
    }
    stack
        .wait_task(&tasks[3].id, |t| t.state() == TaskState::Failed)
        .await?;

    let want = || DeliveryCounts {
        accepted: 4,
        delivered: 3,
        read: 1,
        failed_after_acceptance: 1,
    };
    let mut stats = StatsServiceClient::connect(url).await?;
    let answer = stats
        .delivery_stats(DeliveryStatsRequest {
            window: Some(StatsWindow {
                last: Some(prost_types::Duration {
                    seconds: 3600,
                    nanos: 0,
                }),
                ..StatsWindow::default()
            }),
            queue: "numbers".into(),
        })
        .await?
        .into_inner();
    assert_eq!(answer.counts, Some(want()));
    let latency = answer.latency.context("latency")?;
    assert_eq!(latency.count, 3);
    // Each delivery took its whole seconds plus the part of a second before the first whole
    // one: (n, n + 1] seconds. Over 10, 20 and 60: the median is 20, p95 and p99 are 60.
    let within = |ms: i64, s: i64| ms > s * 1000 && ms <= (s + 1) * 1000;
    assert!(within(latency.p50_ms, 20), "{latency:?}");
    assert!(within(latency.p95_ms, 60), "{latency:?}");
    assert!(within(latency.p99_ms, 60), "{latency:?}");
    // Another queue's window has none of them.
    let other = stats
        .delivery_stats(DeliveryStatsRequest {
            window: None,
            queue: "orders".into(),
        })
        .await?
        .into_inner();
    assert_eq!(other.counts.map(|c| c.accepted), Some(0));

    // The campaign's progress shows the same.
    let progress = campaigns
        .get_campaign(GetCampaignRequest {
            id: campaign.id.clone(),
        })
        .await?
        .into_inner()
        .progress
        .context("progress")?;
    assert_eq!(progress.delivery, Some(want()));

    // The scheduler counts the events it recorded and those that changed something.
    let base = stack.scheduler.http_url();
    let recorded = metric(
        &base,
        "herald_provider_events_total",
        &["kind=\"delivery\""],
    )
    .await?;
    let applied = metric(&base, "herald_provider_events_applied_total", &[]).await?;
    assert_eq!((recorded, applied), (6.0, 5.0));
    Ok(())
}

/// A task sent again after its first message failed is timed from its current message's
/// acceptance, not the first one's: the retry came ten minutes later, and its message was
/// delivered five seconds after it was accepted.
#[tokio::test]
async fn delivery_latency_is_timed_from_the_current_messages_acceptance() -> Result<()> {
    let mut stack = Stack::start().await?;
    let recipient = "16505550045";
    stack
        .fake
        .plan_callbacks_once(recipient, CallbackPlan::after(&[Callback::Failed(131047)]));
    let failed = stack.send(recipient).await?;
    let failed = stack
        .wait_task(&failed.id, |t| t.state() == TaskState::Failed)
        .await?;
    let first = stack.wamid(&failed)?;
    // The first message was accepted ten minutes before the retry.
    stack
        .db
        .connect()
        .await?
        .execute(
            "UPDATE herald.delivery_events SET occurred_at = occurred_at - interval '10 minutes' \
             WHERE provider_message_id = $1",
            &[&first],
        )
        .await?;
    stack
        .tasks
        .retry_task(RetryTaskRequest {
            id: failed.id.clone(),
            ..Default::default()
        })
        .await?;
    let retried = stack
        .wait_task(&failed.id, |t| {
            t.state() == TaskState::Succeeded && state(t) == DeliveryState::Accepted
        })
        .await?;
    let second = stack.wamid(&retried)?;
    ensure!(
        second != first,
        "the retry sent no new message: {retried:?}"
    );
    let accepted = retried
        .delivery
        .as_ref()
        .and_then(|d| d.accepted_at.as_ref())
        .context("not accepted")?;
    let mut delivered = status_value(
        PHONE_ID,
        &second,
        Callback::Delivered,
        recipient,
        Some(&format!("{}/2", retried.id)),
    );
    delivered["statuses"][0]["timestamp"] = json!((accepted.seconds + 1 + 5).to_string());
    let posted = stack
        .fake
        .post_webhook(&webhook_body(WABA, "messages", delivered))
        .await?;
    assert_eq!(posted, 200);
    stack
        .wait_task(&retried.id, |t| state(t) == DeliveryState::Delivered)
        .await?;

    let answer = StatsServiceClient::connect(stack.scheduler.grpc_url())
        .await?
        .delivery_stats(DeliveryStatsRequest {
            window: None,
            queue: "orders".into(),
        })
        .await?
        .into_inner();
    assert_eq!(
        answer.counts,
        Some(DeliveryCounts {
            accepted: 1,
            delivered: 1,
            read: 0,
            failed_after_acceptance: 0,
        })
    );
    let latency = answer.latency.context("latency")?;
    assert_eq!(latency.count, 1);
    assert!(
        latency.p50_ms > 5_000 && latency.p50_ms <= 6_000,
        "timed from the first message's acceptance: {latency:?}"
    );
    Ok(())
}
