//! The harness itself works: the shared cluster starts, each test gets its own database, and
//! the webhook receiver records and scripts responses. Needs no herald binary.

use std::time::Duration;

use anyhow::{Context, Result};
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

/// A minimal HTTP/1.1 POST over a raw socket, so the harness tests need no HTTP client crate.
/// Returns the status and the `retry-after` header (empty when absent).
async fn post(base: impl AsRef<str>, webhook_id: &str) -> Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.as_ref().trim_start_matches("http://").to_owned();
    let mut stream = tokio::net::TcpStream::connect(&addr).await?;
    let request = format!(
        "POST /hook HTTP/1.1\r\nhost: {addr}\r\nwebhook-id: {webhook_id}\r\n\
         content-length: 5\r\nconnection: close\r\n\r\nhello"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .context("no status code in the response")?;
    let retry_after = response
        .lines()
        .find_map(|line| line.strip_prefix("retry-after: "))
        .unwrap_or_default()
        .to_owned();
    Ok((status, retry_after))
}
