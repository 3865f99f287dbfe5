//! Waiting for what a test observes from outside: a background job's effect, a page that
//! changes. Polls; the tests that can await an event await it instead.

use std::time::Duration;

use anyhow::{ensure, Result};

/// How long [`until`] waits before it fails.
const UNTIL_LIMIT: Duration = Duration::from_secs(30);

/// Polls `f` every 100 ms until it holds; fails naming `what` after [`UNTIL_LIMIT`].
pub async fn until<F, Fut>(what: &str, mut f: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let deadline = tokio::time::Instant::now() + UNTIL_LIMIT;
    while !f().await? {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
