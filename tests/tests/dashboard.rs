//! The dashboard in a real browser: a stack of the real binaries (scheduler, executor, a webhook
//! receiver that accepts some messages and refuses others with 422) produces successes and
//! failures; headless Chromium (Debian's `chromium`, driven over the DevTools protocol) opens
//! the page, which must show the counts the database holds, and a click on a failed task's
//! Retry button must re-drive it. A screenshot is saved to `target/test-artifacts/dashboard.png`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use base64::Engine;
use chromiumoxide::browser::{Browser, BrowserConfig};
use chromiumoxide::page::ScreenshotParams;
use chromiumoxide::Page;
use futures::StreamExt;
use herald_proto::v1::task_service_client::TaskServiceClient;
use herald_proto::v1::{GetTaskRequest, TaskState};
use herald_tests::{
    connect_tasks, create_task, task_spec, wait_for_task_state, ExecutorProcess, Response,
    SchedulerProcess, TestDb, WebhookReceiver,
};
use serde_json::Value;
use tonic::transport::Channel;

const CHROMIUM: &str = "/usr/bin/chromium";
const QUEUE: &str = "hooks";
const WAIT: Duration = Duration::from_secs(30);
const TASKS: usize = 6;
const REFUSED: usize = 2;

fn executor_config(receiver: &WebhookReceiver) -> String {
    let secret =
        base64::engine::general_purpose::STANDARD.encode(b"dashboard test signing key 32 b!");
    format!(
        "[queues.{QUEUE}]\nsender = \"webhook\"\nurl = \"{}/hook\"\nsecret = \"whsec_{secret}\"\n",
        receiver.url()
    )
}

async fn start_executor(
    scheduler: &SchedulerProcess,
    receiver: &WebhookReceiver,
    id: &str,
) -> Result<ExecutorProcess> {
    ExecutorProcess::builder(&[scheduler.grpc_url()])
        .config_toml(executor_config(receiver))
        .env("HERALD_EXECUTOR_ID", id)
        .name(id)
        .spawn()
        .await
}

/// Polls GetTask until the task has ended, and returns its state.
async fn wait_until_ended(client: &mut TaskServiceClient<Channel>, id: &str) -> Result<TaskState> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let task = client
            .get_task(GetTaskRequest { id: id.into() })
            .await?
            .into_inner();
        let state = TaskState::try_from(task.state)?;
        if !matches!(state, TaskState::Scheduled | TaskState::Leased) {
            return Ok(state);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("task {id} still {state:?} after {WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Today's counts by state (UTC day), as the dashboard defines them, straight from the rows.
async fn db_counts(db: &TestDb) -> Result<Value> {
    let pg = db.connect().await?;
    let row = pg
        .query_one(
            "WITH day AS (SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' AS s)
             SELECT
               count(*) FILTER (WHERE state = 'scheduled' AND run_at >= s AND run_at < s + interval '1 day'),
               count(*) FILTER (WHERE state = 'leased' AND run_at >= s AND run_at < s + interval '1 day'),
               count(*) FILTER (WHERE state = 'succeeded' AND finished_at >= s AND finished_at < s + interval '1 day'),
               count(*) FILTER (WHERE state = 'failed' AND finished_at >= s AND finished_at < s + interval '1 day'),
               count(*) FILTER (WHERE state = 'expired' AND finished_at >= s AND finished_at < s + interval '1 day'),
               count(*) FILTER (WHERE state = 'cancelled' AND finished_at >= s AND finished_at < s + interval '1 day')
             FROM herald.tasks, day",
            &[],
        )
        .await?;
    let n = |i: usize| row.get::<_, i64>(i).to_string();
    Ok(serde_json::json!({
        "scheduled": n(0), "leased": n(1), "succeeded": n(2),
        "failed": n(3), "expired": n(4), "cancelled": n(5),
    }))
}

/// Resolves once `condition` (a JavaScript expression) is true, re-checked on every DOM change:
/// waits for the page's own rendering instead of sleeping.
async fn wait_for_dom(page: &Page, condition: &str) -> Result<()> {
    let script = format!(
        "() => new Promise((resolve) => {{
            const done = () => {{ try {{ return !!({condition}); }} catch (e) {{ return false; }} }};
            if (done()) return resolve(true);
            const observer = new MutationObserver(() => {{
                if (done()) {{ observer.disconnect(); resolve(true); }}
            }});
            observer.observe(document.documentElement,
                {{ attributes: true, childList: true, subtree: true, characterData: true }});
        }})"
    );
    tokio::time::timeout(WAIT, page.evaluate_function(script))
        .await
        .with_context(|| format!("page never satisfied {condition}"))??;
    Ok(())
}

fn artifact_path() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("test-artifacts").join("dashboard.png")
}

#[tokio::test]
async fn dashboard_shows_todays_figures_and_retries_a_failure() -> Result<()> {
    ensure!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: install Debian's chromium package (script/test does)"
    );
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let receiver = WebhookReceiver::start().await?;
    // The first two sends are refused (422 is PERMANENT: the task fails at once); every later
    // one, the retry included, is accepted.
    receiver.respond_with(vec![Response::status(422); REFUSED]);
    let mut executor = start_executor(&scheduler, &receiver, "dash-exec-1").await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;

    let mut ids = Vec::new();
    for i in 0..TASKS {
        let task = create_task(
            &mut tasks,
            task_spec(QUEUE, &format!("+1555000{i:04}"), &format!("message {i}")),
        )
        .await?;
        ids.push(task.id);
    }
    let mut failed = Vec::new();
    for id in &ids {
        if wait_until_ended(&mut tasks, id).await? == TaskState::Failed {
            failed.push(id.clone());
        }
    }
    ensure!(
        failed.len() == REFUSED,
        "expected {REFUSED} failures, got {failed:?}"
    );
    // No executor while the retry is checked, so the re-driven task stays SCHEDULED until the
    // test starts one.
    executor.terminate()?;
    executor.wait().await?;

    let profile = std::env::temp_dir().join(format!("herald-chromium-{}", uuid::Uuid::new_v4()));
    let config = BrowserConfig::builder()
        .chrome_executable(CHROMIUM)
        .no_sandbox()
        .user_data_dir(&profile)
        .window_size(1280, 1500)
        .viewport(None)
        .args([
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .build()
        .map_err(anyhow::Error::msg)?;
    let (mut browser, mut handler) = Browser::launch(config)
        .await
        .context("launching chromium")?;
    let events = tokio::spawn(async move { while handler.next().await.is_some() {} });

    let result = drive(&browser, &scheduler, &db, &failed, &mut tasks).await;

    let _ = browser.close().await;
    let _ = browser.wait().await;
    events.abort();
    let _ = std::fs::remove_dir_all(&profile);
    let retried = result?;

    // With an executor back, the receiver's default 200 sends the retried task.
    let _executor = start_executor(&scheduler, &receiver, "dash-exec-2").await?;
    wait_for_task_state(&mut tasks, &retried, TaskState::Succeeded, WAIT).await?;
    Ok(())
}

/// Opens the dashboard, checks it against the database, retries one failure from the page and
/// returns that task's id.
async fn drive(
    browser: &Browser,
    scheduler: &SchedulerProcess,
    db: &TestDb,
    failed: &[String],
    tasks: &mut TaskServiceClient<Channel>,
) -> Result<String> {
    let url = format!("{}/dashboard/?tz=UTC", scheduler.http_url());
    let page = browser
        .new_page(url.as_str())
        .await
        .context("opening the dashboard")?;
    wait_for_dom(&page, "document.body.dataset.loaded === '1'").await?;

    let shown: Value = page
        .evaluate_function(
            "() => Object.fromEntries(['scheduled', 'leased', 'succeeded', 'failed', 'expired',
                'cancelled'].map((s) => [s, document.getElementById('count-' + s).textContent]))",
        )
        .await?
        .into_value()?;
    let expected = db_counts(db).await?;
    ensure!(
        shown == expected,
        "page shows {shown}, database says {expected}"
    );
    let (want_failed, want_sent) = (REFUSED.to_string(), (TASKS - REFUSED).to_string());
    ensure!(
        shown["failed"] == want_failed && shown["succeeded"] == want_sent,
        "unexpected counts {shown}"
    );
    // The namespace asked for (?ns=, as the console's links pass it) is the one shown and
    // counted: it reaches every API call. It was ignored, showing the default's figures.
    let label = |page: &Page| {
        let page = page.clone();
        async move {
            anyhow::Ok(
                page.evaluate_function(
                    "() => [document.getElementById('namespace').textContent,
                            document.getElementById('count-failed').textContent]",
                )
                .await?
                .into_value::<(String, String)>()?,
            )
        }
    };
    let here = label(&page).await?;
    ensure!(here.0 == "namespace default", "{here:?}");
    let elsewhere = browser
        .new_page(format!("{}/dashboard/?tz=UTC&ns=elsewhere", scheduler.http_url()).as_str())
        .await
        .context("opening another namespace's dashboard")?;
    wait_for_dom(&elsewhere, "document.body.dataset.loaded === '1'").await?;
    let there = label(&elsewhere).await?;
    ensure!(
        there == ("namespace elsewhere".to_string(), "0".to_string()),
        "{there:?}"
    );
    // Closed, and the first page brought back to the front: clicks go to the front page.
    elsewhere.close().await?;
    page.bring_to_front().await?;

    // The failure list has a row with a Retry button per failed task; the chart and the
    // account table are drawn.
    let rows: Vec<String> = page
        .evaluate_function(
            "() => [...document.querySelectorAll('#failures tbody tr[data-task-id]')]
                .map((tr) => tr.dataset.taskId)",
        )
        .await?
        .into_value()?;
    let mut sorted_rows = rows.clone();
    sorted_rows.sort();
    let mut sorted_failed = failed.to_vec();
    sorted_failed.sort();
    ensure!(
        sorted_rows == sorted_failed,
        "failure rows {rows:?}, failed tasks {failed:?}"
    );
    let bars: u64 = page
        .evaluate_function("() => document.querySelectorAll('#chart rect').length")
        .await?
        .into_value()?;
    ensure!(bars > 0, "the per-minute chart has no bars");
    let attempts: String = page
        .evaluate_function(
            "() => document.querySelector('#accounts tbody tr td:nth-child(2)').textContent",
        )
        .await?
        .into_value()?;
    ensure!(
        attempts == TASKS.to_string(),
        "accounts table shows {attempts} attempts"
    );

    let target = rows.first().context("no failure row")?.clone();
    page.find_element(format!("button.retry[data-task-id='{target}']"))
        .await?
        .click()
        .await?;
    // The row is marked when the POST answers; the action line says so too, which survives a
    // refresh that re-draws the table in between.
    wait_for_dom(
        &page,
        &format!(
            "document.querySelector(\"#failures tr[data-task-id='{target}']\")?.dataset.retried \
             || document.getElementById('action').textContent.includes('task {target} is')"
        ),
    )
    .await?;
    let task = tasks
        .get_task(GetTaskRequest { id: target.clone() })
        .await?
        .into_inner();
    ensure!(
        task.state == TaskState::Scheduled as i32,
        "after the page's retry the task is {:?}",
        TaskState::try_from(task.state)
    );

    let path = artifact_path();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    page.save_screenshot(ScreenshotParams::builder().full_page(true).build(), &path)
        .await
        .context("saving the screenshot")?;
    println!("dashboard screenshot: {}", path.display());
    Ok(target)
}
