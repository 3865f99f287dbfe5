//! Account webhooks: quality, messaging tier, and the provider pausing and reconnecting a number.

use super::*;

#[tokio::test]
async fn quality_and_tier_updates_show_in_get_account() -> Result<()> {
    let mut stack = Stack::start().await?;
    // The older form (current_limit) beside the portfolio one, which wins.
    let body = webhook_body(
        WABA,
        "phone_number_quality_update",
        json!({"display_phone_number": "15550783881", "event": "DOWNGRADE",
               "current_limit": "TIER_1K", "max_daily_conversations_per_business": "TIER_2K",
               "quality_rating": "YELLOW"}),
    );
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    let account = get_account(&mut stack.accounts, "wa-1").await?;
    assert_eq!(
        account.limits.context("limits")?.messaging_tier(),
        MessagingTier::Limit2k
    );
    assert_eq!(account.status.context("status")?.quality, "yellow");

    // The old form alone, and a value herald does not know (informational: nothing changes).
    let body = webhook_body(
        WABA,
        "phone_number_quality_update",
        json!({"display_phone_number": "15550783881", "event": "UPGRADE", "current_limit": "TIER_50"}),
    );
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    let body = webhook_body(
        WABA,
        "phone_number_quality_update",
        json!({"display_phone_number": "15550783881", "event": "UPGRADE", "current_limit": "TIER_7"}),
    );
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    let account = get_account(&mut stack.accounts, "wa-1").await?;
    assert_eq!(
        account.limits.context("limits")?.messaging_tier(),
        MessagingTier::Limit50
    );

    // An inbound message opens the customer-service window (as RecordInbound does). It is
    // stamped now: retention forgets pairs whose window closed more than 24 hours ago, and it
    // may run between the webhook and the read below.
    let written_at = chrono::Utc::now().timestamp();
    let body = webhook_body(
        WABA,
        "messages",
        json!({"messaging_product": "whatsapp",
               "metadata": {"display_phone_number": "15550783881", "phone_number_id": PHONE_ID},
               "contacts": [{"profile": {"name": "Sheena"}, "wa_id": "16505550009"}],
               "messages": [{"from": "16505550009", "id": "wamid.IN", "timestamp": written_at.to_string(),
                             "type": "text", "text": {"body": "hi"}}]}),
    );
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    let inbound: Option<chrono::DateTime<chrono::Utc>> = stack
        .db
        .connect()
        .await?
        .query_one(
            "SELECT inbound_at FROM herald.recipient_sends \
             WHERE account_id = 'wa-1' AND recipient = '16505550009'",
            &[],
        )
        .await?
        .get("inbound_at");
    assert_eq!(inbound.map(|t| t.timestamp()), Some(written_at));
    Ok(())
}

#[tokio::test]
async fn account_updates_pause_with_a_notification_and_reconnected_resumes() -> Result<()> {
    let notify = WebhookReceiver::start().await?;
    let notify_url = format!("{}/notify", notify.url());
    let mut stack = Stack::start_with(|b| {
        b.env("HERALD_NOTIFY_URL", &notify_url).env(
            "HERALD_NOTIFY_SECRET",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        )
    })
    .await?;
    let body = webhook_body(
        WABA,
        "account_update",
        json!({"event": "DISABLED_UPDATE",
               "ban_info": {"waba_ban_state": "DISABLE", "waba_ban_date": "2025-06-01"}}),
    );
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    // Meta delivers it again: still one pause, one notification.
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    let account = get_account(&mut stack.accounts, "wa-1").await?;
    assert_eq!(account.state(), AccountState::Paused);
    let reason = account.status.context("status")?.state_reason;
    assert!(
        reason.starts_with("paused by the provider: account_update DISABLED_UPDATE"),
        "{reason}"
    );

    let delivered = notify.wait_for_requests(1, WAIT).await?;
    let event: serde_json::Value = serde_json::from_slice(&delivered[0].body)?;
    assert_eq!(event["type"], "account.paused");
    assert_eq!(event["data"]["account_id"], "wa-1");
    assert!(event["data"]["reason"]
        .as_str()
        .is_some_and(|r| r.contains("DISABLED_UPDATE")));

    let body = webhook_body(
        WABA,
        "account_update",
        json!({"event": "ACCOUNT_RECONNECTED"}),
    );
    assert_eq!(stack.fake.post_webhook(&body).await?, 200);
    let account = get_account(&mut stack.accounts, "wa-1").await?;
    assert_eq!(account.state(), AccountState::Active);
    // Back in rotation: a task goes out through it.
    stack.send("16505550010").await?;
    let paused_events = notify
        .requests()
        .iter()
        .filter_map(|r| serde_json::from_slice::<serde_json::Value>(&r.body).ok())
        .filter(|e| e["type"] == "account.paused")
        .count();
    assert_eq!(paused_events, 1);
    Ok(())
}
