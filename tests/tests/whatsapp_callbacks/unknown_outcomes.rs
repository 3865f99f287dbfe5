//! A send whose outcome the executor never reported: a status callback settles it, else it is
//! sent again after the grace.

use super::*;

/// Waits until the fake has recorded a message to `recipient`.
async fn wait_for_request(fake: &FakeWhatsApp, recipient: &str) -> Result<()> {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !fake.requests().iter().any(|r| r.body["to"] == recipient) {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "no message to {recipient} reached the fake"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// A stack whose leases last 2 s and whose WhatsApp sends wait `grace` for a status callback,
/// with a task to `recipient` whose message Meta has received and not yet answered.
async fn sent_unanswered(recipient: &str, grace: &str) -> Result<(Stack, String)> {
    let mut stack = Stack::start_with(|b| {
        b.env("HERALD_LEASE_TTL", "2s")
            .env("HERALD_UNKNOWN_OUTCOME_GRACE", grace)
    })
    .await?;
    stack.fake.hold_answers();
    let id = stack.create(recipient).await?;
    wait_for_request(&stack.fake, recipient).await?;
    Ok((stack, id))
}

/// Messages the fake accepted for `recipient`.
fn messages_to(fake: &FakeWhatsApp, recipient: &str) -> usize {
    fake.requests()
        .iter()
        .filter(|r| r.body["to"] == recipient && r.status == 200)
        .count()
}

/// Waits until the task's first attempt is charged and it is due again only after the grace
/// (an hour in these tests), waiting for a status callback.
async fn waiting_for_a_callback(stack: &mut Stack, id: &str) -> Result<Task> {
    let waiting = stack
        .wait_task(id, |t| t.state() == TaskState::Scheduled && t.attempts == 1)
        .await?;
    let due_in = waiting.run_at.context("run_at")?.seconds - chrono::Utc::now().timestamp();
    ensure!(
        due_in > 3000,
        "due again in {due_in} s, not after the grace"
    );
    Ok(waiting)
}

/// Posts Meta's `sent` for the waiting task's first message; waits until that ends the task
/// SUCCEEDED, SENT, with that message as its delivery.
async fn settled_by_its_callback(stack: &mut Stack, waiting: &Task) -> Result<Task> {
    let wamid = "wamid.fake00000001";
    let body = webhook_body(WABA, "messages", status_of(waiting, wamid, Callback::Sent));
    ensure!(
        stack.fake.post_webhook(&body).await? == 200,
        "webhook refused"
    );
    let task = stack
        .wait_task(&waiting.id, |t| t.state() == TaskState::Succeeded)
        .await?;
    ensure!(task.end_reason() == EndReason::Sent, "ended {task:?}");
    let delivery = task.delivery.clone().context("delivery")?;
    ensure!(
        (delivery.state(), delivery.provider_message_id.as_str())
            == (DeliveryState::Accepted, wamid),
        "delivery {delivery:?}"
    );
    Ok(task)
}

#[tokio::test]
async fn an_executor_killed_after_meta_accepted_sends_once_a_callback_settles_it() -> Result<()> {
    // Short leases, so the kill is noticed quickly; a long grace, so only a callback (not the
    // clock) can settle the task before the test ends. Meta accepts the message, but the
    // executor never hears back: it is killed while waiting.
    let recipient = "16505550051";
    let (mut stack, id) = sent_unanswered(recipient, "1h").await?;
    stack.executor.kill()?;
    stack.executor.wait().await?;

    // The lease runs out unreported: the attempt is charged and the task waits for a callback
    // (due again only after the grace), instead of being leased again at once.
    let waiting = waiting_for_a_callback(&mut stack, &id).await?;

    // A new executor takes over the webhook; Meta's `sent` status names the task.
    stack.executor = executor(&stack.scheduler.grpc_url(), &stack.fake).await?;
    stack
        .fake
        .send_callbacks_to(&webhook_url(&stack.executor)?, APP_SECRET);
    settled_by_its_callback(&mut stack, &waiting).await?;
    stack.fake.release_answers();
    assert_eq!(messages_to(&stack.fake, recipient), 1, "sent twice");
    Ok(())
}

#[tokio::test]
async fn without_a_callback_the_task_is_sent_again_after_the_grace() -> Result<()> {
    let recipient = "16505550052";
    let (mut stack, id) = sent_unanswered(recipient, "1s").await?;
    stack.executor.kill()?;
    stack.executor.wait().await?;
    stack.fake.release_answers();
    // Nothing says the first send went out: after the grace a new executor sends it again.
    stack.executor = executor(&stack.scheduler.grpc_url(), &stack.fake).await?;
    let task = stack
        .wait_task(&id, |t| t.state() == TaskState::Succeeded)
        .await?;
    assert_eq!(task.lease_count, 2);
    assert_eq!(messages_to(&stack.fake, recipient), 2);
    Ok(())
}

/// A send settled by its callback after its lease lapsed, then failed late with a code worth
/// retrying, is sent once more; the new message's success is final. The lapsed attempt had no
/// message id of its own, so its message's failure was taken for every later send's and the
/// task was retried at each report until its attempts ran out.
#[tokio::test]
async fn a_callback_settled_send_that_fails_late_is_retried_once_and_its_retry_stands() -> Result<()>
{
    let recipient = "16505550053";
    let (mut stack, id) = sent_unanswered(recipient, "1h").await?;
    stack.executor.kill()?;
    stack.executor.wait().await?;
    let waiting = stack
        .wait_task(&id, |t| {
            t.state() == TaskState::Scheduled && t.attempts == 1
        })
        .await?;
    stack.fake.release_answers();
    stack.executor = executor(&stack.scheduler.grpc_url(), &stack.fake).await?;
    stack
        .fake
        .send_callbacks_to(&webhook_url(&stack.executor)?, APP_SECRET);
    let first = "wamid.fake00000001";
    let sent = webhook_body(WABA, "messages", status_of(&waiting, first, Callback::Sent));
    assert_eq!(stack.fake.post_webhook(&sent).await?, 200);
    stack
        .wait_task(&id, |t| t.state() == TaskState::Succeeded)
        .await?;
    // Meta then fails the first message with a temporary error; the retry is delivered.
    stack.fake.plan_callbacks(
        recipient,
        CallbackPlan::after(&[Callback::Sent, Callback::Delivered]),
    );
    let failed = webhook_body(
        WABA,
        "messages",
        status_of(&waiting, first, Callback::Failed(131000)),
    );
    assert_eq!(stack.fake.post_webhook(&failed).await?, 200);
    let task = stack
        .wait_task(&id, |t| {
            t.state() == TaskState::Succeeded
                && t.delivery
                    .as_ref()
                    .is_some_and(|d| d.provider_message_id != first)
                && state(t) == DeliveryState::Delivered
        })
        .await?;
    assert_eq!(task.attempts, 2, "{task:?}");
    assert_eq!(
        messages_to(&stack.fake, recipient),
        2,
        "sent more than once again"
    );
    Ok(())
}

/// Meta accepts a message and reports it failed while the executor still holds the lease; the
/// executor then dies without reporting. The sweep sees the status and counts the message as
/// sent, but a failure must still be settled as one: no report will ever come to do it. Before,
/// the task stayed SUCCEEDED with its delivery FAILED_AFTER_ACCEPTANCE.
#[tokio::test]
async fn a_failure_reported_before_the_executor_died_is_settled_by_the_sweep() -> Result<()> {
    let recipient = "16505550054";
    let (mut stack, id) = sent_unanswered(recipient, "1h").await?;
    let leased = stack.task(&id).await?;
    let failed = status_of(&leased, "wamid.fake00000001", Callback::Failed(131026));
    let body = webhook_body(WABA, "messages", failed);
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    stack.executor.kill()?;
    stack.executor.wait().await?;
    let ended = stack
        .wait_task(&id, |t| t.state() != TaskState::Leased)
        .await?;
    assert_eq!(ended.state(), TaskState::Failed, "{ended:?}");
    assert_eq!(ended.end_reason(), EndReason::FailedAfterAcceptance);
    assert_eq!(ended.end_code, 131026);
    stack.fake.release_answers();
    Ok(())
}

/// A stack whose WhatsApp sends time out after a second and wait an hour for a callback, with
/// a task to `recipient` whose posts Meta accepts and never answers.
async fn timing_out(recipient: &str) -> Result<(Stack, String)> {
    let mut stack = Stack::start_configured(
        |b| b.env("HERALD_UNKNOWN_OUTCOME_GRACE", "1h"),
        "timeout = \"1s\"",
    )
    .await?;
    stack.fake.hold_answers();
    let id = stack.create(recipient).await?;
    Ok((stack, id))
}

/// A send whose answer never came within the route's timeout may have been accepted: the task
/// waits the grace for a status callback instead of being sent again after its retry delay,
/// and the callback ends it SUCCEEDED with the one message. Before, the timeout was an ordinary
/// TRANSIENT failure and the customer got the message twice.
#[tokio::test]
async fn a_send_whose_answer_timed_out_waits_for_its_callback_and_goes_once() -> Result<()> {
    let recipient = "16505550054";
    let (mut stack, id) = timing_out(recipient).await?;
    wait_for_request(&stack.fake, recipient).await?;

    // The route's timeout ends the send; its report says the outcome is unknown.
    let waiting = waiting_for_a_callback(&mut stack, &id).await?;
    let attempts = stack
        .tasks
        .list_attempts(ListAttemptsRequest {
            task_id: id.clone(),
        })
        .await?
        .into_inner()
        .attempts;
    assert_eq!(
        attempts.iter().map(Attempt::outcome).collect::<Vec<_>>(),
        [OutcomeClass::Transient]
    );

    settled_by_its_callback(&mut stack, &waiting).await?;
    stack.fake.release_answers();
    assert_eq!(messages_to(&stack.fake, recipient), 1, "sent twice");
    Ok(())
}

/// A last attempt whose answer timed out ends the task FAILED (exhausted) at once, but its
/// message may have gone out: a status callback that comes later proves it did, and ends the
/// task SUCCEEDED instead of leaving a delivered message among the failures.
#[tokio::test]
async fn a_last_attempt_whose_answer_timed_out_ends_sent_when_its_callback_comes_later(
) -> Result<()> {
    let recipient = "16505550059";
    let mut stack = Stack::start_configured(
        |b| b.env("HERALD_UNKNOWN_OUTCOME_GRACE", "1h"),
        "timeout = \"1s\"",
    )
    .await?;
    stack.fake.hold_answers();
    let spec = TaskSpec {
        pool: "wa".into(),
        max_attempts: Some(1),
        ..task_spec("orders", recipient, "Your order has shipped")
    };
    let id = create_task(&mut stack.tasks, spec).await?.id;
    let failed = stack
        .wait_task(&id, |t| t.state() == TaskState::Failed)
        .await?;
    assert_eq!(failed.end_reason(), EndReason::Exhausted);
    settled_by_its_callback(&mut stack, &failed).await?;
    stack.fake.release_answers();
    assert_eq!(messages_to(&stack.fake, recipient), 1, "sent twice");
    Ok(())
}

/// The status callback can come before the executor learns that its answer is lost: the report
/// of unknown outcome then ends the task SUCCEEDED at once, and its attempt keeps the message.
#[tokio::test]
async fn a_lost_answer_whose_callback_came_first_ends_the_task_sent() -> Result<()> {
    let recipient = "16505550055";
    let mut stack = Stack::start_with(|b| b.env("HERALD_UNKNOWN_OUTCOME_GRACE", "1h")).await?;
    stack.fake.plan_callbacks(
        recipient,
        CallbackPlan {
            before_response: true,
            ..CallbackPlan::after(&[Callback::Sent])
        },
    );
    stack.fake.lose_answers();
    let id = stack.create(recipient).await?;
    let task = stack
        .wait_task(&id, |t| t.state() != TaskState::Leased && t.attempts == 1)
        .await?;
    assert_eq!(
        (task.state(), task.end_reason(), task.lease_count),
        (TaskState::Succeeded, EndReason::Sent, 1)
    );
    let wamid = stack.wamid(&task)?;
    let attempts = stack
        .tasks
        .list_attempts(ListAttemptsRequest {
            task_id: id.clone(),
        })
        .await?
        .into_inner()
        .attempts;
    assert_eq!(
        attempts
            .iter()
            .map(|a| (a.outcome(), a.provider_message_id.as_str()))
            .collect::<Vec<_>>(),
        [(OutcomeClass::Transient, wamid.as_str())]
    );
    assert_eq!(messages_to(&stack.fake, recipient), 1, "sent twice");
    Ok(())
}

/// A message of a lapsed attempt that the grace gave up on, sent again by the next attempt: a
/// late failure of the first message, named by its callback data as attempt 1's, is not the
/// second message's. Before, the lapsed attempt's row knew no message, so the first message's
/// reports counted as the current send's and its failure ended the delivered task FAILED.
#[tokio::test]
async fn a_late_failure_of_a_lapsed_attempts_message_does_not_touch_the_next_send() -> Result<()> {
    let recipient = "16505550056";
    let (mut stack, id) = sent_unanswered(recipient, "1s").await?;
    stack.executor.kill()?;
    stack.executor.wait().await?;
    stack.fake.release_answers();
    stack.executor = executor(&stack.scheduler.grpc_url(), &stack.fake).await?;
    stack
        .fake
        .send_callbacks_to(&webhook_url(&stack.executor)?, APP_SECRET);
    let sent = stack
        .wait_task(&id, |t| t.state() == TaskState::Succeeded)
        .await?;
    assert_eq!(sent.lease_count, 2);
    let second = stack.wamid(&sent)?;
    assert_ne!(second, "wamid.fake00000001");

    // Meta fails the first message, for good, long after the second went out.
    let failed = webhook_body(
        WABA,
        "messages",
        status_of(&sent, "wamid.fake00000001", Callback::Failed(131026)),
    );
    assert_eq!(stack.fake.post_webhook(&failed).await?, 200);
    let delivered = webhook_body(
        WABA,
        "messages",
        status_value(
            PHONE_ID,
            &second,
            Callback::Delivered,
            recipient,
            Some(&format!("{id}/2")),
        ),
    );
    assert_eq!(stack.fake.post_webhook(&delivered).await?, 200);
    let task = stack
        .wait_task(&id, |t| {
            t.delivery
                .as_ref()
                .is_some_and(|d| d.state() != DeliveryState::Accepted)
        })
        .await?;
    assert_eq!(
        (
            task.state(),
            task.delivery.as_ref().map(|d| d.state()),
            stack.wamid(&task)?
        ),
        (TaskState::Succeeded, Some(DeliveryState::Delivered), second)
    );
    Ok(())
}

/// A stack whose WhatsApp sends wait an hour for a callback, with a task to `recipient`
/// created with `max_attempts` whose first post Meta accepts, reporting `statuses` for it
/// before the executor learns its answer is lost.
async fn lost_after_callbacks(
    recipient: &str,
    statuses: &[Callback],
    max_attempts: Option<i32>,
) -> Result<(Stack, String)> {
    let mut stack = Stack::start_with(|b| b.env("HERALD_UNKNOWN_OUTCOME_GRACE", "1h")).await?;
    stack.fake.plan_callbacks_once(
        recipient,
        CallbackPlan {
            before_response: true,
            ..CallbackPlan::after(statuses)
        },
    );
    stack.fake.lose_answers();
    let spec = TaskSpec {
        pool: "wa".into(),
        max_attempts,
        ..task_spec("orders", recipient, "Your order has shipped")
    };
    let id = create_task(&mut stack.tasks, spec).await?.id;
    Ok((stack, id))
}

/// A callback that reported the lost send failed is settled as a late failure is, by its code:
/// 131026 (not a WhatsApp user) ends the task FAILED, not sent again. Before, the report left
/// the task to a plain retry, and the failure was then taken for the retry's message.
#[tokio::test]
async fn a_lost_answer_whose_callback_came_first_with_a_failure_is_settled_by_its_code(
) -> Result<()> {
    let recipient = "16505550057";
    let (mut stack, id) =
        lost_after_callbacks(recipient, &[Callback::Sent, Callback::Failed(131026)], None).await?;
    let task = stack
        .wait_task(&id, |t| t.state() != TaskState::Leased && t.attempts == 1)
        .await?;
    assert_eq!(
        (
            task.state(),
            task.end_reason(),
            task.end_code,
            task.lease_count
        ),
        (
            TaskState::Failed,
            EndReason::FailedAfterAcceptance,
            131026,
            1
        )
    );
    assert_eq!(messages_to(&stack.fake, recipient), 1, "sent twice");
    Ok(())
}

/// The lost send was the task's last attempt: the report ends it, but the callback that came
/// first proves the message went out, so it ends SUCCEEDED rather than FAILED (exhausted), and
/// no task.failed notification goes out.
#[tokio::test]
async fn a_last_attempt_whose_lost_answer_a_callback_proved_ends_sent() -> Result<()> {
    let recipient = "16505550058";
    let (mut stack, id) = lost_after_callbacks(recipient, &[Callback::Sent], Some(1)).await?;
    // Notifications recorded (none delivers them here): the report ends the task FAILED for a
    // moment inside its transaction, which queued task.failed.
    let sql = stack.db.connect().await?;
    sql.execute(
        "INSERT INTO herald.notify_settings (id, enabled_until)
         VALUES (true, now() + interval '1 hour')",
        &[],
    )
    .await?;
    let task = stack
        .wait_task(&id, |t| t.state() != TaskState::Leased && t.attempts == 1)
        .await?;
    assert_eq!(
        (task.state(), task.end_reason()),
        (TaskState::Succeeded, EndReason::Sent)
    );
    let told: Vec<String> = sql
        .query(
            "SELECT event FROM herald.notifications WHERE payload -> 'data' ->> 'task_id' = $1",
            &[&id],
        )
        .await?
        .iter()
        .map(|r| r.get("event"))
        .collect();
    assert!(
        told.is_empty(),
        "notified of a task that succeeded: {told:?}"
    );
    Ok(())
}

/// A task whose answer was lost twice: the callback for the first message, which comes only
/// while the second send waits for its own, proves the task's message went out, so there is
/// no third send.
#[tokio::test]
async fn a_callback_for_an_earlier_lost_send_settles_a_task_waiting_after_another() -> Result<()> {
    let recipient = "16505550059";
    let (mut stack, id) = timing_out(recipient).await?;
    let first = waiting_for_a_callback(&mut stack, &id).await?;
    // An hour on, the grace is over: the task is sent again, and that answer is lost too.
    stack.advance_clock("61 minutes").await?;
    stack
        .wait_task(&id, |t| {
            t.state() == TaskState::Scheduled && t.attempts == 2
        })
        .await?;
    // Meta's `sent` for the first message arrives only now.
    settled_by_its_callback(&mut stack, &first).await?;
    stack.fake.release_answers();
    assert_eq!(messages_to(&stack.fake, recipient), 2, "sent a third time");
    Ok(())
}

/// As above with a failure worth trying again (131000): the sweep settles it by sending the task
/// once more, and the new message's success stands. Before, the lapsed attempt's row knew no
/// message, so the first message's failure was taken for the second's and the task was sent
/// again at every report until its attempts ran out.
#[tokio::test]
async fn a_retryable_failure_reported_before_the_executor_died_is_retried_once() -> Result<()> {
    let recipient = "16505550060";
    let (mut stack, id) = sent_unanswered(recipient, "1h").await?;
    let leased = stack.task(&id).await?;
    let failed = status_of(&leased, "wamid.fake00000001", Callback::Failed(131000));
    let body = webhook_body(WABA, "messages", failed);
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    stack.executor.kill()?;
    stack.executor.wait().await?;
    stack.fake.release_answers();
    stack.executor = executor(&stack.scheduler.grpc_url(), &stack.fake).await?;
    let task = stack
        .wait_task(&id, |t| {
            t.lease_count == 2 && t.state() != TaskState::Leased
        })
        .await?;
    assert_eq!(
        (task.state(), task.end_reason(), stack.wamid(&task)?),
        (
            TaskState::Succeeded,
            EndReason::Sent,
            "wamid.fake00000002".to_owned()
        )
    );
    Ok(())
}
