//! The operator's console in a real browser: headless Chromium (Debian's `chromium`, over the
//! DevTools protocol) drives every page and control of `/console` against the real scheduler
//! binary on a real database, and every action's effect is checked in the database, not only on
//! the page. Each page is kept as a screenshot at 1280 and 390 px wide under
//! `target/test-artifacts/console/`.
//!
//! A second test checks the doors with plain HTTP: a viewer token reads but cannot act, and a
//! cross-site POST is refused.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use chromiumoxide::browser::{Browser, BrowserConfig};
use chromiumoxide::cdp::browser_protocol::emulation::SetDeviceMetricsOverrideParams;
use chromiumoxide::cdp::browser_protocol::page::EventLoadEventFired;
use chromiumoxide::page::ScreenshotParams;
use chromiumoxide::Page;
use futures::StreamExt;
use herald_proto::v1::account_service_client::AccountServiceClient;
use herald_proto::v1::campaign_service_client::CampaignServiceClient;
use herald_proto::v1::schedule_service_client::ScheduleServiceClient;
use herald_proto::v1::{
    content, Account, CampaignRecipient, CampaignSpec, Content, CreateAccountRequest,
    CreateCampaignRequest, CreateScheduleRequest, OutcomeClass, ScheduleSpec, TaskSpec,
};
use herald_tests::accounts::whatsapp_account;
use herald_tests::lease::{result, ScriptedExecutor};
use herald_tests::security::{write_tokens_file, TestToken};
use herald_tests::{connect_tasks, create_task, task_spec, SchedulerProcess, TaskSpecExt, TestDb};
use serde::de::DeserializeOwned;
use uuid::Uuid;

const CHROMIUM: &str = "/usr/bin/chromium";
const WAIT: Duration = Duration::from_secs(30);
const WIDTHS: [u32; 2] = [1280, 390];

fn artifacts() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("test-artifacts").join("console")
}

/// Evaluates a JavaScript expression on the page.
async fn js<T: DeserializeOwned>(page: &Page, expression: &str) -> Result<T> {
    Ok(page
        .evaluate_function(format!("() => {expression}"))
        .await
        .with_context(|| format!("evaluating {expression}"))?
        .into_value()?)
}

/// Resolves once `condition` holds, re-checked on every DOM change (no sleeping).
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

/// Opens `path` of the console in the default namespace.
async fn open(page: &Page, base: &str, path: &str) -> Result<()> {
    let sep = if path.contains('?') { '&' } else { '?' };
    page.goto(format!("{base}{path}{sep}ns=default"))
        .await
        .with_context(|| format!("opening {path}"))?;
    let status: String = js(page, "document.title").await?;
    ensure!(!status.starts_with("Error"), "{path} answered {status}");
    Ok(())
}

/// Clicks what `selector` finds (a submit button or link) and waits for the page it leads to
/// to fire its load event (subscribed before the click, so it cannot be missed).
async fn submit(page: &Page, selector: &str) -> Result<()> {
    let mut loaded = page.event_listener::<EventLoadEventFired>().await?;
    page.find_element(selector)
        .await
        .with_context(|| format!("finding {selector}"))?
        .click()
        .await?;
    tokio::time::timeout(WAIT, loaded.next())
        .await
        .with_context(|| format!("no page loaded after clicking {selector}"))?;
    page.wait_for_navigation().await?;
    Ok(())
}

/// Types `text` into the field `selector` finds and presses Enter, as a keyboard user would,
/// and waits for the page the form leads to.
async fn type_and_enter(page: &Page, selector: &str, text: &str) -> Result<()> {
    let mut loaded = page.event_listener::<EventLoadEventFired>().await?;
    page.find_element(selector)
        .await?
        .click()
        .await?
        .type_str(text)
        .await?
        .press_key("Enter")
        .await?;
    tokio::time::timeout(WAIT, loaded.next())
        .await
        .with_context(|| format!("no page loaded after Enter in {selector}"))?;
    page.wait_for_navigation().await?;
    Ok(())
}

/// The status line an action left on the page it led to.
async fn done_message(page: &Page) -> Result<String> {
    js(page, "document.getElementById('done')?.textContent ?? ''").await
}

/// Saves the page at both widths.
async fn shoot(page: &Page, name: &str) -> Result<()> {
    let dir = artifacts();
    std::fs::create_dir_all(&dir)?;
    for width in WIDTHS {
        let metrics = SetDeviceMetricsOverrideParams::builder()
            .width(width)
            .height(900)
            .device_scale_factor(1.0)
            .mobile(width < 600)
            .build()
            .map_err(anyhow::Error::msg)?;
        page.execute(metrics).await?;
        let path = dir.join(format!("{name}-{width}.png"));
        page.save_screenshot(ScreenshotParams::builder().full_page(true).build(), &path)
            .await
            .with_context(|| format!("saving {}", path.display()))?;
    }
    Ok(())
}

async fn scalar<T>(
    db: &TestDb,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<T>
where
    T: for<'a> tokio_postgres::types::FromSql<'a>,
{
    let c = db.connect().await?;
    Ok(c.query_one(sql, params).await?.get(0))
}

/// The nightly report schedule both tests create: 03:00 in Berlin, one recipient.
fn nightly() -> ScheduleSpec {
    ScheduleSpec {
        id: "nightly".into(),
        cron: "0 3 * * *".into(),
        time_zone: "Europe/Berlin".into(),
        queue: "reports".into(),
        recipients: vec!["ops@example.com".into()],
        content: Some(Content {
            body: Some(content::Body::Text("nightly report".into())),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// What the stack holds before the browser opens.
struct Fixture {
    pending_task: String,
    later_task: String,
    campaign: String,
    failed: Vec<String>,
    paused_campaign: String,
}

async fn campaign(
    client: &mut CampaignServiceClient<tonic::transport::Channel>,
    name: &str,
    queue: &str,
    recipients: &[&str],
    start_at: Option<prost_types::Timestamp>,
) -> Result<String> {
    Ok(client
        .create_campaign(CreateCampaignRequest {
            campaign: Some(CampaignSpec {
                name: name.into(),
                queue: queue.into(),
                content: Some(Content {
                    body: Some(content::Body::Text(format!("{name} is here"))),
                    ..Default::default()
                }),
                start_at,
                ..Default::default()
            }),
            recipients: recipients
                .iter()
                .map(|r| CampaignRecipient {
                    recipient: (*r).into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .id)
}

async fn fixture(scheduler: &SchedulerProcess) -> Result<Fixture> {
    let url = scheduler.grpc_url();
    let mut accounts = AccountServiceClient::connect(url.clone()).await?;
    accounts
        .create_account(CreateAccountRequest {
            account: Some(Account {
                credentials_ref: "wa-main-token".into(),
                ..whatsapp_account("wa-main", "wa", 5.0)
            }),
        })
        .await?;
    let mut tasks = connect_tasks(&url).await?;
    // Due now through the pool, with no executor connected: it waits.
    let pending = create_task(
        &mut tasks,
        TaskSpec {
            pool: "wa".into(),
            ..herald_tests::task_spec("notify", "+15550001111", "your parcel is on its way")
        },
    )
    .await?;
    // Due in an hour.
    let later = create_task(
        &mut tasks,
        task_spec("notify", "+15550002222", "see you tomorrow")
            .with_run_at(std::time::SystemTime::now() + std::time::Duration::from_secs(3600)),
    )
    .await?;

    let mut campaigns = CampaignServiceClient::connect(url.clone()).await?;
    let launch = campaign(
        &mut campaigns,
        "launch",
        "camp",
        &["c-1", "c-2", "c-3", "c-4"],
        None,
    )
    .await?;
    // Sends two and fails two, through the real lease stream.
    let mut exec = ScriptedExecutor::connect(&url, "console-exec", &["camp"], 4).await?;
    let leases = exec.leases(4).await?;
    let mut failed = Vec::new();
    let results = leases
        .iter()
        .enumerate()
        .map(|(i, l)| {
            if i % 2 == 0 {
                failed.push(l.task_id.clone());
                result(l, OutcomeClass::Permanent)
            } else {
                result(l, OutcomeClass::Ok)
            }
        })
        .collect();
    exec.report(results).await?;
    exec.close();
    let tomorrow = prost_types::Timestamp {
        seconds: chrono::Utc::now().timestamp() + 86_400,
        nanos: 0,
    };
    let paused = campaign(
        &mut campaigns,
        "autumn",
        "camp",
        &["a-1", "a-2"],
        Some(tomorrow),
    )
    .await?;

    let mut schedules = ScheduleServiceClient::connect(url).await?;
    schedules
        .create_schedule(CreateScheduleRequest {
            schedule: Some(nightly()),
        })
        .await?;
    Ok(Fixture {
        pending_task: pending.id,
        later_task: later.id,
        campaign: launch,
        failed,
        paused_campaign: paused,
    })
}

#[tokio::test]
async fn console_drives_every_page_and_action() -> Result<()> {
    ensure!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: install Debian's chromium package (script/test does)"
    );
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let fx = fixture(&scheduler).await?;

    let profile = std::env::temp_dir().join(format!("herald-chromium-{}", Uuid::new_v4()));
    let config = BrowserConfig::builder()
        .chrome_executable(CHROMIUM)
        .no_sandbox()
        .user_data_dir(&profile)
        .window_size(1280, 900)
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
    let outcome = drive(&browser, &scheduler, &db, &fx).await;
    let _ = browser.close().await;
    let _ = browser.wait().await;
    events.abort();
    let _ = std::fs::remove_dir_all(&profile);
    outcome
}

async fn drive(
    browser: &Browser,
    scheduler: &SchedulerProcess,
    db: &TestDb,
    fx: &Fixture,
) -> Result<()> {
    let base = scheduler.http_url();
    let page = browser.new_page("about:blank").await?;

    // The front page: the pooled task waits for an executor, the later one is not due.
    open(&page, &base, "/console/").await?;
    let not_due: String = js(
        &page,
        "document.querySelector('#not-due strong').textContent",
    )
    .await?;
    // The later task and the two of the campaign that starts tomorrow.
    ensure!(not_due == "3", "not due: {not_due}");
    let kinds: Vec<String> = js(
        &page,
        "[...document.querySelectorAll('#waiting tbody tr')].map((tr) => tr.dataset.kinds)",
    )
    .await?;
    ensure!(
        kinds == ["no executor for its queue"],
        "front page holds: {kinds:?}"
    );
    shoot(&page, "waiting").await?;

    // An executor serving the queue connects, holding another account's credentials: the
    // page (live) names the account whose credentials none holds. Then one that holds them:
    // the task only waits for its next claim. (Credit 0: neither takes it.)
    let holds_kinds = "[...document.querySelectorAll('#waiting tbody tr')].map((tr) => tr.dataset.kinds).join('|')";
    let url = scheduler.grpc_url();
    let other =
        ScriptedExecutor::connect_holding(&url, "other-exec", &["notify"], &["x"], 0).await?;
    wait_for_dom(
        &page,
        &format!("{holds_kinds} === 'no executor holds its credentials'"),
    )
    .await?;
    other.close();
    let holder =
        ScriptedExecutor::connect_holding(&url, "holder-exec", &["notify"], &["wa-main-token"], 0)
            .await?;
    wait_for_dom(&page, &format!("{holds_kinds} === 'next claim'")).await?;
    holder.close();
    wait_for_dom(
        &page,
        &format!("{holds_kinds} === 'no executor for its queue'"),
    )
    .await?;

    // Accounts: pause from the list; the account is paused in the database, and the front
    // page then says the pooled task is held by it.
    open(&page, &base, "/console/accounts").await?;
    shoot(&page, "accounts").await?;
    submit(
        &page,
        "tr[data-account='wa-main'] button[name='state'][value='paused']",
    )
    .await?;
    ensure!(done_message(&page).await?.contains("wa-main paused"));
    let state: String = scalar(
        db,
        "SELECT state::text FROM herald.accounts WHERE id = 'wa-main'",
        &[],
    )
    .await?;
    ensure!(state == "paused", "account is {state}");
    open(&page, &base, "/console/").await?;
    let kinds: Vec<String> = js(
        &page,
        "[...document.querySelectorAll('#waiting tbody tr')].map((tr) => tr.dataset.kinds)",
    )
    .await?;
    ensure!(kinds == ["account paused"], "after the pause: {kinds:?}");
    open(&page, &base, "/console/accounts").await?;
    submit(
        &page,
        "tr[data-account='wa-main'] button[name='state'][value='active']",
    )
    .await?;
    let state: String = scalar(
        db,
        "SELECT state::text FROM herald.accounts WHERE id = 'wa-main'",
        &[],
    )
    .await?;
    ensure!(state == "active", "account is {state} after resume");

    // Edit limits: a bad value is shown next to its field and changes nothing; a good one is
    // saved, and the fields not touched keep their values (an interval of 4.1 s shown in the
    // form stays 4,100 ms). The form is filled with the keyboard.
    db.connect()
        .await?
        .execute(
            "UPDATE herald.accounts SET recipient_interval_ms = 4100 WHERE id = 'wa-main'",
            &[],
        )
        .await?;
    open(&page, &base, "/console/accounts/wa-main").await?;
    type_and_enter(&page, "#f-daily_cap", "-5").await?;
    let error: String = js(
        &page,
        "document.getElementById('e-daily_cap')?.textContent ?? ''",
    )
    .await?;
    ensure!(!error.is_empty(), "no error next to the daily cap field");
    let stored: Option<i32> = scalar(
        db,
        "SELECT daily_cap FROM herald.accounts WHERE id = 'wa-main'",
        &[],
    )
    .await?;
    ensure!(stored.is_none(), "a refused edit stored {stored:?}");
    shoot(&page, "account-invalid").await?;
    page.evaluate_function("() => { document.getElementById('f-daily_cap').value = ''; }")
        .await?;
    type_and_enter(&page, "#f-daily_cap", "250").await?;
    let saved = done_message(&page).await?;
    let errors: Vec<String> = js(&page, "[...document.querySelectorAll('.field-error, #error-message')].map((e) => e.id + ': ' + e.textContent)").await?;
    ensure!(
        saved.contains("limits saved"),
        "after saving: {saved:?}, errors {errors:?}"
    );
    let stored: Option<i32> = scalar(
        db,
        "SELECT daily_cap FROM herald.accounts WHERE id = 'wa-main'",
        &[],
    )
    .await?;
    ensure!(stored == Some(250), "daily cap stored {stored:?}");
    let interval: Option<i64> = scalar(
        db,
        "SELECT recipient_interval_ms FROM herald.accounts WHERE id = 'wa-main'",
        &[],
    )
    .await?;
    ensure!(
        interval == Some(4100),
        "saving the form changed the interval to {interval:?}"
    );
    shoot(&page, "account").await?;

    // Tasks: search by recipient with the keyboard, open the task, see what holds it.
    open(&page, &base, "/console/tasks").await?;
    type_and_enter(&page, "#s-recipient", "+15550001111").await?;
    let rows: Vec<String> = js(
        &page,
        "[...document.querySelectorAll('#tasks tbody tr')].map((tr) => tr.dataset.taskId)",
    )
    .await?;
    ensure!(
        rows == [fx.pending_task.clone()],
        "search by recipient found {rows:?}"
    );
    shoot(&page, "tasks").await?;
    open(&page, &base, &format!("/console/tasks/{}", fx.pending_task)).await?;
    let why: Vec<String> = js(
        &page,
        "[...document.querySelectorAll('#why li')].map((li) => li.dataset.kind)",
    )
    .await?;
    ensure!(
        why == ["no executor for its queue"],
        "task page holds: {why:?}"
    );
    let content: String = js(&page, "document.getElementById('content').textContent").await?;
    ensure!(content.contains("parcel"), "content shown: {content}");
    shoot(&page, "task-waiting").await?;

    // Cancel the later task from its page.
    open(&page, &base, &format!("/console/tasks/{}", fx.later_task)).await?;
    submit(&page, "#cancel-task").await?;
    let id: Uuid = fx.later_task.parse()?;
    let state: String = scalar(
        db,
        "SELECT state::text FROM herald.tasks WHERE id = $1",
        &[&id],
    )
    .await?;
    ensure!(state == "cancelled", "cancelled task is {state}");
    // The confirmation says what the cancel found, in words (it showed `NotStarted`).
    let shown: String = js(&page, "document.body.textContent").await?;
    ensure!(
        shown.contains("is cancelled: it had not been sent"),
        "the confirmation: {shown}"
    );

    // Search by state and campaign: the failed ones.
    open(
        &page,
        &base,
        &format!("/console/tasks?state=failed&campaign={}", fx.campaign),
    )
    .await?;
    let mut rows: Vec<String> = js(
        &page,
        "[...document.querySelectorAll('#tasks tbody tr')].map((tr) => tr.dataset.taskId)",
    )
    .await?;
    rows.sort();
    let mut want = fx.failed.clone();
    want.sort();
    ensure!(rows == want, "failed search {rows:?}, want {want:?}");
    // The export of that search holds the same rows.
    let csv = reqwest::get(format!(
        "{base}/console/tasks.csv?ns=default&state=failed&campaign={}",
        fx.campaign
    ))
    .await?
    .text()
    .await?;
    let lines: Vec<&str> = csv.lines().collect();
    ensure!(
        lines.first().is_some_and(|h| h.starts_with("id,state,")),
        "csv header: {csv}"
    );
    ensure!(lines.len() == 1 + want.len(), "csv rows: {csv}");

    // Search by why they ended, chosen in the form's list.
    open(&page, &base, "/console/tasks").await?;
    page.evaluate("document.getElementById('s-reason').value = 'permanent_error'")
        .await?;
    type_and_enter(&page, "#s-campaign", &fx.campaign).await?;
    let mut rows: Vec<String> = js(
        &page,
        "[...document.querySelectorAll('#tasks tbody tr')].map((tr) => tr.dataset.taskId)",
    )
    .await?;
    rows.sort();
    ensure!(rows == want, "search by reason {rows:?}, want {want:?}");

    // A failed task's page: attempts, and retry.
    let first_failed = &fx.failed[0];
    open(&page, &base, &format!("/console/tasks/{first_failed}")).await?;
    let outcomes: Vec<String> = js(
        &page,
        "[...document.querySelectorAll('#attempts tbody tr')].map((tr) => tr.dataset.outcome)",
    )
    .await?;
    ensure!(outcomes == ["PERMANENT"], "attempts {outcomes:?}");
    shoot(&page, "task-failed").await?;
    submit(&page, "#retry-task").await?;
    let id: Uuid = first_failed.parse()?;
    let state: String = scalar(
        db,
        "SELECT state::text FROM herald.tasks WHERE id = $1",
        &[&id],
    )
    .await?;
    ensure!(state == "scheduled", "retried task is {state}");

    // Campaigns: the list, the failures of the launch by reason, retry the rest of them after
    // the count is shown.
    open(&page, &base, "/console/campaigns").await?;
    let listed: u64 = js(
        &page,
        "document.querySelectorAll('#campaigns tbody tr').length",
    )
    .await?;
    ensure!(listed == 2, "{listed} campaigns listed");
    // The launch's failures, by why they ended, on the list itself.
    let reasons: Vec<String> = js(
        &page,
        &format!(
            "[...document.querySelectorAll(\"tr[data-campaign='{}'] .reason\")].map((d) => d.textContent)",
            fx.campaign
        ),
    )
    .await?;
    ensure!(
        reasons == ["permanent_error 1"],
        "failed by reason {reasons:?}"
    );
    shoot(&page, "campaigns").await?;
    open(&page, &base, &format!("/console/campaigns/{}", fx.campaign)).await?;
    let sent: String = js(&page, "document.getElementById('c-sent').textContent").await?;
    ensure!(sent == "2", "campaign sent {sent}");
    let delivered: String = js(&page, "document.getElementById('c-delivered').textContent").await?;
    ensure!(delivered == "0", "campaign delivered {delivered}");
    // The sparkline counts the two sends of the last hour.
    let spark: String = js(
        &page,
        "document.querySelector('#live-campaign svg.spark').getAttribute('aria-label')",
    )
    .await?;
    ensure!(spark.starts_with("2 sent"), "sparkline {spark}");
    let reasons: Vec<String> = js(
        &page,
        "[...document.querySelectorAll('#reasons tbody tr')].map((tr) => tr.dataset.reason)",
    )
    .await?;
    ensure!(
        reasons == ["permanent_error"],
        "failures by reason {reasons:?}"
    );
    shoot(&page, "campaign").await?;
    submit(&page, "#reasons a.retry-reason").await?;
    let count: String = js(
        &page,
        "document.querySelector('#retry-count strong').textContent",
    )
    .await?;
    ensure!(count == "1", "retry would take {count} tasks");
    shoot(&page, "campaign-retry").await?;
    submit(&page, "#confirm-retry").await?;
    ensure!(done_message(&page)
        .await?
        .contains("retrying 1 failed tasks (permanent_error)"));
    // The bulk operation's page follows it until it is done.
    wait_for_dom(
        &page,
        "document.getElementById('bulk-state').textContent === 'done'",
    )
    .await?;
    let processed: String = js(
        &page,
        "document.getElementById('bulk-processed').textContent",
    )
    .await?;
    ensure!(processed == "1", "bulk processed {processed}");
    shoot(&page, "bulk").await?;
    let campaign: Uuid = fx.campaign.parse()?;
    let still_failed: i64 = scalar(
        db,
        "SELECT count(*) FROM herald.tasks WHERE campaign_id = $1 AND state = 'failed'",
        &[&campaign],
    )
    .await?;
    ensure!(
        still_failed == 0,
        "{still_failed} still failed after the retry"
    );

    // Every list's export: a header row, then one row per item the list shows.
    let campaign_id = &fx.campaign;
    for (path, header, rows) in [
        ("/console/accounts.csv".to_owned(), "id,", 1),
        ("/console/campaigns.csv".to_owned(), "id,name,state,", 2),
        ("/console/schedules.csv".to_owned(), "id,cron,", 1),
        (
            format!("/console/campaigns/{campaign_id}/failures.csv"),
            "end_reason,provider_code,",
            0,
        ),
    ] {
        let csv = reqwest::get(format!("{base}{path}?ns=default"))
            .await?
            .text()
            .await?;
        let lines: Vec<&str> = csv.lines().collect();
        ensure!(
            lines.first().is_some_and(|h| h.starts_with(header)),
            "{path} header: {csv}"
        );
        ensure!(lines.len() == 1 + rows, "{path} rows: {csv}");
    }

    // Pause, resume and cancel the other campaign.
    let autumn: Uuid = fx.paused_campaign.parse()?;
    let campaign_state = || async {
        scalar::<String>(
            db,
            "SELECT state::text FROM herald.campaigns WHERE id = $1",
            &[&autumn],
        )
        .await
    };
    open(&page, &base, &format!("/console/campaigns/{autumn}")).await?;
    submit(&page, "button[name='action'][value='pause']").await?;
    ensure!(campaign_state().await? == "paused");
    let parked: i64 = scalar(
        db,
        "SELECT count(*) FROM herald.tasks WHERE campaign_id = $1 AND route LIKE 'paused:%'",
        &[&autumn],
    )
    .await?;
    ensure!(parked == 2, "{parked} tasks parked");
    submit(&page, "button[name='action'][value='resume']").await?;
    ensure!(campaign_state().await? == "active");
    // Cancelling asks first, saying what it will do; nothing changes until confirmed.
    submit(&page, "#cancel-campaign").await?;
    let asked = js::<String>(&page, "document.getElementById('cancel-count').textContent").await?;
    ensure!(
        asked.contains("2 queued tasks will be cancelled"),
        "{asked}"
    );
    ensure!(campaign_state().await? == "active");
    submit(&page, "#confirm-cancel").await?;
    ensure!(campaign_state().await? == "cancelled");
    let cancelled: i64 = scalar(
        db,
        "SELECT count(*) FROM herald.tasks WHERE campaign_id = $1 AND state = 'cancelled'",
        &[&autumn],
    )
    .await?;
    ensure!(cancelled == 2, "{cancelled} tasks cancelled");

    // Schedules: next fires in the schedule's zone, a preview of 10, pause and resume.
    open(&page, &base, "/console/schedules").await?;
    let next: String = js(
        &page,
        "document.querySelector(\"tr[data-schedule='nightly'] td:nth-child(3)\").textContent",
    )
    .await?;
    ensure!(
        next.contains("03:00:00") && next.contains("Europe/Berlin"),
        "next fire {next}"
    );
    shoot(&page, "schedules").await?;
    submit(&page, "tr[data-schedule='nightly'] button[value='pause']").await?;
    let paused: bool = scalar(
        db,
        "SELECT paused FROM herald.schedules WHERE id = 'nightly'",
        &[],
    )
    .await?;
    ensure!(paused, "schedule not paused");
    let preview: u64 = js(&page, "document.querySelectorAll('#preview li').length").await?;
    ensure!(preview == 10, "{preview} fires previewed");
    submit(&page, "button[name='action'][value='resume']").await?;
    let paused: bool = scalar(
        db,
        "SELECT paused FROM herald.schedules WHERE id = 'nightly'",
        &[],
    )
    .await?;
    ensure!(!paused, "schedule still paused");
    // Run it now: a manual run with its task, and the next fire unchanged.
    submit(&page, "#run-now").await?;
    ensure!(
        done_message(&page).await?.contains("1 task(s) created"),
        "run now: {}",
        done_message(&page).await?
    );
    let manual: i64 = scalar(
        db,
        "SELECT count(*) FROM herald.schedule_runs WHERE schedule_id = 'nightly' AND kind = 'manual'",
        &[],
    )
    .await?;
    ensure!(manual == 1, "{manual} manual runs");
    let run_tasks: i64 = scalar(
        db,
        "SELECT count(*) FROM herald.tasks WHERE schedule_id = 'nightly'",
        &[],
    )
    .await?;
    ensure!(run_tasks == 1, "{run_tasks} tasks from the manual run");
    shoot(&page, "schedule").await?;

    // Live: a task created meanwhile shows on the open front page without a reload.
    open(&page, &base, "/console/").await?;
    wait_for_dom(&page, "document.body.dataset.live === '1'").await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    create_task(
        &mut tasks,
        herald_tests::task_spec("late-queue", "+15550003333", "hello"),
    )
    .await?;
    wait_for_dom(
        &page,
        "[...document.querySelectorAll('#waiting tbody td:first-child')].some((td) => td.textContent === 'late-queue')",
    )
    .await?;
    let reloads: String = js(&page, "document.body.dataset.refreshes").await?;
    ensure!(reloads != "0", "the page changed without a refresh");
    Ok(())
}

#[tokio::test]
async fn a_viewer_reads_but_cannot_act_and_cross_site_posts_are_refused() -> Result<()> {
    let db = TestDb::new().await?;
    let admin = TestToken::new("ops", &["admin", "client"], &["default"]);
    let viewer = TestToken::new("support", &["viewer"], &["default"]);
    let (scheduler, _tokens) = with_tokens(&db, &[admin.clone(), viewer.clone()]).await?;
    let mut accounts = AccountServiceClient::connect(scheduler.grpc_url()).await?;
    accounts
        .create_account(admin.request(
            CreateAccountRequest {
                account: Some(whatsapp_account("wa-main", "wa", 5.0)),
            },
            None,
        ))
        .await?;
    let http = reqwest::Client::new();
    let base = scheduler.http_url();
    for path in [
        "/console/",
        "/console/accounts",
        "/console/tasks",
        "/console/accounts.csv",
    ] {
        let r = http
            .get(format!("{base}{path}"))
            .basic_auth("support", Some(&viewer.token))
            .send()
            .await?;
        assert_eq!(r.status(), 200, "a viewer reads {path}");
    }
    let page = http
        .get(format!("{base}/console/accounts"))
        .basic_auth("support", Some(&viewer.token))
        .send()
        .await?
        .text()
        .await?;
    assert!(
        page.contains("read only") && !page.contains("name=\"state\""),
        "a viewer sees no actions"
    );
    let pause = |token: &str, origin: Option<&str>| {
        let mut r = http
            .post(format!("{base}/console/accounts/wa-main/state"))
            .basic_auth("x", Some(token))
            .form(&[("state", "paused")]);
        if let Some(o) = origin {
            r = r.header("origin", o).header("sec-fetch-site", "cross-site");
        }
        r.send()
    };
    assert_eq!(
        pause(&viewer.token, None).await?.status(),
        403,
        "a viewer cannot act"
    );
    assert_eq!(
        pause(&admin.token, Some("https://elsewhere.example"))
            .await?
            .status(),
        403,
        "a cross-site form cannot act"
    );
    let state = || async {
        let c = db.connect().await?;
        anyhow::Ok(
            c.query_one(
                "SELECT state::text FROM herald.accounts WHERE id = 'wa-main'",
                &[],
            )
            .await?
            .get::<_, String>(0),
        )
    };
    assert_eq!(state().await?, "active", "refused posts changed nothing");
    let ok = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?
        .post(format!("{base}/console/accounts/wa-main/state"))
        .basic_auth("x", Some(&admin.token))
        .form(&[("state", "paused")])
        .send()
        .await?;
    assert_eq!(ok.status(), 303, "the admin's own post");
    assert_eq!(state().await?, "paused");
    // A `back` a Location header cannot hold goes to the accounts page (it was a 500).
    let odd = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?
        .post(format!("{base}/console/accounts/wa-main/state"))
        .basic_auth("x", Some(&admin.token))
        .form(&[
            ("state", "active"),
            ("back", "/console/x\r\nSet-Cookie: a=b"),
        ])
        .send()
        .await?;
    assert_eq!(odd.status(), 303);
    let location = odd
        .headers()
        .get("location")
        .and_then(|l| l.to_str().ok())
        .unwrap_or_default();
    assert!(location.starts_with("/console/accounts?"), "{location}");
    assert!(odd.headers().get("set-cookie").is_none());
    assert_eq!(state().await?, "active");

    // Nor can a viewer run a schedule or start a bulk retry.
    ScheduleServiceClient::connect(scheduler.grpc_url())
        .await?
        .create_schedule(admin.request(
            CreateScheduleRequest {
                schedule: Some(nightly()),
            },
            None,
        ))
        .await?;
    for path in [
        "/console/schedules/nightly/run",
        "/console/campaigns/00000000-0000-0000-0000-000000000000/retry",
    ] {
        let r = http
            .post(format!("{base}{path}"))
            .basic_auth("support", Some(&viewer.token))
            .form(&[("reason", "exhausted")])
            .send()
            .await?;
        assert_eq!(r.status(), 403, "a viewer cannot post {path}");
    }
    let runs: i64 = db
        .connect()
        .await?
        .query_one("SELECT count(*) FROM herald.schedule_runs", &[])
        .await?
        .get(0);
    assert_eq!(runs, 0, "a refused run-now ran");
    Ok(())
}

/// Another site cannot frame the console (a framed page would take the operator's clicks as
/// its own), and a token's request rate binds its console reads as it binds its RPCs.
#[tokio::test]
async fn the_console_cannot_be_framed_and_a_tokens_rate_binds_it_too() -> Result<()> {
    let db = TestDb::new().await?;
    let admin = TestToken::new("ops", &["admin", "client"], &["default"]);
    let viewer = TestToken::new("support", &["viewer"], &["default"]).with_rate(1, 2);
    let (scheduler, _tokens) = with_tokens(&db, &[admin.clone(), viewer.clone()]).await?;
    let http = reqwest::Client::new();
    let base = scheduler.http_url();
    for path in ["/console/", "/console/tasks.csv", "/dashboard/", "/healthz"] {
        let r = http
            .get(format!("{base}{path}"))
            .basic_auth("ops", Some(&admin.token))
            .send()
            .await?;
        assert_eq!(r.status(), 200, "{path}");
        let header = |name: &str| {
            r.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        assert_eq!(header("x-frame-options").as_deref(), Some("DENY"), "{path}");
        assert_eq!(
            header("content-security-policy").as_deref(),
            Some("frame-ancestors 'none'"),
            "{path}"
        );
        assert_eq!(header("x-content-type-options").as_deref(), Some("nosniff"));
    }
    // A burst of two, then refused with when to come back; the admin's token is not limited.
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let r = http
            .get(format!("{base}/console/tasks.csv"))
            .basic_auth("support", Some(&viewer.token))
            .send()
            .await?;
        if r.status() == 429 {
            assert!(r.headers().contains_key("retry-after"), "{:?}", r.headers());
        }
        statuses.push(r.status().as_u16());
    }
    assert!(
        statuses.contains(&429),
        "the viewer was never limited: {statuses:?}"
    );
    let r = http
        .get(format!("{base}/console/"))
        .basic_auth("ops", Some(&admin.token))
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    // An error page keeps the operator in the namespace they were in: its links led to the
    // default one.
    let error = http
        .get(format!("{base}/console/tasks?ns=default&state=bad"))
        .basic_auth("ops", Some(&admin.token))
        .send()
        .await?;
    assert_eq!(error.status(), 400);
    let page = error.text().await?;
    assert!(
        page.contains("href=\"/console/tasks?ns=default\""),
        "{page}"
    );
    // The harness also allows anonymous callers, which a tokens file does not switch off: the
    // scheduler says so at start, since shipped that way the tokens restrict nobody.
    assert!(
        scheduler
            .stderr_all()
            .contains("HERALD_ALLOW_ANONYMOUS=true with a tokens file"),
        "{}",
        scheduler.stderr_tail()
    );
    Ok(())
}

/// Without a token the console answers only under names no other site can own: a page that
/// points a name of its own at the listener (DNS rebinding) is refused, reads and actions
/// alike, and changes nothing; the same request with a token, or under `localhost`, is served.
#[tokio::test]
async fn an_anonymous_console_refuses_a_host_name_another_site_could_own() -> Result<()> {
    let db = TestDb::new().await?;
    let admin = TestToken::new("ops", &["admin", "client"], &["default"]);
    let (scheduler, _tokens) = with_tokens(&db, std::slice::from_ref(&admin)).await?;
    let http = reqwest::Client::new();
    let base = scheduler.http_url();
    let port = base
        .rsplit(':')
        .next()
        .context("no port in the listener's url")?;
    let rebound = format!("attacker.example:{port}");
    let read = http
        .get(format!("{base}/console/"))
        .header("host", &rebound)
        .send()
        .await?;
    assert_eq!(read.status(), 403, "an anonymous read under a foreign name");
    let body = read.text().await?;
    assert!(body.contains("localhost"), "{body}");
    let task = create_task(
        &mut connect_tasks(&scheduler.grpc_url()).await?,
        task_spec("notify", "+15550003333", "hello"),
    )
    .await?;
    let act = http
        .post(format!("{base}/console/tasks/{}/cancel", task.id))
        .header("host", &rebound)
        .header("sec-fetch-site", "same-origin")
        .send()
        .await?;
    assert_eq!(
        act.status(),
        403,
        "an anonymous action under a foreign name"
    );
    let state: String = db
        .connect()
        .await?
        .query_one(
            "SELECT state::text FROM herald.tasks WHERE id = $1",
            &[&Uuid::parse_str(&task.id)?],
        )
        .await?
        .get(0);
    assert_eq!(state, "scheduled", "a refused action changed the task");
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        let r = http
            .get(format!("{base}/console/"))
            .header("host", &host)
            .send()
            .await?;
        assert_eq!(r.status(), 200, "{host}");
    }
    let with_token = http
        .get(format!("{base}/console/"))
        .header("host", &rebound)
        .basic_auth("ops", Some(&admin.token))
        .send()
        .await?;
    assert_eq!(with_token.status(), 200, "a token's caller under any name");
    // Probes stay open to anything that can reach the port (kubelet uses the pod's IP, but a
    // Service name works too).
    let probe = http
        .get(format!("{base}/readyz"))
        .header("host", &rebound)
        .send()
        .await?;
    assert_eq!(probe.status(), 200);
    Ok(())
}

/// A search by recipient finds the recipient's tasks in every state and nobody else's: the
/// recipient index leaves leased tasks out (migration 32), so they are found another way. The
/// number spelled with or without its `+` is one recipient, searched either way (as the
/// suppression list compares them; WhatsApp shows it without).
#[tokio::test]
async fn a_search_by_recipient_finds_its_tasks_in_every_state() -> Result<()> {
    const RECIPIENT: &str = "+15550002222";
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let later = create_task(
        &mut tasks,
        task_spec("later", RECIPIENT, "later").with_delay(Duration::from_secs(3600)),
    )
    .await?
    .id;
    create_task(
        &mut tasks,
        task_spec("later", "+15550003333", "someone else").with_delay(Duration::from_secs(3600)),
    )
    .await?;
    let bare = create_task(
        &mut tasks,
        task_spec("later", "15550002222", "without the plus").with_delay(Duration::from_secs(3600)),
    )
    .await?
    .id;
    let sent = create_task(&mut tasks, task_spec("now", RECIPIENT, "sent"))
        .await?
        .id;
    let mut exec =
        ScriptedExecutor::connect(&scheduler.grpc_url(), "searched", &["now"], 1).await?;
    let first = exec.leases(1).await?;
    ensure!(first[0].task_id == sent, "leased {first:?}");
    exec.report(vec![result(&first[0], OutcomeClass::Ok)])
        .await?;
    let held = create_task(&mut tasks, task_spec("now", RECIPIENT, "held"))
        .await?
        .id;
    exec.credit(1).await?;
    let second = exec.leases(1).await?;
    ensure!(second[0].task_id == held, "leased {second:?}");

    let mut want = vec![
        (later, "scheduled".to_owned()),
        (bare, "scheduled".to_owned()),
        (sent, "succeeded".to_owned()),
        (held, "leased".to_owned()),
    ];
    want.sort();
    for spelled in ["%2B15550002222", "15550002222"] {
        let csv = reqwest::get(format!(
            "{}/console/tasks.csv?ns=default&recipient={spelled}",
            scheduler.http_url()
        ))
        .await?
        .error_for_status()?
        .text()
        .await?;
        let mut found: Vec<(String, String)> = csv
            .lines()
            .skip(1)
            .filter_map(|line| {
                let mut fields = line.split(',');
                Some((fields.next()?.to_owned(), fields.next()?.to_owned()))
            })
            .collect();
        found.sort();
        ensure!(
            found == want,
            "search by {spelled} found {found:?}, want {want:?}:\n{csv}"
        );
    }
    Ok(())
}

/// "Why is it waiting" groups a pooled task by its pool, as its own page explains it: the
/// account of its last attempt, kept on the task, does not hold it (another account of the
/// pool may send it). The front page said a paused account held it.
#[tokio::test]
async fn a_pooled_task_waits_on_its_pool_not_on_its_last_account() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut accounts = AccountServiceClient::connect(scheduler.grpc_url()).await?;
    for id in ["wa-main", "wa-backup"] {
        accounts
            .create_account(CreateAccountRequest {
                account: Some(whatsapp_account(id, "wa", 5.0)),
            })
            .await?;
    }
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let spec = TaskSpec {
        pool: "wa".into(),
        ..task_spec("orders", "+15550009999", "hi")
    };
    create_task(&mut tasks, spec).await?;
    // As after an attempt through wa-main, which was then paused.
    let conn = db.connect().await?;
    conn.execute("UPDATE herald.tasks SET account_id = 'wa-main'", &[])
        .await?;
    conn.execute(
        "UPDATE herald.accounts SET state = 'paused' WHERE id = 'wa-main'",
        &[],
    )
    .await?;
    let page = reqwest::get(format!("{}/console/?ns=default", scheduler.http_url()))
        .await?
        .text()
        .await?;
    ensure!(page.contains("pool wa"), "{page}");
    ensure!(!page.contains("account wa-main"), "{page}");
    Ok(())
}

/// A task's page, and the overview, weigh every account of its pool: with the first hundred
/// paused and the hundred-and-first free, the pool holds nothing (the pages once read only the
/// first hundred and blamed the pool).
#[tokio::test]
async fn a_pooled_tasks_page_weighs_every_account_of_its_pool() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut accounts = AccountServiceClient::connect(scheduler.grpc_url()).await?;
    for n in 0..=100 {
        accounts
            .create_account(CreateAccountRequest {
                account: Some(whatsapp_account(&format!("wa-{n:03}"), "wa", 5.0)),
            })
            .await?;
    }
    let conn = db.connect().await?;
    conn.execute(
        "UPDATE herald.accounts SET state = 'paused' WHERE id <> 'wa-100'",
        &[],
    )
    .await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let task = create_task(
        &mut tasks,
        TaskSpec {
            pool: "wa".into(),
            ..task_spec("orders", "+15550009998", "hi")
        },
    )
    .await?;
    let page = reqwest::get(format!(
        "{}/console/tasks/{}?ns=default",
        scheduler.http_url(),
        task.id
    ))
    .await?
    .text()
    .await?;
    ensure!(
        !page.contains("is paused by an operator"),
        "the pool's free account was not weighed: {page}"
    );
    ensure!(page.contains("executor"), "{page}");
    // The overview's "why is it waiting" weighs the same accounts.
    let overview = reqwest::get(format!("{}/console/?ns=default", scheduler.http_url()))
        .await?
        .text()
        .await?;
    ensure!(
        overview.contains("no executor") && !overview.contains("is paused by an operator"),
        "the overview did not weigh the pool's free account: {overview}"
    );
    Ok(())
}

/// A cancelled campaign's failures cannot be retried (nothing of it is sent any more): its page
/// offers no "Retry all", and the retry's confirm page and post answer 409 saying why, instead
/// of counting the tasks and reporting a retry that changes nothing.
#[tokio::test]
async fn a_cancelled_campaign_offers_no_retry_and_refuses_one() -> Result<()> {
    use herald_proto::v1::CancelCampaignRequest;
    let db = TestDb::new().await?;
    let admin = TestToken::new("ops", &["admin", "client"], &["default"]);
    let (scheduler, _tokens) = with_tokens(&db, std::slice::from_ref(&admin)).await?;
    let mut campaigns = CampaignServiceClient::connect(scheduler.grpc_url()).await?;
    let id = campaigns
        .create_campaign(admin.request(
            CreateCampaignRequest {
                campaign: Some(CampaignSpec {
                    name: "gone".into(),
                    queue: "offers".into(),
                    content: Some(Content {
                        body: Some(content::Body::Text("hi".into())),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                recipients: vec![CampaignRecipient {
                    recipient: "+15550004444".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
            None,
        ))
        .await?
        .into_inner()
        .id;
    // Its task failed for good, then the campaign was cancelled.
    db.connect()
        .await?
        .execute(
            "UPDATE herald.tasks SET state = 'failed', end_reason = 'permanent_error',
                 finished_at = now() WHERE campaign_id = $1::text::uuid",
            &[&id],
        )
        .await?;
    campaigns
        .cancel_campaign(admin.request(CancelCampaignRequest { id: id.clone() }, None))
        .await?;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let base = scheduler.http_url();
    let page = http
        .get(format!("{base}/console/campaigns/{id}?ns=default"))
        .basic_auth("ops", Some(&admin.token))
        .send()
        .await?
        .text()
        .await?;
    assert!(page.contains("permanent_error"), "the failure is shown");
    assert!(
        !page.contains("retry-reason"),
        "a cancelled campaign offers a retry"
    );
    let confirm = http
        .get(format!(
            "{base}/console/campaigns/{id}/retry?reason=permanent_error&ns=default"
        ))
        .basic_auth("ops", Some(&admin.token))
        .send()
        .await?;
    assert_eq!(confirm.status(), 409);
    assert!(confirm.text().await?.contains("cancelled"));
    let post = http
        .post(format!("{base}/console/campaigns/{id}/retry?ns=default"))
        .basic_auth("ops", Some(&admin.token))
        .form(&[("reason", "permanent_error")])
        .send()
        .await?;
    assert_eq!(post.status(), 409);
    let operations: i64 = db
        .connect()
        .await?
        .query_one("SELECT count(*) FROM herald.bulk_operations", &[])
        .await?
        .get(0);
    assert_eq!(operations, 0, "a retry was started");
    Ok(())
}

/// The suppression list's page: a viewer reads it and cannot change it; an admin suppresses a
/// recipient by hand (checked as AddSuppressions checks, in either spelling), sees and checks
/// the entry, and removes it.
#[tokio::test]
async fn the_opt_out_page_lists_checks_adds_and_removes_suppressions() -> Result<()> {
    let db = TestDb::new().await?;
    let admin = TestToken::new("ops", &["admin", "client"], &["default"]);
    let viewer = TestToken::new("support", &["viewer"], &["default"]);
    let (scheduler, _tokens) = with_tokens(&db, &[admin.clone(), viewer.clone()]).await?;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let base = scheduler.http_url();
    let get = |token: &str, query: &str| {
        http.get(format!("{base}/console/suppressions?ns=default{query}"))
            .basic_auth("x", Some(token.to_owned()))
            .send()
    };
    let post = |token: &str, path: &str, form: &[(&str, &str)]| {
        http.post(format!("{base}/console/suppressions{path}?ns=default"))
            .basic_auth("x", Some(token.to_owned()))
            .form(form)
            .send()
    };
    let empty = get(&viewer.token, "").await?;
    assert_eq!(empty.status(), 200);
    let page = empty.text().await?;
    assert!(page.contains("Nobody is suppressed") && page.contains("Opt-outs"));
    assert!(!page.contains("id=\"add\""), "a viewer sees the add form");
    let refused = post(&viewer.token, "", &[("recipient", "+15550006666")]).await?;
    assert_eq!(refused.status(), 403, "a viewer cannot suppress");

    let bad = post(&admin.token, "", &[("recipient", "+")]).await?;
    assert_eq!(bad.status(), 400, "an empty number is refused");
    let added = post(
        &admin.token,
        "",
        &[("recipient", "+15550006666"), ("note", "asked by phone")],
    )
    .await?;
    assert_eq!(added.status(), 303);
    // The redirect's banner says what was done; a link someone else made says nothing.
    let back = added
        .headers()
        .get("location")
        .context("the add redirects")?
        .to_str()?
        .to_owned();
    let shown = http
        .get(format!("{base}{back}"))
        .basic_auth("x", Some(admin.token.clone()))
        .send()
        .await?
        .text()
        .await?;
    assert!(
        shown.contains("id=\"done\""),
        "no banner after the add: {shown}"
    );
    let forged = get(&admin.token, "&done=Account+closed%2C+call+555-0100").await?;
    let forged = forged.text().await?;
    assert!(
        !forged.contains("id=\"done\"") && !forged.contains("Account closed"),
        "a forged banner shows: {forged}"
    );
    let listed = get(&admin.token, "").await?.text().await?;
    assert!(
        listed.contains("data-recipient=\"15550006666\"") && listed.contains("asked by phone"),
        "the entry is listed: {listed}"
    );
    let checked = get(&admin.token, "&q=15550006666").await?.text().await?;
    assert!(checked.contains("data-listed=\"yes\""), "{checked}");

    let removed = post(&admin.token, "/remove", &[("recipient", "15550006666")]).await?;
    assert_eq!(removed.status(), 303);
    let checked = get(&admin.token, "&q=%2B15550006666").await?.text().await?;
    assert!(checked.contains("data-listed=\"no\""), "{checked}");
    let missing = post(&admin.token, "/remove", &[("recipient", "15550006666")]).await?;
    assert_eq!(missing.status(), 404, "removing what is not listed");
    Ok(())
}

/// A scheduler that knows `tokens`; the file it reads them from lives as long as the handle.
async fn with_tokens(
    db: &TestDb,
    tokens: &[TestToken],
) -> Result<(SchedulerProcess, herald_tests::security::TokensFile)> {
    let file = write_tokens_file(tokens)?;
    let scheduler = SchedulerProcess::builder(db)
        .env("HERALD_AUTH_TOKENS_FILE", &file.path)
        .spawn()
        .await?;
    Ok((scheduler, file))
}
