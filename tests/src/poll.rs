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

/// Waits until task `id` has left `herald.tasks` for the history (migration V28), which the
/// retention job does once the task has been finished for `HERALD_HISTORY_AFTER`.
pub async fn until_moved_to_history(sql: &tokio_postgres::Client, id: &str) -> Result<()> {
    until(&format!("task {id} to move into the history"), || async {
        let row = sql
            .query_one(
                "SELECT (SELECT count(*) FROM herald.tasks WHERE id::text = $1) AS hot,
                        (SELECT count(*) FROM herald.task_history WHERE id::text = $1) AS moved",
                &[&id],
            )
            .await?;
        Ok(row.get::<_, i64>("hot") == 0 && row.get::<_, i64>("moved") == 1)
    })
    .await
}
