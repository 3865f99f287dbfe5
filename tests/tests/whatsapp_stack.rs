//! The whole stack on accounts: the real scheduler routes pooled tasks to WhatsApp accounts, the
//! real executor sends them with each account's credentials to local fakes of the Cloud API,
//! and what the fake answers moves the account (offline on a locked number) and the task; and
//! long provider errors reported again after a reconnect, in frames the scheduler accepts.

use std::time::Duration;

use anyhow::{Context, Result};
use herald_proto::v1::{
    account_service_client::AccountServiceClient, AccountState, CreateAccountRequest,
    CreateTaskRequest, CreateTasksRequest, GetAccountRequest, ListAttemptsRequest, OutcomeClass,
    TaskSpec, TaskState,
};
use herald_tests::accounts::whatsapp_account;
use herald_tests::fakes::whatsapp::{FakeWhatsApp, Scripted};
use herald_tests::{
    connect_tasks, task_spec, until, wait_for_task_state, ExecutorProcess, SchedulerProcess,
    TcpProxy, TestDb,
};
use tonic::transport::Channel;

const WAIT: Duration = Duration::from_secs(30);

fn account_table(id: &str, fake: &FakeWhatsApp, phone: &str, token_var: &str) -> String {
    format!(
        "[accounts.{id}]\nsender = \"whatsapp_cloud\"\nphone_number_id = \"{phone}\"\n\
         access_token = {{ env = \"{token_var}\" }}\nbase_url = \"{}\"\n",
        fake.base_url()
    )
}

#[tokio::test]
async fn a_locked_number_goes_offline_and_its_message_goes_out_through_the_other() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut accounts = AccountServiceClient::new(
        Channel::from_shared(scheduler.grpc_url())?
            .connect()
            .await?,
    );
    // wa-1 has the more room, so it is tried first.
    for a in [
        whatsapp_account("wa-1", "wa", 80.0),
        whatsapp_account("wa-2", "wa", 20.0),
    ] {
        accounts
            .create_account(CreateAccountRequest { account: Some(a) })
            .await?;
    }
    let locked = FakeWhatsApp::start("1001", "token-one").await?;
    let healthy = FakeWhatsApp::start("1002", "token-two").await?;
    locked.respond_next(Scripted::Code(131031));
    let config = format!(
        "{}{}",
        account_table("wa-1", &locked, "1001", "WA_ONE"),
        account_table("wa-2", &healthy, "1002", "WA_TWO")
    );
    let _executor = ExecutorProcess::builder(&[scheduler.grpc_url()])
        .config_toml(config)
        .env("WA_ONE", "token-one")
        .env("WA_TWO", "token-two")
        .spawn()
        .await?;

    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let id = tasks
        .create_task(CreateTaskRequest {
            task: Some(TaskSpec {
                pool: "wa".into(),
                ..task_spec("orders", "16505551234", "Your order has shipped")
            }),
        })
        .await?
        .into_inner()
        .task
        .context("task")?
        .id;
    let task = wait_for_task_state(&mut tasks, &id, TaskState::Succeeded, WAIT).await?;
    assert_eq!(task.account_id, "wa-2");
    assert_eq!(
        task.attempts, 1,
        "the locked number's attempt was not charged"
    );

    let attempts = tasks
        .list_attempts(ListAttemptsRequest {
            task_id: id.clone(),
        })
        .await?
        .into_inner()
        .attempts;
    let seen: Vec<(String, OutcomeClass)> = attempts
        .iter()
        .map(|a| (a.account.clone(), a.outcome()))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("wa-1".to_string(), OutcomeClass::AccountUnavailable),
            ("wa-2".to_string(), OutcomeClass::Ok)
        ]
    );
    assert!(
        attempts[1].provider_message_id.starts_with("wamid."),
        "{attempts:?}"
    );

    let sent = healthy.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].authorization.as_deref(), Some("Bearer token-two"));
    assert_eq!(sent[0].body["to"], "16505551234");
    assert_eq!(sent[0].body["text"]["body"], "Your order has shipped");
    // The fencing token of the lease that sent it: the second (the first went to wa-1).
    assert_eq!(sent[0].body["biz_opaque_callback_data"], format!("{id}/2"));

    let wa1 = accounts
        .get_account(GetAccountRequest { id: "wa-1".into() })
        .await?
        .into_inner();
    assert_eq!(wa1.state(), AccountState::Offline);
    assert!(wa1
        .status
        .context("status")?
        .state_reason
        .contains("131031"));
    Ok(())
}

/// Tasks in the report test: more than one report batch (1,000) of results.
const LONG_ERRORS: usize = 1_200;

#[tokio::test]
async fn long_provider_errors_resent_after_a_reconnect_arrive_in_frames_the_scheduler_accepts(
) -> Result<()> {
    // 1,200 sends fail with errors of about 4 KB (the executor keeps 4,096 bytes of one). The
    // network to the scheduler goes while they fail, so the new session reports all of them at
    // once: without a byte bound, a batch of 1,000 such results is 4.2 MB, and this scheduler
    // (2 MiB, below the 4 MiB default, so that a batch of 500 is over it too) would refuse it at
    // every reconnect while the leases run out and the messages are sent again.
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_MAX_MESSAGE_BYTES", (2 * 1024 * 1024).to_string())
        .env("HERALD_LEASE_TTL", "120s")
        .env("HERALD_HEARTBEAT_INTERVAL", "1s")
        .spawn()
        .await?;
    let mut accounts = AccountServiceClient::new(
        Channel::from_shared(scheduler.grpc_url())?
            .connect()
            .await?,
    );
    let mut account = whatsapp_account("wa-1", "wa", 5_000.0);
    if let Some(limits) = account.limits.as_mut() {
        limits.burst = Some(5_000);
    }
    accounts
        .create_account(CreateAccountRequest {
            account: Some(account),
        })
        .await?;
    let fake = FakeWhatsApp::start("1001", "token-one").await?;
    let details = "d".repeat(4_000);
    let refusal = serde_json::json!({ "error": {
        "message": "(#100) Invalid parameter",
        "type": "OAuthException",
        "code": 100,
        "error_data": { "messaging_product": "whatsapp", "details": details },
    }})
    .to_string();
    for _ in 0..LONG_ERRORS {
        fake.respond_next(Scripted::Raw(400, refusal.clone()));
    }
    fake.hold_answers();
    let proxy = TcpProxy::start(scheduler.grpc_addr()).await?;
    let _executor = ExecutorProcess::builder(&[proxy.url()])
        .config_toml(account_table("wa-1", &fake, "1001", "WA_ONE"))
        .env("WA_ONE", "token-one")
        .env("HERALD_MAX_IN_FLIGHT", "2048")
        .spawn()
        .await?;

    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    for first in (0..LONG_ERRORS).step_by(200) {
        let specs = (first..first + 200)
            .map(|i| TaskSpec {
                pool: "wa".into(),
                ..task_spec(
                    "orders",
                    &format!("1650555{i:04}"),
                    "Your order has shipped",
                )
            })
            .collect();
        tasks
            .create_tasks(CreateTasksRequest {
                tasks: specs,
                ..Default::default()
            })
            .await?;
    }
    until("every send to reach the provider", || {
        let n = fake.requests().len();
        async move { Ok(n == LONG_ERRORS) }
    })
    .await?;
    proxy.cut();
    fake.release_answers();
    until("every refusal to be answered", || {
        let n = fake.answered();
        async move { Ok(n == LONG_ERRORS as u64) }
    })
    .await?;
    proxy.restore();

    let conn = db.connect().await?;
    until("every task to fail", || {
        let conn = &conn;
        async move {
            let failed: i64 = conn
                .query_one(
                    "SELECT count(*) FROM herald.task_records WHERE state = 'failed'",
                    &[],
                )
                .await?
                .get(0);
            Ok(failed == LONG_ERRORS as i64)
        }
    })
    .await?;
    let shortest: i32 = conn
        .query_one(
            "SELECT min(octet_length(last_error)) FROM herald.task_records",
            &[],
        )
        .await?
        .get(0);
    assert!(
        shortest > 4_000,
        "errors kept whole up to the limit: {shortest} bytes"
    );
    assert_eq!(
        fake.requests().len(),
        LONG_ERRORS,
        "no message was sent a second time"
    );
    Ok(())
}
