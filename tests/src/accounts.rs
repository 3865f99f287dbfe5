//! Accounts and pooled tasks as the account tests drive them through the real API.

use anyhow::Result;
use herald_proto::v1::account_service_client::AccountServiceClient;
use herald_proto::v1::task_service_client::TaskServiceClient;
use herald_proto::v1::{Account, AccountLimits, CreateTasksRequest, GetAccountRequest, TaskSpec};
use tonic::transport::Channel;

use crate::task_spec;

/// An AccountService client for the scheduler at `url`.
pub async fn accounts_client(url: &str) -> Result<AccountServiceClient<Channel>> {
    Ok(AccountServiceClient::new(
        Channel::from_shared(url.to_owned())?.connect().await?,
    ))
}

/// The account `id` with its live status.
pub async fn get_account(client: &mut AccountServiceClient<Channel>, id: &str) -> Result<Account> {
    Ok(client
        .get_account(GetAccountRequest { id: id.into() })
        .await?
        .into_inner())
}

/// A text task to `recipient` through any account of `pool`, on queue `q`.
pub fn pooled(pool: &str, recipient: &str) -> TaskSpec {
    TaskSpec {
        pool: pool.into(),
        ..task_spec("q", recipient, "hello")
    }
}

/// Creates `specs` in CreateTasks calls of at most 1,000.
pub async fn create_many(
    client: &mut TaskServiceClient<Channel>,
    specs: Vec<TaskSpec>,
) -> Result<()> {
    for chunk in specs.chunks(1000) {
        client
            .create_tasks(CreateTasksRequest {
                tasks: chunk.to_vec(),
                ..Default::default()
            })
            .await?;
    }
    Ok(())
}

/// A WhatsApp Cloud account `id` in `pool`, sending at `rate` per second.
pub fn whatsapp_account(id: &str, pool: &str, rate: f64) -> Account {
    Account {
        id: id.into(),
        sender_kind: "whatsapp_cloud".into(),
        pool: pool.into(),
        limits: Some(AccountLimits {
            rate_per_second: rate,
            ..Default::default()
        }),
        ..Default::default()
    }
}
