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
    ListTasksRequest, MessagingTier, OutcomeClass, RemoveSuppressionRequest, RetryTaskRequest,
    StatsWindow, SuppressionReason, Task, TaskSpec, TaskState, Template, TemplateContent,
    TextTemplate,
};
use herald_tests::accounts::{accounts_client, get_account, whatsapp_account};
use herald_tests::fakes::whatsapp::{
    hub_signature, status_value, webhook_body, Callback, CallbackPlan, FakeWhatsApp, Scripted,
};
use herald_tests::{
    connect_tasks, create_task, task_spec, wait_for_task_state, ExecutorProcess, SchedulerProcess,
    TestDb, WebhookReceiver,
};
use serde_json::json;
use tonic::transport::Channel;
use tonic_types::StatusExt;

mod account_events;
mod delivery_stats;
mod handshake_and_signatures;
mod history;
mod replies;
mod statuses;
mod template_pauses;
mod unknown_outcomes;
mod window_closed_fallback;

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
        Self::start_configured(scheduler, "").await
    }

    /// With the scheduler builder adjusted by `scheduler` and `account_settings` (TOML lines,
    /// such as `timeout = "1s"`) added to the executor's `wa-1` table.
    async fn start_configured(
        scheduler: impl FnOnce(herald_tests::SchedulerBuilder) -> herald_tests::SchedulerBuilder,
        account_settings: &str,
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
        let executor = executor_with(&scheduler.grpc_url(), &fake, account_settings).await?;
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

    /// Creates a text task to `recipient` through the pool; returns its id.
    async fn create(&mut self, recipient: &str) -> Result<String> {
        let spec = TaskSpec {
            pool: "wa".into(),
            ..task_spec("orders", recipient, "Your order has shipped")
        };
        Ok(create_task(&mut self.tasks, spec).await?.id)
    }

    /// Creates a text task to `recipient` through the pool and waits until it has ended
    /// (SUCCEEDED once accepted; a failure webhook may already have made it FAILED).
    async fn send(&mut self, recipient: &str) -> Result<Task> {
        let id = self.create(recipient).await?;
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

    /// Moves the scheduler's clock `interval` (SQL, e.g. `'61 minutes'`) ahead of the real one.
    async fn advance_clock(&self, interval: &str) -> Result<()> {
        self.db
            .connect()
            .await?
            .execute(
                "SELECT herald.set_test_clock($1::text::interval)",
                &[&interval],
            )
            .await?;
        Ok(())
    }

    /// The wamid the fake returned for the only message sent to `recipient`.
    fn wamid(&self, task: &Task) -> Result<String> {
        let delivery = task.delivery.as_ref().context("no delivery")?;
        Ok(delivery.provider_message_id.clone())
    }
}

/// The executor with `wa-1`'s table and the webhook on an ephemeral port.
async fn executor(scheduler_url: &str, fake: &FakeWhatsApp) -> Result<ExecutorProcess> {
    executor_with(scheduler_url, fake, "").await
}

/// [`executor`] with `account_settings` (TOML lines) added to `wa-1`'s table.
async fn executor_with(
    scheduler_url: &str,
    fake: &FakeWhatsApp,
    account_settings: &str,
) -> Result<ExecutorProcess> {
    let config = format!(
        "[accounts.wa-1]\nsender = \"whatsapp_cloud\"\nphone_number_id = \"{PHONE_ID}\"\n\
         access_token = \"token\"\nbase_url = \"{}\"\nwaba_id = \"{WABA}\"\n\
         display_phone_number = \"+1 555 078 3881\"\n{account_settings}\n\n\
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
    let text = herald_tests::metrics::scrape(base).await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}
