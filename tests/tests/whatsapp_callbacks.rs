//! Delivery truth end to end: the fake WhatsApp API accepts a message and then, like Meta,
//! posts signed status webhooks to the real executor's webhook endpoint, which forwards them to
//! the real scheduler; GetTask shows how far each message got, and account webhooks move the
//! account (docs/senders.md#status-callbacks).

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use herald_proto::v1::account_service_client::AccountServiceClient;
use herald_proto::v1::campaign_service_client::CampaignServiceClient;
use herald_proto::v1::stats_service_client::StatsServiceClient;
use herald_proto::v1::suppression_service_client::SuppressionServiceClient;
use herald_proto::v1::task_service_client::TaskServiceClient;
use herald_proto::v1::template_service_client::TemplateServiceClient;
use herald_proto::v1::{
    content, template, AccountState, Attempt, CampaignRecipient, CampaignSpec,
    CheckSuppressionsRequest, Content, CreateAccountRequest, CreateCampaignRequest,
    CreateTaskRequest, CreateTemplateRequest, Delivery, DeliveryCounts, DeliveryState,
    DeliveryStatsRequest, EndReason, GetCampaignRequest, GetTaskRequest, ListAttemptsRequest,
    ListTasksRequest, MessagingTier, OutcomeClass, RetryTaskRequest, StatsWindow,
    SuppressionReason, Task, TaskSpec, TaskState, Template, TemplateContent, TextTemplate,
};
use herald_tests::accounts::{accounts_client, get_account, whatsapp_account};
use herald_tests::fakes::whatsapp::{
    hub_signature, status_value, webhook_body, Callback, CallbackPlan, FakeWhatsApp, Scripted,
};
use herald_tests::{
    connect_tasks, task_spec, wait_for_task_state, ExecutorProcess, SchedulerProcess, TestDb,
    WebhookReceiver,
};
use serde_json::json;
use tonic::transport::Channel;
use tonic_types::StatusExt;

const WAIT: Duration = Duration::from_secs(30);
const PHONE_ID: &str = "1065";
const WABA: &str = "waba-1";
const APP_SECRET: &str = "meta-app-secret";
const VERIFY_TOKEN: &str = "let-me-in";

/// The scheduler, a WhatsApp account `wa-1` and the executor with its webhook, in front of a
/// fake Cloud API that posts its status webhooks to that executor.
struct Stack {
    db: TestDb,
    scheduler: SchedulerProcess,
    executor: ExecutorProcess,
    fake: FakeWhatsApp,
    tasks: TaskServiceClient<Channel>,
    accounts: AccountServiceClient<Channel>,
}

impl Stack {
    async fn start() -> Result<Self> {
        Self::start_with(|b| b).await
    }

    /// With the scheduler builder adjusted by `scheduler` (a notification URL, say).
    async fn start_with(
        scheduler: impl FnOnce(herald_tests::SchedulerBuilder) -> herald_tests::SchedulerBuilder,
    ) -> Result<Self> {
        let db = TestDb::new().await?;
        let scheduler = scheduler(SchedulerProcess::builder(&db)).spawn().await?;
        let mut accounts = accounts_client(&scheduler.grpc_url()).await?;
        accounts
            .create_account(CreateAccountRequest {
                account: Some(whatsapp_account("wa-1", "wa", 100.0)),
            })
            .await?;
        let fake = FakeWhatsApp::start(PHONE_ID, "token").await?;
        let executor = executor(&scheduler.grpc_url(), &fake).await?;
        fake.send_callbacks_to(&webhook_url(&executor)?, APP_SECRET);
        let tasks = connect_tasks(&scheduler.grpc_url()).await?;
        Ok(Stack {
            db,
            scheduler,
            executor,
            fake,
            tasks,
            accounts,
        })
    }

    /// Creates a text task to `recipient` through the pool and waits until it has ended
    /// (SUCCEEDED once accepted; a failure webhook may already have made it FAILED).
    async fn send(&mut self, recipient: &str) -> Result<Task> {
        let id = self
            .tasks
            .create_task(CreateTaskRequest {
                task: Some(TaskSpec {
                    pool: "wa".into(),
                    ..task_spec("orders", recipient, "Your order has shipped")
                }),
            })
            .await?
            .into_inner()
            .task
            .context("task")?
            .id;
        self.wait_task(&id, |t| {
            matches!(t.state(), TaskState::Succeeded | TaskState::Failed)
        })
        .await
    }

    async fn task(&mut self, id: &str) -> Result<Task> {
        Ok(self
            .tasks
            .get_task(GetTaskRequest { id: id.into() })
            .await?
            .into_inner())
    }

    /// Polls GetTask until `done` holds for the task, or fails after WAIT.
    async fn wait_task(&mut self, id: &str, done: impl Fn(&Task) -> bool) -> Result<Task> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let task = self.task(id).await?;
            if done(&task) {
                return Ok(task);
            }
            ensure!(
                tokio::time::Instant::now() < deadline,
                "task never got there: {task:?}\nexecutor: {}",
                self.executor.stderr_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The wamid the fake returned for the only message sent to `recipient`.
    fn wamid(&self, task: &Task) -> Result<String> {
        let delivery = task.delivery.as_ref().context("no delivery")?;
        Ok(delivery.provider_message_id.clone())
    }
}

/// The executor with `wa-1`'s table and the webhook on an ephemeral port.
async fn executor(scheduler_url: &str, fake: &FakeWhatsApp) -> Result<ExecutorProcess> {
    let config = format!(
        "[accounts.wa-1]\nsender = \"whatsapp_cloud\"\nphone_number_id = \"{PHONE_ID}\"\n\
         access_token = \"token\"\nbase_url = \"{}\"\nwaba_id = \"{WABA}\"\n\
         display_phone_number = \"+1 555 078 3881\"\n\n\
         [whatsapp_webhook]\nlisten = \"127.0.0.1:0\"\nverify_token = \"{VERIFY_TOKEN}\"\n\
         app_secret = {{ env = \"WA_APP_SECRET\" }}\n",
        fake.base_url()
    );
    ExecutorProcess::builder(&[scheduler_url])
        .config_toml(config)
        .env("WA_APP_SECRET", APP_SECRET)
        .spawn()
        .await
}

/// The `messages` value of one status of `task`'s message `wamid`, as Meta would post it.
fn status_of(task: &Task, wamid: &str, status: Callback) -> serde_json::Value {
    let data = format!("{}/1", task.id);
    status_value(PHONE_ID, wamid, status, &task.recipient, Some(&data))
}

fn webhook_url(executor: &ExecutorProcess) -> Result<String> {
    Ok(format!(
        "{}/whatsapp/webhook",
        executor.whatsapp_webhook_url()?
    ))
}

fn state(task: &Task) -> DeliveryState {
    task.delivery
        .as_ref()
        .map_or(DeliveryState::Unspecified, Delivery::state)
}

/// The executor's counter `name` with all of `labels`, summed.
async fn counter(executor: &ExecutorProcess, name: &str, labels: &[&str]) -> Result<f64> {
    metric(&executor.http_url(), name, labels).await
}

/// The counter `name` with all of `labels`, summed, from the `/metrics` under `base`.
async fn metric(base: &str, name: &str, labels: &[&str]) -> Result<f64> {
    let text = reqwest::get(format!("{base}/metrics"))
        .await?
        .text()
        .await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

#[tokio::test]
async fn the_handshake_echoes_the_challenge_for_the_right_token_only() -> Result<()> {
    let stack = Stack::start().await?;
    let url = webhook_url(&stack.executor)?;
    let http = reqwest::Client::new();
    let get = |mode: &str, token: &str| {
        http.get(&url)
            .query(&[
                ("hub.mode", mode),
                ("hub.verify_token", token),
                ("hub.challenge", "1158201444"),
            ])
            .send()
    };
    let ok = get("subscribe", VERIFY_TOKEN).await?;
    assert_eq!(ok.status().as_u16(), 200);
    assert_eq!(ok.text().await?, "1158201444");
    assert_eq!(get("subscribe", "wrong").await?.status().as_u16(), 403);
    assert_eq!(
        get("unsubscribe", VERIFY_TOKEN).await?.status().as_u16(),
        403
    );
    assert_eq!(http.get(&url).send().await?.status().as_u16(), 403);
    Ok(())
}

#[tokio::test]
async fn a_bad_or_missing_signature_is_401_and_records_nothing() -> Result<()> {
    let mut stack = Stack::start().await?;
    let task = stack.send("16505550001").await?;
    let task = stack
        .wait_task(&task.id, |t| state(t) == DeliveryState::Accepted)
        .await?;
    let wamid = stack.wamid(&task)?;
    let body = webhook_body(WABA, "messages", status_of(&task, &wamid, Callback::Read));
    let bytes = serde_json::to_vec(&body)?;
    let url = webhook_url(&stack.executor)?;
    let http = reqwest::Client::new();
    for signature in [
        None,
        Some(hub_signature("not-the-app-secret", &bytes)),
        Some(hub_signature(APP_SECRET, b"another body")),
        Some("sha256=nothex".to_owned()),
    ] {
        let mut request = http
            .post(&url)
            .header("content-type", "application/json")
            .body(bytes.clone());
        if let Some(s) = &signature {
            request = request.header("x-hub-signature-256", s);
        }
        assert_eq!(
            request.send().await?.status().as_u16(),
            401,
            "{signature:?}"
        );
    }
    let rows: i64 = stack
        .db
        .connect()
        .await?
        .query_one(
            "SELECT count(*) AS n FROM herald.delivery_events WHERE state <> 1",
            &[],
        )
        .await?
        .get("n");
    assert_eq!(rows, 0, "a refused webhook recorded something");
    assert_eq!(state(&stack.task(&task.id).await?), DeliveryState::Accepted);
    let rejected = counter(
        &stack.executor,
        "herald_callbacks_rejected_total",
        &["reason=\"signature\""],
    )
    .await?;
    assert_eq!(rejected, 4.0);
    Ok(())
}

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
    // A late delivered (out of order) cannot revive it.
    let late = status_of(&task, &delivery.provider_message_id, Callback::Delivered);
    let body = webhook_body(WABA, "messages", late);
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    let task = stack.task(&task.id).await?;
    assert_eq!(task.state(), TaskState::Failed);
    assert_eq!(state(&task), DeliveryState::FailedAfterAcceptance);

    // A late failure that limits one recipient (131049, the per-user marketing limit) also
    // leaves that recipient alone on the account, as the send's own answer would.
    stack.fake.plan_callbacks(
        "16505550011",
        CallbackPlan::after(&[Callback::Failed(131049)]),
    );
    let limited = stack.send("16505550011").await?;
    stack
        .wait_task(&limited.id, |t| t.state() == TaskState::Failed)
        .await?;
    let blocked: bool = stack
        .db
        .connect()
        .await?
        .query_one(
            "SELECT blocked_until > herald.now() AS blocked FROM herald.recipient_sends \
             WHERE account_id = 'wa-1' AND recipient = '16505550011'",
            &[],
        )
        .await?
        .get("blocked");
    assert!(blocked, "131049 did not back the recipient off");
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
    let retried = stack
        .wait_task(&task.id, |t| state(t) == DeliveryState::Delivered)
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

#[tokio::test]
async fn quality_and_tier_updates_show_in_get_account() -> Result<()> {
    let mut stack = Stack::start().await?;
    // The older form (current_limit) beside the portfolio one, which wins.
    let body = webhook_body(
        WABA,
        "phone_number_quality_update",
        json!({"display_phone_number": "15550783881", "event": "DOWNGRADE",
               "current_limit": "TIER_1K", "max_daily_conversations_per_business": "TIER_2K",
               "quality_rating": "YELLOW"}),
    );
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    let account = get_account(&mut stack.accounts, "wa-1").await?;
    assert_eq!(
        account.limits.context("limits")?.messaging_tier(),
        MessagingTier::Limit2k
    );
    assert_eq!(account.status.context("status")?.quality, "yellow");

    // The old form alone, and a value herald does not know (informational: nothing changes).
    let body = webhook_body(
        WABA,
        "phone_number_quality_update",
        json!({"display_phone_number": "15550783881", "event": "UPGRADE", "current_limit": "TIER_50"}),
    );
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    let body = webhook_body(
        WABA,
        "phone_number_quality_update",
        json!({"display_phone_number": "15550783881", "event": "UPGRADE", "current_limit": "TIER_7"}),
    );
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    let account = get_account(&mut stack.accounts, "wa-1").await?;
    assert_eq!(
        account.limits.context("limits")?.messaging_tier(),
        MessagingTier::Limit50
    );

    // An inbound message opens the customer-service window (as RecordInbound does). It is
    // stamped now: retention forgets pairs whose window closed more than 24 hours ago, and it
    // may run between the webhook and the read below.
    let written_at = chrono::Utc::now().timestamp();
    let body = webhook_body(
        WABA,
        "messages",
        json!({"messaging_product": "whatsapp",
               "metadata": {"display_phone_number": "15550783881", "phone_number_id": PHONE_ID},
               "contacts": [{"profile": {"name": "Sheena"}, "wa_id": "16505550009"}],
               "messages": [{"from": "16505550009", "id": "wamid.IN", "timestamp": written_at.to_string(),
                             "type": "text", "text": {"body": "hi"}}]}),
    );
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    let inbound: Option<chrono::DateTime<chrono::Utc>> = stack
        .db
        .connect()
        .await?
        .query_one(
            "SELECT inbound_at FROM herald.recipient_sends \
             WHERE account_id = 'wa-1' AND recipient = '16505550009'",
            &[],
        )
        .await?
        .get("inbound_at");
    assert_eq!(inbound.map(|t| t.timestamp()), Some(written_at));
    Ok(())
}

#[tokio::test]
async fn account_updates_pause_with_a_notification_and_reconnected_resumes() -> Result<()> {
    let notify = WebhookReceiver::start().await?;
    let notify_url = format!("{}/notify", notify.url());
    let mut stack = Stack::start_with(|b| {
        b.env("HERALD_NOTIFY_URL", &notify_url).env(
            "HERALD_NOTIFY_SECRET",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        )
    })
    .await?;
    let body = webhook_body(
        WABA,
        "account_update",
        json!({"event": "DISABLED_UPDATE",
               "ban_info": {"waba_ban_state": "DISABLE", "waba_ban_date": "2025-06-01"}}),
    );
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    // Meta delivers it again: still one pause, one notification.
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    let account = get_account(&mut stack.accounts, "wa-1").await?;
    assert_eq!(account.state(), AccountState::Paused);
    let reason = account.status.context("status")?.state_reason;
    assert!(
        reason.starts_with("paused by the provider: account_update DISABLED_UPDATE"),
        "{reason}"
    );

    let delivered = notify.wait_for_requests(1, WAIT).await?;
    let event: serde_json::Value = serde_json::from_slice(&delivered[0].body)?;
    assert_eq!(event["type"], "account.paused");
    assert_eq!(event["data"]["account_id"], "wa-1");
    assert!(event["data"]["reason"]
        .as_str()
        .is_some_and(|r| r.contains("DISABLED_UPDATE")));

    let body = webhook_body(
        WABA,
        "account_update",
        json!({"event": "ACCOUNT_RECONNECTED"}),
    );
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    let account = get_account(&mut stack.accounts, "wa-1").await?;
    assert_eq!(account.state(), AccountState::Active);
    // Back in rotation: a task goes out through it.
    stack.send("16505550010").await?;
    let paused_events = notify
        .requests()
        .iter()
        .filter_map(|r| serde_json::from_slice::<serde_json::Value>(&r.body).ok())
        .filter(|e| e["type"] == "account.paused")
        .count();
    assert_eq!(paused_events, 1);
    Ok(())
}

/// A `messages` webhook value: `from` wrote `text` to the account.
fn reply_from(from: &str, text: &str) -> serde_json::Value {
    json!({"messaging_product": "whatsapp",
           "metadata": {"display_phone_number": "15550783881", "phone_number_id": PHONE_ID},
           "contacts": [{"profile": {"name": "Sheena"}, "wa_id": from}],
           "messages": [{"from": from, "id": format!("wamid.IN-{from}"), "timestamp": chrono::Utc::now().timestamp().to_string(),
                         "type": "text", "text": {"body": text}}]})
}

#[tokio::test]
async fn an_opt_out_reply_suppresses_the_sender_and_its_queued_task_is_never_sent() -> Result<()> {
    let mut stack = Stack::start().await?;
    // Queued for in an hour: one to the recipient who will opt out, one to another.
    let queue = |recipient: &str| TaskSpec {
        pool: "wa".into(),
        when: Some(herald_proto::v1::task_spec::When::Delay(
            prost_types::Duration {
                seconds: 3600,
                nanos: 0,
            },
        )),
        ..task_spec("promo", recipient, "Spring sale")
    };
    let mut ids = Vec::new();
    for recipient in ["16505550031", "16505550032"] {
        let task = stack
            .tasks
            .create_task(CreateTaskRequest {
                task: Some(queue(recipient)),
            })
            .await?
            .into_inner()
            .task
            .context("task")?;
        ids.push(task.id);
    }

    // "Stop" (any case, trimmed) opts out; a sentence that contains the word does not.
    let body = webhook_body(WABA, "messages", reply_from("16505550031", " Stop "));
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    let body = webhook_body(
        WABA,
        "messages",
        reply_from("16505550032", "stop sending at night"),
    );
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);

    let mut suppressions = SuppressionServiceClient::connect(stack.scheduler.grpc_url()).await?;
    let listed = suppressions
        .check_suppressions(CheckSuppressionsRequest {
            recipients: vec!["16505550031".into(), "16505550032".into()],
        })
        .await?
        .into_inner()
        .suppressions;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (listed[0].recipient.as_str(), listed[0].reason()),
        ("16505550031", SuppressionReason::OptOut)
    );
    // Both replies are kept, minimally.
    let replies: Vec<(String, String, Option<String>)> = stack
        .db
        .connect()
        .await?
        .query(
            "SELECT sender, kind, body FROM herald.inbound_messages \
             WHERE credentials_ref = 'wa-1' ORDER BY sender",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get("sender"), r.get("kind"), r.get("body")))
        .collect();
    assert_eq!(
        replies,
        [
            ("16505550031".into(), "text".into(), Some("Stop".into())),
            (
                "16505550032".into(),
                "text".into(),
                Some("stop sending at night".into())
            ),
        ]
    );

    // An hour later both are due: the claim ends the opted-out one instead of sending it.
    stack
        .db
        .connect()
        .await?
        .execute("SELECT herald.set_test_clock(interval '61 minutes')", &[])
        .await?;
    let sent = stack
        .wait_task(&ids[1], |t| t.state() == TaskState::Succeeded)
        .await?;
    assert_eq!(sent.end_reason(), EndReason::Sent);
    let skipped = stack
        .wait_task(&ids[0], |t| t.state() == TaskState::Cancelled)
        .await?;
    assert_eq!(
        (skipped.end_reason(), skipped.lease_count),
        (EndReason::Suppressed, 0)
    );
    let to_opted_out = stack
        .fake
        .requests()
        .iter()
        .filter(|r| r.body["to"] == "16505550031")
        .count();
    assert_eq!(
        to_opted_out, 0,
        "a message went to the recipient who opted out"
    );

    // A new task to them is created already ended, with the reason.
    let later = stack
        .tasks
        .create_task(CreateTaskRequest {
            task: Some(TaskSpec {
                pool: "wa".into(),
                ..task_spec("promo", "+16505550031", "Last chance")
            }),
        })
        .await?
        .into_inner()
        .task
        .context("task")?;
    assert_eq!(
        (later.state(), later.end_reason()),
        (TaskState::Cancelled, EndReason::Suppressed)
    );
    Ok(())
}

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

/// Waits until the fake has recorded a message to `recipient`.
async fn wait_for_request(fake: &FakeWhatsApp, recipient: &str) -> Result<()> {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !fake.requests().iter().any(|r| r.body["to"] == recipient) {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "no message to {recipient} reached the fake"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Messages the fake accepted for `recipient`.
fn messages_to(fake: &FakeWhatsApp, recipient: &str) -> usize {
    fake.requests()
        .iter()
        .filter(|r| r.body["to"] == recipient && r.status == 200)
        .count()
}

#[tokio::test]
async fn an_executor_killed_after_meta_accepted_sends_once_a_callback_settles_it() -> Result<()> {
    // Short leases, so the kill is noticed quickly; a long grace, so only a callback (not the
    // clock) can settle the task before the test ends.
    let mut stack = Stack::start_with(|b| {
        b.env("HERALD_LEASE_TTL", "2s")
            .env("HERALD_UNKNOWN_OUTCOME_GRACE", "1h")
    })
    .await?;
    let recipient = "16505550051";
    // Meta accepts the message, but the executor never hears back: it is killed while waiting.
    stack.fake.hold_answers();
    let id = stack
        .tasks
        .create_task(CreateTaskRequest {
            task: Some(TaskSpec {
                pool: "wa".into(),
                ..task_spec("orders", recipient, "Your order has shipped")
            }),
        })
        .await?
        .into_inner()
        .task
        .context("task")?
        .id;
    wait_for_request(&stack.fake, recipient).await?;
    stack.executor.kill()?;
    stack.executor.wait().await?;

    // The lease runs out unreported: the attempt is charged and the task waits for a callback
    // (due again only after the grace), instead of being leased again at once.
    let waiting = stack
        .wait_task(&id, |t| {
            t.state() == TaskState::Scheduled && t.attempts == 1
        })
        .await?;
    let due_in = waiting.run_at.context("run_at")?.seconds - chrono::Utc::now().timestamp();
    assert!(
        due_in > 3000,
        "due again in {due_in} s, not after the grace"
    );

    // A new executor takes over the webhook; Meta's `sent` status names the task.
    stack.executor = executor(&stack.scheduler.grpc_url(), &stack.fake).await?;
    stack
        .fake
        .send_callbacks_to(&webhook_url(&stack.executor)?, APP_SECRET);
    let wamid = "wamid.fake00000001";
    let body = webhook_body(WABA, "messages", status_of(&waiting, wamid, Callback::Sent));
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    let task = stack
        .wait_task(&id, |t| t.state() == TaskState::Succeeded)
        .await?;
    assert_eq!(task.end_reason(), EndReason::Sent);
    let delivery = task.delivery.clone().context("delivery")?;
    assert_eq!(
        (delivery.state(), delivery.provider_message_id.as_str()),
        (DeliveryState::Accepted, wamid)
    );
    stack.fake.release_answers();
    assert_eq!(messages_to(&stack.fake, recipient), 1, "sent twice");
    Ok(())
}

#[tokio::test]
async fn without_a_callback_the_task_is_sent_again_after_the_grace() -> Result<()> {
    let mut stack = Stack::start_with(|b| {
        b.env("HERALD_LEASE_TTL", "2s")
            .env("HERALD_UNKNOWN_OUTCOME_GRACE", "1s")
    })
    .await?;
    let recipient = "16505550052";
    stack.fake.hold_answers();
    let id = stack
        .tasks
        .create_task(CreateTaskRequest {
            task: Some(TaskSpec {
                pool: "wa".into(),
                ..task_spec("orders", recipient, "Your order has shipped")
            }),
        })
        .await?
        .into_inner()
        .task
        .context("task")?
        .id;
    wait_for_request(&stack.fake, recipient).await?;
    stack.executor.kill()?;
    stack.executor.wait().await?;
    stack.fake.release_answers();
    // Nothing says the first send went out: after the grace a new executor sends it again.
    stack.executor = executor(&stack.scheduler.grpc_url(), &stack.fake).await?;
    let task = stack
        .wait_task(&id, |t| t.state() == TaskState::Succeeded)
        .await?;
    assert_eq!(task.lease_count, 2);
    assert_eq!(messages_to(&stack.fake, recipient), 2);
    Ok(())
}

/// The approved template a task falls back to when the 24-hour window is closed.
fn window_reopen() -> TemplateContent {
    TemplateContent {
        template_id: "window_reopen".into(),
        language: "en_US".into(),
        variables: [("1".to_owned(), "Ada".to_owned())].into(),
        ..Default::default()
    }
}

impl Stack {
    /// Creates a text task to `recipient` through the pool with the window-closed fallback
    /// [`window_reopen`]; returns its id.
    async fn create_with_fallback(&mut self, recipient: &str) -> Result<String> {
        Ok(self
            .tasks
            .create_task(CreateTaskRequest {
                task: Some(TaskSpec {
                    pool: "wa".into(),
                    window_closed_fallback: Some(window_reopen()),
                    ..task_spec("orders", recipient, "Your order has shipped")
                }),
            })
            .await?
            .into_inner()
            .task
            .context("task")?
            .id)
    }

    async fn attempts(&mut self, id: &str) -> Result<Vec<Attempt>> {
        Ok(self
            .tasks
            .list_attempts(ListAttemptsRequest { task_id: id.into() })
            .await?
            .into_inner()
            .attempts)
    }
}

/// The messages the fake accepted for `recipient`, as (type, template name, callback data).
fn accepted_to(fake: &FakeWhatsApp, recipient: &str) -> Vec<(String, String, String)> {
    fake.requests()
        .iter()
        .filter(|r| r.body["to"] == recipient && r.status == 200)
        .map(|r| {
            let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
            (
                text(&r.body["type"]),
                text(&r.body["template"]["name"]),
                text(&r.body["biz_opaque_callback_data"]),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_send_refused_because_the_window_closed_sends_the_fallback_template_in_the_same_attempt(
) -> Result<()> {
    let mut stack = Stack::start().await?;
    let recipient = "16505550061";
    // The text is refused as Meta does outside the customer-service window; the template that
    // follows is accepted.
    stack.fake.respond_next(Scripted::Code(131047));
    let id = stack.create_with_fallback(recipient).await?;
    let task = wait_for_task_state(&mut stack.tasks, &id, TaskState::Succeeded, WAIT).await?;

    let tried: Vec<(String, u16)> = stack
        .fake
        .requests()
        .iter()
        .filter(|r| r.body["to"] == recipient)
        .map(|r| {
            (
                r.body["type"].as_str().unwrap_or_default().to_owned(),
                r.status,
            )
        })
        .collect();
    assert_eq!(
        tried,
        vec![("text".to_owned(), 400), ("template".to_owned(), 200)]
    );
    assert_eq!(
        accepted_to(&stack.fake, recipient),
        vec![(
            "template".to_owned(),
            "window_reopen".to_owned(),
            format!("{id}/1")
        )]
    );
    // One attempt, which says the fallback went and why.
    let attempts = stack.attempts(&id).await?;
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    let attempt = &attempts[0];
    assert_eq!(attempt.outcome(), OutcomeClass::Ok);
    assert!(attempt.window_closed_fallback);
    assert!(attempt.error.contains("131047"), "{}", attempt.error);
    assert_eq!(
        Some(attempt.provider_message_id.as_str()),
        task.delivery
            .as_ref()
            .map(|d| d.provider_message_id.as_str())
    );
    assert_eq!(task.end_reason(), EndReason::Sent);
    assert!(task.window_closed_fallback_at.is_some());
    assert_eq!(task.window_closed_fallback, Some(window_reopen()));
    assert_eq!(task.replaced_delivery, None);
    Ok(())
}

#[tokio::test]
async fn a_late_window_closed_failure_sends_the_fallback_once_and_repeats_change_nothing(
) -> Result<()> {
    let mut stack = Stack::start().await?;
    let recipient = "16505550062";
    use Callback::*;
    // The text is accepted, then fails with 131047; the template sent after it is delivered.
    stack
        .fake
        .plan_callbacks_once(recipient, CallbackPlan::after(&[Sent, Failed(131047)]));
    stack
        .fake
        .plan_callbacks(recipient, CallbackPlan::after(&[Sent, Delivered]));
    let id = stack.create_with_fallback(recipient).await?;
    let task = stack
        .wait_task(&id, |t| {
            t.state() == TaskState::Succeeded && state(t) == DeliveryState::Delivered
        })
        .await?;

    // The first message and exactly one template, sent by the task's second lease.
    let accepted = accepted_to(&stack.fake, recipient);
    assert_eq!(accepted.len(), 2, "{accepted:?}");
    assert_eq!(accepted[0].0, "text");
    assert_eq!(
        accepted[1],
        (
            "template".to_owned(),
            "window_reopen".to_owned(),
            format!("{id}/2")
        )
    );
    // The first message's reports stay visible beside the template's delivery.
    let first = task
        .replaced_delivery
        .clone()
        .context("replaced delivery")?;
    assert_eq!(first.state(), DeliveryState::FailedAfterAcceptance);
    assert_eq!(first.error_code, 131047);
    let delivery = task.delivery.clone().context("delivery")?;
    assert_ne!(delivery.provider_message_id, first.provider_message_id);
    assert_eq!(task.end_reason(), EndReason::Sent);
    assert!(task.window_closed_fallback_at.is_some());
    let attempts = stack.attempts(&id).await?;
    assert_eq!(
        attempts.iter().map(Attempt::outcome).collect::<Vec<_>>(),
        vec![OutcomeClass::Ok, OutcomeClass::Ok]
    );

    // Meta repeats the first message's failure, and reports it again as if from a crashed
    // attempt: each webhook is answered only once recorded, so the task as read right after
    // is what it did. No third message, and the task stays as it was.
    for data in [format!("{id}/1"), format!("{id}/3")] {
        let late = status_value(
            PHONE_ID,
            &first.provider_message_id,
            Failed(131047),
            recipient,
            Some(&data),
        );
        let body = webhook_body(WABA, "messages", late);
        assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    }
    // A report the first message never had before (read, late) does not touch the template's
    // delivery either.
    let read = status_value(
        PHONE_ID,
        &first.provider_message_id,
        Read,
        recipient,
        Some(&format!("{id}/1")),
    );
    let body = webhook_body(WABA, "messages", read);
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    let after = stack.task(&id).await?;
    assert_eq!(after.state(), TaskState::Succeeded);
    assert_eq!(after.lease_count, 2);
    assert_eq!(
        after.window_closed_fallback_at,
        task.window_closed_fallback_at
    );
    assert_eq!(state(&after), DeliveryState::Delivered);
    assert_eq!(accepted_to(&stack.fake, recipient).len(), 2);
    Ok(())
}

#[tokio::test]
async fn a_failure_of_the_fallback_itself_ends_the_task_failed() -> Result<()> {
    let mut stack = Stack::start().await?;
    let recipient = "16505550063";
    // Every message to this recipient fails with 131047 after acceptance: the text, then the
    // template (which Meta would not do for an approved template, but herald must not loop).
    stack.fake.plan_callbacks(
        recipient,
        CallbackPlan::after(&[Callback::Sent, Callback::Failed(131047)]),
    );
    let id = stack.create_with_fallback(recipient).await?;
    let task = stack
        .wait_task(&id, |t| t.state() == TaskState::Failed)
        .await?;
    assert_eq!(
        (task.end_reason(), task.end_code),
        (EndReason::FailedAfterAcceptance, 131047)
    );
    let templates = accepted_to(&stack.fake, recipient)
        .into_iter()
        .filter(|m| m.0 == "template")
        .count();
    assert_eq!(templates, 1);
    assert_eq!(task.lease_count, 2);
    assert_eq!(state(&task), DeliveryState::FailedAfterAcceptance);
    Ok(())
}

#[tokio::test]
async fn a_retried_task_whose_new_message_finds_the_window_closed_sends_its_fallback() -> Result<()>
{
    let mut stack = Stack::start().await?;
    let recipient = "16505550064";
    use Callback::*;
    // The text fails late for another reason (131026, undeliverable): no fallback for that.
    stack
        .fake
        .plan_callbacks_once(recipient, CallbackPlan::after(&[Sent, Failed(131026)]));
    // Sent again, it fails with 131047 (the window closed meanwhile); the template arrives.
    stack
        .fake
        .plan_callbacks_once(recipient, CallbackPlan::after(&[Sent, Failed(131047)]));
    stack
        .fake
        .plan_callbacks(recipient, CallbackPlan::after(&[Sent, Delivered]));
    let id = stack.create_with_fallback(recipient).await?;
    let failed = stack
        .wait_task(&id, |t| t.state() == TaskState::Failed)
        .await?;
    assert_eq!(failed.end_code, 131026);
    stack
        .tasks
        .retry_task(RetryTaskRequest {
            id: id.clone(),
            ..Default::default()
        })
        .await?;
    // The first message's older failure must not stand for the new one's: the fallback goes.
    let task = stack
        .wait_task(&id, |t| {
            t.state() == TaskState::Succeeded && state(t) == DeliveryState::Delivered
        })
        .await?;
    let sent: Vec<String> = accepted_to(&stack.fake, recipient)
        .into_iter()
        .map(|m| m.0)
        .collect();
    assert_eq!(sent, ["text", "text", "template"]);
    assert!(task.window_closed_fallback_at.is_some());
    let replaced = task.replaced_delivery.context("replaced delivery")?;
    assert_eq!(replaced.error_code, 131047);
    assert_eq!(task.lease_count, 3);
    Ok(())
}

#[tokio::test]
async fn a_bad_window_closed_fallback_is_invalid_argument_naming_the_field_and_creates_nothing(
) -> Result<()> {
    let mut stack = Stack::start().await?;
    let mut wecom = whatsapp_account("wc-1", "wc", 100.0);
    wecom.sender_kind = "wecom".into();
    stack
        .accounts
        .create_account(CreateAccountRequest {
            account: Some(wecom),
        })
        .await?;
    let spec = |pool: &str, fallback: TemplateContent| TaskSpec {
        pool: pool.into(),
        window_closed_fallback: Some(fallback),
        ..task_spec("orders", "16505550064", "hello")
    };
    let cases = [
        // WeCom has no 24-hour window and cannot send a WhatsApp template.
        (spec("wc", window_reopen()), "task.window_closed_fallback"),
        // Sent by queue: the scheduler cannot tell the channel.
        (
            TaskSpec {
                pool: String::new(),
                ..spec("wa", window_reopen())
            },
            "task.window_closed_fallback",
        ),
        (
            spec(
                "wa",
                TemplateContent {
                    template_id: String::new(),
                    ..window_reopen()
                },
            ),
            "task.window_closed_fallback.template_id",
        ),
        (
            spec(
                "wa",
                TemplateContent {
                    language: String::new(),
                    ..window_reopen()
                },
            ),
            "task.window_closed_fallback.language",
        ),
    ];
    for (spec, field) in cases {
        let status = stack
            .tasks
            .create_task(CreateTaskRequest { task: Some(spec) })
            .await
            .err()
            .with_context(|| format!("{field}: accepted"))?;
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        let fields: Vec<String> = status
            .get_details_bad_request()
            .context("bad request details")?
            .field_violations
            .into_iter()
            .map(|v| v.field)
            .collect();
        assert_eq!(fields, [field]);
    }
    let listed = stack
        .tasks
        .list_tasks(ListTasksRequest::default())
        .await?
        .into_inner()
        .tasks;
    assert!(listed.is_empty(), "a refused task was written: {listed:?}");
    Ok(())
}

#[tokio::test]
async fn a_stored_templates_fallback_goes_with_the_tasks_that_name_it_and_can_send_it() -> Result<()>
{
    let mut stack = Stack::start().await?;
    let mut wecom = whatsapp_account("wc-1", "wc", 100.0);
    wecom.sender_kind = "wecom".into();
    stack
        .accounts
        .create_account(CreateAccountRequest {
            account: Some(wecom),
        })
        .await?;
    let mut templates = TemplateServiceClient::connect(stack.scheduler.grpc_url()).await?;
    templates
        .create_template(CreateTemplateRequest {
            template: Some(Template {
                id: "shipped".into(),
                kind: Some(template::Kind::Text(TextTemplate {
                    body: "Order {{ order }} has shipped".into(),
                })),
                window_closed_fallback: Some(window_reopen()),
                ..Default::default()
            }),
        })
        .await?;
    // A malformed fallback is refused when the template is stored.
    let status = templates
        .create_template(CreateTemplateRequest {
            template: Some(Template {
                id: "broken".into(),
                kind: Some(template::Kind::Text(TextTemplate {
                    body: "Hello".into(),
                })),
                window_closed_fallback: Some(TemplateContent {
                    language: String::new(),
                    ..window_reopen()
                }),
                ..Default::default()
            }),
        })
        .await
        .err()
        .context("a fallback without a language was stored")?;
    let fields: Vec<String> = status
        .get_details_bad_request()
        .context("bad request details")?
        .field_violations
        .into_iter()
        .map(|v| v.field)
        .collect();
    assert_eq!(fields, ["template.window_closed_fallback.language"]);

    let named = |pool: &str, recipient: &str| TaskSpec {
        pool: pool.into(),
        content: Some(Content {
            body: Some(content::Body::Template(TemplateContent {
                template_id: "shipped".into(),
                variables: [("order".to_owned(), "A-1001".to_owned())].into(),
                ..Default::default()
            })),
            ..Default::default()
        }),
        ..task_spec("orders", recipient, "unused")
    };
    // Through WhatsApp: the task takes the template's fallback, and the refused text is
    // followed by it.
    let recipient = "16505550065";
    stack.fake.respond_next(Scripted::Code(131047));
    let id = stack
        .tasks
        .create_task(CreateTaskRequest {
            task: Some(named("wa", recipient)),
        })
        .await?
        .into_inner()
        .task
        .context("task")?
        .id;
    let task = wait_for_task_state(&mut stack.tasks, &id, TaskState::Succeeded, WAIT).await?;
    assert_eq!(task.window_closed_fallback, Some(window_reopen()));
    assert!(task.window_closed_fallback_at.is_some());
    assert_eq!(
        accepted_to(&stack.fake, recipient),
        vec![(
            "template".to_owned(),
            "window_reopen".to_owned(),
            format!("{id}/1")
        )]
    );
    // Through WeCom, which cannot send it: the task is created, without a fallback.
    let other = stack
        .tasks
        .create_task(CreateTaskRequest {
            task: Some(named("wc", "alice")),
        })
        .await?
        .into_inner()
        .task
        .context("task")?;
    assert_eq!(other.window_closed_fallback, None);
    Ok(())
}
