//! Replies and refusals that suppress a recipient: an opt-out keyword, and WhatsApp's
//! "message undeliverable".

use super::*;

/// A `messages` webhook value: `from` wrote `text` to the account.
fn reply_from(from: &str, text: &str) -> serde_json::Value {
    json!({"messaging_product": "whatsapp",
           "metadata": {"display_phone_number": "15550783881", "phone_number_id": PHONE_ID},
           "contacts": [{"profile": {"name": "Sheena"}, "wa_id": from}],
           "messages": [{"from": from, "id": format!("wamid.IN-{from}"), "timestamp": chrono::Utc::now().timestamp().to_string(),
                         "type": "text", "text": {"body": text}}]})
}

#[tokio::test]
async fn an_opt_out_reply_suppresses_the_sender_and_its_queued_task_is_never_sent() -> Result<()> {
    let mut stack = Stack::start().await?;
    // Queued for in an hour: one to the recipient who will opt out, one to another.
    let queue = |recipient: &str| TaskSpec {
        pool: "wa".into(),
        when: Some(herald_proto::v1::task_spec::When::Delay(
            prost_types::Duration {
                seconds: 3600,
                nanos: 0,
            },
        )),
        ..task_spec("promo", recipient, "Spring sale")
    };
    let mut ids = Vec::new();
    for recipient in ["16505550031", "16505550032"] {
        let task = stack
            .tasks
            .create_task(CreateTaskRequest {
                task: Some(queue(recipient)),
            })
            .await?
            .into_inner()
            .task
            .context("task")?;
        ids.push(task.id);
    }

    // "Stop" (any case, trimmed) opts out; a sentence that contains the word does not. Meta
    // delivers the first webhook twice (it redelivers what it thinks unanswered): the reply is
    // kept once, by its message id.
    let body = webhook_body(WABA, "messages", reply_from("16505550031", " Stop "));
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    let body = webhook_body(
        WABA,
        "messages",
        reply_from("16505550032", "stop sending at night"),
    );
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);

    let mut suppressions = SuppressionServiceClient::connect(stack.scheduler.grpc_url()).await?;
    let listed = suppressions
        .check_suppressions(CheckSuppressionsRequest {
            recipients: vec!["16505550031".into(), "16505550032".into()],
        })
        .await?
        .into_inner()
        .suppressions;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (listed[0].recipient.as_str(), listed[0].reason()),
        ("16505550031", SuppressionReason::OptOut)
    );
    // Both replies are kept, minimally, once each.
    let replies: Vec<(String, String, Option<String>)> = stack
        .db
        .connect()
        .await?
        .query(
            "SELECT sender, kind, body FROM herald.inbound_messages \
             WHERE credentials_ref = 'wa-1' ORDER BY sender",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get("sender"), r.get("kind"), r.get("body")))
        .collect();
    assert_eq!(
        replies,
        [
            ("16505550031".into(), "text".into(), Some("Stop".into())),
            (
                "16505550032".into(),
                "text".into(),
                Some("stop sending at night".into())
            ),
        ]
    );

    // An hour later both are due: the claim ends the opted-out one instead of sending it.
    stack.advance_clock("61 minutes").await?;
    let sent = stack
        .wait_task(&ids[1], |t| t.state() == TaskState::Succeeded)
        .await?;
    assert_eq!(sent.end_reason(), EndReason::Sent);
    let skipped = stack
        .wait_task(&ids[0], |t| t.state() == TaskState::Cancelled)
        .await?;
    assert_eq!(
        (skipped.end_reason(), skipped.lease_count),
        (EndReason::Suppressed, 0)
    );
    let to_opted_out = stack
        .fake
        .requests()
        .iter()
        .filter(|r| r.body["to"] == "16505550031")
        .count();
    assert_eq!(
        to_opted_out, 0,
        "a message went to the recipient who opted out"
    );

    // A new task to them is created already ended, with the reason.
    let later = stack
        .tasks
        .create_task(CreateTaskRequest {
            task: Some(TaskSpec {
                pool: "wa".into(),
                ..task_spec("promo", "+16505550031", "Last chance")
            }),
        })
        .await?
        .into_inner()
        .task
        .context("task")?;
    assert_eq!(
        (later.state(), later.end_reason()),
        (TaskState::Cancelled, EndReason::Suppressed)
    );
    Ok(())
}

/// One item of a payload outside what the scheduler stores (a timestamp past the year 9999, a
/// sender longer than any number) used to make the scheduler refuse the whole payload, and the
/// executor answer 503 to every one of Meta's redeliveries for seven days: the opt-out beside
/// it was never recorded. The item is skipped or its time dropped; the rest is recorded.
#[tokio::test]
async fn an_item_past_the_schedulers_limits_does_not_lose_the_rest_of_its_payload() -> Result<()> {
    let stack = Stack::start().await?;
    let mut value = reply_from("16505550041", "STOP");
    value["messages"][0]["timestamp"] = json!("99999999999999");
    let long_sender = "1".repeat(300);
    value["messages"].as_array_mut().context("messages")?.push(
        json!({"from": long_sender, "id": "wamid.IN-long", "type": "text",
                     "timestamp": chrono::Utc::now().timestamp().to_string(),
                     "text": {"body": "STOP"}}),
    );
    let body = webhook_body(WABA, "messages", value);
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);

    let mut suppressions = SuppressionServiceClient::connect(stack.scheduler.grpc_url()).await?;
    let listed = suppressions
        .check_suppressions(CheckSuppressionsRequest {
            recipients: vec!["16505550041".into()],
        })
        .await?
        .into_inner()
        .suppressions;
    assert_eq!(listed.len(), 1, "the opt-out was not recorded: {listed:?}");
    let senders: Vec<String> = stack
        .db
        .connect()
        .await?
        .query(
            "SELECT sender FROM herald.inbound_messages WHERE credentials_ref = 'wa-1'",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get("sender"))
        .collect();
    assert_eq!(senders, ["16505550041"], "the over-long sender is skipped");
    Ok(())
}

/// Meta posts every number's webhooks to one URL, which may reach an executor that does not
/// hold the number written to. A STOP there still suppresses the sender; before, it was
/// acknowledged and dropped, and Meta never sent it again.
#[tokio::test]
async fn a_stop_to_a_number_this_executor_does_not_hold_still_suppresses_the_sender() -> Result<()>
{
    let stack = Stack::start().await?;
    let mut reply = reply_from("16505550035", "STOP");
    reply["metadata"]["phone_number_id"] = json!("another-executors-number");
    let body = webhook_body(WABA, "messages", reply);
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    let mut suppressions = SuppressionServiceClient::connect(stack.scheduler.grpc_url()).await?;
    let listed = suppressions
        .check_suppressions(CheckSuppressionsRequest {
            recipients: vec!["+16505550035".into()],
        })
        .await?
        .into_inner()
        .suppressions;
    assert_eq!(listed.len(), 1, "the opt-out was lost: {listed:?}");
    assert_eq!(listed[0].reason(), SuppressionReason::OptOut);
    // No account's window opened: the number is no account of this namespace's executors.
    let windows: i64 = stack
        .db
        .connect()
        .await?
        .query_one(
            "SELECT count(*) FROM herald.recipient_sends WHERE recipient = '16505550035'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(windows, 0);
    Ok(())
}

/// Which of `names` are on the suppression list, sorted.
async fn listed(stack: &Stack, names: &[&str]) -> Result<Vec<String>> {
    let mut suppressions = SuppressionServiceClient::connect(stack.scheduler.grpc_url()).await?;
    let mut listed: Vec<String> = suppressions
        .check_suppressions(CheckSuppressionsRequest {
            recipients: names.iter().map(|n| (*n).to_owned()).collect(),
        })
        .await?
        .into_inner()
        .suppressions
        .into_iter()
        .map(|s| s.recipient)
        .collect();
    listed.sort();
    Ok(listed)
}

/// Posts Meta's `delivered` for `task`'s message naming its recipient `wa_id`.
async fn delivered_to(stack: &Stack, task: &Task, wa_id: &str) -> Result<()> {
    let wamid = stack.wamid(task)?;
    let data = format!("{}/1", task.id);
    let value = status_value(PHONE_ID, &wamid, Callback::Delivered, wa_id, Some(&data));
    let answer = stack
        .fake
        .post_webhook(&webhook_body(WABA, "messages", value))
        .await?;
    ensure!(answer == 200, "status webhook answered {answer}");
    Ok(())
}

/// WhatsApp may name a user by an id that is not the number herald sent to ("a user's ID and
/// phone number may not always match": a Brazilian number without its ninth digit, say). The
/// status callback teaches herald the second name; a STOP from it stops messages to the
/// number, and taking the number off the list takes both names off. Before, the STOP listed
/// the WhatsApp id alone and the number went on being messaged.
#[tokio::test]
async fn a_stop_from_the_whatsapp_id_of_a_number_stops_messages_to_the_number() -> Result<()> {
    let mut stack = Stack::start().await?;
    let number = "+5511987650001";
    let wa_id = "551187650001";
    let sent = stack.send(number).await?;
    delivered_to(&stack, &sent, wa_id).await?;
    let stop = webhook_body(WABA, "messages", reply_from(wa_id, "STOP"));
    assert_eq!(stack.fake.post_webhook(&stop).await?, 200);
    assert_eq!(
        listed(&stack, &[number, wa_id]).await?,
        [wa_id, "5511987650001"]
    );

    let again = create_task(
        &mut stack.tasks,
        TaskSpec {
            pool: "wa".into(),
            ..task_spec("orders", number, "Your order has shipped")
        },
    )
    .await?;
    assert_eq!(
        (again.state(), again.end_reason()),
        (TaskState::Cancelled, EndReason::Suppressed)
    );
    assert_eq!(stack.fake.requests().len(), 1, "messaged after the STOP");

    let mut suppressions = SuppressionServiceClient::connect(stack.scheduler.grpc_url()).await?;
    suppressions
        .remove_suppression(RemoveSuppressionRequest {
            recipient: number.into(),
        })
        .await?;
    assert_eq!(
        listed(&stack, &[number, wa_id]).await?,
        Vec::<String>::new()
    );
    Ok(())
}

/// The STOP can come first, from a WhatsApp id herald has not seen yet: the first status that
/// ties that id to a number lists the number too.
#[tokio::test]
async fn a_stop_before_the_whatsapp_id_is_known_lists_the_number_once_it_is() -> Result<()> {
    let mut stack = Stack::start().await?;
    let number = "+5511987650002";
    let wa_id = "551187650002";
    let stop = webhook_body(WABA, "messages", reply_from(wa_id, "STOP"));
    assert_eq!(stack.fake.post_webhook(&stop).await?, 200);
    let sent = stack.send(number).await?;
    assert_eq!(listed(&stack, &[number]).await?, Vec::<String>::new());
    delivered_to(&stack, &sent, wa_id).await?;
    assert_eq!(listed(&stack, &[number]).await?, ["5511987650002"]);
    Ok(())
}

/// A STOP that Meta delivers again after an operator removed the entry (the person subscribed
/// again) is the same STOP: it is acted on once, and does not list them again.
#[tokio::test]
async fn a_stop_delivered_again_after_its_entry_was_removed_does_not_list_again() -> Result<()> {
    let stack = Stack::start().await?;
    let body = webhook_body(WABA, "messages", reply_from("16505550036", "STOP"));
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    assert_eq!(listed(&stack, &["16505550036"]).await?, ["16505550036"]);
    SuppressionServiceClient::connect(stack.scheduler.grpc_url())
        .await?
        .remove_suppression(herald_proto::v1::RemoveSuppressionRequest {
            recipient: "16505550036".into(),
        })
        .await?;
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    assert!(
        listed(&stack, &["16505550036"]).await?.is_empty(),
        "a redelivered STOP listed the recipient again"
    );
    Ok(())
}

/// A send WhatsApp refuses as undeliverable (131026: not on WhatsApp, app too old, terms not
/// accepted) fails, and its recipient is listed INVALID_RECIPIENT as Meta advises: the next
/// task to them, in either spelling, ends suppressed instead of being sent and refused again.
#[tokio::test]
async fn a_recipient_whatsapp_cannot_deliver_to_is_listed_and_not_sent_again() -> Result<()> {
    let mut stack = Stack::start().await?;
    stack.fake.respond_next(Scripted::Code(131026));
    let refused = stack.send("+16505550037").await?;
    assert_eq!(refused.state(), TaskState::Failed, "{refused:?}");
    let mut suppressions = SuppressionServiceClient::connect(stack.scheduler.grpc_url()).await?;
    let entries = suppressions
        .check_suppressions(CheckSuppressionsRequest {
            recipients: vec!["16505550037".into()],
        })
        .await?
        .into_inner()
        .suppressions;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].reason(), SuppressionReason::InvalidRecipient);
    assert!(
        entries[0].note.contains("undeliverable"),
        "{:?}",
        entries[0].note
    );
    let sent_before = stack.fake.requests().len();
    let next = stack.create("16505550037").await?;
    let next = stack
        .wait_task(&next, |t| t.state() == TaskState::Cancelled)
        .await?;
    assert_eq!(next.end_reason(), EndReason::Suppressed);
    assert_eq!(stack.fake.requests().len(), sent_before, "sent again");

    // Accepted, then reported undeliverable by a status webhook: listed the same way.
    let accepted = stack.send("16505550038").await?;
    let wamid = stack.wamid(&accepted)?;
    let late = status_of(&accepted, &wamid, Callback::Failed(131026));
    assert_eq!(
        stack
            .fake
            .post_webhook(&webhook_body(WABA, "messages", late))
            .await?,
        200
    );
    stack
        .wait_task(&accepted.id, |t| t.state() == TaskState::Failed)
        .await?;
    assert_eq!(
        listed(&stack, &["16505550038"]).await?,
        ["16505550038"],
        "a late 131026 did not list the recipient"
    );
    Ok(())
}
