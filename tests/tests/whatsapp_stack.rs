//! The whole stack on accounts: the real scheduler routes pooled tasks to WhatsApp accounts, the
//! real executor sends them with each account's credentials to local fakes of the Cloud API,
//! and what the fake answers moves the account (offline on a locked number) and the task.

use std::time::Duration;

use anyhow::{Context, Result};
use herald_proto::v1::{
    account_service_client::AccountServiceClient, AccountState, CreateAccountRequest,
    CreateTaskRequest, GetAccountRequest, ListAttemptsRequest, OutcomeClass, TaskSpec, TaskState,
};
use herald_tests::accounts::whatsapp_account;
use herald_tests::fakes::whatsapp::{FakeWhatsApp, Scripted};
use herald_tests::{
    connect_tasks, task_spec, wait_for_task_state, ExecutorProcess, SchedulerProcess, TestDb,
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
