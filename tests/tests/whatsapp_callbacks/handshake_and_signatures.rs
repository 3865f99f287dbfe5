//! The webhook's handshake and its signature check: nothing unsigned gets through.

use super::*;

#[tokio::test]
async fn the_handshake_echoes_the_challenge_for_the_right_token_only() -> Result<()> {
    let stack = Stack::start().await?;
    let url = webhook_url(&stack.executor)?;
    let http = reqwest::Client::new();
    let get = |mode: &str, token: &str| {
        http.get(&url)
            .query(&[
                ("hub.mode", mode),
                ("hub.verify_token", token),
                ("hub.challenge", "1158201444"),
            ])
            .send()
    };
    let ok = get("subscribe", VERIFY_TOKEN).await?;
    assert_eq!(ok.status().as_u16(), 200);
    assert_eq!(ok.text().await?, "1158201444");
    assert_eq!(get("subscribe", "wrong").await?.status().as_u16(), 403);
    assert_eq!(
        get("unsubscribe", VERIFY_TOKEN).await?.status().as_u16(),
        403
    );
    assert_eq!(http.get(&url).send().await?.status().as_u16(), 403);
    Ok(())
}

#[tokio::test]
async fn a_bad_or_missing_signature_is_401_and_records_nothing() -> Result<()> {
    let mut stack = Stack::start().await?;
    let task = stack.send("16505550001").await?;
    let task = stack
        .wait_task(&task.id, |t| state(t) == DeliveryState::Accepted)
        .await?;
    let wamid = stack.wamid(&task)?;
    let body = webhook_body(WABA, "messages", status_of(&task, &wamid, Callback::Read));
    let bytes = serde_json::to_vec(&body)?;
    let url = webhook_url(&stack.executor)?;
    let http = reqwest::Client::new();
    for signature in [
        None,
        Some(hub_signature("not-the-app-secret", &bytes)),
        Some(hub_signature(APP_SECRET, b"another body")),
        Some("sha256=nothex".to_owned()),
    ] {
        let mut request = http
            .post(&url)
            .header("content-type", "application/json")
            .body(bytes.clone());
        if let Some(s) = &signature {
            request = request.header("x-hub-signature-256", s);
        }
        assert_eq!(
            request.send().await?.status().as_u16(),
            401,
            "{signature:?}"
        );
    }
    let rows: i64 = stack
        .db
        .connect()
        .await?
        .query_one(
            "SELECT count(*) AS n FROM herald.delivery_events WHERE state <> 1",
            &[],
        )
        .await?
        .get("n");
    assert_eq!(rows, 0, "a refused webhook recorded something");
    assert_eq!(state(&stack.task(&task.id).await?), DeliveryState::Accepted);
    let rejected = counter(
        &stack.executor,
        "herald_callbacks_rejected_total",
        &["reason=\"signature\""],
    )
    .await?;
    assert_eq!(rejected, 4.0);
    Ok(())
}
