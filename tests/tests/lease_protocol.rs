//! The scheduler's half of the lease stream, driven frame by frame by a scripted executor:
//! credit, outcomes and retries, fencing, extension, revokes, priorities and due times.

use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use herald_proto::v1::{
    executor_message, retry_policy, scheduler_message, task_service_client::TaskServiceClient,
    CancelOutcome, CancelTaskRequest, CreateTaskRequest, CreateTasksRequest, EndReason,
    ExecutorMessage, FixedDelays, GetTaskRequest, Heartbeat, ListAttemptsRequest, OutcomeClass,
    RetryPolicy, RevokeResult, TaskSpec, TaskState,
};
use herald_tests::accounts::create_many;
use herald_tests::lease::{lease_ref, result, ScriptedExecutor};
use herald_tests::metrics::{scrape, series};
use herald_tests::{
    connect_lease, connect_tasks, task_spec, unique_id, until, wait_for_task_state,
    SchedulerProcess, TaskSpecExt, TestDb,
};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

const WAIT: Duration = Duration::from_secs(20);

fn ms(ts: &Option<prost_types::Timestamp>) -> i64 {
    let ts = ts.as_ref().expect("timestamp present");
    ts.seconds * 1000 + i64::from(ts.nanos) / 1_000_000
}

fn micros(ts: &Option<prost_types::Timestamp>) -> i64 {
    let ts = ts.as_ref().expect("timestamp present");
    ts.seconds * 1_000_000 + i64::from(ts.nanos) / 1_000
}

async fn create(client: &mut TaskServiceClient<Channel>, spec: TaskSpec) -> Result<String> {
    let task = client
        .create_task(CreateTaskRequest { task: Some(spec) })
        .await?
        .into_inner()
        .task
        .expect("task in response");
    Ok(task.id)
}

fn delays(list: &[Duration]) -> RetryPolicy {
    RetryPolicy {
        strategy: Some(retry_policy::Strategy::Delays(FixedDelays {
            delays: list
                .iter()
                .map(|d| prost_types::Duration {
                    seconds: d.as_secs() as i64,
                    nanos: d.subsec_nanos() as i32,
                })
                .collect(),
        })),
    }
}

async fn leased_count(db: &TestDb) -> Result<i64> {
    let conn = db.connect().await?;
    let row = conn
        .query_one(
            "SELECT count(*) FROM herald.tasks WHERE state = 'leased'",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

#[tokio::test]
async fn grants_no_more_leases_than_credit() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let queue = unique_id("q");
    let specs = (0..10)
        .map(|i| task_spec(&queue, &format!("+1555000{i}"), "hi"))
        .collect();
    tasks
        .create_tasks(CreateTasksRequest {
            tasks: specs,
            ..Default::default()
        })
        .await?;

    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "exec-a", &[], 3).await?;
    let first = exec.leases(3).await?;
    assert_eq!(first.len(), 3, "exactly the credit is granted");
    // With its credit spent the dispatcher is parked on the credit semaphore, so the database
    // shows exactly what was granted.
    assert_eq!(leased_count(&db).await?, 3);

    exec.credit(2).await?;
    let more = exec.leases(2).await?;
    assert_eq!(more.len(), 2);
    assert_eq!(leased_count(&db).await?, 5);
    Ok(())
}

#[tokio::test]
async fn outcomes_move_tasks_to_their_states_and_record_attempts() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let queue = unique_id("q");
    let ok = create(&mut tasks, task_spec(&queue, "+1", "ok")).await?;
    let permanent = create(&mut tasks, task_spec(&queue, "+2", "perm")).await?;
    let exhausted = create(
        &mut tasks,
        task_spec(&queue, "+3", "x").with_max_attempts(1),
    )
    .await?;
    let mut retry_spec = task_spec(&queue, "+4", "retry");
    retry_spec.retry_policy = Some(delays(&[Duration::from_secs(3600)]));
    let retried = create(&mut tasks, retry_spec).await?;
    let throttled = create(&mut tasks, task_spec(&queue, "+5", "429")).await?;
    let offline = create(&mut tasks, task_spec(&queue, "+6", "offline")).await?;

    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "exec-a", &[], 6).await?;
    let leases = exec.leases(6).await?;
    let by_id = |id: &str| leases.iter().find(|l| l.task_id == id).expect("leased");
    let mut rate_limited = result(by_id(&throttled), OutcomeClass::RateLimited);
    rate_limited.retry_after = Some(prost_types::Duration {
        seconds: 7200,
        nanos: 0,
    });
    let mut provider_ok = result(by_id(&ok), OutcomeClass::Ok);
    provider_ok.provider_message_id = "wamid.123".into();
    let acks = exec
        .report(vec![
            provider_ok,
            result(by_id(&permanent), OutcomeClass::Permanent),
            result(by_id(&exhausted), OutcomeClass::Transient),
            result(by_id(&retried), OutcomeClass::Transient),
            rate_limited,
            result(by_id(&offline), OutcomeClass::AccountUnavailable),
        ])
        .await?;
    assert_eq!(acks.len(), 6);
    assert!(acks.iter().all(|a| a.accepted), "{acks:?}");

    let get = |id: String| {
        let mut tasks = tasks.clone();
        async move { anyhow::Ok(tasks.get_task(GetTaskRequest { id }).await?.into_inner()) }
    };
    assert_eq!(get(ok.clone()).await?.state(), TaskState::Succeeded);
    assert_eq!(get(permanent.clone()).await?.state(), TaskState::Failed);
    let t = get(exhausted).await?;
    assert_eq!(t.state(), TaskState::Failed);
    assert_eq!(t.attempts, 1);

    // The explicit delay list and the provider's retry-after set the next due time.
    let t = get(retried).await?;
    assert_eq!(t.state(), TaskState::Scheduled);
    let delay = ms(&t.run_at) - ms(&t.updated_at);
    assert!((3_599_000..=3_601_000).contains(&delay), "delay {delay} ms");
    let t = get(throttled).await?;
    assert_eq!(t.state(), TaskState::Scheduled);
    let delay = ms(&t.run_at) - ms(&t.updated_at);
    assert!((7_199_000..=7_201_000).contains(&delay), "delay {delay} ms");

    // ACCOUNT_UNAVAILABLE from a task sent by queue alone (no account to take offline, as
    // for a webhook endpoint answering 410): charged and backed off like TRANSIENT. Not
    // charged and due at once, it was leased and sent again about 70 times a second, forever.
    // (From an account it is not charged: accounts.rs.)
    let t = get(offline).await?;
    assert_eq!(t.state(), TaskState::Scheduled);
    assert_eq!(t.attempts, 1);
    assert!(
        ms(&t.run_at) > ms(&t.updated_at),
        "due again at once: {:?} against {:?}",
        t.run_at,
        t.updated_at
    );

    let attempts = tasks
        .list_attempts(ListAttemptsRequest { task_id: ok })
        .await?
        .into_inner()
        .attempts;
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].outcome(), OutcomeClass::Ok);
    assert_eq!(attempts[0].executor_id, "exec-a");
    assert_eq!(attempts[0].provider_message_id, "wamid.123");
    let attempts = tasks
        .list_attempts(ListAttemptsRequest { task_id: permanent })
        .await?
        .into_inner()
        .attempts;
    assert_eq!(attempts[0].outcome(), OutcomeClass::Permanent);
    assert_eq!(attempts[0].error, "scripted OUTCOME_CLASS_PERMANENT");
    Ok(())
}

#[tokio::test]
async fn a_transient_failure_is_retried_after_its_backoff_then_succeeds() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let queue = unique_id("q");
    let mut spec = task_spec(&queue, "+1", "retry me");
    spec.retry_policy = Some(delays(&[Duration::from_millis(300)]));
    let id = create(&mut tasks, spec).await?;

    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "exec-a", &[], 10).await?;
    let first = exec.leases(1).await?.remove(0);
    assert_eq!((first.attempt, first.attempts_before), (1, 0));
    let acks = exec
        .report(vec![result(&first, OutcomeClass::Transient)])
        .await?;
    assert_eq!(acks[0].state(), TaskState::Scheduled);
    exec.credit(1).await?;
    let after = tasks
        .get_task(GetTaskRequest { id: id.clone() })
        .await?
        .into_inner();

    let second = exec.leases(1).await?.remove(0);
    assert_eq!(second.task_id, id);
    assert_eq!((second.attempt, second.attempts_before), (2, 1));
    // Never before the backoff's due time, by the database clock.
    assert!(micros(&second.leased_at) >= micros(&after.run_at));
    assert!(ms(&after.run_at) - ms(&after.updated_at) >= 299);

    let acks = exec.report(vec![result(&second, OutcomeClass::Ok)]).await?;
    assert_eq!(acks[0].state(), TaskState::Succeeded);
    let attempts = tasks
        .list_attempts(ListAttemptsRequest { task_id: id })
        .await?
        .into_inner()
        .attempts;
    let outcomes: Vec<_> = attempts.iter().map(|a| a.outcome()).collect();
    assert_eq!(outcomes, vec![OutcomeClass::Transient, OutcomeClass::Ok]);
    Ok(())
}

#[tokio::test]
async fn a_report_for_a_lapsed_lease_is_rejected_and_changes_nothing() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_LEASE_TTL", "1s")
        .spawn()
        .await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let queue = unique_id("q");
    let id = create(&mut tasks, task_spec(&queue, "+1", "fenced")).await?;

    let mut zombie = ScriptedExecutor::connect(&scheduler.grpc_url(), "zombie", &[], 1).await?;
    let stale = zombie.leases(1).await?.remove(0);
    // A second executor gets the task once the first lease runs out unreported.
    let mut fresh = ScriptedExecutor::connect(&scheduler.grpc_url(), "fresh", &[], 1).await?;
    let current = fresh.leases(1).await?.remove(0);
    assert_eq!(current.task_id, id);
    assert_eq!(current.attempt, stale.attempt + 1);

    let acks = zombie
        .report(vec![result(&stale, OutcomeClass::Ok)])
        .await?;
    assert!(!acks[0].accepted, "stale report must be rejected: {acks:?}");
    assert_eq!(acks[0].state(), TaskState::Leased);
    let task = tasks
        .get_task(GetTaskRequest { id: id.clone() })
        .await?
        .into_inner();
    assert_eq!(task.state(), TaskState::Leased);
    assert_eq!(
        task.lease.as_ref().map(|l| l.executor_id.as_str()),
        Some("fresh")
    );

    let acks = fresh
        .report(vec![result(&current, OutcomeClass::Ok)])
        .await?;
    assert!(acks[0].accepted);
    let attempts = tasks
        .list_attempts(ListAttemptsRequest { task_id: id })
        .await?
        .into_inner()
        .attempts;
    let outcomes: Vec<_> = attempts.iter().map(|a| a.outcome()).collect();
    assert_eq!(
        outcomes,
        vec![OutcomeClass::LeaseExpired, OutcomeClass::Ok],
        "the lapsed attempt is recorded, the stale report is not"
    );
    Ok(())
}

/// An executor whose stream was down past the lease's TTL while the provider took the message
/// reports OK once it is back. If nothing leased the task since the sweeper took the lease back,
/// the message went out: the task ends SUCCEEDED with that attempt, and is not sent again (it
/// was refused, and the task sent a second time). Once another lease exists, the late report is
/// that lease's to settle and is refused (above).
#[tokio::test]
async fn a_late_ok_on_a_lapsed_lease_nothing_replaced_settles_the_task() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_LEASE_TTL", "1s")
        .spawn()
        .await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let queue = unique_id("q");
    let id = create(&mut tasks, task_spec(&queue, "+1", "sent, then cut off")).await?;

    let mut cut_off = ScriptedExecutor::connect(&scheduler.grpc_url(), "cut-off", &[], 1).await?;
    let lease = cut_off.leases(1).await?.remove(0);
    drop(cut_off);
    // The sweeper takes the lease back: due again, the attempt charged.
    until("the lease to lapse", || {
        let mut tasks = tasks.clone();
        let id = id.clone();
        async move {
            let task = tasks.get_task(GetTaskRequest { id }).await?.into_inner();
            Ok(task.state() == TaskState::Scheduled && task.attempts == 1)
        }
    })
    .await?;

    // Back on a new stream that can lease nothing of this queue: the report it kept.
    let mut back =
        ScriptedExecutor::connect(&scheduler.grpc_url(), "cut-off", &["another-queue"], 1).await?;
    let mut ok = result(&lease, OutcomeClass::Ok);
    ok.provider_message_id = "msg-late".into();
    let acks = back.report(vec![ok]).await?;
    assert!(acks[0].accepted, "{acks:?}");
    assert_eq!(acks[0].state(), TaskState::Succeeded);
    let task = tasks
        .get_task(GetTaskRequest { id: id.clone() })
        .await?
        .into_inner();
    assert_eq!(
        (task.state(), task.end_reason(), task.lease_count),
        (TaskState::Succeeded, EndReason::Sent, 1)
    );
    let attempts = tasks
        .list_attempts(ListAttemptsRequest {
            task_id: id.clone(),
        })
        .await?
        .into_inner()
        .attempts;
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0].outcome(), OutcomeClass::Ok);
    assert_eq!(attempts[0].provider_message_id, "msg-late");

    // The same report again (its answer lost) changes nothing and is not accepted twice.
    let mut again = result(&lease, OutcomeClass::Ok);
    again.provider_message_id = "msg-late".into();
    let acks = back.report(vec![again]).await?;
    assert!(!acks[0].accepted, "{acks:?}");
    assert_eq!(acks[0].state(), TaskState::Succeeded);
    Ok(())
}

#[tokio::test]
async fn extending_a_lease_keeps_it_past_its_ttl() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_LEASE_TTL", "1s")
        .spawn()
        .await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let queue = unique_id("q");
    let id = create(&mut tasks, task_spec(&queue, "+1", "slow send")).await?;
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "slow", &[], 1).await?;
    let lease = exec.leases(1).await?.remove(0);

    // Hold the lease for three TTLs, extending at a third of the TTL as an executor does.
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < until {
        let ack = exec.extend(&[&lease]).await?;
        assert_eq!(ack.extended.len(), 1, "lease lost while extended: {ack:?}");
        tokio::time::sleep(Duration::from_millis(330)).await;
    }
    let acks = exec.report(vec![result(&lease, OutcomeClass::Ok)]).await?;
    assert!(acks[0].accepted);
    assert_eq!(lease.attempt, 1, "never re-leased");
    let task = tasks.get_task(GetTaskRequest { id }).await?.into_inner();
    assert_eq!((task.state(), task.lease_count), (TaskState::Succeeded, 1));

    // Extending a lease that has ended reports it lost.
    let ack = exec.extend(&[&lease]).await?;
    assert!(ack.extended.is_empty());
    assert_eq!(ack.lost, vec![lease_ref(&lease)]);
    Ok(())
}

#[tokio::test]
async fn higher_priority_is_leased_first() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let queue = unique_id("q");
    let mut urgent = Vec::new();
    for i in 0..5 {
        let mut low = task_spec(&queue, &format!("+10{i}"), "low");
        low.priority = Some(0);
        create(&mut tasks, low).await?;
    }
    for i in 0..5 {
        let mut high = task_spec(&queue, &format!("+20{i}"), "high");
        high.priority = Some(9);
        urgent.push(create(&mut tasks, high).await?);
    }
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "exec", &[], 5).await?;
    let mut got: Vec<String> = exec
        .leases(5)
        .await?
        .into_iter()
        .map(|l| l.task_id)
        .collect();
    got.sort();
    urgent.sort();
    assert_eq!(got, urgent);
    Ok(())
}

/// Creates `n` tasks on `queue`, due 10 s apart in creation order (the first `10·n` s ago), so
/// a walk of the due index meets them in that order. `tag` keeps recipients apart.
async fn due_in_order(
    tasks: &mut TaskServiceClient<Channel>,
    sql: &tokio_postgres::Client,
    queue: &str,
    n: usize,
    tag: &str,
) -> Result<Vec<String>> {
    let mut ids = Vec::new();
    for i in 0..n {
        ids.push(create(tasks, task_spec(queue, &format!("+3{tag}{i}"), "walk")).await?);
    }
    let oldest = 10 * n as i32;
    for (i, id) in ids.iter().enumerate() {
        sql.execute(
            "UPDATE herald.tasks SET run_at = now() - ($3::int - 10 * $2::int) * interval '1 second'
             WHERE id = $1::text::uuid",
            &[id, &(i as i32), &oldest],
        )
        .await?;
    }
    Ok(ids)
}

/// Holds the row of task `id` in a transaction of `sql`, as any other writer could.
async fn hold_row<'a>(
    sql: &'a mut tokio_postgres::Client,
    id: &str,
) -> Result<tokio_postgres::Transaction<'a>> {
    let held = sql.transaction().await?;
    held.execute(
        "SELECT 1 FROM herald.tasks WHERE id = $1::text::uuid FOR UPDATE",
        &[&id],
    )
    .await?;
    Ok(held)
}

/// A claim lets the next one start its walk of the due index where it ended
/// (scheduler/src/lease/due_marks.rs). A task the walk passed because another transaction held
/// its row, and which becomes claimable without any announcement, lies below that start: it
/// must still be leased, by the full walk the dispatcher makes once its marks are old.
#[tokio::test]
async fn a_task_a_claim_walked_past_while_another_transaction_held_it_is_still_leased() -> Result<()>
{
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let queue = unique_id("q");
    let mut sql = db.connect().await?;
    // Due 50, 40, 30, 20 and 10 seconds ago, in creation order: the walk's order is known.
    let ids = due_in_order(&mut tasks, &sql, &queue, 5, "0").await?;
    let held = hold_row(&mut sql, &ids[0]).await?;

    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "walker", &[], 2).await?;
    let mut first: Vec<String> = exec
        .leases(2)
        .await?
        .into_iter()
        .map(|l| l.task_id)
        .collect();
    first.sort();
    let mut passed = ids[1..3].to_vec();
    passed.sort();
    assert_eq!(
        first, passed,
        "the oldest task's row was held: the walk skipped it"
    );
    // Released without a word: nothing announces that the oldest task is claimable again.
    held.rollback().await?;

    exec.credit(3).await?;
    let mut rest: Vec<String> = exec
        .leases(3)
        .await?
        .into_iter()
        .map(|l| l.task_id)
        .collect();
    rest.sort();
    let mut expected = vec![ids[0].clone(), ids[3].clone(), ids[4].clone()];
    expected.sort();
    assert_eq!(
        rest, expected,
        "every task leased once, the skipped one too"
    );
    Ok(())
}

/// The same with the dispatcher kept busy: every claim finds a new task, so its marks never
/// grow old and its own walk from the oldest entry never comes. The task it passed is leased
/// by the session's straggler claim, which walks from the oldest entry every few seconds.
#[tokio::test]
async fn a_task_walked_past_is_leased_by_the_straggler_claim_while_new_tasks_keep_coming(
) -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let queue = unique_id("q");
    let mut sql = db.connect().await?;
    let ids = due_in_order(&mut tasks, &sql, &queue, 3, "1").await?;
    let held = hold_row(&mut sql, &ids[0]).await?;
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "busy", &[], 2).await?;
    let first = exec.leases(2).await?;
    let mut passed: Vec<String> = first.iter().map(|l| l.task_id.clone()).collect();
    passed.sort();
    assert_eq!(passed, ids[1..].to_vec(), "the held row was walked past");
    exec.report_each(&first, OutcomeClass::Ok).await?;
    held.rollback().await?;

    // One new task at a time, each leased and reported: every claim of the main loop finds one.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut new_tasks = 0;
    loop {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the passed task was not leased while {new_tasks} new ones were"
        );
        create(&mut tasks, task_spec(&queue, "+319", "new")).await?;
        new_tasks += 1;
        exec.credit(1).await?;
        let lease = exec.leases(1).await?.remove(0);
        exec.report(vec![result(&lease, OutcomeClass::Ok)]).await?;
        if lease.task_id == ids[0] {
            break;
        }
    }
    Ok(())
}

/// The straggler claim walks from the oldest entry once a period. Under a backlog each of its
/// walks comes back full, of tasks the main claim was about to reach, not of stragglers: it
/// must still wait its period, or it becomes a second claim beside the main one, walking from
/// the oldest entry for as long as the backlog lasts (S6 in docs/performance.md).
#[tokio::test]
async fn the_straggler_claim_walks_once_a_period_while_a_backlog_drains() -> Result<()> {
    const PERIOD: Duration = Duration::from_secs(1);
    const BACKLOG: usize = 20_000;
    const WALKS: f64 = 3.0;
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_STRAGGLER_PERIOD", "1s")
        .spawn()
        .await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let queue = unique_id("q");
    let specs = (0..BACKLOG)
        .map(|i| task_spec(&queue, &format!("+5{i}"), "backlog"))
        .collect();
    create_many(&mut tasks, specs).await?;
    let straggler_walks = || async {
        let body = scrape(&scheduler.http_url()).await?;
        Ok::<_, anyhow::Error>(
            series(&body, "herald_claims_total", "loop=\"stragglers\"").unwrap_or(0.0),
        )
    };

    // The session's walks all begin after this; each straggler walk at least a period after
    // the one before, the first a period after the session starts.
    let session_start = std::time::Instant::now();
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "backlogged", &[], 4).await?;
    let mut leased = 0;
    let walks = loop {
        let batch = match exec.next().await? {
            scheduler_message::Kind::Leases(batch) => batch.leases,
            other => bail!("expected leases, got {other:?}"),
        };
        leased += batch.len();
        // Held, not reported: only the credit comes back, a few leases at a time, so the
        // backlog outlasts several periods.
        exec.credit(batch.len() as u32).await?;
        let walks = straggler_walks().await?;
        if walks >= WALKS {
            break walks;
        }
        anyhow::ensure!(
            leased < BACKLOG,
            "the backlog drained before the straggler claim walked {WALKS} times ({walks})"
        );
    };
    let periods = (session_start.elapsed().as_secs_f64() / PERIOD.as_secs_f64()).floor();
    assert!(
        walks <= periods,
        "{walks} straggler walks in {periods} periods: the claim walked again without waiting"
    );
    Ok(())
}

/// A sweep lets the next one start its walk of the lease expiries where it stopped
/// (scheduler/src/low_water.rs). A lapsed lease the sweep passed because another transaction
/// held its row lies below that start: it must still be returned, by the sweeper's periodic
/// walk from the oldest expiry.
#[tokio::test]
async fn a_lapsed_lease_a_sweep_passed_while_another_transaction_held_it_is_still_returned(
) -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_LEASE_TTL", "1s")
        .spawn()
        .await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let queue = unique_id("q");
    let held_id = create(&mut tasks, task_spec(&queue, "+401", "held")).await?;
    let swept_id = create(&mut tasks, task_spec(&queue, "+402", "swept")).await?;
    // One claim leases both, so both leases run out at the same instant; neither is reported.
    let mut silent = ScriptedExecutor::connect(&scheduler.grpc_url(), "silent", &[], 2).await?;
    assert_eq!(silent.leases(2).await?.len(), 2);

    let mut sql = db.connect().await?;
    let held = hold_row(&mut sql, &held_id).await?;
    let watch = db.connect().await?;
    let charged = |id: String| {
        let watch = &watch;
        async move {
            let row = watch
                .query_one(
                    "SELECT attempts FROM herald.tasks WHERE id = $1::text::uuid",
                    &[&id],
                )
                .await?;
            Ok(row.get::<_, i32>(0) >= 1)
        }
    };
    // The sweep that returns the other lease walks past the held row's expiry.
    herald_tests::until("the unheld lease to be swept", || charged(swept_id.clone())).await?;
    let held_state: String = held
        .query_one(
            "SELECT state::text FROM herald.tasks WHERE id = $1::text::uuid",
            &[&held_id],
        )
        .await?
        .get(0);
    assert_eq!(held_state, "leased", "the held row was passed, not swept");
    // Released without a word: only a walk from the oldest expiry finds it now.
    held.rollback().await?;
    herald_tests::until("the passed lease to be swept", || charged(held_id.clone())).await?;
    let attempts = tasks
        .list_attempts(ListAttemptsRequest { task_id: held_id })
        .await?
        .into_inner()
        .attempts;
    let outcomes: Vec<_> = attempts.iter().map(|a| a.outcome()).collect();
    assert_eq!(outcomes, vec![OutcomeClass::LeaseExpired]);
    Ok(())
}

#[tokio::test]
async fn an_idle_executor_gets_new_and_future_tasks_never_early() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let queue = unique_id("q");
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "idle", &[], 100).await?;

    // Created after the executor is waiting: woken by the database notification.
    let now_id = create(&mut tasks, task_spec(&queue, "+1", "now")).await?;
    let lease = exec.leases(1).await?.remove(0);
    assert_eq!(lease.task_id, now_id);

    // Due in the future: leased at or after run_at by the database clock, for each of them.
    let mut ids = Vec::new();
    for i in 0..5u64 {
        let spec = task_spec(&queue, &format!("+2{i}"), "later")
            .with_delay(Duration::from_millis(200 + 150 * i));
        ids.push(create(&mut tasks, spec).await?);
    }
    let leases = exec.leases(5).await?;
    for lease in &leases {
        assert!(
            micros(&lease.leased_at) >= micros(&lease.run_at),
            "leased before due: {lease:?}"
        );
    }
    let mut got: Vec<_> = leases.into_iter().map(|l| l.task_id).collect();
    got.sort();
    ids.sort();
    assert_eq!(got, ids);
    Ok(())
}

#[tokio::test]
async fn an_executor_only_gets_its_queues() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let mine = unique_id("mine");
    let other = unique_id("other");
    create(&mut tasks, task_spec(&other, "+1", "not yours")).await?;
    let wanted = create(&mut tasks, task_spec(&mine, "+2", "yours")).await?;
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "picky", &[&mine], 10).await?;
    let lease = exec.leases(1).await?.remove(0);
    assert_eq!(
        (lease.task_id.as_str(), lease.queue.as_str()),
        (wanted.as_str(), mine.as_str())
    );
    assert_eq!(
        leased_count(&db).await?,
        1,
        "the other queue's task stays scheduled"
    );
    Ok(())
}

/// Cancels `id` in the background and returns the handle of the CancelTask call.
fn cancel_in_background(
    tasks: &TaskServiceClient<Channel>,
    id: &str,
) -> tokio::task::JoinHandle<Result<herald_proto::v1::CancelTaskResponse, tonic::Status>> {
    let mut tasks = tasks.clone();
    let id = id.to_owned();
    tokio::spawn(async move {
        tasks
            .cancel_task(CancelTaskRequest { id })
            .await
            .map(|r| r.into_inner())
    })
}

#[tokio::test]
async fn cancelling_a_leased_task_revokes_it_and_reports_it_stopped() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let queue = unique_id("q");
    let id = create(&mut tasks, task_spec(&queue, "+1", "cancel me")).await?;
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "holder", &[], 1).await?;
    let lease = exec.leases(1).await?.remove(0);

    let cancel = cancel_in_background(&tasks, &id);
    match exec.next().await? {
        scheduler_message::Kind::Revoke(r) => assert_eq!(r.lease, Some(lease_ref(&lease))),
        other => bail!("expected Revoke, got {other:?}"),
    }
    exec.revoke_ack(lease_ref(&lease), RevokeResult::StoppedBeforeSend)
        .await?;
    let answer = cancel.await??;
    assert_eq!(answer.outcome(), CancelOutcome::StoppedBeforeSend);
    assert_eq!(
        answer.task.as_ref().map(|t| t.state()),
        Some(TaskState::Cancelled)
    );

    // A late report cannot revive it.
    let acks = exec.report(vec![result(&lease, OutcomeClass::Ok)]).await?;
    assert!(!acks[0].accepted);
    let task = tasks.get_task(GetTaskRequest { id }).await?.into_inner();
    assert_eq!(task.state(), TaskState::Cancelled);
    assert_eq!(task.cancel_outcome(), CancelOutcome::StoppedBeforeSend);
    Ok(())
}

/// A cancel whose notification no replica heard (its listener was starting, or reconnecting
/// after a lost connection or a failover) still reaches the executor: a listener that
/// (re)subscribes sends again every revoke not yet answered.
#[tokio::test]
async fn a_revoke_missed_while_the_listener_was_away_is_sent_when_it_listens_again() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let queue = unique_id("q");
    let id = create(&mut tasks, task_spec(&queue, "+1", "cancel me unheard")).await?;
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "holder", &[], 1).await?;
    let lease = exec.leases(1).await?.remove(0);

    // The cancel's own transition, committed without its notification: what a replica whose
    // listener is away misses.
    let sql = db.connect().await?;
    let cancelled = sql
        .execute(
            "UPDATE herald.tasks SET state = 'cancelled', end_reason = 'cancelled',
                    cancel_outcome = 5, finished_at = herald.now(), updated_at = herald.now()
             WHERE id::text = $1 AND state = 'leased'",
            &[&id],
        )
        .await?;
    assert_eq!(cancelled, 1, "the task was leased");
    drop_the_listeners_connection(&sql).await?;

    match exec.next().await? {
        scheduler_message::Kind::Revoke(r) => assert_eq!(r.lease, Some(lease_ref(&lease))),
        other => bail!("expected Revoke, got {other:?}"),
    }
    exec.revoke_ack(lease_ref(&lease), RevokeResult::StoppedBeforeSend)
        .await?;
    // The answer has no reply of its own to await.
    until("the executor's answer to be recorded", || {
        let mut tasks = tasks.clone();
        let id = id.clone();
        async move {
            let task = tasks.get_task(GetTaskRequest { id }).await?.into_inner();
            Ok(task.cancel_outcome() == CancelOutcome::StoppedBeforeSend)
        }
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_cancel_answered_while_the_listener_was_away_is_answered_when_it_listens_again(
) -> Result<()> {
    let db = TestDb::new().await?;
    // Without the listener's catch-up, the CancelTask below would wait this long for an answer
    // it missed.
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_CANCEL_WAIT", "1h")
        .spawn()
        .await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let queue = unique_id("q");
    let id = create(&mut tasks, task_spec(&queue, "+1", "answered unheard")).await?;
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "holder", &[], 1).await?;
    exec.leases(1).await?;
    let cancel = cancel_in_background(&tasks, &id);
    match exec.next().await? {
        scheduler_message::Kind::Revoke(_) => {}
        other => bail!("expected Revoke, got {other:?}"),
    }

    // The executor's answer, committed without its notification: what a replica whose listener
    // is away misses when the answer reaches another replica.
    let sql = db.connect().await?;
    let answered = sql
        .execute(
            "UPDATE herald.tasks SET cancel_outcome = 2 WHERE id::text = $1 AND cancel_outcome = 5",
            &[&id],
        )
        .await?;
    assert_eq!(answered, 1, "the cancel was waiting for its answer");
    drop_the_listeners_connection(&sql).await?;

    let answer = tokio::time::timeout(WAIT, cancel)
        .await
        .context("CancelTask still waits for an answer given while its listener was away")???;
    assert_eq!(answer.outcome(), CancelOutcome::StoppedBeforeSend);
    Ok(())
}

/// Ends the scheduler's LISTEN connection, as a lost connection or a failover would: it
/// subscribes again, having missed whatever was notified meanwhile.
async fn drop_the_listeners_connection(sql: &tokio_postgres::Client) -> Result<()> {
    let terminated: i64 = sql
        .query_one(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE application_name = 'herald-scheduler listener' AND datname = current_database()",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(terminated, 1, "one listener connection");
    Ok(())
}

#[tokio::test]
async fn cancelling_a_task_mid_send_reports_it_already_sent() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let queue = unique_id("q");
    let id = create(&mut tasks, task_spec(&queue, "+1", "in flight")).await?;
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "holder", &[], 1).await?;
    let lease = exec.leases(1).await?.remove(0);

    let cancel = cancel_in_background(&tasks, &id);
    match exec.next().await? {
        scheduler_message::Kind::Revoke(_) => {}
        other => bail!("expected Revoke, got {other:?}"),
    }
    exec.revoke_ack(lease_ref(&lease), RevokeResult::SendInProgress)
        .await?;
    let acks = exec.report(vec![result(&lease, OutcomeClass::Ok)]).await?;
    assert!(acks[0].accepted, "the send's outcome is recorded");
    assert_eq!(
        acks[0].state(),
        TaskState::Cancelled,
        "but the task stays cancelled"
    );
    let answer = cancel.await??;
    assert_eq!(answer.outcome(), CancelOutcome::AlreadySent);
    let attempts = tasks
        .list_attempts(ListAttemptsRequest { task_id: id })
        .await?
        .into_inner()
        .attempts;
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].outcome(), OutcomeClass::Ok);
    Ok(())
}

#[tokio::test]
async fn a_task_past_its_deadline_expires_unsent() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let queue = unique_id("q");
    // Due now, deadline soon, and no executor connected until after the deadline.
    let spec = task_spec(&queue, "+1", "too late")
        .with_expire_at(SystemTime::now() + Duration::from_millis(500));
    let id = create(&mut tasks, spec).await?;
    let task = wait_for_task_state(&mut tasks, &id, TaskState::Expired, WAIT).await?;
    assert_eq!(task.attempts, 0);
    // An executor connecting afterwards gets nothing: a heartbeat round trip comes back first.
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "late", &[], 10).await?;
    exec.send(executor_message::Kind::Heartbeat(Heartbeat::default()))
        .await?;
    match exec.next().await? {
        scheduler_message::Kind::Heartbeat(_) => {}
        other => bail!("expected only a heartbeat, got {other:?}"),
    }
    assert_eq!(leased_count(&db).await?, 0);
    Ok(())
}

#[tokio::test]
async fn a_stream_must_start_with_a_supported_hello() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;

    let open = |first: ExecutorMessage| {
        let url = scheduler.grpc_url();
        async move {
            let mut client = connect_lease(&url).await?;
            let (tx, rx) = tokio::sync::mpsc::channel(4);
            tx.send(first).await?;
            let status = match client.lease(ReceiverStream::new(rx)).await {
                Err(status) => status,
                Ok(response) => match response.into_inner().message().await {
                    Err(status) => status,
                    Ok(m) => bail!("stream accepted: {m:?}"),
                },
            };
            drop(tx);
            anyhow::Ok(status)
        }
    };
    let status = open(ExecutorMessage {
        kind: Some(executor_message::Kind::Heartbeat(Heartbeat::default())),
    })
    .await?;
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let status = open(ExecutorMessage {
        kind: Some(executor_message::Kind::Hello(herald_proto::v1::Hello {
            executor_id: "old".into(),
            protocol_version: 0,
            queues: vec![],
            initial_credit: 1,
            credentials_refs: vec![],
        })),
    })
    .await?;
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    Ok(())
}

/// A session ended by a bad frame says, in the scheduler's log, which executor it was and
/// which frame ended it (it said only the namespace and the error).
#[tokio::test]
async fn an_ended_session_logs_its_executor_and_the_frame_that_ended_it() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "noisy-one", &[], 1).await?;
    exec.send(executor_message::Kind::Hello(herald_proto::v1::Hello {
        executor_id: "noisy-one".into(),
        protocol_version: herald_proto::LEASE_PROTOCOL_VERSION,
        ..Default::default()
    }))
    .await?;
    let ended = exec.finish().await;
    assert!(ended.is_err(), "a second Hello ended nothing: {ended:?}");
    until("the session's end in the scheduler's log", || {
        let log = scheduler.stderr_all();
        async move {
            Ok(log.lines().any(|l| {
                l.contains("ending lease stream")
                    && l.contains("noisy-one")
                    && l.contains("protocol violation")
            }))
        }
    })
    .await
    .with_context(|| scheduler.stderr_tail())?;
    Ok(())
}

#[tokio::test]
async fn a_released_lease_is_due_again_without_charging_an_attempt() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let queue = unique_id("q");
    let id = create(&mut tasks, task_spec(&queue, "+1", "hand me back")).await?;
    let mut leaving = ScriptedExecutor::connect(&scheduler.grpc_url(), "leaving", &[], 1).await?;
    let lease = leaving.leases(1).await?.remove(0);
    leaving
        .send(executor_message::Kind::Release(herald_proto::v1::Release {
            leases: vec![lease_ref(&lease)],
        }))
        .await?;

    let mut staying = ScriptedExecutor::connect(&scheduler.grpc_url(), "staying", &[], 1).await?;
    let again = staying.leases(1).await?.remove(0);
    assert_eq!(again.task_id, id);
    assert_eq!((again.attempt, again.attempts_before), (2, 0));
    // The released lease's fencing token is stale now.
    let acks = leaving
        .report(vec![result(&lease, OutcomeClass::Ok)])
        .await?;
    assert!(!acks[0].accepted);
    Ok(())
}

/// Regression (#14): a refused report was answered with the task's state read without the
/// session's namespace, so an executor of one namespace learned the state of another's task,
/// while an unknown id answered UNSPECIFIED. Both must read the same.
#[tokio::test]
async fn a_refused_report_about_another_namespaces_task_reads_as_unknown() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let queue = unique_id("q");
    let mut request = tonic::Request::new(CreateTaskRequest {
        task: Some(task_spec(&queue, "+1", "belongs to b")),
    });
    request
        .metadata_mut()
        .insert("x-herald-namespace", "team-b".parse()?);
    let theirs = tasks
        .create_task(request)
        .await?
        .into_inner()
        .task
        .expect("task in response");
    let ours = create(&mut tasks, task_spec(&queue, "+2", "belongs to a")).await?;

    let client = connect_lease(&scheduler.grpc_url()).await?;
    let mut executor = ScriptedExecutor::connect_with(
        client,
        &[("x-herald-namespace", "default")],
        "exec-a",
        &[&queue],
        0,
    )
    .await?;
    let probe = |task_id: &str| herald_proto::v1::AttemptResult {
        task_id: task_id.to_owned(),
        attempt: 1,
        outcome: OutcomeClass::Ok as i32,
        ..Default::default()
    };
    let unknown = uuid::Uuid::now_v7().to_string();
    let acks = executor
        .report(vec![probe(&theirs.id), probe(&unknown), probe(&ours)])
        .await?;
    let answers: Vec<(&str, bool, i32)> = acks
        .iter()
        .map(|a| (a.task_id.as_str(), a.accepted, a.state))
        .collect();
    assert_eq!(
        answers,
        vec![
            (theirs.id.as_str(), false, TaskState::Unspecified as i32),
            (unknown.as_str(), false, TaskState::Unspecified as i32),
            // Our own task is not leased by this token: refused, with its state.
            (ours.as_str(), false, TaskState::Scheduled as i32),
        ]
    );
    Ok(())
}

/// Regression (#14): acks of refused results (an UNSPECIFIED or LEASE_EXPIRED outcome, a lease
/// reported twice) came first and without the task's state, while lease.proto promises acks
/// in the order of the report and a refused ack carrying the task's current state. Each
/// refusal also says why, so an executor's log tells a result it sent wrong from a lost lease.
#[tokio::test]
async fn acks_follow_the_reports_order_and_refusals_carry_the_state() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let queue = unique_id("q");
    for i in 0..3 {
        create(&mut tasks, task_spec(&queue, &format!("+1{i}"), "hi")).await?;
    }
    let mut executor =
        ScriptedExecutor::connect(&scheduler.grpc_url(), "exec", &[&queue], 3).await?;
    let leases = executor.leases(3).await?;
    let ok = result(&leases[0], OutcomeClass::Ok);
    let mut unspecified = result(&leases[1], OutcomeClass::Ok);
    unspecified.outcome = OutcomeClass::Unspecified as i32;
    let expired = result(&leases[2], OutcomeClass::LeaseExpired);
    let again = result(&leases[0], OutcomeClass::Transient);
    let mut not_a_uuid = result(&leases[1], OutcomeClass::Ok);
    not_a_uuid.task_id = "not-a-uuid".into();
    let acks = executor
        .report(vec![ok, unspecified, expired, again, not_a_uuid])
        .await?;
    let answers: Vec<(String, bool, i32)> = acks
        .iter()
        .map(|a| (a.task_id.clone(), a.accepted, a.state))
        .collect();
    assert_eq!(
        answers,
        vec![
            (leases[0].task_id.clone(), true, TaskState::Succeeded as i32),
            (leases[1].task_id.clone(), false, TaskState::Leased as i32),
            (leases[2].task_id.clone(), false, TaskState::Leased as i32),
            // The same lease again in the batch: refused, with the state the first report set.
            (
                leases[0].task_id.clone(),
                false,
                TaskState::Succeeded as i32
            ),
            (
                "not-a-uuid".to_string(),
                false,
                TaskState::Unspecified as i32
            ),
        ]
    );
    let reasons: Vec<&str> = acks.iter().map(|a| a.reason.as_str()).collect();
    assert_eq!(reasons[0], "", "an accepted result has no reason");
    assert!(reasons[1].contains("outcome"), "{reasons:?}");
    assert!(reasons[2].contains("outcome"), "{reasons:?}");
    assert!(reasons[3].contains("repeats"), "{reasons:?}");
    assert!(reasons[4].contains("task_id"), "{reasons:?}");
    Ok(())
}

/// A result on a lease the sweeper took back is refused as no longer the task's current lease,
/// and one about a task the namespace does not have says so.
#[tokio::test]
async fn a_refused_result_says_whether_its_lease_was_lost_or_its_task_is_unknown() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let queue = unique_id("q");
    create(&mut tasks, task_spec(&queue, "+10", "hi")).await?;
    let mut executor =
        ScriptedExecutor::connect(&scheduler.grpc_url(), "exec", &[&queue], 1).await?;
    let leases = executor.leases(1).await?;
    let mut unknown = result(&leases[0], OutcomeClass::Ok);
    unknown.task_id = uuid::Uuid::new_v4().to_string();
    let ok = result(&leases[0], OutcomeClass::Ok);
    let acks = executor.report(vec![unknown, ok.clone()]).await?;
    assert!(!acks[0].accepted && acks[1].accepted, "{acks:?}");
    assert!(acks[0].reason.contains("no task"), "{acks:?}");
    // Reported again (its answer lost): the lease is no longer the task's current one.
    let acks = executor.report(vec![ok]).await?;
    assert!(!acks[0].accepted, "{acks:?}");
    assert!(
        acks[0].reason.contains("not the task's current"),
        "{acks:?}"
    );
    Ok(())
}

/// A fresh scheduler, what it leased to a scripted executor.
type Leased = (
    TestDb,
    SchedulerProcess,
    ScriptedExecutor,
    Vec<herald_proto::v1::Lease>,
);

/// 2,049 leased tasks in a fresh queue, every lease held by one scripted executor.
async fn leased_for_lanes(executor_id: &str) -> Result<Leased> {
    leased_in_fresh_queue(executor_id, GATHERED + 1, u32::try_from(GATHERED + 1)?).await
}

/// `n` tasks due now in a fresh queue, all leased to one scripted executor with `credit`.
async fn leased_in_fresh_queue(executor_id: &str, n: usize, credit: u32) -> Result<Leased> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let queue = unique_id("q");
    let specs = (0..n)
        .map(|i| task_spec(&queue, &format!("+1555{i:07}"), "hi"))
        .collect();
    create_many(&mut tasks, specs).await?;
    let mut exec =
        ScriptedExecutor::connect(&scheduler.grpc_url(), executor_id, &[&queue], credit).await?;
    let leases = exec.leases(n).await?;
    Ok((db, scheduler, exec, leases))
}

/// The most results the scheduler gathers into one report batch (MAX_GATHERED_REPORTS).
const GATHERED: usize = 2048;

/// Reports `leases` OK: the first alone, while `sql` holds its row, then the rest in frames of
/// 1,000 behind it. Returns the transaction holding the row.
async fn report_first_held<'a>(
    exec: &ScriptedExecutor,
    sql: &'a mut tokio_postgres::Client,
    leases: &[herald_proto::v1::Lease],
) -> Result<tokio_postgres::Transaction<'a>> {
    let (first, behind) = leases.split_first().context("leases granted")?;
    let held = hold_row(sql, &first.task_id).await?;
    let report = |leases: &[herald_proto::v1::Lease]| {
        executor_message::Kind::Report(herald_proto::v1::ReportBatch {
            results: leases.iter().map(|l| result(l, OutcomeClass::Ok)).collect(),
        })
    };
    exec.send(report(std::slice::from_ref(first))).await?;
    for chunk in behind.chunks(1000) {
        exec.send(report(chunk)).await?;
    }
    Ok(held)
}

/// Collects report acks until `n` distinct tasks are answered, each accepted once; `held` must
/// not be among them.
async fn accepted_acks(
    exec: &mut ScriptedExecutor,
    n: usize,
    held: &str,
) -> Result<std::collections::HashSet<String>> {
    let mut answered = std::collections::HashSet::new();
    while answered.len() < n {
        match exec.next().await? {
            scheduler_message::Kind::ReportAcks(batch) => {
                for ack in batch.acks {
                    assert!(ack.accepted, "{} refused", ack.task_id);
                    assert_ne!(ack.task_id, held, "answered while its row was held");
                    assert!(answered.insert(ack.task_id), "answered twice");
                }
            }
            other => bail!("expected report acks, got {other:?}"),
        }
    }
    Ok(answered)
}

/// The next frame is the held report's ack alone, accepting it.
async fn held_report_accepted(exec: &mut ScriptedExecutor, held: &str) -> Result<()> {
    match exec.next().await? {
        scheduler_message::Kind::ReportAcks(batch) => {
            let answers: Vec<(String, bool)> = batch
                .acks
                .into_iter()
                .map(|a| (a.task_id, a.accepted))
                .collect();
            assert_eq!(answers, vec![(held.to_owned(), true)]);
            Ok(())
        }
        other => bail!("expected the held report's ack, got {other:?}"),
    }
}

/// A report batch written while another is held up (here by a row lock, in production by a
/// slow statement or a busy core) goes to a second transaction once a full batch of 2,048
/// results has gathered behind it: a backlog of reports is applied on two backends, not one
/// after the other (docs/performance.md, "Reports in two lanes"). The held one is applied once
/// its row is free, and every report is acknowledged once.
#[tokio::test]
async fn a_full_batch_of_reports_is_applied_beside_one_that_is_held_up() -> Result<()> {
    let (db, scheduler, mut exec, leases) = leased_for_lanes("lanes").await?;
    let mut sql = db.connect().await?;
    let held = report_first_held(&exec, &mut sql, &leases).await?;
    let first = &leases[0].task_id;

    // Every report behind the held one is answered while its row is still held.
    accepted_acks(&mut exec, GATHERED, first).await?;
    let check = db.connect().await?;
    let row = check
        .query_one(
            "SELECT count(*) FILTER (WHERE state = 'succeeded') AS succeeded,
                    count(*) FILTER (WHERE state = 'leased') AS leased
             FROM herald.tasks",
            &[],
        )
        .await?;
    assert_eq!(row.try_get::<_, i64>("succeeded")?, GATHERED as i64);
    assert_eq!(row.try_get::<_, i64>("leased")?, 1, "the held task waits");

    held.rollback().await?;
    held_report_accepted(&mut exec, first).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    wait_for_task_state(&mut tasks, first, TaskState::Succeeded, WAIT).await?;
    Ok(())
}

/// The last reports of a burst go to a second transaction while an earlier report is held up,
/// though far fewer than a full batch have gathered: the burst's claim walked every due task
/// (it came back short of the executor's credit) and every lease it handed out is reported, so
/// nothing more can join them, and waiting for the first lane would only delay them
/// (docs/performance.md, "The last reports of a burst in the second lane"). With the second
/// lane opened only for a full batch they waited for the held row.
#[tokio::test]
async fn the_last_reports_of_a_burst_are_applied_beside_one_that_is_held_up() -> Result<()> {
    // Credit for more than is due, so that the claim comes back short: it walked every due
    // task, and the burst ends with it.
    let (db, scheduler, mut exec, leases) = leased_in_fresh_queue("burst", 3, 10).await?;
    let mut sql = db.connect().await?;
    let held = report_first_held(&exec, &mut sql, &leases).await?;
    let first = &leases[0].task_id;

    let answered = accepted_acks(&mut exec, 2, first).await?;
    let behind: std::collections::HashSet<String> =
        leases[1..].iter().map(|l| l.task_id.clone()).collect();
    assert_eq!(answered, behind);
    assert_eq!(leased_count(&db).await?, 1, "the held task waits");

    held.rollback().await?;
    held_report_accepted(&mut exec, first).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    wait_for_task_state(&mut tasks, first, TaskState::Succeeded, WAIT).await?;
    Ok(())
}

/// A report under way when the executor closes its half of the stream is still written and
/// acknowledged before the scheduler ends its half: here the first lane's report is held up by
/// a row lock when the stream closes, while the second lane has answered the 2,048 behind it.
#[tokio::test]
async fn a_report_held_up_when_the_stream_closes_is_acknowledged_before_it_ends() -> Result<()> {
    let (db, _scheduler, mut exec, leases) = leased_for_lanes("closing").await?;
    let mut sql = db.connect().await?;
    let held = report_first_held(&exec, &mut sql, &leases).await?;
    let first = leases[0].task_id.clone();
    let mut answered = accepted_acks(&mut exec, GATHERED, &first).await?;

    let closing = tokio::spawn(exec.finish());
    held.rollback().await?;
    for frame in closing.await?? {
        if let scheduler_message::Kind::ReportAcks(batch) = frame {
            for ack in batch.acks {
                assert!(ack.accepted, "{} refused", ack.task_id);
                assert!(answered.insert(ack.task_id), "answered twice");
            }
        }
    }
    let leased: std::collections::HashSet<String> = leases.into_iter().map(|l| l.task_id).collect();
    assert_eq!(
        answered, leased,
        "every report answered before the stream ended"
    );
    Ok(())
}

/// A report under way when another report batch of the session fails is still written and
/// acknowledged before the scheduler ends the stream with that failure: here the first lane's
/// report is held up by a row lock while the second lane's batch of 2,048 fails in the database.
#[tokio::test]
async fn a_report_held_up_when_another_batch_fails_is_acknowledged_before_the_stream_ends(
) -> Result<()> {
    let (db, _scheduler, mut exec, leases) = leased_for_lanes("failing").await?;
    let mut sql = db.connect().await?;
    // The second lane's batch fails when it writes its last task's transition. The sequence
    // counts the failure: it is not rolled back with the batch's transaction.
    let doomed = &leases[GATHERED].task_id;
    sql.batch_execute(&format!(
        "CREATE SEQUENCE report_failed;
         CREATE FUNCTION fail_report() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             PERFORM nextval('report_failed');
             RAISE EXCEPTION 'report refused by the test';
         END $$;
         CREATE TRIGGER fail_report BEFORE UPDATE ON herald.tasks
             FOR EACH ROW WHEN (NEW.id = '{doomed}'::uuid AND OLD.state = 'leased')
             EXECUTE FUNCTION fail_report();"
    ))
    .await?;
    let check = db.connect().await?;
    let held = report_first_held(&exec, &mut sql, &leases).await?;

    // The held report's row is freed only once the second lane has failed.
    until("the second lane's batch to fail", || async {
        let failed = check
            .query_one("SELECT is_called FROM report_failed", &[])
            .await?;
        Ok(failed.try_get::<_, bool>("is_called")?)
    })
    .await?;
    held.rollback().await?;

    held_report_accepted(&mut exec, &leases[0].task_id).await?;
    let ended = exec
        .next()
        .await
        .expect_err("the stream ends with the failure");
    let status = ended
        .downcast_ref::<tonic::Status>()
        .with_context(|| format!("expected a status, got {ended:#}"))?;
    assert_ne!(status.code(), tonic::Code::Ok, "{status:?}");
    let written: i64 = check
        .query_one(
            "SELECT count(*) AS n FROM herald.tasks WHERE state = 'succeeded'",
            &[],
        )
        .await?
        .try_get("n")?;
    assert_eq!(written, 1, "only the held report was written");
    Ok(())
}

/// A scheduler whose leases last 2 s, with a WhatsApp Cloud account `wa-1` in pool `wa`: a
/// lapsed lease through it waits for a status callback.
async fn with_whatsapp_pool() -> Result<(TestDb, SchedulerProcess)> {
    use herald_proto::v1::CreateAccountRequest;
    use herald_tests::accounts::{accounts_client, whatsapp_account};
    let db = TestDb::new().await?;
    let s = SchedulerProcess::builder(&db)
        .env("HERALD_LEASE_TTL", "2s")
        .spawn()
        .await?;
    accounts_client(&s.grpc_url())
        .await?
        .create_account(CreateAccountRequest {
            account: Some(whatsapp_account("wa-1", "wa", 100.0)),
        })
        .await?;
    Ok((db, s))
}

/// A lease lapsed while its executor was cut off, and a status meanwhile said its message
/// failed because the 24-hour window was closed (131047): the sweep scheduled the task's
/// window-closed fallback. The executor's late OK for that message, once it is back, must not
/// end the task SUCCEEDED and drop the fallback: the message it reports on is the one that
/// failed.
#[tokio::test]
async fn a_late_ok_for_a_message_that_failed_since_leaves_its_fallback_due() -> Result<()> {
    use herald_proto::v1::{
        provider_event, DeliveryState, DeliveryStatusEvent, ProviderEvent,
        RecordProviderEventsRequest, TemplateContent,
    };
    let (_db, s) = with_whatsapp_pool().await?;
    let mut tasks = connect_tasks(&s.grpc_url()).await?;
    let id = create(
        &mut tasks,
        TaskSpec {
            pool: "wa".into(),
            window_closed_fallback: Some(TemplateContent {
                template_id: "window_reopen".into(),
                language: "en_US".into(),
                ..Default::default()
            }),
            ..task_spec("orders", "+15550100", "hi")
        },
    )
    .await?;
    let mut exec = ScriptedExecutor::connect(&s.grpc_url(), "exec-1", &[], 1).await?;
    let lease = exec.leases(1).await?.remove(0);
    connect_lease(&s.grpc_url())
        .await?
        .record_provider_events(RecordProviderEventsRequest {
            events: vec![ProviderEvent {
                kind: Some(provider_event::Kind::Delivery(DeliveryStatusEvent {
                    provider_message_id: "wamid-late".into(),
                    state: DeliveryState::FailedAfterAcceptance as i32,
                    task_id: id.clone(),
                    attempt: lease.attempt,
                    error_code: 131_047,
                    error: "Re-engagement message".into(),
                    ..Default::default()
                })),
            }],
        })
        .await?;
    until("the lapsed lease to be swept", || {
        let mut tasks = tasks.clone();
        let id = id.clone();
        async move {
            let t = tasks.get_task(GetTaskRequest { id }).await?.into_inner();
            Ok(t.state != TaskState::Leased as i32)
        }
    })
    .await?;
    let task = tasks
        .get_task(GetTaskRequest { id: id.clone() })
        .await?
        .into_inner();
    assert_eq!(task.state(), TaskState::Scheduled, "the fallback: {task:?}");

    let mut late = result(&lease, OutcomeClass::Ok);
    late.provider_message_id = "wamid-late".into();
    exec.report(vec![late]).await?;
    let task = tasks
        .get_task(GetTaskRequest { id: id.clone() })
        .await?
        .into_inner();
    assert_eq!(
        task.state(),
        TaskState::Scheduled,
        "the late OK dropped the fallback: {task:?}"
    );
    Ok(())
}

/// A webhook batch recording that a lapsed lease's message went out, still uncommitted while
/// the sweep runs: the sweep leaves that task to a later pass instead of making it wait for a
/// callback it cannot see, and the later pass finds the status and ends it SUCCEEDED. Both
/// missed each other before, and the message was sent again after the grace.
#[tokio::test]
async fn a_sweep_leaves_a_lapsed_task_a_webhook_batch_is_naming_to_a_later_pass() -> Result<()> {
    let (db, s) = with_whatsapp_pool().await?;
    let mut tasks = connect_tasks(&s.grpc_url()).await?;
    let pooled = |recipient: &str| TaskSpec {
        pool: "wa".into(),
        ..task_spec("orders", recipient, "hi")
    };
    let named = create(&mut tasks, pooled("+15550101")).await?;
    let other = create(&mut tasks, pooled("+15550102")).await?;
    let mut exec = ScriptedExecutor::connect(&s.grpc_url(), "exec-1", &[], 2).await?;
    let leases = exec.leases(2).await?;
    // Leased in one batch: they lapse together, and a sweep that ends one has read both.
    assert_eq!(leases[0].expires_at, leases[1].expires_at);

    // The webhook batch: its lock on the task, then the status it records, not yet committed.
    let webhook = db.connect().await?;
    webhook.batch_execute("BEGIN").await?;
    webhook
        .execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('default:task:' || $1::text, 0))",
            &[&named],
        )
        .await?;
    webhook
        .execute(
            "INSERT INTO herald.delivery_events (namespace, provider_message_id, state, task_id,
                                                 occurred_at)
             VALUES ('default', 'wamid-101', 1, $1::text::uuid, now())",
            &[&named],
        )
        .await?;
    let state_of = |id: &str| {
        let mut tasks = tasks.clone();
        let id = id.to_owned();
        async move {
            Ok::<_, anyhow::Error>(
                tasks
                    .get_task(GetTaskRequest { id })
                    .await?
                    .into_inner()
                    .state(),
            )
        }
    };
    until("the other lapsed lease to be swept", || async {
        Ok(state_of(&other).await? != TaskState::Leased)
    })
    .await?;
    assert_eq!(
        state_of(&named).await?,
        TaskState::Leased,
        "the sweep took the task the webhook batch holds"
    );
    webhook.batch_execute("COMMIT").await?;
    until("the named task to end SUCCEEDED", || async {
        Ok(state_of(&named).await? == TaskState::Succeeded)
    })
    .await?;
    Ok(())
}
