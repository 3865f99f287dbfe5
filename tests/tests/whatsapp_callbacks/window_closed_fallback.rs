//! The window-closed fallback: a template sent in place of a message the closed 24-hour window
//! refused, at once or after a late failure, once.

use super::*;

/// The approved template a task falls back to when the 24-hour window is closed.
fn window_reopen() -> TemplateContent {
    TemplateContent {
        template_id: "window_reopen".into(),
        language: "en_US".into(),
        variables: [("1".to_owned(), "Ada".to_owned())].into(),
        ..Default::default()
    }
}

impl Stack {
    /// Creates a text task to `recipient` through the pool with the window-closed fallback
    /// [`window_reopen`]; returns its id.
    async fn create_with_fallback(&mut self, recipient: &str) -> Result<String> {
        Ok(self
            .tasks
            .create_task(CreateTaskRequest {
                task: Some(TaskSpec {
                    pool: "wa".into(),
                    window_closed_fallback: Some(window_reopen()),
                    ..task_spec("orders", recipient, "Your order has shipped")
                }),
            })
            .await?
            .into_inner()
            .task
            .context("task")?
            .id)
    }

    async fn attempts(&mut self, id: &str) -> Result<Vec<Attempt>> {
        Ok(self
            .tasks
            .list_attempts(ListAttemptsRequest { task_id: id.into() })
            .await?
            .into_inner()
            .attempts)
    }
}

/// The messages the fake accepted for `recipient`, as (type, template name, callback data).
fn accepted_to(fake: &FakeWhatsApp, recipient: &str) -> Vec<(String, String, String)> {
    fake.requests()
        .iter()
        .filter(|r| r.body["to"] == recipient && r.status == 200)
        .map(|r| {
            let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
            (
                text(&r.body["type"]),
                text(&r.body["template"]["name"]),
                text(&r.body["biz_opaque_callback_data"]),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_send_refused_because_the_window_closed_sends_the_fallback_template_in_the_same_attempt(
) -> Result<()> {
    let mut stack = Stack::start().await?;
    let recipient = "16505550061";
    // The text is refused as Meta does outside the customer-service window; the template that
    // follows is accepted.
    stack.fake.respond_next(Scripted::Code(131047));
    let id = stack.create_with_fallback(recipient).await?;
    let task = wait_for_task_state(&mut stack.tasks, &id, TaskState::Succeeded, WAIT).await?;

    let tried: Vec<(String, u16)> = stack
        .fake
        .requests()
        .iter()
        .filter(|r| r.body["to"] == recipient)
        .map(|r| {
            (
                r.body["type"].as_str().unwrap_or_default().to_owned(),
                r.status,
            )
        })
        .collect();
    assert_eq!(
        tried,
        vec![("text".to_owned(), 400), ("template".to_owned(), 200)]
    );
    assert_eq!(
        accepted_to(&stack.fake, recipient),
        vec![(
            "template".to_owned(),
            "window_reopen".to_owned(),
            format!("{id}/1")
        )]
    );
    // One attempt, which says the fallback went and why.
    let attempts = stack.attempts(&id).await?;
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    let attempt = &attempts[0];
    assert_eq!(attempt.outcome(), OutcomeClass::Ok);
    assert!(attempt.window_closed_fallback);
    assert!(attempt.error.contains("131047"), "{}", attempt.error);
    assert_eq!(
        Some(attempt.provider_message_id.as_str()),
        task.delivery
            .as_ref()
            .map(|d| d.provider_message_id.as_str())
    );
    assert_eq!(task.end_reason(), EndReason::Sent);
    assert!(task.window_closed_fallback_at.is_some());
    assert_eq!(task.window_closed_fallback, Some(window_reopen()));
    assert_eq!(task.replaced_delivery, None);
    Ok(())
}

#[tokio::test]
async fn a_late_window_closed_failure_sends_the_fallback_once_and_repeats_change_nothing(
) -> Result<()> {
    let mut stack = Stack::start().await?;
    let recipient = "16505550062";
    use Callback::*;
    // The text is accepted, then fails with 131047; the template sent after it is delivered.
    stack
        .fake
        .plan_callbacks_once(recipient, CallbackPlan::after(&[Sent, Failed(131047)]));
    stack
        .fake
        .plan_callbacks(recipient, CallbackPlan::after(&[Sent, Delivered]));
    let id = stack.create_with_fallback(recipient).await?;
    let task = stack
        .wait_task(&id, |t| {
            t.state() == TaskState::Succeeded && state(t) == DeliveryState::Delivered
        })
        .await?;

    // The first message and exactly one template, sent by the task's second lease.
    let accepted = accepted_to(&stack.fake, recipient);
    assert_eq!(accepted.len(), 2, "{accepted:?}");
    assert_eq!(accepted[0].0, "text");
    assert_eq!(
        accepted[1],
        (
            "template".to_owned(),
            "window_reopen".to_owned(),
            format!("{id}/2")
        )
    );
    // The first message's reports stay visible beside the template's delivery.
    let first = task
        .replaced_delivery
        .clone()
        .context("replaced delivery")?;
    assert_eq!(first.state(), DeliveryState::FailedAfterAcceptance);
    assert_eq!(first.error_code, 131047);
    let delivery = task.delivery.clone().context("delivery")?;
    assert_ne!(delivery.provider_message_id, first.provider_message_id);
    assert_eq!(task.end_reason(), EndReason::Sent);
    assert!(task.window_closed_fallback_at.is_some());
    let attempts = stack.attempts(&id).await?;
    assert_eq!(
        attempts.iter().map(Attempt::outcome).collect::<Vec<_>>(),
        vec![OutcomeClass::Ok, OutcomeClass::Ok]
    );

    // Meta repeats the first message's failure, and reports it again as if from a crashed
    // attempt: each webhook is answered only once recorded, so the task as read right after
    // is what it did. No third message, and the task stays as it was.
    for data in [format!("{id}/1"), format!("{id}/3")] {
        let late = status_value(
            PHONE_ID,
            &first.provider_message_id,
            Failed(131047),
            recipient,
            Some(&data),
        );
        let body = webhook_body(WABA, "messages", late);
        assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    }
    // A report the first message never had before (read, late) does not touch the template's
    // delivery either.
    let read = status_value(
        PHONE_ID,
        &first.provider_message_id,
        Read,
        recipient,
        Some(&format!("{id}/1")),
    );
    let body = webhook_body(WABA, "messages", read);
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    let after = stack.task(&id).await?;
    assert_eq!(after.state(), TaskState::Succeeded);
    assert_eq!(after.lease_count, 2);
    assert_eq!(
        after.window_closed_fallback_at,
        task.window_closed_fallback_at
    );
    assert_eq!(state(&after), DeliveryState::Delivered);
    assert_eq!(accepted_to(&stack.fake, recipient).len(), 2);
    Ok(())
}

#[tokio::test]
async fn a_failure_of_the_fallback_itself_ends_the_task_failed() -> Result<()> {
    let mut stack = Stack::start().await?;
    let recipient = "16505550063";
    // Every message to this recipient fails with 131047 after acceptance: the text, then the
    // template (which Meta would not do for an approved template, but herald must not loop).
    stack.fake.plan_callbacks(
        recipient,
        CallbackPlan::after(&[Callback::Sent, Callback::Failed(131047)]),
    );
    let id = stack.create_with_fallback(recipient).await?;
    let task = stack
        .wait_task(&id, |t| t.state() == TaskState::Failed)
        .await?;
    assert_eq!(
        (task.end_reason(), task.end_code),
        (EndReason::FailedAfterAcceptance, 131047)
    );
    let templates = accepted_to(&stack.fake, recipient)
        .into_iter()
        .filter(|m| m.0 == "template")
        .count();
    assert_eq!(templates, 1);
    assert_eq!(task.lease_count, 2);
    assert_eq!(state(&task), DeliveryState::FailedAfterAcceptance);
    Ok(())
}

#[tokio::test]
async fn a_retried_task_whose_new_message_finds_the_window_closed_sends_its_fallback() -> Result<()>
{
    let mut stack = Stack::start().await?;
    let recipient = "16505550064";
    use Callback::*;
    // The text fails late for another reason (131051, unsupported message type): no fallback
    // for that.
    stack
        .fake
        .plan_callbacks_once(recipient, CallbackPlan::after(&[Sent, Failed(131051)]));
    // Sent again, it fails with 131047 (the window closed meanwhile); the template arrives.
    stack
        .fake
        .plan_callbacks_once(recipient, CallbackPlan::after(&[Sent, Failed(131047)]));
    stack
        .fake
        .plan_callbacks(recipient, CallbackPlan::after(&[Sent, Delivered]));
    let id = stack.create_with_fallback(recipient).await?;
    let failed = stack
        .wait_task(&id, |t| t.state() == TaskState::Failed)
        .await?;
    assert_eq!(failed.end_code, 131051);
    stack
        .tasks
        .retry_task(RetryTaskRequest {
            id: id.clone(),
            ..Default::default()
        })
        .await?;
    // The first message's older failure must not stand for the new one's: the fallback goes.
    let task = stack
        .wait_task(&id, |t| {
            t.state() == TaskState::Succeeded && state(t) == DeliveryState::Delivered
        })
        .await?;
    let sent: Vec<String> = accepted_to(&stack.fake, recipient)
        .into_iter()
        .map(|m| m.0)
        .collect();
    assert_eq!(sent, ["text", "text", "template"]);
    assert!(task.window_closed_fallback_at.is_some());
    let replaced = task.replaced_delivery.context("replaced delivery")?;
    assert_eq!(replaced.error_code, 131047);
    assert_eq!(task.lease_count, 3);
    Ok(())
}

#[tokio::test]
async fn a_bad_window_closed_fallback_is_invalid_argument_naming_the_field_and_creates_nothing(
) -> Result<()> {
    let mut stack = Stack::start().await?;
    let mut wecom = whatsapp_account("wc-1", "wc", 100.0);
    wecom.sender_kind = "wecom".into();
    stack
        .accounts
        .create_account(CreateAccountRequest {
            account: Some(wecom),
        })
        .await?;
    let spec = |pool: &str, fallback: TemplateContent| TaskSpec {
        pool: pool.into(),
        window_closed_fallback: Some(fallback),
        ..task_spec("orders", "16505550064", "hello")
    };
    let cases = [
        // WeCom has no 24-hour window and cannot send a WhatsApp template.
        (spec("wc", window_reopen()), "task.window_closed_fallback"),
        // Sent by queue: the scheduler cannot tell the channel.
        (
            TaskSpec {
                pool: String::new(),
                ..spec("wa", window_reopen())
            },
            "task.window_closed_fallback",
        ),
        (
            spec(
                "wa",
                TemplateContent {
                    template_id: String::new(),
                    ..window_reopen()
                },
            ),
            "task.window_closed_fallback.template_id",
        ),
        (
            spec(
                "wa",
                TemplateContent {
                    language: String::new(),
                    ..window_reopen()
                },
            ),
            "task.window_closed_fallback.language",
        ),
    ];
    for (spec, field) in cases {
        let status = stack
            .tasks
            .create_task(CreateTaskRequest { task: Some(spec) })
            .await
            .err()
            .with_context(|| format!("{field}: accepted"))?;
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        let fields: Vec<String> = status
            .get_details_bad_request()
            .context("bad request details")?
            .field_violations
            .into_iter()
            .map(|v| v.field)
            .collect();
        assert_eq!(fields, [field]);
    }
    let listed = stack
        .tasks
        .list_tasks(ListTasksRequest::default())
        .await?
        .into_inner()
        .tasks;
    assert!(listed.is_empty(), "a refused task was written: {listed:?}");
    Ok(())
}

#[tokio::test]
async fn a_stored_templates_fallback_goes_with_the_tasks_that_name_it_and_can_send_it() -> Result<()>
{
    let mut stack = Stack::start().await?;
    let mut wecom = whatsapp_account("wc-1", "wc", 100.0);
    wecom.sender_kind = "wecom".into();
    stack
        .accounts
        .create_account(CreateAccountRequest {
            account: Some(wecom),
        })
        .await?;
    let mut templates = TemplateServiceClient::connect(stack.scheduler.grpc_url()).await?;
    templates
        .create_template(CreateTemplateRequest {
            template: Some(Template {
                id: "shipped".into(),
                kind: Some(template::Kind::Text(TextTemplate {
                    body: "Order {{ order }} has shipped".into(),
                })),
                window_closed_fallback: Some(window_reopen()),
                ..Default::default()
            }),
        })
        .await?;
    // A malformed fallback is refused when the template is stored.
    let status = templates
        .create_template(CreateTemplateRequest {
            template: Some(Template {
                id: "broken".into(),
                kind: Some(template::Kind::Text(TextTemplate {
                    body: "Hello".into(),
                })),
                window_closed_fallback: Some(TemplateContent {
                    language: String::new(),
                    ..window_reopen()
                }),
                ..Default::default()
            }),
        })
        .await
        .err()
        .context("a fallback without a language was stored")?;
    let fields: Vec<String> = status
        .get_details_bad_request()
        .context("bad request details")?
        .field_violations
        .into_iter()
        .map(|v| v.field)
        .collect();
    assert_eq!(fields, ["template.window_closed_fallback.language"]);

    let named = |pool: &str, recipient: &str| TaskSpec {
        pool: pool.into(),
        content: Some(Content {
            body: Some(content::Body::Template(TemplateContent {
                template_id: "shipped".into(),
                variables: [("order".to_owned(), "A-1001".to_owned())].into(),
                ..Default::default()
            })),
            ..Default::default()
        }),
        ..task_spec("orders", recipient, "unused")
    };
    // Through WhatsApp: the task takes the template's fallback, and the refused text is
    // followed by it.
    let recipient = "16505550065";
    stack.fake.respond_next(Scripted::Code(131047));
    let id = stack
        .tasks
        .create_task(CreateTaskRequest {
            task: Some(named("wa", recipient)),
        })
        .await?
        .into_inner()
        .task
        .context("task")?
        .id;
    let task = wait_for_task_state(&mut stack.tasks, &id, TaskState::Succeeded, WAIT).await?;
    assert_eq!(task.window_closed_fallback, Some(window_reopen()));
    assert!(task.window_closed_fallback_at.is_some());
    assert_eq!(
        accepted_to(&stack.fake, recipient),
        vec![(
            "template".to_owned(),
            "window_reopen".to_owned(),
            format!("{id}/1")
        )]
    );
    // Through WeCom, which cannot send it: the task is created, without a fallback.
    let other = stack
        .tasks
        .create_task(CreateTaskRequest {
            task: Some(named("wc", "alice")),
        })
        .await?
        .into_inner()
        .task
        .context("task")?;
    assert_eq!(other.window_closed_fallback, None);
    Ok(())
}
