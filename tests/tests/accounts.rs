//! Sending accounts and their limits, enforced by the scheduler across executors and replicas:
//! AccountService itself, rate and burst, in-flight limits and the high-priority reserve, daily
//! caps across midnight, per-recipient spacing, quiet hours, the adaptive rate and accounts
//! going offline.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use chrono::{DateTime, Utc};
use herald_proto::v1::{
    account_service_client::AccountServiceClient, executor_message, scheduler_message,
    task_service_client::TaskServiceClient, Account, AccountLimits, AccountState,
    CreateAccountRequest, CreatePoolRequest, CreateTaskRequest, DeleteAccountRequest,
    DeletePoolRequest, GetAccountRequest, GetPoolRequest, GetTaskRequest, ListAccountsRequest,
    OutcomeClass, Pool, QuietHours, RateLimitScope, TaskSpec, TaskState, UpdateAccountRequest,
};
use herald_tests::accounts::{
    accounts_client, create_many, get_account, hold_account, pooled, until_blocked_by,
};
use herald_tests::lease::{result, ScriptedExecutor};
use herald_tests::{
    connect_tasks, create_task, task_spec, unique_id, wait_for_task_state, SchedulerProcess,
    TaskSpecExt, TestDb,
};
use tonic::transport::Channel;
use tonic::Code;

const WAIT: Duration = Duration::from_secs(30);

fn account(id: &str, pool: &str, limits: AccountLimits) -> Account {
    Account {
        id: id.into(),
        sender_kind: "webhook".into(),
        pool: pool.into(),
        limits: Some(limits),
        ..Default::default()
    }
}

fn rate(per_second: f64, burst: i32) -> AccountLimits {
    AccountLimits {
        rate_per_second: per_second,
        burst: Some(burst),
        ..Default::default()
    }
}

async fn create_account(client: &mut AccountServiceClient<Channel>, a: Account) -> Result<Account> {
    Ok(client
        .create_account(CreateAccountRequest { account: Some(a) })
        .await?
        .into_inner())
}

fn pinned(account: &str, recipient: &str) -> TaskSpec {
    TaskSpec {
        account_id: account.into(),
        ..task_spec("q", recipient, "hello")
    }
}

async fn create(client: &mut TaskServiceClient<Channel>, spec: TaskSpec) -> Result<String> {
    Ok(create_task(client, spec).await?.id)
}

/// One send as the database recorded it: the account and the lease time (database clock;
/// [`granted_sends`] puts the grant instant there instead).
#[derive(Debug, Clone)]
struct Send {
    account: String,
    recipient: String,
    leased_at: DateTime<Utc>,
    finished_at: DateTime<Utc>,
}

/// Every routed send, in the order of its recorded time.
async fn sends(db: &TestDb) -> Result<Vec<Send>> {
    recorded_sends(
        db,
        "SELECT a.account, t.recipient, a.leased_at, a.finished_at
         FROM herald.attempt_records a JOIN herald.task_records t ON t.id = a.task_id
         WHERE a.account IS NOT NULL ORDER BY a.leased_at",
    )
    .await
}

/// Every send with its grant instant in place of its lease time: the recipient mark the grant
/// wrote (accounts that record recipients only; each recipient sent to once).
async fn granted_sends(db: &TestDb) -> Result<Vec<Send>> {
    recorded_sends(
        db,
        "SELECT a.account, t.recipient, s.last_sent_at, a.finished_at
         FROM herald.attempt_records a JOIN herald.task_records t ON t.id = a.task_id
         JOIN herald.recipient_sends s
           ON s.namespace = t.namespace AND s.account_id = a.account
          AND s.recipient = ltrim(t.recipient, '+')
         WHERE a.account IS NOT NULL ORDER BY s.last_sent_at",
    )
    .await
}

/// The sends `query` reads: account, recipient, the send's time and its finish, in order.
async fn recorded_sends(db: &TestDb, query: &str) -> Result<Vec<Send>> {
    let conn = db.connect().await?;
    let rows = conn.query(query, &[]).await?;
    Ok(rows
        .iter()
        .map(|r| Send {
            account: r.get(0),
            recipient: r.get(1),
            leased_at: r.get(2),
            finished_at: r.get(3),
        })
        .collect())
}

/// The most sends of one account inside any window of `window` (a sliding window anchored at
/// each send).
fn max_in_window(times: &[DateTime<Utc>], window: chrono::Duration) -> usize {
    let mut best = 0;
    let mut start = 0;
    for end in 0..times.len() {
        while times[end] - times[start] > window {
            start += 1;
        }
        best = best.max(end - start + 1);
    }
    best
}

/// The most intervals [leased_at, finished_at) open at once.
fn max_overlap(sends: &[&Send]) -> usize {
    let mut events: Vec<(DateTime<Utc>, i32)> = Vec::new();
    for s in sends {
        events.push((s.leased_at, 1));
        events.push((s.finished_at, -1));
    }
    // Ends before starts at the same instant: a slot given back can be reused at once.
    events.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut open, mut best) = (0i32, 0i32);
    for (_, d) in events {
        open += d;
        best = best.max(open);
    }
    best as usize
}

/// An executor that "sends" every lease by recording it, holds it for `hold`, and reports OK.
async fn recording_executor(
    url: String,
    id: String,
    credit: u32,
    hold: Duration,
    stop: tokio_util_like::Stop,
) -> Result<()> {
    let mut exec = ScriptedExecutor::connect(&url, &id, &[], credit).await?;
    loop {
        let frame = tokio::select! {
            _ = stop.wait() => return Ok(()),
            f = exec.next_within(Duration::from_secs(120)) => f?,
        };
        match frame {
            scheduler_message::Kind::Leases(batch) => {
                // The "send" takes `hold`, then it is reported and its slot offered again.
                tokio::time::sleep(hold).await;
                let n = batch.leases.len() as u32;
                exec.send(herald_proto::v1::executor_message::Kind::Report(
                    herald_proto::v1::ReportBatch {
                        results: batch
                            .leases
                            .iter()
                            .map(|l| result(l, OutcomeClass::Ok))
                            .collect(),
                    },
                ))
                .await?;
                exec.credit(n).await?;
            }
            scheduler_message::Kind::ReportAcks(_) | scheduler_message::Kind::Heartbeat(_) => {}
            other => bail!("unexpected frame {other:?}"),
        }
    }
}

/// A tiny stop signal shared by the recording executors.
mod tokio_util_like {
    use tokio::sync::watch;

    /// Cloneable; `wait` resolves once `stop` was called.
    #[derive(Clone)]
    pub(crate) struct Stop(watch::Receiver<bool>);

    impl Stop {
        pub(crate) fn new() -> (watch::Sender<bool>, Self) {
            let (tx, rx) = watch::channel(false);
            (tx, Stop(rx))
        }

        pub(crate) async fn wait(&self) {
            let mut rx = self.0.clone();
            let _ = rx.wait_for(|v| *v).await;
        }
    }
}

#[tokio::test]
async fn account_service_manages_accounts_and_pools() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut accounts = accounts_client(&scheduler.grpc_url()).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;

    accounts
        .create_pool(CreatePoolRequest {
            pool: Some(Pool {
                name: "wa".into(),
                description: "WhatsApp numbers".into(),
                ..Default::default()
            }),
        })
        .await?;
    let mut a = account("wa-1", "wa", rate(80.0, 80));
    a.time_zone = "Asia/Shanghai".into();
    a.sender_kind = "whatsapp_cloud".into();
    let created = create_account(&mut accounts, a.clone()).await?;
    assert_eq!(created.credentials_ref, "wa-1", "defaults to the id");
    assert_eq!(created.state(), AccountState::Active);
    let status = created.status.context("status")?;
    assert_eq!(status.effective_rate, 80.0);
    assert_eq!(status.today_count, 0);
    // Its pool is created on demand too.
    create_account(&mut accounts, account("wc-1", "wecom", rate(5.0, 1))).await?;

    let err = create_account(&mut accounts, a.clone()).await.unwrap_err();
    assert_eq!(
        err.downcast_ref::<tonic::Status>().map(|s| s.code()),
        Some(Code::AlreadyExists)
    );
    let mut bad = account("wa-2", "wa", rate(0.0, 1));
    bad.time_zone = "Nowhere/City".into();
    let status = accounts
        .create_account(CreateAccountRequest { account: Some(bad) })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("account.time_zone"),
        "{}",
        status.message()
    );
    assert!(status.message().contains("account.limits.rate_per_second"));
    // An empty account names every missing field in one answer, not only its limits.
    let status = accounts
        .create_account(CreateAccountRequest {
            account: Some(Account::default()),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    for field in ["account.id", "account.sender_kind", "account.limits"] {
        assert!(
            status.message().contains(field),
            "{field} not named: {}",
            status.message()
        );
    }
    // A warm-up with no first-day cap is refused, not dropped (which sent at full rate at once).
    let mut unramped = account("wa-3", "wa", rate(5.0, 1));
    if let Some(limits) = unramped.limits.as_mut() {
        limits.warm_up = Some(herald_proto::v1::WarmUp::default());
    }
    let status = accounts
        .create_account(CreateAccountRequest {
            account: Some(unramped),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("account.limits.warm_up.initial"),
        "{}",
        status.message()
    );

    // Update only what the mask names.
    let mut patch = account("wa-1", "ignored", rate(40.0, 1));
    patch.limits = Some(AccountLimits {
        rate_per_second: 40.0,
        daily_cap: Some(1000),
        ..Default::default()
    });
    let updated = accounts
        .update_account(UpdateAccountRequest {
            account: Some(patch),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["limits.rate_per_second".into(), "limits.daily_cap".into()],
            }),
        })
        .await?
        .into_inner();
    assert_eq!(updated.pool, "wa");
    let limits = updated.limits.context("limits")?;
    assert_eq!(
        (limits.rate_per_second, limits.daily_cap),
        (40.0, Some(1000))
    );
    assert_eq!(updated.status.context("status")?.effective_rate, 40.0);
    // A state named in the mask must be one: UNSPECIFIED would resume a paused account.
    let status = accounts
        .update_account(UpdateAccountRequest {
            account: Some(account("wa-1", "wa", rate(40.0, 1))),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["state".into()],
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("account.state"),
        "{}",
        status.message()
    );
    // The kind is fixed: the tasks waiting on the account were checked against it.
    let status = accounts
        .update_account(UpdateAccountRequest {
            account: Some(Account {
                sender_kind: "wecom".into(),
                ..account("wa-1", "wa", rate(40.0, 1))
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["sender_kind".into()],
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("account.sender_kind"),
        "{status:?}"
    );
    // An id no account can have is a bad request, not a missing account; so is a pool's name.
    for id in ["", "Bad Id"] {
        let status = accounts
            .update_account(UpdateAccountRequest {
                account: Some(account(id, "wa", rate(40.0, 1))),
                update_mask: Some(prost_types::FieldMask {
                    paths: vec!["limits.rate_per_second".into()],
                }),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{id:?}: {status:?}");
        assert!(status.message().contains("account.id"), "{status:?}");
    }
    let status = accounts
        .update_pool(herald_proto::v1::UpdatePoolRequest {
            pool: Some(herald_proto::v1::Pool {
                name: "Bad Pool".into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("pool.name"), "{status:?}");

    let listed = accounts
        .list_accounts(ListAccountsRequest {
            pool: "wa".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(listed.accounts.len(), 1);
    let pool = accounts
        .get_pool(GetPoolRequest { name: "wa".into() })
        .await?
        .into_inner();
    assert_eq!(pool.account_ids, vec!["wa-1"]);
    assert_eq!(pool.description, "WhatsApp numbers");

    // Tasks must target something that exists.
    let status = tasks
        .create_task(CreateTaskRequest {
            task: Some(pooled("nope", "+1")),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("task.pool"),
        "{}",
        status.message()
    );
    let mut both = pooled("wa", "+1");
    both.account_id = "wa-1".into();
    let status = tasks
        .create_task(CreateTaskRequest { task: Some(both) })
        .await
        .unwrap_err();
    assert!(
        status.message().contains("task.account_id"),
        "{}",
        status.message()
    );

    // In use: cannot delete.
    create(
        &mut tasks,
        pinned("wa-1", "+1").with_delay(Duration::from_secs(3600)),
    )
    .await?;
    let status = accounts
        .delete_account(DeleteAccountRequest { id: "wa-1".into() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    let status = accounts
        .delete_pool(DeletePoolRequest { name: "wa".into() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    accounts
        .delete_account(DeleteAccountRequest { id: "wc-1".into() })
        .await?;
    accounts
        .delete_pool(DeletePoolRequest {
            name: "wecom".into(),
        })
        .await?;
    let status = accounts
        .get_account(GetAccountRequest { id: "wc-1".into() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    Ok(())
}

#[tokio::test]
async fn limits_hold_across_three_executors_and_two_replicas() -> Result<()> {
    let db = TestDb::new().await?;
    let s1 = SchedulerProcess::builder(&db)
        .name("scheduler-1")
        .spawn()
        .await?;
    let s2 = SchedulerProcess::builder(&db)
        .name("scheduler-2")
        .spawn()
        .await?;
    let mut accounts = accounts_client(&s1.grpc_url()).await?;
    let mut tasks = connect_tasks(&s2.grpc_url()).await?;

    // A recipient interval of 1 ms spaces nothing here (every recipient is new) but records
    // each send's grant instant as its recipient mark, which is what the limits bound.
    let tracked = |mut limits: AccountLimits| {
        limits.recipient_interval = Some(prost_types::Duration {
            seconds: 0,
            nanos: 1_000_000,
        });
        limits
    };
    let mut fast = rate(20.0, 5);
    fast.max_in_flight = Some(3);
    create_account(&mut accounts, account("fast", "pool", tracked(fast))).await?;
    create_account(
        &mut accounts,
        account("slow", "pool", tracked(rate(8.0, 2))),
    )
    .await?;
    // Far more work than the window allows, so both accounts run at their limits throughout.
    let specs = (0..1500)
        .map(|i| pooled("pool", &format!("+1555{i:05}")))
        .collect();
    create_many(&mut tasks, specs).await?;

    let (stop_tx, stop) = tokio_util_like::Stop::new();
    let mut executors = Vec::new();
    for (i, url) in [s1.grpc_url(), s2.grpc_url(), s1.grpc_url()]
        .into_iter()
        .enumerate()
    {
        executors.push(tokio::spawn(recording_executor(
            url,
            format!("exec-{i}"),
            50,
            Duration::from_millis(40),
            stop.clone(),
        )));
    }
    // 20 s of sending on the test clock, a quarter second at a time; the short real pause only
    // lets the executors work between steps (every limit is checked on the database clock).
    let conn = db.connect().await?;
    for _ in 0..80 {
        conn.execute(
            "SELECT herald.set_test_clock(
                 coalesce((SELECT skew FROM herald.test_clock), interval '0') + interval '250 ms')",
            &[],
        )
        .await?;
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let _ = stop_tx.send(true);
    for e in executors {
        e.await??;
    }

    // Each send at its grant instant, not its lease time: a routed lease is written before its
    // grant reserves the account's capacity, by the claim's wait for the account rows
    // (docs/accounts.md), which this fast clock stretches into bursts the bucket never granted.
    let all = granted_sends(&db).await?;
    assert_eq!(
        all.len(),
        sends(&db).await?.len(),
        "every send has its grant instant"
    );
    let window = chrono::Duration::seconds(20);
    for (name, per_second, burst, max_in_flight) in
        [("fast", 20.0, 5, Some(3)), ("slow", 8.0, 2, None)]
    {
        let mine: Vec<&Send> = all.iter().filter(|s| s.account == name).collect();
        let times: Vec<DateTime<Utc>> = mine.iter().map(|s| s.leased_at).collect();
        assert!(
            times.len() > 20,
            "{name} sent too little to test: {}",
            times.len()
        );
        // Never more than rate x window + burst in any window, however long.
        for w in [1, 2, 5, 20] {
            let most = max_in_window(&times, chrono::Duration::seconds(w));
            let allowed = (per_second * w as f64).floor() as usize + burst;
            assert!(
                most <= allowed,
                "{name}: {most} sends in {w}s, allowed {allowed}"
            );
        }
        let total = times.len();
        let allowed = (per_second * 20.0) as usize + burst;
        assert!(
            max_in_window(&times, window) <= allowed,
            "{name}: {total} in the window"
        );
        if let Some(max) = max_in_flight {
            let overlap = max_overlap(&mine);
            assert!(overlap <= max, "{name}: {overlap} in flight, limit {max}");
        }
    }
    Ok(())
}

#[tokio::test]
async fn the_high_priority_reserve_keeps_slots_for_urgent_tasks() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut accounts = accounts_client(&scheduler.grpc_url()).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let mut limits = rate(1000.0, 1000);
    limits.max_in_flight = Some(4);
    limits.high_priority_reserve = 0.5;
    create_account(&mut accounts, account("acct", "pool", limits)).await?;
    let low: Vec<TaskSpec> = (0..10)
        .map(|i| {
            let mut t = pooled("pool", &format!("+10{i}"));
            t.priority = Some(1);
            t
        })
        .collect();
    create_many(&mut tasks, low).await?;

    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "holder", &[], 100).await?;
    let held = exec.leases(2).await?;
    assert_eq!(held.len(), 2, "low priority stops at its share");
    // The bulk leaves two slots free: an urgent task created now still goes out.
    let mut urgent = pooled("pool", "+999");
    urgent.priority = Some(9);
    let urgent_id = create(&mut tasks, urgent).await?;
    let lease = exec.leases(1).await?.remove(0);
    assert_eq!(lease.task_id, urgent_id);
    assert_eq!(
        get_account(&mut accounts, "acct")
            .await?
            .status
            .context("status")?
            .in_flight,
        3
    );
    Ok(())
}

#[tokio::test]
async fn the_daily_cap_counts_in_the_accounts_time_zone_and_resets_at_its_midnight() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut accounts = accounts_client(&scheduler.grpc_url()).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let mut limits = rate(1000.0, 1000);
    limits.daily_cap = Some(3);
    let mut a = account("capped", "pool", limits);
    a.time_zone = "Asia/Tokyo".into();
    create_account(&mut accounts, a).await?;

    // Through the claim: the cap stops the fourth send today.
    create_many(
        &mut tasks,
        (0..5).map(|i| pooled("pool", &format!("+{i}"))).collect(),
    )
    .await?;
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "e", &[], 100).await?;
    let leases = exec.leases(3).await?;
    exec.report_each(&leases, OutcomeClass::Ok).await?;
    let status = get_account(&mut accounts, "capped")
        .await?
        .status
        .context("status")?;
    assert_eq!(status.today_count, 3);
    let conn = db.connect().await?;
    let scheduled: i64 = conn
        .query_one(
            "SELECT count(*) FROM herald.task_records WHERE state = 'scheduled'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(scheduled, 2, "the rest wait for tomorrow");

    // Across midnight in Tokyo, with the clock driven through the reservation function (the
    // one definition of the limits that every claim goes through).
    conn.execute(
        "UPDATE herald.accounts SET day = NULL, day_count = 0, in_flight = 0",
        &[],
    )
    .await?;
    let reserve = |at: &'static str| {
        let conn = &conn;
        async move {
            let row = conn
                .query_one(
                    "SELECT out_low FROM herald.reserve_capacity(
                         'default', ARRAY['capped'], ARRAY[0], ARRAY[5], ARRAY[0], $1::text::timestamptz)",
                    &[&at],
                )
                .await?;
            anyhow::Ok(row.get::<_, i32>(0))
        }
    };
    assert_eq!(reserve("2030-03-01 23:58:00+09").await?, 3);
    assert_eq!(
        reserve("2030-03-01 23:59:59+09").await?,
        0,
        "cap reached for 1 March"
    );
    // 00:00:01 in Tokyo is still 1 March in UTC: the day is the account's, not the server's.
    assert_eq!(
        reserve("2030-03-02 00:00:01+09").await?,
        3,
        "a new day in Tokyo"
    );
    assert_eq!(reserve("2030-03-02 12:00:00+09").await?, 0);
    Ok(())
}

#[tokio::test]
async fn sends_to_one_recipient_are_spaced_by_the_interval() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut accounts = accounts_client(&scheduler.grpc_url()).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let mut limits = rate(1000.0, 1000);
    limits.recipient_interval = Some(prost_types::Duration {
        seconds: 1,
        nanos: 0,
    });
    create_account(&mut accounts, account("spaced", "pool", limits)).await?;
    let mut specs: Vec<TaskSpec> = (0..3).map(|_| pooled("pool", "+same")).collect();
    specs.push(pooled("pool", "+other"));
    create_many(&mut tasks, specs).await?;

    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "e", &[], 100).await?;
    let mut got = Vec::new();
    while got.len() < 4 {
        let leases = exec.leases(1).await?;
        exec.report_each(&leases, OutcomeClass::Ok).await?;
        got.extend(leases);
    }
    let all = sends(&db).await?;
    let same: Vec<DateTime<Utc>> = all
        .iter()
        .filter(|s| s.recipient == "+same")
        .map(|s| s.leased_at)
        .collect();
    assert_eq!(same.len(), 3);
    for pair in same.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(gap >= chrono::Duration::seconds(1), "sent {gap} apart");
    }
    Ok(())
}

#[tokio::test]
async fn quiet_hours_hold_sends_and_the_pool_uses_another_account() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut accounts = accounts_client(&scheduler.grpc_url()).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    // A quiet window around the current time in UTC.
    let now = Utc::now();
    let fmt = |t: DateTime<Utc>| t.format("%H:%M").to_string();
    let mut quiet = rate(1000.0, 1000);
    quiet.quiet_hours = Some(QuietHours {
        start: fmt(now - chrono::Duration::hours(1)),
        end: fmt(now + chrono::Duration::hours(1)),
    });
    create_account(&mut accounts, account("sleeping", "pool", quiet.clone())).await?;
    create_account(&mut accounts, account("awake", "pool", rate(1000.0, 1000))).await?;
    create_many(
        &mut tasks,
        (0..4).map(|i| pooled("pool", &format!("+{i}"))).collect(),
    )
    .await?;
    let pinned_id = create(&mut tasks, pinned("sleeping", "+9")).await?;

    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "e", &[], 100).await?;
    let leases = exec.leases(4).await?;
    assert!(leases.iter().all(|l| l.account_id == "awake"), "{leases:?}");
    exec.send(herald_proto::v1::executor_message::Kind::Heartbeat(
        herald_proto::v1::Heartbeat::default(),
    ))
    .await?;
    match exec.next().await? {
        scheduler_message::Kind::Heartbeat(_) => {}
        other => bail!("the quiet account's task was leased: {other:?}"),
    }
    let task = tasks
        .get_task(GetTaskRequest { id: pinned_id })
        .await?
        .into_inner();
    assert_eq!(task.state(), TaskState::Scheduled);
    Ok(())
}

#[tokio::test]
async fn rate_limits_halve_the_rate_and_successes_restore_it() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut accounts = accounts_client(&scheduler.grpc_url()).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let mut limits = rate(100.0, 100);
    limits.recovery_successes = Some(3);
    limits.adaptive_floor = Some(0.1);
    create_account(&mut accounts, account("wa", "pool", limits)).await?;
    create_many(
        &mut tasks,
        (0..40).map(|i| pooled("pool", &format!("+{i}"))).collect(),
    )
    .await?;

    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "e", &[], 1).await?;
    // A 429 storm: each one halves the effective rate, down to the floor (10/s).
    let mut rates = Vec::new();
    for _ in 0..5 {
        let lease = exec.leases(1).await?.remove(0);
        exec.report(vec![result(&lease, OutcomeClass::RateLimited)])
            .await?;
        exec.credit(1).await?;
        rates.push(
            get_account(&mut accounts, "wa")
                .await?
                .status
                .context("status")?
                .effective_rate,
        );
    }
    assert_eq!(rates, vec![50.0, 25.0, 12.5, 10.0, 10.0]);
    let status = get_account(&mut accounts, "wa")
        .await?
        .status
        .context("status")?;
    assert!(
        status.rate_change_reason.contains("RATE_LIMITED"),
        "{}",
        status.rate_change_reason
    );

    // Recovery: every 3 successes add a quarter of the configured rate, up to it.
    let mut rates = Vec::new();
    for _ in 0..12 {
        let lease = exec.leases(1).await?.remove(0);
        exec.report(vec![result(&lease, OutcomeClass::Ok)]).await?;
        exec.credit(1).await?;
        rates.push(
            get_account(&mut accounts, "wa")
                .await?
                .status
                .context("status")?
                .effective_rate,
        );
    }
    assert_eq!(
        rates,
        vec![10.0, 10.0, 35.0, 35.0, 35.0, 60.0, 60.0, 60.0, 85.0, 85.0, 85.0, 100.0]
    );
    let status = get_account(&mut accounts, "wa")
        .await?
        .status
        .context("status")?;
    assert!(
        status.rate_change_reason.contains("raised"),
        "{}",
        status.rate_change_reason
    );
    Ok(())
}

#[tokio::test]
async fn retry_after_pauses_the_account_or_only_the_recipient() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut accounts = accounts_client(&scheduler.grpc_url()).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    create_account(&mut accounts, account("wa", "pool", rate(100.0, 100))).await?;
    let first = create(&mut tasks, pooled("pool", "+pair")).await?;
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "e", &[], 10).await?;
    let lease = exec.leases(1).await?.remove(0);
    assert_eq!(lease.task_id, first);

    // The pair limit: only this recipient waits; others go out at once.
    let mut pair = result(&lease, OutcomeClass::RateLimited);
    pair.retry_after = Some(prost_types::Duration {
        seconds: 3600,
        nanos: 0,
    });
    pair.rate_limit_scope = RateLimitScope::Recipient as i32;
    exec.report(vec![pair]).await?;
    let status = get_account(&mut accounts, "wa")
        .await?
        .status
        .context("status")?;
    assert_eq!(
        status.effective_rate, 100.0,
        "a pair limit does not slow the account"
    );
    assert!(status.throttled_until.is_none());
    let again = create(&mut tasks, pooled("pool", "+pair")).await?;
    let other = create(&mut tasks, pooled("pool", "+other")).await?;
    let lease = exec.leases(1).await?.remove(0);
    assert_eq!(lease.task_id, other);
    exec.report(vec![result(&lease, OutcomeClass::Ok)]).await?;
    let waiting = tasks
        .get_task(GetTaskRequest { id: again })
        .await?
        .into_inner();
    assert_eq!(waiting.state(), TaskState::Scheduled);

    // Account-wide: the whole account pauses for retry_after.
    let third = create(&mut tasks, pooled("pool", "+third")).await?;
    let lease = exec.leases(1).await?.remove(0);
    assert_eq!(lease.task_id, third);
    let mut throttled = result(&lease, OutcomeClass::RateLimited);
    throttled.retry_after = Some(prost_types::Duration {
        seconds: 3600,
        nanos: 0,
    });
    exec.report(vec![throttled]).await?;
    let status = get_account(&mut accounts, "wa")
        .await?
        .status
        .context("status")?;
    assert!(status.throttled_until.is_some());
    assert_eq!(status.effective_rate, 50.0);
    let fourth = create(&mut tasks, pooled("pool", "+fourth")).await?;
    exec.send(herald_proto::v1::executor_message::Kind::Heartbeat(
        herald_proto::v1::Heartbeat::default(),
    ))
    .await?;
    match exec.next().await? {
        scheduler_message::Kind::Heartbeat(_) => {}
        other => bail!("a throttled account got a lease: {other:?}"),
    }
    let t = tasks
        .get_task(GetTaskRequest { id: fourth })
        .await?
        .into_inner();
    assert_eq!(t.state(), TaskState::Scheduled);
    Ok(())
}

/// Two sends to one recipient on one account, both throttled for that recipient and reported
/// in one batch: the batch is applied (one block, the longer), not refused as a whole.
#[tokio::test]
async fn two_sends_to_one_recipient_throttled_in_one_batch_block_it_once() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut accounts = accounts_client(&scheduler.grpc_url()).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    create_account(&mut accounts, account("wa", "pool", rate(100.0, 100))).await?;
    create_many(
        &mut tasks,
        vec![pooled("pool", "+pair"), pooled("pool", "+pair")],
    )
    .await?;
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "e", &[], 10).await?;
    let leases = exec.leases(2).await?;
    let throttled = |lease, seconds| {
        let mut r = result(lease, OutcomeClass::RateLimited);
        r.retry_after = Some(prost_types::Duration { seconds, nanos: 0 });
        r.rate_limit_scope = RateLimitScope::Recipient as i32;
        r
    };
    let acks = exec
        .report(vec![throttled(&leases[0], 60), throttled(&leases[1], 3600)])
        .await?;
    assert_eq!(acks.len(), 2);
    assert!(acks.iter().all(|a| a.accepted), "{acks:?}");

    let sql = db.connect().await?;
    let rows = sql
        .query(
            "SELECT extract(epoch FROM blocked_until - last_sent_at)::bigint AS held
             FROM herald.recipient_sends
             WHERE account_id = 'wa' AND recipient = 'pair'",
            &[],
        )
        .await?;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, i64>("held"), 3600, "the longer block wins");
    Ok(())
}

#[tokio::test]
async fn an_unavailable_account_goes_offline_and_its_pooled_tasks_move_without_losing_an_attempt(
) -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut accounts = accounts_client(&scheduler.grpc_url()).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    // "broken" has more room, so it is picked first.
    create_account(&mut accounts, account("broken", "pool", rate(1000.0, 1000))).await?;
    create_account(&mut accounts, account("healthy", "pool", rate(10.0, 10))).await?;
    let id = create(&mut tasks, pooled("pool", "+1").with_max_attempts(1)).await?;
    let pinned_id = create(
        &mut tasks,
        pinned("broken", "+2")
            .with_expire_at(std::time::SystemTime::now() + Duration::from_secs(3)),
    )
    .await?;

    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "e", &[], 1).await?;
    let lease = exec.leases(1).await?.remove(0);
    let first_account = lease.account_id.clone();
    assert_eq!(first_account, "broken");
    let mut down = result(&lease, OutcomeClass::AccountUnavailable);
    down.error = "(#131031) account locked".into();
    exec.report(vec![down]).await?;
    let a = get_account(&mut accounts, "broken").await?;
    assert_eq!(a.state(), AccountState::Offline);
    let status = a.status.context("status")?;
    assert!(status.offline_until.is_some());
    assert!(
        status.state_reason.contains("131031"),
        "{}",
        status.state_reason
    );

    exec.credit(1).await?;
    let lease = exec.leases(1).await?.remove(0);
    assert_eq!(
        (lease.task_id.as_str(), lease.account_id.as_str()),
        (id.as_str(), "healthy")
    );
    assert_eq!(
        lease.attempts_before, 0,
        "no attempt spent on the offline account"
    );
    exec.report(vec![result(&lease, OutcomeClass::Ok)]).await?;
    let task = wait_for_task_state(&mut tasks, &id, TaskState::Succeeded, WAIT).await?;
    assert_eq!(task.attempts, 1);

    // The task pinned to the offline account waits, then expires by its deadline.
    wait_for_task_state(&mut tasks, &pinned_id, TaskState::Expired, WAIT).await?;
    Ok(())
}

#[tokio::test]
async fn an_executor_only_gets_accounts_it_holds_credentials_for() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut accounts = accounts_client(&scheduler.grpc_url()).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    create_account(&mut accounts, account("mine", "pool", rate(1.0, 1))).await?;
    let mut theirs = account("theirs", "pool", rate(1000.0, 1000));
    theirs.credentials_ref = unique_id("secret-ref");
    create_account(&mut accounts, theirs).await?;
    create_many(
        &mut tasks,
        (0..3).map(|i| pooled("pool", &format!("+{i}"))).collect(),
    )
    .await?;

    let mut client = herald_tests::connect_lease(&scheduler.grpc_url()).await?;
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tx.send(herald_proto::v1::ExecutorMessage {
        kind: Some(herald_proto::v1::executor_message::Kind::Hello(
            herald_proto::v1::Hello {
                executor_id: "partial".into(),
                protocol_version: 1,
                queues: vec![],
                initial_credit: 10,
                credentials_refs: vec!["mine".into()],
            },
        )),
    })
    .await?;
    let mut stream = client
        .lease(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    let mut leases = Vec::new();
    while leases.is_empty() {
        match stream.message().await?.and_then(|m| m.kind) {
            Some(scheduler_message::Kind::Leases(b)) => leases.extend(b.leases),
            Some(scheduler_message::Kind::Welcome(_)) => {}
            other => bail!("unexpected {other:?}"),
        }
    }
    // "mine" has a burst of 1: one lease, through it, although "theirs" has all the room.
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].account_id, "mine");
    assert_eq!(leases[0].credentials_ref, "mine");
    drop(tx);
    let per_account: BTreeMap<String, usize> =
        sends(&db).await?.iter().fold(BTreeMap::new(), |mut m, s| {
            *m.entry(s.account.clone()).or_default() += 1;
            m
        });
    assert!(!per_account.contains_key("theirs"));
    Ok(())
}

/// An account's leased tasks are left out of the index the search by account reads (migration
/// 33); they must still count as the account's live tasks and show in its search.
#[tokio::test]
async fn an_account_holding_only_a_lease_is_kept_and_its_search_finds_every_state() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut accounts = accounts_client(&scheduler.grpc_url()).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    create_account(&mut accounts, account("acct", "pool", rate(1000.0, 1000))).await?;
    create_account(&mut accounts, account("other", "spare", rate(1000.0, 1000))).await?;
    let later = create(
        &mut tasks,
        pinned("acct", "+1").with_delay(Duration::from_secs(3600)),
    )
    .await?;
    create(
        &mut tasks,
        pinned("other", "+2").with_delay(Duration::from_secs(3600)),
    )
    .await?;
    let sent = create(&mut tasks, pooled("pool", "+3")).await?;
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "e", &[], 1).await?;
    let first = exec.leases(1).await?.remove(0);
    assert_eq!(
        (first.task_id.as_str(), first.account_id.as_str()),
        (sent.as_str(), "acct")
    );
    exec.report(vec![result(&first, OutcomeClass::Ok)]).await?;
    let held = create(&mut tasks, pooled("pool", "+4")).await?;
    exec.credit(1).await?;
    let second = exec.leases(1).await?.remove(0);
    assert_eq!(second.task_id, held);

    let listed = tasks
        .list_tasks(herald_proto::v1::ListTasksRequest {
            filter: Some(herald_proto::v1::TaskFilter {
                account_id: "acct".into(),
                ..Default::default()
            }),
            page_size: 100,
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut found: Vec<(String, TaskState)> = listed
        .tasks
        .iter()
        .map(|t| (t.id.clone(), t.state()))
        .collect();
    found.sort();
    let mut want = vec![
        (later.clone(), TaskState::Scheduled),
        (sent, TaskState::Succeeded),
        (held.clone(), TaskState::Leased),
    ];
    want.sort();
    assert_eq!(found, want, "the search by account");

    // The scheduled task ended: the lease alone keeps the account.
    tasks
        .cancel_task(herald_proto::v1::CancelTaskRequest { id: later })
        .await?;
    let status = accounts
        .delete_account(DeleteAccountRequest { id: "acct".into() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status.message().contains("still has 1 "),
        "{}",
        status.message()
    );
    // The report is acknowledged once applied: the account then has no live task.
    exec.report(vec![result(&second, OutcomeClass::Ok)]).await?;
    accounts
        .delete_account(DeleteAccountRequest { id: "acct".into() })
        .await?;
    Ok(())
}

/// DeleteAccount counts the tasks that need the account under the account's lock: a claim
/// leasing through it holds the row until it commits, and the delete then sees the lease and
/// refuses, instead of deleting the account from under it. A pooled task waiting to go again
/// only names the account it last went through: it does not keep the account.
#[tokio::test]
async fn a_delete_racing_a_claim_sees_its_lease_and_a_pooled_retry_keeps_nothing() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut accounts = accounts_client(&scheduler.grpc_url()).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    create_account(&mut accounts, account("acct", "pool", rate(1000.0, 1000))).await?;
    let task = create(
        &mut tasks,
        pooled("pool", "+1").with_delay(Duration::from_secs(3600)),
    )
    .await?;
    let mut holder = db.connect().await?;
    let watcher = db.connect().await?;
    let (tx, pid) = hold_account(&mut holder, "acct").await?;
    // The claim, holding the account's row, leases the task through it.
    tx.execute(
        "UPDATE herald.tasks SET state = 'leased', account_id = 'acct',
                lease_expires_at = now() + interval '1 hour'
         WHERE id = $1::text::uuid",
        &[&task],
    )
    .await?;
    let mut deleting = accounts.clone();
    let delete = tokio::spawn(async move {
        deleting
            .delete_account(DeleteAccountRequest { id: "acct".into() })
            .await
    });
    until_blocked_by(&watcher, pid, "the delete to wait for the claim").await?;
    tx.commit().await?;
    let status = delete
        .await?
        .err()
        .context("the account was deleted under a lease")?;
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    // The lease ends and the task waits to go again, still naming the account.
    watcher
        .execute(
            "UPDATE herald.tasks SET state = 'scheduled', lease_expires_at = NULL
             WHERE id = $1::text::uuid",
            &[&task],
        )
        .await?;
    accounts
        .delete_account(DeleteAccountRequest { id: "acct".into() })
        .await
        .context("a pooled task waiting to go again kept the account")?;
    Ok(())
}

/// An operator's edit of an account's limits while a report or a webhook holds the account's
/// row and pauses it: the edit waits for the row, then keeps the pause. Before, it read the
/// account first and wrote `active` back over the pause, putting a number the provider had
/// disabled, or one that paused itself over its failures, straight back into rotation.
#[tokio::test]
async fn an_edit_racing_a_pause_keeps_the_pause() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut accounts = accounts_client(&s.grpc_url()).await?;
    create_account(&mut accounts, account("acct", "p", rate(10.0, 1))).await?;
    let mut holder = db.connect().await?;
    let watcher = db.connect().await?;
    let (tx, pid) = hold_account(&mut holder, "acct").await?;

    let mut patch = account("acct", "p", rate(10.0, 1));
    patch.limits = Some(AccountLimits {
        rate_per_second: 10.0,
        daily_cap: Some(500),
        ..Default::default()
    });
    let mut editing = accounts.clone();
    let edit = tokio::spawn(async move {
        editing
            .update_account(UpdateAccountRequest {
                account: Some(patch),
                update_mask: Some(prost_types::FieldMask {
                    paths: vec!["limits.daily_cap".into()],
                }),
            })
            .await
    });
    until_blocked_by(&watcher, pid, "the edit waits for the account's row").await?;
    tx.execute(
        "UPDATE herald.accounts SET state = 'paused', state_reason = 'paused by the provider: test'
         WHERE namespace = 'default' AND id = 'acct'",
        &[],
    )
    .await?;
    tx.commit().await?;

    let edited = edit.await??.into_inner();
    assert_eq!(edited.state(), AccountState::Paused, "{edited:?}");
    assert_eq!(edited.limits.context("limits")?.daily_cap, Some(500));
    Ok(())
}

/// Moving an account to another time zone keeps what it sent today: the count kept for the old
/// zone's day becomes the new zone's day's. Before, the count stayed on the old zone's date,
/// which the new zone read as a fresh day: a second full daily cap at once. The two zones are
/// 25 hours apart, so their dates differ whenever the test runs.
#[tokio::test]
async fn a_new_time_zone_keeps_todays_count() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let mut accounts = accounts_client(&s.grpc_url()).await?;
    let mut capped = account(
        "acct",
        "p",
        AccountLimits {
            rate_per_second: 10.0,
            daily_cap: Some(100),
            ..Default::default()
        },
    );
    capped.time_zone = "Pacific/Pago_Pago".into();
    create_account(&mut accounts, capped).await?;
    db.connect()
        .await?
        .execute(
            "UPDATE herald.accounts
             SET day = (herald.now() AT TIME ZONE time_zone)::date, day_count = 60
             WHERE namespace = 'default' AND id = 'acct'",
            &[],
        )
        .await?;
    let today = |a: &Account| a.status.as_ref().map(|s| s.today_count);
    assert_eq!(today(&get_account(&mut accounts, "acct").await?), Some(60));

    let moved = accounts
        .update_account(UpdateAccountRequest {
            account: Some(Account {
                id: "acct".into(),
                time_zone: "Pacific/Kiritimati".into(),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["time_zone".into()],
            }),
        })
        .await?
        .into_inner();
    assert_eq!(moved.time_zone, "Pacific/Kiritimati");
    assert_eq!(today(&get_account(&mut accounts, "acct").await?), Some(60));
    Ok(())
}

/// An account with a daily cap of 100 that sent 40 today, holding one lease of `executor`'s
/// granted yesterday by its clock (before its midnight); the task's id, the lease and the
/// clients.
async fn lease_from_yesterday(
    db: &TestDb,
    s: &SchedulerProcess,
) -> Result<(
    String,
    herald_proto::v1::Lease,
    ScriptedExecutor,
    TaskServiceClient<Channel>,
    AccountServiceClient<Channel>,
)> {
    let mut accounts = accounts_client(&s.grpc_url()).await?;
    let limits = AccountLimits {
        rate_per_second: 10.0,
        daily_cap: Some(100),
        ..Default::default()
    };
    create_account(&mut accounts, account("acct", "p", limits)).await?;
    let mut tasks = connect_tasks(&s.grpc_url()).await?;
    let id = create(&mut tasks, pinned("acct", "+1")).await?;
    let mut exec = ScriptedExecutor::connect(&s.grpc_url(), "midnight", &[], 1).await?;
    let lease = exec.leases(1).await?.remove(0);
    db.connect()
        .await?
        .batch_execute(
            "UPDATE herald.tasks SET leased_at = leased_at - interval '1 day';
             UPDATE herald.accounts SET day = (herald.now() AT TIME ZONE time_zone)::date,
                                        day_count = 40",
        )
        .await?;
    Ok((id, lease, exec, tasks, accounts))
}

/// `acct`'s sends counted today and leases held now.
async fn today_and_in_flight(accounts: &mut AccountServiceClient<Channel>) -> Result<(i32, i32)> {
    let status = get_account(accounts, "acct")
        .await?
        .status
        .context("status")?;
    Ok((status.today_count, status.in_flight))
}

/// A lease granted before the account's midnight and handed back after it (an executor
/// draining at 00:05): its send was counted on the day before, so the new day's count keeps
/// what it has. Before, the release took it off the new day's count, and the account could
/// send that many more than its daily cap on the new day (hundreds, for a draining executor).
#[tokio::test]
async fn a_lease_from_before_midnight_handed_back_after_it_refunds_nothing_today() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let (id, lease, exec, mut tasks, mut accounts) = lease_from_yesterday(&db, &s).await?;
    exec.send(executor_message::Kind::Release(herald_proto::v1::Release {
        leases: vec![herald_tests::lease::lease_ref(&lease)],
    }))
    .await?;
    wait_for_task_state(&mut tasks, &id, TaskState::Scheduled, WAIT).await?;
    assert_eq!(today_and_in_flight(&mut accounts).await?, (40, 0));
    Ok(())
}

/// The same for a send the account could not make (ACCOUNT_UNAVAILABLE gives the daily count
/// back, since nothing was sent): not from the new day's count.
#[tokio::test]
async fn an_unavailable_account_after_midnight_refunds_nothing_today() -> Result<()> {
    let db = TestDb::new().await?;
    let s = SchedulerProcess::spawn(&db).await?;
    let (_id, lease, mut exec, _tasks, mut accounts) = lease_from_yesterday(&db, &s).await?;
    let acks = exec
        .report(vec![result(&lease, OutcomeClass::AccountUnavailable)])
        .await?;
    assert!(acks[0].accepted, "{acks:?}");
    assert_eq!(today_and_in_flight(&mut accounts).await?, (40, 0));
    Ok(())
}
