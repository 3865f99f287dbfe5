//! A template Meta paused for its quality: the sends that meet the pause wait for it to end.

use super::*;

/// 132015 at send time: the task is not ended FAILED (the rest of a campaign would all fail
/// with it) but tried again three hours later, when a first pause is over.
#[tokio::test]
async fn a_send_refused_because_its_template_is_paused_waits_hours_for_it() -> Result<()> {
    let mut stack = Stack::start().await?;
    stack.fake.respond_next(Scripted::Code(132015));
    let id = stack.create("16505550061").await?;
    let task = stack.wait_task(&id, |t| t.attempts == 1).await?;
    assert_eq!(task.state(), TaskState::Scheduled, "{task:?}");
    let due_in = task.run_at.context("run_at")?.seconds - chrono::Utc::now().timestamp();
    assert!(
        due_in > 3 * 3600 - 600,
        "due again in {due_in} s, before the pause could be over"
    );
    assert!(task.last_error.contains("132015"), "{}", task.last_error);
    Ok(())
}
