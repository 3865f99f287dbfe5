//! gRPC client helpers for the scheduler's API.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use herald_proto::v1::lease_service_client::LeaseServiceClient;
use herald_proto::v1::task_service_client::TaskServiceClient;
use herald_proto::v1::{CreateTaskRequest, GetTaskRequest, Task, TaskSpec, TaskState};
use tonic::transport::Channel;
use tonic_health::pb::health_client::HealthClient;

/// How often [`wait_for_task_state`] asks for the task again.
const POLL_INTERVAL: Duration = Duration::from_millis(25);

async fn channel(url: &str) -> Result<Channel> {
    Channel::from_shared(url.to_owned())
        .with_context(|| format!("invalid gRPC URL {url}"))?
        .connect()
        .await
        .with_context(|| format!("connecting to {url}"))
}

/// A `TaskService` client connected to `url` (for example [`crate::SchedulerProcess::grpc_url`]).
pub async fn connect_tasks(url: &str) -> Result<TaskServiceClient<Channel>> {
    Ok(TaskServiceClient::new(channel(url).await?))
}

/// A `LeaseService` client connected to `url`, for tests that play the executor's side of the
/// lease stream themselves.
pub async fn connect_lease(url: &str) -> Result<LeaseServiceClient<Channel>> {
    Ok(LeaseServiceClient::new(channel(url).await?))
}

/// A `grpc.health.v1.Health` client connected to `url`.
pub async fn connect_health(url: &str) -> Result<HealthClient<Channel>> {
    Ok(HealthClient::new(channel(url).await?))
}

/// Creates one task and returns it as the server stored it.
pub async fn create_task(client: &mut TaskServiceClient<Channel>, spec: TaskSpec) -> Result<Task> {
    client
        .create_task(CreateTaskRequest { task: Some(spec) })
        .await
        .context("CreateTask")?
        .into_inner()
        .task
        .context("CreateTask answered without a task")
}

/// Polls `GetTask` until the task is in `state`, and returns it.
///
/// Fails at once if the task reaches a different terminal state (it cannot leave it without a
/// call from the test), and after `timeout` with the last state seen.
pub async fn wait_for_task_state(
    client: &mut TaskServiceClient<Channel>,
    id: &str,
    state: TaskState,
    timeout: Duration,
) -> Result<Task> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut interval = tokio::time::interval(POLL_INTERVAL);
    loop {
        interval.tick().await;
        let task = client
            .get_task(GetTaskRequest { id: id.to_owned() })
            .await
            .with_context(|| format!("GetTask {id}"))?
            .into_inner();
        let current = task.state();
        if current == state {
            return Ok(task);
        }
        let terminal = matches!(
            current,
            TaskState::Succeeded | TaskState::Failed | TaskState::Cancelled | TaskState::Expired
        );
        if terminal {
            bail!(
                "task {id} ended {} while waiting for {}: {task:?}",
                current.as_str_name(),
                state.as_str_name()
            );
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "task {id} not {} within {timeout:?}; last seen: {task:?}",
                state.as_str_name()
            );
        }
    }
}

/// How a List call's pages read from the first to the last: the ids of every item in order, and
/// how many pages it took. `page(token)` asks for one page and answers its items' ids and its
/// `next_page_token`. Fails when a page before the last is empty or the list does not end
/// within `max_pages` pages.
pub async fn read_every_page<F, Fut>(max_pages: usize, mut page: F) -> Result<(Vec<String>, usize)>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<String>, String)>>,
{
    let mut ids = Vec::new();
    let mut token = String::new();
    for pages in 1..=max_pages {
        let (items, next) = page(token).await.context("a page the client can decode")?;
        if items.is_empty() && !next.is_empty() {
            bail!("page {pages} is empty and points to another");
        }
        ids.extend(items);
        if next.is_empty() {
            return Ok((ids, pages));
        }
        token = next;
    }
    bail!(
        "paging does not end within {max_pages} pages, after {} items",
        ids.len()
    )
}
