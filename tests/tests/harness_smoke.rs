//! The harness itself works: the shared cluster starts, each test gets its own database, and
//! the webhook receiver records and scripts responses. Needs no herald binary.

use std::time::Duration;

use anyhow::Result;
use herald_tests::{Gate, Response, TestDb, WebhookReceiver};

async fn current_database(db: &TestDb) -> Result<String> {
    let client = db.connect().await?;
    let one: i32 = client.query_one("SELECT 1", &[]).await?.get(0);
    assert_eq!(one, 1);
    Ok(client
        .query_one("SELECT current_database()", &[])
        .await?
        .get(0))
}

#[tokio::test]
async fn each_test_gets_its_own_database() -> Result<()> {
    let first = TestDb::new().await?;
    let second = TestDb::new().await?;
    assert_ne!(first.url(), second.url());
    assert_eq!(current_database(&first).await?, first.name());
    assert_eq!(current_database(&second).await?, second.name());
    Ok(())
}

#[tokio::test]
async fn another_process_shares_the_cluster() -> Result<()> {
    // nextest runs this in a process of its own, concurrently with the test above: both must
    // end up on one cluster, started once.
    let db = TestDb::new().await?;
    assert_eq!(current_database(&db).await?, db.name());
    Ok(())
}

#[tokio::test]
async fn webhook_receiver_follows_its_script() -> Result<()> {
    let receiver = WebhookReceiver::start().await?;
    receiver.respond_with(vec![Response::status(503).header("retry-after", "1")]);
    assert_eq!(post(&receiver.url(), "msg-1").await?, (503, "1".to_owned()));
    assert_eq!(post(&receiver.url(), "msg-1").await?.0, 200);
    let requests = receiver
        .wait_for_requests(2, Duration::from_secs(5))
        .await?;
    assert_eq!(requests[0].body_text(), "hello");
    assert_eq!(requests[0].path, "/hook");
    assert_eq!(receiver.deliveries_by_webhook_id()["msg-1"], 2);
    Ok(())
}

#[tokio::test]
async fn webhook_receiver_holds_a_response_until_released() -> Result<()> {
    let receiver = WebhookReceiver::start().await?;
    let gate = Gate::new();
    receiver.respond_with(vec![Response::ok().hold_until(&gate)]);
    let in_flight = tokio::spawn(post(receiver.url(), "held"));
    // The request is recorded on arrival, while its answer is still held.
    receiver
        .wait_for_requests(1, Duration::from_secs(5))
        .await?;
    assert!(!in_flight.is_finished());
    gate.release();
    assert_eq!(in_flight.await??.0, 200);
    Ok(())
}

/// POSTs "hello" with a `webhook-id` header; returns the status and the `retry-after` header
/// (empty when absent).
async fn post(base: impl AsRef<str>, webhook_id: &str) -> Result<(u16, String)> {
    let response = reqwest::Client::new()
        .post(format!("{}/hook", base.as_ref()))
        .header("webhook-id", webhook_id)
        .body("hello")
        .send()
        .await?;
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|value| value.to_str().unwrap_or_default().to_owned())
        .unwrap_or_default();
    Ok((response.status().as_u16(), retry_after))
}

#[tokio::test]
async fn a_binary_that_cannot_start_fails_the_spawn_with_its_stderr() -> Result<()> {
    let db = herald_tests::TestDb::new().await?;
    // An address that cannot be bound makes the scheduler exit before READY.
    let error = herald_tests::SchedulerProcess::builder(&db)
        .env("HERALD_GRPC_ADDR", "256.0.0.1:0")
        .spawn()
        .await
        .expect_err("the scheduler cannot bind");
    let message = format!("{error:#}");
    assert!(message.contains("exited before READY"), "{message}");
    assert!(message.contains("256.0.0.1"), "{message}");
    Ok(())
}
