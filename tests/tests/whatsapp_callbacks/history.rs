//! Reports that come after their task moved into the history (migration V28): the task is
//! brought back, judged and moved out again, as if it had never left.

use super::*;

#[tokio::test]
async fn a_late_failure_for_a_task_in_the_history_ends_it_failed() -> Result<()> {
    let mut stack = Stack::start_with(|b| {
        b.env("HERALD_HISTORY_AFTER", "0s")
            .env("HERALD_RETENTION_INTERVAL", "100ms")
    })
    .await?;
    stack
        .fake
        .plan_callbacks("16505550021", CallbackPlan::after(&[Callback::Sent]));
    let task = stack.send("16505550021").await?;
    let task = stack
        .wait_task(&task.id, |t| {
            t.state() == TaskState::Succeeded && state(t) == DeliveryState::Accepted
        })
        .await?;
    let sql = stack.db.connect().await?;
    herald_tests::until_moved_to_history(&sql, &task.id).await?;
    let wamid = stack.wamid(&task)?;

    let late = status_of(&task, &wamid, Callback::Failed(131026));
    assert_eq!(
        stack
            .fake
            .post_webhook(&webhook_body(WABA, "messages", late))
            .await?,
        200
    );
    let task = stack
        .wait_task(&task.id, |t| t.state() == TaskState::Failed)
        .await?;
    assert_eq!(
        (task.end_reason(), task.end_code),
        (EndReason::FailedAfterAcceptance, 131026)
    );
    assert_eq!(state(&task), DeliveryState::FailedAfterAcceptance);
    // And it leaves again, FAILED.
    herald_tests::until_moved_to_history(&sql, &task.id).await?;
    assert_eq!(stack.task(&task.id).await?.state(), TaskState::Failed);
    Ok(())
}
