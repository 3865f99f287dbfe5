//! Accounts and pooled tasks as the account tests drive them through the real API.

use anyhow::Result;
use herald_proto::v1::account_service_client::AccountServiceClient;
use herald_proto::v1::task_service_client::TaskServiceClient;
use herald_proto::v1::{Account, AccountLimits, CreateTasksRequest, GetAccountRequest, TaskSpec};
use tokio_postgres::Client;
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

/// The server process of `db`'s session.
pub async fn backend_pid(db: &impl tokio_postgres::GenericClient) -> Result<i32> {
    Ok(db
        .query_one("SELECT pg_backend_pid() AS pid", &[])
        .await?
        .get("pid"))
}

/// Waits until a session of this database waits for a lock the session `pid` holds.
pub async fn until_blocked_by(conn: &Client, pid: i32, what: &str) -> Result<()> {
    crate::until(what, || async {
        let row = conn
            .query_one(
                "SELECT count(*) AS n FROM pg_stat_activity
                 WHERE datname = current_database() AND $1 = ANY(pg_blocking_pids(pid))",
                &[&pid],
            )
            .await?;
        Ok(row.get::<_, i64>("n") > 0)
    })
    .await
}

/// Locks account `id`'s row in a new transaction of `client`, as a report batch or another
/// claim holding it would; returns the transaction and its server process.
pub async fn hold_account<'c>(
    client: &'c mut Client,
    id: &str,
) -> Result<(tokio_postgres::Transaction<'c>, i32)> {
    let tx = client.transaction().await?;
    tx.execute(
        "SELECT 1 FROM herald.accounts WHERE namespace = 'default' AND id = $1 FOR UPDATE",
        &[&id],
    )
    .await?;
    let pid = backend_pid(&tx).await?;
    Ok((tx, pid))
}
