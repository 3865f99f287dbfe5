//! Account in-flight slots (#14): every lease an account holds is counted once in
//! `accounts.in_flight`, whatever fails in between. A report batch is one transaction, so a
//! connection that dies between the task transition and the slot release loses neither (the
//! scheduler runs the batch again on a fresh connection and applies it once); and a
//! count that drifted anyway (a manual edit here) is corrected by the reconciler.

use std::time::Duration;

use anyhow::{bail, Result};
use herald_proto::v1::account_service_client::AccountServiceClient;
use herald_proto::v1::{
    Account, AccountLimits, CreateAccountRequest, OutcomeClass, TaskSpec, TaskState,
};
use herald_tests::lease::{result, ScriptedExecutor};
use herald_tests::{
    connect_tasks, task_spec, unique_id, wait_for_task_state, SchedulerProcess, TestDb,
};
use tonic::transport::Channel;

const WAIT: Duration = Duration::from_secs(20);

async fn create_account(url: &str, id: &str, pool: &str) -> Result<()> {
    let mut client =
        AccountServiceClient::new(Channel::from_shared(url.to_owned())?.connect().await?);
    client
        .create_account(CreateAccountRequest {
            account: Some(Account {
                id: id.into(),
                sender_kind: "webhook".into(),
                pool: pool.into(),
                limits: Some(AccountLimits {
                    rate_per_second: 100.0,
                    max_in_flight: Some(5),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .await?;
    Ok(())
}

/// (in_flight, leases the account holds now).
async fn slots(db: &TestDb, account: &str) -> Result<(i32, i64)> {
    let conn = db.connect().await?;
    let row = conn
        .query_one(
            "SELECT a.in_flight,
                    (SELECT count(*) FROM herald.tasks t
                     WHERE t.account_id = a.id AND t.state = 'leased') AS leases
             FROM herald.accounts a WHERE a.id = $1",
            &[&account],
        )
        .await?;
    Ok((row.try_get("in_flight")?, row.try_get("leases")?))
}

/// Polls until `check` holds for the account's slots; the reconciler's work is a database
/// state, so there is no event to await.
async fn wait_for_slots(
    db: &TestDb,
    account: &str,
    check: impl Fn((i32, i64)) -> bool,
) -> Result<(i32, i64)> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let now = slots(db, account).await?;
        if check(now) {
            return Ok(now);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("account {account} slots stayed at {now:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_connection_killed_mid_report_loses_no_slot() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let url = scheduler.grpc_url();
    let pool = unique_id("pool");
    create_account(&url, "wa-1", &pool).await?;
    let mut tasks = connect_tasks(&url).await?;
    let queue = unique_id("q");
    let task = tasks
        .create_task(herald_proto::v1::CreateTaskRequest {
            task: Some(TaskSpec {
                pool: pool.clone(),
                ..task_spec(&queue, "+15550001", "hi")
            }),
        })
        .await?
        .into_inner()
        .task
        .expect("task in response");

    let mut executor = ScriptedExecutor::connect(&url, "exec", &[&queue], 1).await?;
    let lease = executor.leases(1).await?.remove(0);
    assert_eq!(slots(&db, "wa-1").await?, (1, 1));

    // The next change to an account row (the report's slot release) kills its own connection,
    // once: after the task's transition was written in the same transaction. A sequence,
    // because it is not rolled back with that transaction.
    db.connect()
        .await?
        .batch_execute(
            "CREATE SEQUENCE kill_once;
             CREATE FUNCTION kill_own_connection() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF nextval('kill_once') = 1 THEN
                     PERFORM pg_terminate_backend(pg_backend_pid());
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER kill_mid_report BEFORE UPDATE ON herald.accounts
                 FOR EACH ROW EXECUTE FUNCTION kill_own_connection();",
        )
        .await?;
    // The batch's transaction dies before its COMMIT, so nothing of it was kept; the scheduler
    // runs it again on a fresh connection (as after a failover) and the whole batch is applied
    // once: the report acknowledged, the task ended, its slot freed.
    let acks = executor
        .report(vec![result(&lease, OutcomeClass::Ok)])
        .await?;
    assert!(acks[0].accepted, "{acks:?}");
    wait_for_task_state(&mut tasks, &task.id, TaskState::Succeeded, WAIT).await?;
    assert_eq!(slots(&db, "wa-1").await?, (0, 0));
    let attempts: i64 = db
        .connect()
        .await?
        .query_one("SELECT count(*) AS n FROM herald.attempts", &[])
        .await?
        .get("n");
    assert_eq!(attempts, 1, "the batch was applied more than once");

    // The executor's own resend (as after a lost stream) is refused: the lease is over.
    let acks = executor
        .report(vec![result(&lease, OutcomeClass::Ok)])
        .await?;
    assert!(!acks[0].accepted, "{acks:?}");
    assert_eq!(slots(&db, "wa-1").await?, (0, 0));
    Ok(())
}

#[tokio::test]
async fn the_reconciler_corrects_a_count_that_drifted() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_RECONCILE_INTERVAL", "100ms")
        .spawn()
        .await?;
    let url = scheduler.grpc_url();
    let pool = unique_id("pool");
    create_account(&url, "wa-1", &pool).await?;
    let mut tasks = connect_tasks(&url).await?;
    let queue = unique_id("q");
    for recipient in ["+15550001", "+15550002"] {
        tasks
            .create_task(herald_proto::v1::CreateTaskRequest {
                task: Some(TaskSpec {
                    pool: pool.clone(),
                    ..task_spec(&queue, recipient, "hi")
                }),
            })
            .await?;
    }
    let mut executor = ScriptedExecutor::connect(&url, "exec", &[&queue], 2).await?;
    let leases = executor.leases(2).await?;
    assert_eq!(slots(&db, "wa-1").await?, (2, 2));

    // Leaked slots (the account would stop sending at max_in_flight) and invented ones.
    let conn = db.connect().await?;
    conn.execute(
        "UPDATE herald.accounts SET in_flight = 5 WHERE id = 'wa-1'",
        &[],
    )
    .await?;
    wait_for_slots(&db, "wa-1", |(in_flight, leases)| {
        i64::from(in_flight) == leases
    })
    .await?;
    executor
        .report(vec![result(&leases[0], OutcomeClass::Ok)])
        .await?;
    assert_eq!(slots(&db, "wa-1").await?, (1, 1));
    conn.execute(
        "UPDATE herald.accounts SET in_flight = 0 WHERE id = 'wa-1'",
        &[],
    )
    .await?;
    assert_eq!(
        wait_for_slots(&db, "wa-1", |(in_flight, _)| in_flight == 1).await?,
        (1, 1)
    );
    assert!(
        scheduler
            .stderr_all()
            .contains("account in-flight count differed from its leases"),
        "the correction is logged"
    );
    Ok(())
}
