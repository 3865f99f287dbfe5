//! Executor presence across replicas: the session a replica recorded keeps counting while it is
//! fresh, and stops counting once the replica died and the record aged past the freshness
//! window (35 s, `lease/presence.rs`), so another replica's console stops saying a task only
//! waits for its next claim.

use anyhow::{ensure, Context, Result};
use herald_tests::lease::ScriptedExecutor;
use herald_tests::{connect_tasks, create_task, task_spec, until, SchedulerProcess, TestDb};

/// The task page of `task` on the console at `base`.
async fn task_page(base: &str, task: &str) -> Result<String> {
    reqwest::get(format!("{base}/console/tasks/{task}?ns=default"))
        .await?
        .error_for_status()?
        .text()
        .await
        .context("reading the task page")
}

/// Polls the task page until it names `hold` (the console reads presence on each request).
async fn until_held_by(base: &str, task: &str, hold: &str) -> Result<()> {
    let marker = format!("data-kind=\"{hold}\"");
    until(&format!("the task page to say {hold:?}"), || async {
        Ok(task_page(base, task).await?.contains(&marker))
    })
    .await
}

#[tokio::test]
async fn a_dead_replicas_session_stops_counting_once_it_is_older_than_the_freshness_window(
) -> Result<()> {
    let db = TestDb::new().await?;
    let mut holder = SchedulerProcess::spawn(&db).await?;
    let console = SchedulerProcess::spawn(&db).await?;
    let base = console.http_url();
    let mut tasks = connect_tasks(&console.grpc_url()).await?;
    let task = create_task(&mut tasks, task_spec("notify", "+15550001", "hello")).await?;
    until_held_by(&base, &task.id, "no executor for its queue").await?;

    // An executor serving the queue connects to the other replica, with no credit: it takes
    // nothing, and the console says the task waits for its next claim.
    let _executor = ScriptedExecutor::connect(&holder.grpc_url(), "exec", &["notify"], 0).await?;
    until_held_by(&base, &task.id, "next claim").await?;

    // That replica dies without ending the session: its record stays, still fresh.
    holder.kill()?;
    holder.wait().await?;
    let page = task_page(&base, &task.id).await?;
    ensure!(
        page.contains("data-kind=\"next claim\""),
        "a fresh record of a dead replica still counts"
    );

    // 36 s later on the database clock, past the 35 s window with no refresh.
    db.connect()
        .await?
        .execute("SELECT herald.set_test_clock(interval '36 seconds')", &[])
        .await?;
    until_held_by(&base, &task.id, "no executor for its queue").await
}
