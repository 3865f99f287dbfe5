//! The whole stack on real binaries: a task created on the scheduler is leased by an executor,
//! sent with the log sender and ends SUCCEEDED.

use std::time::Duration;

use anyhow::Result;
use herald_proto::v1::TaskState;
use herald_tests::{
    connect_tasks, create_task, task_spec, unique_id, wait_for_task_state, ExecutorProcess,
    SchedulerProcess, TestDb,
};

#[tokio::test]
async fn a_task_is_sent_and_succeeds() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let _executor = ExecutorProcess::builder(&[scheduler.grpc_url()])
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
    Ok(())
}
