//! Account in-flight slots (#14): every lease an account holds is counted once in its
//! in-flight count (`herald.account_in_flight`: the row's count less the releases waiting in
//! `account_deltas`), whatever fails in between. A report batch is one transaction, so a
//! connection that dies between the task transition and the slot release loses neither (the
//! scheduler runs the batch again on a fresh connection and applies it once); a batch of
//! successes frees its slots without waiting for a claim that holds the account row (#18); and
//! a count that drifted anyway (a manual edit here) is corrected by the reconciler.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use herald_proto::v1::account_service_client::AccountServiceClient;
use herald_proto::v1::task_service_client::TaskServiceClient;
use herald_proto::v1::{
    Account, AccountLimits, CreateAccountRequest, Lease, OutcomeClass, TaskSpec, TaskState,
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
            "SELECT herald.account_in_flight(a) AS in_flight,
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

/// One task of a fresh pool with account `wa-1`, leased by an executor: the task client, the
/// task's id, the executor and its lease.
async fn one_leased_task(
    url: &str,
) -> Result<(TaskServiceClient<Channel>, String, ScriptedExecutor, Lease)> {
    let pool = unique_id("pool");
    create_account(url, "wa-1", &pool).await?;
    let mut tasks = connect_tasks(url).await?;
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
        .context("task in response")?;
    let mut executor = ScriptedExecutor::connect(url, "exec", &[&queue], 1).await?;
    let lease = executor.leases(1).await?.remove(0);
    Ok((tasks, task.id, executor, lease))
}

#[tokio::test]
async fn a_connection_killed_mid_report_loses_no_slot() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let (mut tasks, task_id, mut executor, lease) = one_leased_task(&scheduler.grpc_url()).await?;
    assert_eq!(slots(&db, "wa-1").await?, (1, 1));

    // The report's slot release (a row waiting to be folded into the account) kills its own
    // connection, once: after the task's transition was written in the same transaction. A
    // sequence, because it is not rolled back with that transaction.
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
             CREATE TRIGGER kill_mid_report BEFORE INSERT ON herald.account_deltas
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
    wait_for_task_state(&mut tasks, &task_id, TaskState::Succeeded, WAIT).await?;
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

/// (the row's own in-flight count, deltas waiting to be folded in, outcomes the row has seen).
async fn account_row(db: &TestDb, account: &str) -> Result<(i32, i64, i32)> {
    let row = db
        .connect()
        .await?
        .query_one(
            "SELECT a.in_flight, a.outcomes_seen,
                    (SELECT count(*) FROM herald.account_deltas d WHERE d.account_id = a.id)
                        AS waiting
             FROM herald.accounts a WHERE a.id = $1",
            &[&account],
        )
        .await?;
    Ok((
        row.try_get("in_flight")?,
        row.try_get("waiting")?,
        row.try_get("outcomes_seen")?,
    ))
}

#[tokio::test]
async fn a_report_batch_frees_its_slots_while_a_claim_holds_the_account_row() -> Result<()> {
    // A claim holds the rows of the accounts it reserves on until it commits. A report batch
    // whose sends succeeded records its freed slots and successes beside the row instead of
    // updating it, so it neither waits for such a claim nor holds one up; the folder applies
    // them once the row is free.
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let (mut tasks, task_id, mut executor, lease) = one_leased_task(&scheduler.grpc_url()).await?;
    assert_eq!(account_row(&db, "wa-1").await?, (1, 0, 0));

    // Hold the account row as a claim's reservation does.
    let mut holder = db.connect().await?;
    let hold = holder.transaction().await?;
    hold.execute(
        "SELECT 1 FROM herald.accounts WHERE id = 'wa-1' FOR UPDATE",
        &[],
    )
    .await?;
    let acks = tokio::time::timeout(
        WAIT,
        executor.report(vec![result(&lease, OutcomeClass::Ok)]),
    )
    .await
    .context("the report waited for the account row")??;
    assert!(acks[0].accepted, "{acks:?}");
    wait_for_task_state(&mut tasks, &task_id, TaskState::Succeeded, WAIT).await?;
    assert_eq!(
        slots(&db, "wa-1").await?,
        (0, 0),
        "the slot is free at once"
    );
    let status = herald_tests::accounts::get_account(
        &mut herald_tests::accounts::accounts_client(&scheduler.grpc_url()).await?,
        "wa-1",
    )
    .await?
    .status
    .context("status")?;
    assert_eq!(status.in_flight, 0, "GetAccount counts the waiting release");
    assert_eq!(
        account_row(&db, "wa-1").await?,
        (1, 1, 0),
        "the row itself is untouched; the release waits beside it"
    );

    // Once the row is free the folder applies the release and the success, and deletes it.
    hold.rollback().await?;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let now = account_row(&db, "wa-1").await?;
        if now == (0, 0, 1) {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!("the waiting release was not folded in: {now:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(slots(&db, "wa-1").await?, (0, 0));
    Ok(())
}
