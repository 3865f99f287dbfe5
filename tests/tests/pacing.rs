//! Sending like a careful operator (#17), on the test clock: warm-up ramps over simulated days,
//! human-like gaps, recipient-local send windows across midnight, messaging tiers over a
//! rolling 24 hours, re-routing without an attempt charged, sticky routing, an unhealthy
//! account pausing itself, and the two defects the issue names. Days pass in seconds:
//! `herald.set_test_clock` moves the scheduler's clock (SQL and Rust) and wakes its
//! dispatchers, and every assertion reads the database or the lease stream, never the wall
//! clock.

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use chrono::{DateTime, Utc};
use herald_proto::v1::account_service_client::AccountServiceClient;
use herald_proto::v1::{executor_message, Lease, ReportBatch};
use herald_proto::v1::{
    scheduler_message, Account, AccountLimits, AccountState, CreateAccountRequest,
    CreatePoolRequest, ListAttemptsRequest, MessagingTier, OutcomeClass, Pool,
    RecordInboundRequest, SendGaps, SendWindow, TaskSpec, TaskState, UpdateAccountRequest, WarmUp,
};
use herald_tests::accounts::{accounts_client, create_many, get_account, pooled};
use herald_tests::lease::{result, ScriptedExecutor};
use herald_tests::{connect_tasks, task_spec, SchedulerProcess, TestDb, WebhookReceiver};
use tonic::transport::Channel;

const WAIT: Duration = Duration::from_secs(30);

/// Sets the scheduler's clock to `at` (an RFC 3339 instant); it runs on from there.
async fn set_clock(conn: &tokio_postgres::Client, at: &str) -> Result<()> {
    conn.execute(
        "SELECT herald.set_test_clock($1::text::timestamptz - now())",
        &[&at],
    )
    .await
    .with_context(|| format!("setting the test clock to {at}"))?;
    Ok(())
}

/// Sets the scheduler's clock to `at`.
async fn set_clock_to(conn: &tokio_postgres::Client, at: DateTime<Utc>) -> Result<()> {
    set_clock(conn, &at.to_rfc3339()).await
}

fn limits(rate: f64) -> AccountLimits {
    AccountLimits {
        rate_per_second: rate,
        burst: Some(rate as i32),
        ..Default::default()
    }
}

async fn create_account(
    client: &mut AccountServiceClient<Channel>,
    id: &str,
    pool: &str,
    limits: AccountLimits,
) -> Result<Account> {
    Ok(client
        .create_account(CreateAccountRequest {
            account: Some(Account {
                id: id.into(),
                sender_kind: "webhook".into(),
                pool: pool.into(),
                limits: Some(limits),
                ..Default::default()
            }),
        })
        .await?
        .into_inner())
}

/// Waits for `n` leases, skipping heartbeats and report acks.
async fn leases(exec: &mut ScriptedExecutor, n: usize) -> Result<Vec<Lease>> {
    let mut out = Vec::new();
    while out.len() < n {
        match exec
            .next_within(WAIT)
            .await
            .with_context(|| format!("waiting for lease {} of {n}", out.len() + 1))?
        {
            scheduler_message::Kind::Leases(batch) => out.extend(batch.leases),
            scheduler_message::Kind::Heartbeat(_) | scheduler_message::Kind::ReportAcks(_) => {}
            other => bail!("expected leases, got {other:?}"),
        }
    }
    ensure!(out.len() == n, "expected {n} leases, got {}", out.len());
    Ok(out)
}

/// Reports every lease with `outcome` and gives their credit back.
async fn report(exec: &ScriptedExecutor, leases: &[Lease], outcome: OutcomeClass) -> Result<()> {
    exec.send(executor_message::Kind::Report(ReportBatch {
        results: leases.iter().map(|l| result(l, outcome)).collect(),
    }))
    .await?;
    exec.credit(leases.len() as u32).await
}

/// Polls the database until `sql` (a count) returns `want`: a claim moving tasks is a database
/// state with no event to await.
async fn wait_for_count(conn: &tokio_postgres::Client, sql: &str, want: i64) -> Result<()> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let n: i64 = conn.query_one(sql, &[]).await?.get("n");
        if n == want {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("{sql} stayed at {n}, expected {want}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What an account may still send now, by the limit functions themselves.
async fn room(conn: &tokio_postgres::Client, account: &str) -> Result<(i32, i32)> {
    let row = conn
        .query_one(
            "SELECT r.room, r.tier_room FROM herald.accounts a,
                    herald.account_room(a, herald.now()) r WHERE a.id = $1",
            &[&account],
        )
        .await?;
    Ok((row.get("room"), row.get("tier_room")))
}

#[tokio::test]
async fn a_warm_up_ramp_raises_the_daily_cap_day_by_day_over_ten_days() -> Result<()> {
    let db = TestDb::new().await?;
    let conn = db.connect().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    set_clock(&conn, "2029-12-31T12:00:00+08:00").await?;
    let mut accounts = accounts_client(&url).await?;
    let mut account = Account {
        id: "fresh".into(),
        sender_kind: "webhook".into(),
        pool: "new-numbers".into(),
        time_zone: "Asia/Shanghai".into(),
        limits: Some(AccountLimits {
            warm_up: Some(WarmUp {
                start_date: "2030-01-01".into(),
                initial: Some(3),
                step: Some(2),
                ceiling: Some(9),
                per_day: Vec::new(),
            }),
            ..limits(1000.0)
        }),
        ..Default::default()
    };
    account = accounts
        .create_account(CreateAccountRequest {
            account: Some(account),
        })
        .await?
        .into_inner();
    let status = account.status.clone().unwrap_or_default();
    assert_eq!(
        (status.today_cap, status.ramp_day),
        (Some(0), Some(0)),
        "before its start the ramp allows nothing"
    );

    let mut tasks = connect_tasks(&url).await?;
    let specs = (0..100)
        .map(|i| pooled("new-numbers", &format!("+86130{i:05}")))
        .collect();
    create_many(&mut tasks, specs).await?;
    let mut exec = ScriptedExecutor::connect(&url, "ramp", &[], 100).await?;

    let mut total = 0;
    for day in 1..=10 {
        set_clock(&conn, &format!("2030-01-{day:02}T09:00:00+08:00")).await?;
        let cap = (3 + 2 * (day - 1)).min(9);
        let granted = leases(&mut exec, cap as usize).await?;
        report(&exec, &granted, OutcomeClass::Ok).await?;
        total += cap;
        let status = get_account(&mut accounts, "fresh")
            .await?
            .status
            .unwrap_or_default();
        assert_eq!(status.today_cap, Some(cap), "day {day}");
        assert_eq!(status.ramp_day, Some(day), "day {day}");
        assert_eq!(status.today_count, cap, "day {day}");
        assert_eq!(room(&conn, "fresh").await?.0, 0, "day {day}: cap reached");
        // Counted from the tasks never leased: by day 9 the retention job may already have
        // pruned day 1's finished tasks, but it never touches one still waiting.
        let never_leased: i64 = conn
            .query_one(
                "SELECT count(*) AS n FROM herald.task_records WHERE lease_count = 0",
                &[],
            )
            .await?
            .get("n");
        assert_eq!(
            never_leased,
            100 - i64::from(total),
            "day {day}: nothing beyond the caps"
        );
    }
    Ok(())
}

/// Gaps of `min_ms` to `max_ms` between an account's sends.
fn gaps(min_ms: i64, max_ms: i64) -> SendGaps {
    let ms = |ms: i64| prost_types::Duration {
        seconds: ms / 1000,
        nanos: (ms % 1000) as i32 * 1_000_000,
    };
    SendGaps {
        min: Some(ms(min_ms)),
        max: Some(ms(max_ms)),
    }
}

/// A pool `p` of one account `id` with gaps of `min_ms`-`max_ms`, `sends` tasks due in it, and a
/// scripted executor with credit for all of them.
async fn gapped_pool(
    id: &str,
    min_ms: i64,
    max_ms: i64,
    sends: usize,
) -> Result<(
    TestDb,
    tokio_postgres::Client,
    SchedulerProcess,
    ScriptedExecutor,
)> {
    let db = TestDb::new().await?;
    let conn = db.connect().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    let mut accounts = accounts_client(&url).await?;
    create_account(
        &mut accounts,
        id,
        "p",
        AccountLimits {
            gaps: Some(gaps(min_ms, max_ms)),
            ..limits(1000.0)
        },
    )
    .await?;
    let mut tasks = connect_tasks(&url).await?;
    let specs = (0..sends)
        .map(|i| pooled("p", &format!("+1555{i:04}")))
        .collect();
    create_many(&mut tasks, specs).await?;
    let exec = ScriptedExecutor::connect(&url, id, &[], sends as u32).await?;
    Ok((db, conn, scheduler, exec))
}

/// The gaps between consecutive grant instants of every leased task, in ms, after checking
/// that each of the `sends` tasks got an instant of its own.
async fn grant_gaps_ms(conn: &tokio_postgres::Client, sends: usize) -> Result<Vec<i64>> {
    let mut times: Vec<DateTime<Utc>> = conn
        .query(
            "SELECT leased_at FROM herald.task_records WHERE lease_count > 0 ORDER BY leased_at",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get("leased_at"))
        .collect();
    times.dedup();
    ensure!(times.len() == sends, "one instant per send: {times:?}");
    Ok(times
        .windows(2)
        .map(|w| (w[1] - w[0]).num_milliseconds())
        .collect())
}

/// Shorter gaps take effect at once: the send planned half an hour ahead under the old gaps is
/// pulled in to the new longest gap, instead of holding the account for the rest of the old one.
#[tokio::test]
async fn shorter_gaps_take_effect_at_once_not_after_the_old_gap() -> Result<()> {
    let (_db, conn, scheduler, mut exec) = gapped_pool("slow", 1_800_000, 1_800_000, 2).await?;
    let first = leases(&mut exec, 1).await?;
    report(&exec, &first, OutcomeClass::Ok).await?;
    let mut accounts = accounts_client(&scheduler.grpc_url()).await?;
    accounts
        .update_account(UpdateAccountRequest {
            account: Some(Account {
                id: "slow".into(),
                limits: Some(AccountLimits {
                    gaps: Some(gaps(1_000, 1_000)),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["limits.gaps".into()],
            }),
        })
        .await?;
    let soon: bool = conn
        .query_one(
            "SELECT next_send_at <= herald.now() + interval '1 second' AS soon
             FROM herald.accounts WHERE id = 'slow'",
            &[],
        )
        .await?
        .get("soon");
    ensure!(soon, "the next send is still planned under the old gaps");
    leases(&mut exec, 1)
        .await
        .context("the second send waited for the old half-hour gap")?;
    Ok(())
}

#[tokio::test]
async fn gaps_are_never_below_the_minimum_and_visibly_irregular() -> Result<()> {
    const SENDS: usize = 30;
    let (_db, conn, _scheduler, mut exec) = gapped_pool("human", 3_000, 12_000, SENDS).await?;

    let mut drawn_ms = Vec::new();
    for i in 0..SENDS {
        let granted = leases(&mut exec, 1).await?;
        report(&exec, &granted, OutcomeClass::Ok).await?;
        let row = conn
            .query_one(
                "SELECT a.next_send_at, t.leased_at FROM herald.accounts a, herald.task_records t
                 WHERE a.id = 'human' AND t.id = $1::text::uuid",
                &[&granted[0].task_id],
            )
            .await?;
        let next: DateTime<Utc> = row.get("next_send_at");
        let leased: DateTime<Utc> = row.get("leased_at");
        drawn_ms.push((next - leased).num_milliseconds());
        if i + 1 < SENDS {
            // Straight to the next permitted instant: nothing may be granted before it.
            set_clock_to(&conn, next).await?;
        }
    }
    let actual = grant_gaps_ms(&conn, SENDS).await?;
    assert!(
        actual.iter().all(|&g| g >= 3_000),
        "a gap below the 3 s minimum: {actual:?}"
    );
    assert!(
        drawn_ms.iter().all(|g| (3_000..=12_000).contains(g)),
        "a drawn gap outside 3-12 s: {drawn_ms:?}"
    );
    // Irregular, not evenly spaced: the drawn gaps vary (uniform over 3-12 s has a coefficient
    // of variation of about 0.35; a fixed gap has 0).
    let n = drawn_ms.len() as f64;
    let mean = drawn_ms.iter().sum::<i64>() as f64 / n;
    let var = drawn_ms
        .iter()
        .map(|g| (*g as f64 - mean).powi(2))
        .sum::<f64>()
        / n;
    let cv = var.sqrt() / mean;
    let distinct: BTreeSet<i64> = drawn_ms.iter().copied().collect();
    assert!(cv > 0.15, "gaps too regular: cv {cv:.3} of {drawn_ms:?}");
    assert!(distinct.len() >= SENDS / 2, "gaps repeat: {drawn_ms:?}");
    Ok(())
}

#[tokio::test]
async fn fast_gaps_grant_several_paced_sends_per_claim_each_held_until_its_instant() -> Result<()> {
    const SENDS: usize = 24;
    let (_db, conn, _scheduler, mut exec) = gapped_pool("quick", 100, 250, SENDS).await?;

    // Batch by batch: a claim grants the sends whose drawn instants fit the one-second horizon.
    let mut batches: Vec<Vec<Lease>> = Vec::new();
    while batches.iter().map(Vec::len).sum::<usize>() < SENDS {
        match exec.next_within(WAIT).await.context("waiting for leases")? {
            scheduler_message::Kind::Leases(batch) => batches.push(batch.leases),
            scheduler_message::Kind::Heartbeat(_) | scheduler_message::Kind::ReportAcks(_) => {}
            other => bail!("expected leases, got {other:?}"),
        }
    }
    ensure!(
        batches.iter().any(|b| b.len() > 1),
        "gaps of 100-250 ms were granted one send per claim: {:?}",
        batches.iter().map(Vec::len).collect::<Vec<_>>()
    );
    let instant = |l: &Lease| -> Result<DateTime<Utc>> {
        let t = l.leased_at.context("lease without leased_at")?;
        DateTime::from_timestamp(t.seconds, t.nanos as u32).context("leased_at out of range")
    };
    let wait_ms = |l: &Lease| {
        l.send_after
            .map_or(0, |d| d.seconds * 1000 + i64::from(d.nanos) / 1_000_000)
    };
    for batch in &batches {
        // The first send of a claim goes at once; each later one is held until its own
        // instant, which lies a drawn gap after the one before and within the horizon.
        let mut sorted: Vec<&Lease> = batch.iter().collect();
        sorted.sort_by_key(|l| instant(l).ok());
        ensure!(
            wait_ms(sorted[0]) == 0,
            "a claim's first send waits: {:?}",
            sorted[0]
        );
        for pair in sorted.windows(2) {
            let gap = (instant(pair[1])? - instant(pair[0])?).num_milliseconds();
            ensure!((100..=250).contains(&gap), "paced instants {gap} ms apart");
            ensure!(
                wait_ms(pair[1]) > wait_ms(pair[0]),
                "a later instant does not wait longer: {:?} then {:?}",
                pair[0].send_after,
                pair[1].send_after
            );
            ensure!(
                wait_ms(pair[1]) <= 1000,
                "held beyond the horizon: {:?}",
                pair[1].send_after
            );
        }
    }
    // Across claims too, no two grants closer than the minimum.
    let gaps = grant_gaps_ms(&conn, SENDS).await?;
    ensure!(
        gaps.iter().all(|&g| g >= 100),
        "a gap below 100 ms: {gaps:?}"
    );
    Ok(())
}

fn windowed(recipient: &str, zone: &str) -> TaskSpec {
    TaskSpec {
        send_window: Some(SendWindow {
            start: "22:00".into(),
            end: "01:00".into(),
            time_zone: zone.into(),
            spread: Some(prost_types::Duration {
                seconds: 600,
                nanos: 0,
            }),
        }),
        ..task_spec("q", recipient, "good evening")
    }
}

#[tokio::test]
async fn a_send_window_across_midnight_holds_tasks_in_each_recipients_zone() -> Result<()> {
    let db = TestDb::new().await?;
    let conn = db.connect().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    // 12:00 UTC: 21:00 in Tokyo (the window opens at 22:00 = 13:00 UTC) and 07:00 in New York
    // (it opens at 22:00 = 03:00 UTC the next day).
    set_clock(&conn, "2030-01-10T12:00:00Z").await?;
    let mut tasks = connect_tasks(&url).await?;
    let mut specs: Vec<TaskSpec> = (0..10)
        .map(|i| windowed(&format!("+8190{i:04}"), "Asia/Tokyo"))
        .collect();
    specs.extend((0..10).map(|i| windowed(&format!("+1212{i:04}"), "America/New_York")));
    create_many(&mut tasks, specs).await?;
    let mut exec = ScriptedExecutor::connect(&url, "windows", &[], 50).await?;

    // Due now, but outside their windows: moved to each opening, spread over its first 10 min.
    wait_for_count(
        &conn,
        "SELECT count(*) AS n FROM herald.task_records WHERE run_at > '2030-01-10T12:30:00Z'",
        20,
    )
    .await?;
    let spread = |zone: &'static str| {
        let conn = &conn;
        async move {
            let rows = conn
                .query(
                    "SELECT run_at, state::text AS state, lease_count FROM herald.task_records
                     WHERE window_zone = $1",
                    &[&zone],
                )
                .await?;
            let times: Vec<DateTime<Utc>> = rows.iter().map(|r| r.get("run_at")).collect();
            ensure!(
                rows.iter().all(|r| r.get::<_, &str>("state") == "scheduled"
                    && r.get::<_, i32>("lease_count") == 0),
                "{zone}: leased outside its window"
            );
            anyhow::Ok(times)
        }
    };
    let tokyo = spread("Asia/Tokyo").await?;
    let new_york = spread("America/New_York").await?;
    let within = |times: &[DateTime<Utc>], from: &str, to: &str| -> Result<bool> {
        let from: DateTime<Utc> = from.parse()?;
        let to: DateTime<Utc> = to.parse()?;
        Ok(times.iter().all(|t| *t >= from && *t < to))
    };
    ensure!(
        within(&tokyo, "2030-01-10T13:00:00Z", "2030-01-10T13:10:00Z")?,
        "Tokyo: {tokyo:?}"
    );
    ensure!(
        within(&new_york, "2030-01-11T03:00:00Z", "2030-01-11T03:10:00Z")?,
        "New York: {new_york:?}"
    );
    let distinct = |t: &[DateTime<Utc>]| t.iter().collect::<BTreeSet<_>>().len();
    ensure!(
        distinct(&tokyo) > 5 && distinct(&new_york) > 5,
        "not spread"
    );

    // Tokyo's window opens; New York's stays shut.
    set_clock(&conn, "2030-01-10T13:10:00Z").await?;
    let granted = leases(&mut exec, 10).await?;
    ensure!(
        granted.iter().all(|l| l.recipient.starts_with("+81")),
        "{granted:?}"
    );
    report(&exec, &granted, OutcomeClass::Ok).await?;

    // 00:30 in Tokyo the next day: still inside the window that spans midnight.
    set_clock(&conn, "2030-01-10T15:30:00Z").await?;
    create_many(&mut tasks, vec![windowed("+81909999", "Asia/Tokyo")]).await?;
    let late = leases(&mut exec, 1).await?;
    ensure!(late[0].recipient == "+81909999");
    report(&exec, &late, OutcomeClass::Ok).await?;
    let waiting: i64 = conn
        .query_one(
            "SELECT count(*) AS n FROM herald.task_records
             WHERE window_zone = 'America/New_York' AND state = 'scheduled'",
            &[],
        )
        .await?
        .get("n");
    ensure!(waiting == 10, "New York sent early");

    set_clock(&conn, "2030-01-11T03:10:00Z").await?;
    let granted = leases(&mut exec, 10).await?;
    ensure!(
        granted.iter().all(|l| l.recipient.starts_with("+1212")),
        "{granted:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_routed_task_outside_its_window_waits_for_the_opening() -> Result<()> {
    let db = TestDb::new().await?;
    let conn = db.connect().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    set_clock(&conn, "2030-01-10T12:00:00Z").await?;
    let mut accounts = accounts_client(&url).await?;
    create_account(&mut accounts, "wa-1", "wa", limits(100.0)).await?;
    let mut tasks = connect_tasks(&url).await?;
    let spec = TaskSpec {
        pool: "wa".into(),
        ..windowed("+81901111", "Asia/Tokyo")
    };
    create_many(&mut tasks, vec![spec]).await?;
    let mut exec = ScriptedExecutor::connect(&url, "routed", &[], 5).await?;
    wait_for_count(
        &conn,
        "SELECT count(*) AS n FROM herald.task_records WHERE run_at >= '2030-01-10T13:00:00Z'
           AND run_at < '2030-01-10T13:10:00Z' AND lease_count = 0",
        1,
    )
    .await?;
    set_clock(&conn, "2030-01-10T13:10:00Z").await?;
    let granted = leases(&mut exec, 1).await?;
    ensure!(granted[0].account_id == "wa-1");
    Ok(())
}

#[tokio::test]
async fn the_tier_caps_new_conversations_over_a_rolling_day_and_replies_do_not_count() -> Result<()>
{
    let db = TestDb::new().await?;
    let conn = db.connect().await?;
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_METRICS_REFRESH", "100ms")
        .spawn()
        .await?;
    let url = scheduler.grpc_url();
    set_clock(&conn, "2030-02-01T08:00:00Z").await?;
    let mut accounts = accounts_client(&url).await?;
    create_account(
        &mut accounts,
        "tiered",
        "wa",
        AccountLimits {
            messaging_tier: MessagingTier::Limit250 as i32,
            ..limits(1000.0)
        },
    )
    .await?;
    // A customer wrote first: replies inside their 24-hour window are free. WhatsApp names the
    // writer by its digits alone; the task below spells the number with its '+' (migration 35).
    let window = accounts
        .record_inbound(RecordInboundRequest {
            account_id: "tiered".into(),
            recipient: "replied".into(),
            received_at: None,
        })
        .await?
        .into_inner();
    ensure!(window.window_until.is_some());
    // A time in the future counts as now: it would keep the window open until then.
    let later = accounts
        .record_inbound(RecordInboundRequest {
            account_id: "tiered".into(),
            recipient: "+future".into(),
            received_at: Some(prost_types::Timestamp::date_time(2099, 1, 1, 0, 0, 0)?),
        })
        .await?
        .into_inner();
    let until = later.window_until.context("window_until")?.seconds;
    let day_from_now = window
        .window_until
        .as_ref()
        .context("window_until")?
        .seconds;
    ensure!(
        until <= day_from_now + 60,
        "the window runs to {until}, past a day from now ({day_from_now})"
    );

    let mut tasks = connect_tasks(&url).await?;
    let mut specs: Vec<TaskSpec> = (0..255)
        .map(|i| pooled("wa", &format!("+new{i:04}")))
        .collect();
    specs.push(pooled("wa", "+replied"));
    create_many(&mut tasks, specs).await?;
    let mut exec = ScriptedExecutor::connect(&url, "tier", &[], 400).await?;
    let first = leases(&mut exec, 251).await?;
    report(&exec, &first, OutcomeClass::Ok).await?;
    ensure!(first.iter().any(|l| l.recipient == "+replied"));
    let status = get_account(&mut accounts, "tiered")
        .await?
        .status
        .unwrap_or_default();
    assert_eq!(status.tier_used, 250, "the reply was not counted");
    assert_eq!(room(&conn, "tiered").await?.1, 0, "the tier is full");
    let waiting: i64 = conn
        .query_one(
            "SELECT count(*) AS n FROM herald.task_records WHERE state = 'scheduled'",
            &[],
        )
        .await?
        .get("n");
    assert_eq!(waiting, 5, "five new recipients wait for the tier");

    // A second message to someone already reached today opens no new conversation.
    let again = first
        .iter()
        .find(|l| l.recipient.starts_with("+new"))
        .context("a new recipient")?
        .recipient
        .clone();
    create_many(&mut tasks, vec![pooled("wa", &again)]).await?;
    let repeat = leases(&mut exec, 1).await?;
    ensure!(repeat[0].recipient == again);
    report(&exec, &repeat, OutcomeClass::Ok).await?;

    // A rolling day later the conversations have aged out and the five go.
    set_clock(&conn, "2030-02-02T08:05:00Z").await?;
    let rest = leases(&mut exec, 5).await?;
    report(&exec, &rest, OutcomeClass::Ok).await?;
    let status = get_account(&mut accounts, "tiered")
        .await?
        .status
        .unwrap_or_default();
    assert_eq!(status.tier_used, 5);
    Ok(())
}

#[tokio::test]
async fn a_rate_limited_pooled_task_moves_to_another_account_at_once_without_an_attempt(
) -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    let mut accounts = accounts_client(&url).await?;
    create_account(&mut accounts, "wa-1", "wa", limits(100.0)).await?;
    create_account(&mut accounts, "wa-2", "wa", limits(100.0)).await?;
    let mut tasks = connect_tasks(&url).await?;
    let id = tasks
        .create_task(herald_proto::v1::CreateTaskRequest {
            task: Some(pooled("wa", "+4915100000")),
        })
        .await?
        .into_inner()
        .task
        .context("task")?
        .id;
    let mut exec = ScriptedExecutor::connect(&url, "router", &[], 2).await?;
    let first = leases(&mut exec, 1).await?;
    let mut limited = result(&first[0], OutcomeClass::RateLimited);
    limited.retry_after = Some(prost_types::Duration {
        seconds: 3600,
        nanos: 0,
    });
    exec.send(executor_message::Kind::Report(ReportBatch {
        results: vec![limited],
    }))
    .await?;
    let second = leases(&mut exec, 1).await?;
    ensure!(second[0].task_id == id);
    ensure!(
        second[0].account_id != first[0].account_id,
        "offered to the throttled account again: {}",
        second[0].account_id
    );
    ensure!(second[0].attempts_before == 0, "an attempt was charged");
    report(&exec, &second, OutcomeClass::Ok).await?;
    let task =
        herald_tests::wait_for_task_state(&mut tasks, &id, TaskState::Succeeded, WAIT).await?;
    assert_eq!(task.attempts, 1, "only the send that went out counts");
    let attempts = tasks
        .list_attempts(ListAttemptsRequest {
            task_id: id.clone(),
        })
        .await?
        .into_inner()
        .attempts;
    assert_eq!(attempts.len(), 2, "both tries are on record");
    Ok(())
}

/// Creates the sticky pool "sticky".
async fn create_sticky_pool(accounts: &mut AccountServiceClient<Channel>) -> Result<()> {
    accounts
        .create_pool(CreatePoolRequest {
            pool: Some(Pool {
                name: "sticky".into(),
                sticky: true,
                ..Default::default()
            }),
        })
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_sticky_pool_keeps_each_recipient_on_the_account_that_last_messaged_them() -> Result<()> {
    let db = TestDb::new().await?;
    let conn = db.connect().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    let mut accounts = accounts_client(&url).await?;
    create_sticky_pool(&mut accounts).await?;
    create_account(&mut accounts, "a", "sticky", limits(1000.0)).await?;
    let mut b = Account {
        id: "b".into(),
        sender_kind: "webhook".into(),
        pool: "sticky".into(),
        state: AccountState::Paused as i32,
        limits: Some(limits(1000.0)),
        ..Default::default()
    };
    accounts
        .create_account(CreateAccountRequest {
            account: Some(b.clone()),
        })
        .await?;
    let mut tasks = connect_tasks(&url).await?;
    let mut exec = ScriptedExecutor::connect(&url, "sticky", &[], 50).await?;
    let known: Vec<String> = (0..5).map(|i| format!("+4420{i:04}")).collect();
    create_many(
        &mut tasks,
        known.iter().map(|r| pooled("sticky", r)).collect(),
    )
    .await?;
    let first = leases(&mut exec, 5).await?;
    ensure!(first.iter().all(|l| l.account_id == "a"));
    report(&exec, &first, OutcomeClass::Ok).await?;

    // b is back with all its room; a has spent some. New recipients go to b, known ones stay.
    b.state = AccountState::Active as i32;
    accounts
        .update_account(UpdateAccountRequest {
            account: Some(b),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["state".into()],
            }),
        })
        .await?;
    let fresh: Vec<String> = (0..5).map(|i| format!("+4477{i:04}")).collect();
    let mut specs: Vec<TaskSpec> = known.iter().map(|r| pooled("sticky", r)).collect();
    specs.extend(fresh.iter().map(|r| pooled("sticky", r)));
    create_many(&mut tasks, specs).await?;
    let second = leases(&mut exec, 10).await?;
    for l in &second {
        let want = if known.contains(&l.recipient) {
            "a"
        } else {
            "b"
        };
        ensure!(
            l.account_id == want,
            "{} went through {}, expected {want}",
            l.recipient,
            l.account_id
        );
    }
    let pairs: i64 = conn
        .query_one("SELECT count(*) AS n FROM herald.recipient_sends", &[])
        .await?
        .get("n");
    ensure!(pairs == 10, "each recipient is recorded once: {pairs}");
    Ok(())
}

/// Waits for the acknowledgement of a report `exec` sent, skipping other frames.
async fn report_acked(exec: &mut ScriptedExecutor) -> Result<()> {
    loop {
        if let scheduler_message::Kind::ReportAcks(_) = exec.next_within(WAIT).await? {
            return Ok(());
        }
    }
}

#[tokio::test]
async fn a_sticky_recipient_waits_for_the_executor_holding_its_account_and_moves_once_none_does(
) -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    let mut accounts = accounts_client(&url).await?;
    create_sticky_pool(&mut accounts).await?;
    // Each account's credentials ref is its id.
    create_account(&mut accounts, "a", "sticky", limits(1000.0)).await?;
    create_account(&mut accounts, "b", "sticky", limits(1000.0)).await?;
    let mut tasks = connect_tasks(&url).await?;
    let mut x = ScriptedExecutor::connect_holding(&url, "x", &[], &["a"], 5).await?;
    let known: Vec<String> = (0..5).map(|i| format!("+4420{i:04}")).collect();
    create_many(
        &mut tasks,
        known.iter().map(|r| pooled("sticky", r)).collect(),
    )
    .await?;
    let first = leases(&mut x, 5).await?;
    ensure!(first.iter().all(|l| l.account_id == "a"));
    // Reported without new credit: x stays connected, holding a, and takes nothing more.
    x.send(executor_message::Kind::Report(ReportBatch {
        results: first.iter().map(|l| result(l, OutcomeClass::Ok)).collect(),
    }))
    .await?;
    report_acked(&mut x).await?;

    // y holds only b: it takes the new recipients and leaves a's to x.
    let mut y = ScriptedExecutor::connect_holding(&url, "y", &[], &["b"], 10).await?;
    let fresh: Vec<String> = (0..5).map(|i| format!("+4477{i:04}")).collect();
    let mut specs: Vec<TaskSpec> = known.iter().map(|r| pooled("sticky", r)).collect();
    specs.extend(fresh.iter().map(|r| pooled("sticky", r)));
    create_many(&mut tasks, specs).await?;
    let taken = leases(&mut y, 5).await?;
    let mut got: Vec<(String, String)> = taken
        .iter()
        .map(|l| (l.recipient.clone(), l.account_id.clone()))
        .collect();
    got.sort();
    let want: Vec<(String, String)> = fresh.iter().map(|r| (r.clone(), "b".into())).collect();
    ensure!(got == want, "y took {got:?}");
    x.credit(5).await?;
    let kept = leases(&mut x, 5).await?;
    for l in &kept {
        ensure!(
            known.contains(&l.recipient) && l.account_id == "a",
            "{} went through {}",
            l.recipient,
            l.account_id
        );
    }
    report(&x, &kept, OutcomeClass::Ok).await?;
    report_acked(&mut x).await?;

    // x leaves and no live executor holds a: its recipient moves to b rather than wait.
    drop(x);
    create_many(&mut tasks, vec![pooled("sticky", &known[0])]).await?;
    let moved = leases(&mut y, 1).await?;
    ensure!(
        moved.len() == 1 && moved[0].recipient == known[0] && moved[0].account_id == "b",
        "after x left: {moved:?}"
    );
    Ok(())
}

#[tokio::test]
async fn an_account_failing_past_its_threshold_pauses_itself_and_notifies() -> Result<()> {
    let notify = WebhookReceiver::start().await?;
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_NOTIFY_URL", format!("{}/notify", notify.url()))
        .spawn()
        .await?;
    let url = scheduler.grpc_url();
    let mut accounts = accounts_client(&url).await?;
    create_account(
        &mut accounts,
        "shaky",
        "wa",
        AccountLimits {
            pause_failure_rate: Some(0.5),
            ..limits(1000.0)
        },
    )
    .await?;
    let mut tasks = connect_tasks(&url).await?;
    let specs = (0..40)
        .map(|i| TaskSpec {
            max_attempts: Some(1),
            ..pooled("wa", &format!("+3361{i:04}"))
        })
        .collect();
    create_many(&mut tasks, specs).await?;
    let mut exec = ScriptedExecutor::connect(&url, "shaky", &[], 20).await?;
    let batch = leases(&mut exec, 20).await?;
    // The results only, no credit back: reports are applied while the stream goes on, so
    // credit sent with them could be spent before the last of them paused the account.
    exec.send(executor_message::Kind::Report(ReportBatch {
        results: batch
            .iter()
            .map(|l| result(l, OutcomeClass::Transient))
            .collect(),
    }))
    .await?;

    let deadline = tokio::time::Instant::now() + WAIT;
    let account = loop {
        let a = get_account(&mut accounts, "shaky").await?;
        if a.state == AccountState::Paused as i32 {
            break a;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "never paused: {a:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let status = account.status.unwrap_or_default();
    ensure!(
        status.state_reason.contains("paused itself"),
        "{}",
        status.state_reason
    );
    ensure!(status.health < 0.5, "health {}", status.health);
    // Every failed task notifies too; wait until the pause is among the deliveries.
    let mut seen = 1;
    loop {
        let delivered = notify.wait_for_requests(seen, WAIT).await?;
        let paused = delivered
            .iter()
            .filter_map(|r| serde_json::from_slice::<serde_json::Value>(&r.body).ok())
            .any(|e| e["type"] == "account.paused" && e["data"]["account_id"] == "shaky");
        if paused {
            break;
        }
        seen = delivered.len() + 1;
    }
    // Paused: the other 20 tasks are not offered, whatever the credit.
    exec.credit(20).await?;
    assert_eq!(room(&db.connect().await?, "shaky").await?.0, 0);
    let leased: i64 = db
        .connect()
        .await?
        .query_one(
            "SELECT count(*) AS n FROM herald.task_records WHERE lease_count > 0",
            &[],
        )
        .await?
        .get("n");
    ensure!(leased == 20, "{leased} leased");

    // The operator resumes it: it starts afresh, so the failures that paused it do not pause
    // it again at its next outcome, a success.
    accounts
        .update_account(UpdateAccountRequest {
            account: Some(Account {
                id: "shaky".into(),
                state: AccountState::Active as i32,
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["state".into()],
            }),
        })
        .await?;
    let mut rest = Vec::new();
    while rest.len() < 20 {
        match exec.next().await? {
            scheduler_message::Kind::Leases(batch) => rest.extend(batch.leases),
            scheduler_message::Kind::ReportAcks(_) => {}
            other => bail!("expected leases, got {other:?}"),
        }
    }
    // One success alone: with the old record it lowered the failure rate only from 64 % to
    // 61 %, still past the threshold.
    exec.report_each(&rest[..1], OutcomeClass::Ok).await?;
    let conn = db.connect().await?;
    herald_tests::until("the successes to be folded into the account", || async {
        let waiting: i64 = conn
            .query_one(
                "SELECT count(*) FROM herald.account_deltas WHERE account_id = 'shaky'",
                &[],
            )
            .await?
            .get(0);
        Ok(waiting == 0)
    })
    .await?;
    let resumed = get_account(&mut accounts, "shaky").await?;
    ensure!(
        resumed.state == AccountState::Active as i32,
        "paused again after the resume: {resumed:?}"
    );
    Ok(())
}

/// Feedback for the account `adaptive`: $1 successes and $2 rate limits, as a report batch
/// gives it.
const ADAPTIVE_FEEDBACK: &str = "SELECT herald.account_feedback('default', ARRAY['adaptive'],
    ARRAY[0], ARRAY[0], ARRAY[$1::int4], ARRAY[$2::int4], ARRAY[0::bigint], ARRAY[0], ARRAY[0],
    ARRAY[NULL::text])";

/// The account `adaptive` at 100/s, raised a step every four successes after a rate limit.
async fn create_adaptive_account(scheduler: &SchedulerProcess) -> Result<()> {
    let mut accounts = accounts_client(&scheduler.grpc_url()).await?;
    create_account(
        &mut accounts,
        "adaptive",
        "p",
        AccountLimits {
            recovery_successes: Some(4),
            ..limits(100.0)
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn every_full_run_of_successes_in_one_batch_raises_the_rate_a_step() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    create_adaptive_account(&scheduler).await?;
    let conn = db.connect().await?;
    let feedback = ADAPTIVE_FEEDBACK;
    // Two rate limits: 100 -> 50 -> 25 per second.
    conn.execute(feedback, &[&0i32, &1i32]).await?;
    conn.execute(feedback, &[&0i32, &1i32]).await?;
    // Nine successes in one batch with a step every four: two steps of 25, one success kept.
    conn.execute(feedback, &[&9i32, &0i32]).await?;
    let row = conn
        .query_one(
            "SELECT effective_rate, success_streak FROM herald.accounts WHERE id = 'adaptive'",
            &[],
        )
        .await?;
    assert_eq!(row.get::<_, f64>("effective_rate"), 75.0);
    assert_eq!(row.get::<_, i32>("success_streak"), 1);
    Ok(())
}

#[tokio::test]
async fn successes_waiting_to_be_folded_do_not_count_towards_the_recovery_of_a_later_rate_limit(
) -> Result<()> {
    // Successes on an account at its configured rate wait beside the row (account_deltas); a
    // rate limit that follows folds them in first, so they cannot raise the halved rate again.
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::builder(&db)
        // The background folder would race the direct calls below.
        .env("HERALD_FOLD_INTERVAL", "1h")
        .spawn()
        .await?;
    create_adaptive_account(&scheduler).await?;
    let conn = db.connect().await?;
    let feedback = ADAPTIVE_FEEDBACK;
    conn.execute(feedback, &[&9i32, &0i32]).await?;
    let waiting: i64 = conn
        .query_one("SELECT count(*) AS n FROM herald.account_deltas", &[])
        .await?
        .get("n");
    assert_eq!(waiting, 1, "the successes wait beside the row");
    conn.execute(feedback, &[&0i32, &1i32]).await?;
    let row = conn
        .query_one(
            "SELECT effective_rate, success_streak, outcomes_seen,
                    (SELECT count(*) FROM herald.account_deltas) AS waiting
             FROM herald.accounts WHERE id = 'adaptive'",
            &[],
        )
        .await?;
    assert_eq!(row.get::<_, f64>("effective_rate"), 50.0);
    assert_eq!(row.get::<_, i32>("success_streak"), 0);
    assert_eq!(row.get::<_, i32>("outcomes_seen"), 10);
    assert_eq!(row.get::<_, i64>("waiting"), 0);
    Ok(())
}

#[tokio::test]
async fn a_pooled_task_right_after_its_account_is_created_is_not_held_by_the_cache() -> Result<()> {
    let db = TestDb::new().await?;
    // A cache far longer than the wait below: only invalidation can release the task in time.
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_NO_ACCOUNTS_TTL", "1h")
        .spawn()
        .await?;
    let url = scheduler.grpc_url();
    let mut tasks = connect_tasks(&url).await?;
    let mut exec = ScriptedExecutor::connect(&url, "cache", &[], 10).await?;
    // A claim finds the namespace without accounts and remembers it.
    create_many(&mut tasks, vec![task_spec("q", "+1", "by queue")]).await?;
    let first = leases(&mut exec, 1).await?;
    report(&exec, &first, OutcomeClass::Ok).await?;

    let mut accounts = accounts_client(&url).await?;
    create_account(&mut accounts, "just-made", "fresh", limits(10.0)).await?;
    create_many(&mut tasks, vec![pooled("fresh", "+2")]).await?;
    let routed = leases(&mut exec, 1).await?;
    ensure!(routed[0].account_id == "just-made");
    Ok(())
}

#[tokio::test]
async fn the_providers_standing_sets_the_tier_and_lowers_health_and_bad_input_changes_nothing(
) -> Result<()> {
    use herald_proto::v1::RecordProviderStandingRequest;
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut accounts = accounts_client(&scheduler.grpc_url()).await?;
    create_account(&mut accounts, "wa-1", "wa", limits(10.0)).await?;
    let before = get_account(&mut accounts, "wa-1").await?;
    assert_eq!(before.status.clone().unwrap_or_default().health, 1.0);

    let bad = accounts
        .record_provider_standing(RecordProviderStandingRequest {
            account_id: "wa-1".into(),
            quality: "purple".into(),
            tier: MessagingTier::Limit1k as i32,
        })
        .await
        .err()
        .context("a bad quality was accepted")?;
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        get_account(&mut accounts, "wa-1").await?.limits,
        before.limits,
        "a refused request changed nothing"
    );

    let after = accounts
        .record_provider_standing(RecordProviderStandingRequest {
            account_id: "wa-1".into(),
            quality: "RED".into(),
            tier: MessagingTier::Limit1k as i32,
        })
        .await?
        .into_inner();
    let status = after.status.unwrap_or_default();
    assert_eq!(status.quality, "red");
    assert!(status.health < 0.5, "health {}", status.health);
    assert_eq!(
        after.limits.unwrap_or_default().messaging_tier,
        MessagingTier::Limit1k as i32
    );
    let missing = accounts
        .record_provider_standing(RecordProviderStandingRequest {
            account_id: "nobody".into(),
            quality: "green".into(),
            tier: 0,
        })
        .await
        .err()
        .context("an unknown account was accepted")?;
    assert_eq!(missing.code(), tonic::Code::NotFound);
    Ok(())
}

#[tokio::test]
async fn the_tier_and_the_ramp_hold_across_two_replicas_and_two_executors() -> Result<()> {
    let db = TestDb::new().await?;
    let conn = db.connect().await?;
    let s1 = SchedulerProcess::builder(&db)
        .name("scheduler-1")
        .spawn()
        .await?;
    let s2 = SchedulerProcess::builder(&db)
        .name("scheduler-2")
        .spawn()
        .await?;
    set_clock(&conn, "2030-03-01T10:00:00Z").await?;
    let mut accounts = accounts_client(&s1.grpc_url()).await?;
    for (id, limits) in [
        (
            "tiered",
            AccountLimits {
                messaging_tier: MessagingTier::Limit250 as i32,
                ..limits(1000.0)
            },
        ),
        (
            "ramped",
            AccountLimits {
                warm_up: Some(WarmUp {
                    initial: Some(40),
                    step: Some(10),
                    ..Default::default()
                }),
                ..limits(1000.0)
            },
        ),
    ] {
        create_account(&mut accounts, id, id, limits).await?;
    }
    let mut tasks = connect_tasks(&s2.grpc_url()).await?;
    let mut specs: Vec<TaskSpec> = (0..400)
        .map(|i| pooled("tiered", &format!("+t{i:04}")))
        .collect();
    specs.extend((0..100).map(|i| pooled("ramped", &format!("+r{i:04}"))));
    create_many(&mut tasks, specs).await?;
    let _e1 = ScriptedExecutor::connect(&s1.grpc_url(), "exec-1", &[], 300).await?;
    let _e2 = ScriptedExecutor::connect(&s2.grpc_url(), "exec-2", &[], 300).await?;

    let leased = "SELECT count(*) AS n FROM herald.task_records WHERE lease_count > 0";
    wait_for_count(&conn, leased, 290).await?;
    // Nothing more can be granted today: both accounts are at their limits.
    assert_eq!(room(&conn, "tiered").await?.1, 0);
    assert_eq!(room(&conn, "ramped").await?.0, 0);
    let per_account: Vec<(String, i64)> = conn
        .query(
            "SELECT account_id, count(*) AS n FROM herald.task_records WHERE lease_count > 0
             GROUP BY 1 ORDER BY 1",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get("account_id"), r.get("n")))
        .collect();
    assert_eq!(
        per_account,
        vec![("ramped".to_string(), 40), ("tiered".to_string(), 250)]
    );
    Ok(())
}

#[tokio::test]
async fn retention_forgets_recipient_pairs_nothing_depends_on_any_more() -> Result<()> {
    let db = TestDb::new().await?;
    let conn = db.connect().await?;
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_TASK_RETENTION", "1h")
        .env("HERALD_RETENTION_INTERVAL", "100ms")
        .spawn()
        .await?;
    let mut accounts = accounts_client(&scheduler.grpc_url()).await?;
    create_account(&mut accounts, "plain", "p", limits(10.0)).await?;
    create_account(
        &mut accounts,
        "spaced",
        "p",
        AccountLimits {
            recipient_interval: Some(prost_types::Duration {
                seconds: 3 * 3600,
                nanos: 0,
            }),
            ..limits(10.0)
        },
    )
    .await?;
    // (account, recipient, last sent, blocked until, conversation opened, last inbound), as
    // offsets from now; NULL where absent, -infinity for a pair only an inbound message made.
    conn.batch_execute(
        "INSERT INTO herald.recipient_sends
             (namespace, account_id, recipient, last_sent_at, blocked_until, opened_at, inbound_at)
         VALUES
           ('default', 'plain', 'stale', now() - interval '2 hours', NULL, NULL, NULL),
           ('default', 'plain', 'stale-inbound', '-infinity', NULL, NULL, now() - interval '25 hours'),
           ('default', 'plain', 'recent', now() - interval '10 minutes', NULL, NULL, NULL),
           ('default', 'plain', 'blocked', now() - interval '2 hours', now() + interval '1 hour', NULL, NULL),
           ('default', 'plain', 'in-tier', now() - interval '2 hours', NULL, now() - interval '2 hours', NULL),
           ('default', 'plain', 'window-open', '-infinity', NULL, NULL, now() - interval '1 hour'),
           ('default', 'spaced', 'within-interval', now() - interval '2 hours', NULL, NULL, NULL)",
    )
    .await?;
    wait_for_count(
        &conn,
        "SELECT count(*) AS n FROM herald.recipient_sends WHERE recipient LIKE 'stale%'",
        0,
    )
    .await?;
    let kept: BTreeSet<String> = conn
        .query("SELECT recipient FROM herald.recipient_sends", &[])
        .await?
        .iter()
        .map(|r| r.get("recipient"))
        .collect();
    let expected: BTreeSet<String> = [
        "recent",
        "blocked",
        "in-tier",
        "window-open",
        "within-interval",
    ]
    .map(String::from)
    .into();
    ensure!(kept == expected, "kept {kept:?}, expected {expected:?}");
    Ok(())
}
