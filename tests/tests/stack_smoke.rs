//! The whole stack on real binaries: a task created on the scheduler is leased by an executor,
//! sent with the log sender and ends SUCCEEDED.

use std::time::Duration;

use anyhow::{Context as _, Result};
use herald_proto::v1::account_service_client::AccountServiceClient;
use herald_proto::v1::{CreateAccountRequest, TaskSpec, TaskState};
use herald_tests::accounts::whatsapp_account;
use herald_tests::{
    connect_tasks, create_task, task_spec, unique_id, wait_for_task_state, ExecutorProcess,
    SchedulerProcess, TestDb,
};
use tonic::transport::Channel;

#[tokio::test]
async fn a_task_is_sent_and_succeeds() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let executor = ExecutorProcess::builder(&[scheduler.grpc_url()])
        .spawn()
        .await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;

    let created = create_task(
        &mut tasks,
        task_spec("default", &unique_id("recipient"), "hello"),
    )
    .await?;
    let done = wait_for_task_state(
        &mut tasks,
        &created.id,
        TaskState::Succeeded,
        Duration::from_secs(30),
    )
    .await?;
    assert_eq!(done.attempts, 1);
    assert!(done.finished_at.is_some());
    // It holds a lease session, so it is ready.
    let ready = reqwest::get(format!("{}/readyz", executor.http_url())).await?;
    assert_eq!(ready.status(), reqwest::StatusCode::OK);
    // The defaults leave a running send time to finish within the shutdown grace.
    assert!(
        !executor.stderr_all().contains(GRACE_WARNING),
        "{}",
        executor.stderr_tail()
    );
    Ok(())
}

/// An executor that cannot reach any scheduler (a wrong address, token or CA after an upgrade)
/// answers its liveness probe but not its readiness probe, so a rollout stops at its first pod.
#[tokio::test]
async fn an_executor_without_a_lease_session_is_not_ready() -> Result<()> {
    // Nothing listens on port 1.
    let executor = ExecutorProcess::builder(&["http://127.0.0.1:1".to_owned()])
        .spawn()
        .await?;
    let live = reqwest::get(format!("{}/healthz", executor.http_url())).await?;
    assert_eq!(live.status(), reqwest::StatusCode::OK);
    let ready = reqwest::get(format!("{}/readyz", executor.http_url())).await?;
    assert_eq!(ready.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    Ok(())
}

const GRACE_WARNING: &str = "HERALD_SHUTDOWN_GRACE is shorter than the longest send timeout";

/// An executor whose shutdown grace is shorter than one of its send timeouts says so at start:
/// a send still running when the grace ends would go unreported and be sent again once its
/// lease lapsed.
#[tokio::test]
async fn a_shutdown_grace_shorter_than_a_send_timeout_is_warned_of() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let executor = ExecutorProcess::builder(&[scheduler.grpc_url()])
        .config_toml(
            "[default]\nsender = \"log\"\n\n[queues.slow]\nsender = \"log\"\ntimeout = \"2m\"\n",
        )
        .spawn()
        .await?;
    herald_tests::until("the warning about the shutdown grace", || async {
        Ok(executor.stderr_all().contains(GRACE_WARNING))
    })
    .await?;
    let stderr = executor.stderr_all();
    let line = stderr
        .lines()
        .find(|l| l.contains(GRACE_WARNING))
        .context("the warning line")?;
    // Without the terminal colours around the field's name.
    let mut warning = String::new();
    let mut in_escape = false;
    for c in line.chars() {
        match (in_escape, c) {
            (false, '\u{1b}') => in_escape = true,
            (true, 'm') => in_escape = false,
            (false, c) => warning.push(c),
            (true, _) => {}
        }
    }
    assert!(
        warning.contains("longest_send=2m"),
        "names the longest timeout: {warning}"
    );
    Ok(())
}

/// An account created through AccountService is sent for by an executor running
/// script/server's own config file (`[accounts."*"]`, the log sender), as the README's
/// walkthrough expects: the task ends SUCCEEDED through that account instead of waiting behind
/// an account gone OFFLINE for lack of credentials.
#[tokio::test]
async fn script_servers_executor_sends_for_accounts_created_through_the_api() -> Result<()> {
    let config = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../script/lib/server-executor.toml")
        .canonicalize()?;
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let _executor = ExecutorProcess::builder(&[scheduler.grpc_url()])
        .env("HERALD_EXECUTOR_CONFIG", &config)
        .spawn()
        .await?;
    let channel = Channel::from_shared(scheduler.grpc_url())?
        .connect()
        .await?;
    let account = AccountServiceClient::new(channel)
        .create_account(CreateAccountRequest {
            account: Some(whatsapp_account("wa-1", "wa", 10.0)),
        })
        .await?
        .into_inner();
    assert_eq!(account.credentials_ref, "wa-1");

    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let created = create_task(
        &mut tasks,
        TaskSpec {
            pool: "wa".into(),
            ..task_spec("orders", &unique_id("recipient"), "hello")
        },
    )
    .await?;
    let done = wait_for_task_state(
        &mut tasks,
        &created.id,
        TaskState::Succeeded,
        Duration::from_secs(30),
    )
    .await?;
    assert_eq!(done.account_id, "wa-1");
    assert_eq!(done.attempts, 1);
    Ok(())
}

/// Both services run without transparent huge pages: with them, every page mimalloc touched
/// afresh made the kernel zero 2 MiB, a quarter of the executor's CPU in a drain
/// (process/src/memory.rs). The kernel reports the process's setting in its status file.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn the_services_run_without_transparent_huge_pages() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let executor = ExecutorProcess::builder(&[scheduler.grpc_url()])
        .spawn()
        .await?;
    for (name, pid) in [("scheduler", scheduler.pid()), ("executor", executor.pid())] {
        let pid = pid.with_context(|| format!("the {name} has no pid"))?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let thp = status
            .lines()
            .find_map(|l| l.strip_prefix("THP_enabled:"))
            .with_context(|| format!("no THP_enabled line in the {name}'s status"))?;
        assert_eq!(
            thp.trim(),
            "0",
            "the {name} runs with transparent huge pages"
        );
    }
    Ok(())
}
