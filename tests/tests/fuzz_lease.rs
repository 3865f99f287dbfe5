//! Fuzzing the scheduler's half of the lease protocol (issue #10) over a real gRPC stream to a
//! real scheduler on a real database (with an account, so claims are routed, and half the tasks
//! sent through its pool to one recipient): arbitrary executor scripts (a Hello with odd values, credit
//! of 0 or more than allowed, reports for unknown tasks, stale fencing tokens and wrong attempts,
//! absurd retry-afters and timestamps, extends, releases, revoke answers, a second Hello, empty
//! frames) never panic the scheduler; the stream either goes on or ends with a gRPC status
//! naming the bad frame; another executor keeps being served; and no task changes state from a
//! report whose fencing token is not one the scheduler granted.
//!
//! A second target puts raw bytes on the stream after a valid Hello (random, truncated and
//! bit-flipped frames): the stream ends or goes on, and the scheduler keeps serving.
//!
//! Slow (a stream per case), so the defaults are 32 scripts and 16 raw streams;
//! `PROPTEST_CASES` overrides both (docs/fuzzing.md).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use herald_proto::v1::{
    executor_message, retry_policy, scheduler_message, Account, AccountLimits, AttemptResult,
    CreateAccountRequest, CreateTasksRequest, Credit, ExecutorMessage, Extend, FixedDelays,
    Heartbeat, Hello, LeaseRef, OutcomeClass, Release, ReportAck, ReportBatch, RetryPolicy,
    RevokeAck, TaskState,
};
use herald_tests::accounts::accounts_client;
use herald_tests::lease::{result, ScriptedExecutor};
use herald_tests::{connect_lease, connect_tasks, task_spec, unique_id, SchedulerProcess, TestDb};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

/// Cases per run unless `PROPTEST_CASES` says otherwise.
const DEFAULT_CASES: u32 = 32;
/// Tasks created for each case's executor to lease.
const TASKS_PER_CASE: usize = 4;
/// The account pool half of each case's tasks go through.
const POOL: &str = "fz-pool";
/// How long any one answer from the scheduler may take.
const WAIT: Duration = Duration::from_secs(20);

/// Which lease a frame names, resolved against the leases received when it is sent.
#[derive(Debug, Clone)]
enum Token {
    /// A granted lease (`index` modulo the number received), its attempt shifted by `delta`
    /// (0: the granted fencing token; anything else: a wrong or stale attempt).
    Granted { index: usize, delta: i32 },
    /// A task id no task has.
    Unknown { attempt: i32 },
    /// Not a task id at all.
    Garbage { id: String, attempt: i32 },
}

/// One report in a script.
#[derive(Debug, Clone)]
struct Report {
    token: Token,
    outcome: i32,
    error: String,
    retry_after: Option<prost_types::Duration>,
    started_at: Option<prost_types::Timestamp>,
    scope: i32,
}

/// One step of an executor script.
#[derive(Debug, Clone)]
enum Step {
    Credit(u32),
    Report(Vec<Report>),
    Extend(Vec<Token>),
    Release(Vec<Token>),
    RevokeAck(Option<Token>, i32),
    Heartbeat,
    /// A second Hello: the stream must end with a status.
    Hello,
    /// A frame with no kind: the stream must end with a status.
    Empty,
    /// Lets the dispatcher grant.
    Pause(u64),
}

/// The queues a Hello names.
#[derive(Debug, Clone)]
enum Queues {
    /// The case's own queue.
    Case,
    /// The case's queue and some names that may not be queue names.
    CaseAnd(Vec<String>),
}

/// What the fuzzed executor says in its Hello.
#[derive(Debug, Clone)]
struct HelloScript {
    executor_id: String,
    protocol_version: u32,
    queues: Queues,
    initial_credit: u32,
    credentials_refs: Vec<String>,
}

#[derive(Debug, Clone)]
struct Script {
    hello: HelloScript,
    steps: Vec<Step>,
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z][a-z0-9-]{0,10}",
        1 => Just(String::new()),
        1 => any::<String>(),
        1 => (120usize..140).prop_map(|n| "é".repeat(n)),
        1 => "Bad Queue|[\\x00-\\x1f]{1,3}",
    ]
}

fn hello() -> impl Strategy<Value = HelloScript> {
    (
        prop_oneof![16 => "fuzz-[a-z0-9]{1,8}", 1 => name()],
        prop_oneof![16 => Just(1u32), 1 => Just(0u32), 1 => any::<u32>()],
        prop_oneof![
            6 => Just(Queues::Case),
            1 => prop::collection::vec(name(), 1..3).prop_map(Queues::CaseAnd),
        ],
        prop_oneof![
            8 => 0u32..6,
            1 => prop::sample::select(vec![100_000u32, 100_001, u32::MAX]),
        ],
        prop_oneof![6 => Just(Vec::new()), 1 => prop::collection::vec(name(), 1..3)],
    )
        .prop_map(
            |(executor_id, protocol_version, queues, initial_credit, credentials_refs)| {
                HelloScript {
                    executor_id,
                    protocol_version,
                    queues,
                    initial_credit,
                    credentials_refs,
                }
            },
        )
}

fn token() -> impl Strategy<Value = Token> {
    prop_oneof![
        6 => (0usize..8, prop_oneof![4 => Just(0i32), 1 => -2i32..3, 1 => any::<i32>()])
            .prop_map(|(index, delta)| Token::Granted { index, delta }),
        1 => any::<i32>().prop_map(|attempt| Token::Unknown { attempt }),
        1 => (name(), any::<i32>()).prop_map(|(id, attempt)| Token::Garbage { id, attempt }),
    ]
}

fn duration() -> impl Strategy<Value = prost_types::Duration> {
    prop_oneof![
        3 => (0i64..7_200, 0i32..1_000_000_000),
        1 => (any::<i64>(), any::<i32>()),
        1 => (
            prop::sample::select(vec![i64::MAX, i64::MAX / 1000, i64::MAX / 1000 + 1, 18_446_744_073_709_551i64, -1, i64::MIN]),
            prop::sample::select(vec![0i32, 999_999_999, 1_000_000_000, -1]),
        ),
    ]
    .prop_map(|(seconds, nanos)| prost_types::Duration { seconds, nanos })
}

fn timestamp() -> impl Strategy<Value = prost_types::Timestamp> {
    prop_oneof![
        3 => (1_700_000_000i64..1_900_000_000, 0i32..1_000_000_000),
        1 => (any::<i64>(), any::<i32>()),
        // Valid protobuf and chrono instants beyond PostgreSQL's range (4713 BC to 294276 AD
        // is PostgreSQL's; chrono reaches about 262143 either side).
        1 => (
            prop::sample::select(vec![-8_000_000_000_000i64, -300_000_000_000, 8_000_000_000_000, -62_135_596_800, 253_402_300_799]),
            Just(0i32),
        ),
    ]
    .prop_map(|(seconds, nanos)| prost_types::Timestamp { seconds, nanos })
}

fn report() -> impl Strategy<Value = Report> {
    (
        token(),
        prop_oneof![8 => 1i32..6, 2 => 0i32..8, 1 => any::<i32>()],
        prop_oneof![4 => Just(String::new()), 1 => name(), 1 => (4090usize..5000).prop_map(|n| "ü".repeat(n))],
        prop::option::of(duration()),
        prop::option::of(timestamp()),
        prop_oneof![4 => 0i32..3, 1 => any::<i32>()],
    )
        .prop_map(
            |(token, outcome, error, retry_after, started_at, scope)| Report {
                token,
                outcome,
                error,
                retry_after,
                started_at,
                scope,
            },
        )
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => prop_oneof![4 => 0u32..4, 1 => Just(100_000u32), 1 => any::<u32>()].prop_map(Step::Credit),
        6 => prop::collection::vec(report(), 0..5).prop_map(Step::Report),
        2 => prop::collection::vec(token(), 0..4).prop_map(Step::Extend),
        2 => prop::collection::vec(token(), 0..4).prop_map(Step::Release),
        1 => (prop::option::of(token()), prop_oneof![0i32..4, any::<i32>()])
            .prop_map(|(t, r)| Step::RevokeAck(t, r)),
        1 => Just(Step::Heartbeat),
        1 => (0u64..60).prop_map(Step::Pause),
    ]
}

fn script() -> impl Strategy<Value = Script> {
    let last = prop_oneof![
        8 => Just(None),
        1 => prop::sample::select(vec![Step::Hello, Step::Empty]).prop_map(Some),
    ];
    (hello(), prop::collection::vec(step(), 0..12), last).prop_map(|(hello, mut steps, last)| {
        steps.extend(last);
        Script { hello, steps }
    })
}

/// True when the scheduler should accept this Hello (lease.proto, session.rs).
fn hello_is_valid(h: &Hello) -> bool {
    let queue_ok = |q: &String| {
        !q.is_empty()
            && q.len() <= 63
            && q.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && q.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || ".-_".contains(c))
    };
    let printable = |s: &String| !s.is_empty() && !s.chars().any(char::is_control);
    printable(&h.executor_id)
        && h.executor_id.chars().count() <= 128
        && h.protocol_version != 0
        && h.initial_credit <= 100_000
        && h.queues.iter().all(queue_ok)
        && h.credentials_refs
            .iter()
            .all(|c| printable(c) && c.len() <= 128)
}

/// What the reader saw on the scheduler's side of the stream.
#[derive(Debug, Default)]
struct Seen {
    /// Fencing tokens granted, in order.
    granted: Vec<(String, i32)>,
    /// Every report ack.
    acks: Vec<ReportAck>,
    /// Heartbeat replies.
    heartbeats: usize,
    /// How the stream ended: None while open, Some(None) closed cleanly, Some(Some(status)).
    end: Option<Option<tonic::Status>>,
    /// Whether a clean close came before the executor closed its half.
    closed_first: bool,
}

fn frame(kind: executor_message::Kind) -> ExecutorMessage {
    ExecutorMessage { kind: Some(kind) }
}

fn resolve(token: &Token, granted: &[(String, i32)]) -> (String, i32) {
    match token {
        Token::Granted { index, delta } if !granted.is_empty() => {
            let (id, attempt) = &granted[index % granted.len()];
            (id.clone(), attempt.wrapping_add(*delta))
        }
        Token::Granted { index, .. } => (uuid::Uuid::new_v4().to_string(), *index as i32),
        Token::Unknown { attempt } => (uuid::Uuid::new_v4().to_string(), *attempt),
        Token::Garbage { id, attempt } => (id.clone(), *attempt),
    }
}

fn lease_ref((task_id, attempt): (String, i32)) -> LeaseRef {
    LeaseRef { task_id, attempt }
}

/// The scheduler, its database, and a well-behaved executor that must keep being served.
struct World {
    db: TestDb,
    scheduler: SchedulerProcess,
    witness: ScriptedExecutor,
    witness_queue: String,
    routing: Routing,
}

/// Which claim path a world's sessions take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Routing {
    /// The namespace has an account in [`POOL`]: every claim is routed (budgets, candidates,
    /// the grant), and half of each case's tasks go through the pool.
    ThroughAccount,
    /// No accounts: every claim is the one-statement queue claim (`claim_due.sql`), the path
    /// of every namespace that sends without accounts.
    ByQueue,
}

/// Plays one script and checks every property; an error fails the case.
async fn play(world: &mut World, script: &Script) -> Result<()> {
    let url = world.scheduler.grpc_url();
    let mut tasks = connect_tasks(&url).await?;
    let queue = unique_id("fz");
    let no_retry = RetryPolicy {
        strategy: Some(retry_policy::Strategy::Delays(FixedDelays {
            delays: vec![prost_types::Duration {
                seconds: 3600,
                nanos: 0,
            }],
        })),
    };
    // Through an account, half by queue and half through the pool to one recipient: a batch
    // may then carry reports on two sends to one recipient through one account.
    let specs = (0..TASKS_PER_CASE)
        .map(|i| {
            let pooled = world.routing == Routing::ThroughAccount && i >= TASKS_PER_CASE / 2;
            let recipient = if pooled {
                "+15559".to_owned()
            } else {
                format!("+1555{i}")
            };
            let mut s = task_spec(&queue, &recipient, "fuzz");
            if pooled {
                s.pool = POOL.into();
            }
            s.retry_policy = Some(no_retry.clone());
            s
        })
        .collect();
    tasks
        .create_tasks(CreateTasksRequest {
            tasks: specs,
            ..Default::default()
        })
        .await?;

    let h = &script.hello;
    let hello = Hello {
        executor_id: h.executor_id.clone(),
        protocol_version: h.protocol_version,
        queues: match &h.queues {
            Queues::Case => vec![queue.clone()],
            Queues::CaseAnd(more) => std::iter::once(queue.clone())
                .chain(more.iter().cloned())
                .collect(),
        },
        initial_credit: h.initial_credit,
        credentials_refs: h.credentials_refs.clone(),
    };
    let valid = hello_is_valid(&hello);

    let (outbound, rx) = mpsc::channel(64);
    outbound
        .send(frame(executor_message::Kind::Hello(hello.clone())))
        .await?;
    let mut client = connect_lease(&url).await?;
    let opened = tokio::time::timeout(WAIT, client.lease(ReceiverStream::new(rx)))
        .await
        .context("no answer to Hello")?;
    let mut inbound = match opened {
        Ok(response) => {
            ensure!(valid, "Hello {hello:?} was accepted");
            response.into_inner()
        }
        Err(status) => {
            eprintln!("[fuzz_lease] Hello refused: {:?}", status.code());
            ensure!(!valid, "valid Hello {hello:?} refused: {status:?}");
            ensure!(
                matches!(
                    status.code(),
                    Code::InvalidArgument | Code::FailedPrecondition
                ),
                "Hello {hello:?} refused with {status:?}"
            );
            return check_world(world, &queue, &Seen::default()).await;
        }
    };

    let seen = Arc::new(Mutex::new(Seen::default()));
    let executor_closed = Arc::new(AtomicBool::new(false));
    let heartbeat = Arc::new(tokio::sync::Notify::new());
    let reader = {
        let seen = seen.clone();
        let executor_closed = executor_closed.clone();
        let heartbeat = heartbeat.clone();
        tokio::spawn(async move {
            loop {
                let message = inbound.message().await;
                let mut seen = seen.lock().expect("seen lock");
                match message {
                    Ok(Some(m)) => match m.kind {
                        Some(scheduler_message::Kind::Leases(batch)) => seen
                            .granted
                            .extend(batch.leases.into_iter().map(|l| (l.task_id, l.attempt))),
                        Some(scheduler_message::Kind::ReportAcks(batch)) => {
                            seen.acks.extend(batch.acks)
                        }
                        Some(scheduler_message::Kind::Heartbeat(_)) => {
                            seen.heartbeats += 1;
                            heartbeat.notify_one();
                        }
                        _ => {}
                    },
                    Ok(None) => {
                        seen.closed_first = !executor_closed.load(Ordering::SeqCst);
                        seen.end = Some(None);
                        heartbeat.notify_one();
                        return;
                    }
                    Err(status) => {
                        seen.end = Some(Some(status));
                        heartbeat.notify_one();
                        return;
                    }
                }
            }
        })
    };

    // Let the first grant arrive, so that most tokens name a real lease.
    if hello.initial_credit > 0 {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
        while tokio::time::Instant::now() < deadline {
            {
                let s = seen.lock().expect("seen lock");
                if !s.granted.is_empty() || s.end.is_some() {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    let mut ended_by_script = false;
    for step in &script.steps {
        if seen.lock().expect("seen lock").end.is_some() {
            break;
        }
        let granted = seen.lock().expect("seen lock").granted.clone();
        let kind = match step {
            Step::Credit(n) => executor_message::Kind::Credit(Credit { additional: *n }),
            Step::Report(reports) => executor_message::Kind::Report(ReportBatch {
                results: reports
                    .iter()
                    .map(|r| {
                        let (task_id, attempt) = resolve(&r.token, &granted);
                        AttemptResult {
                            task_id,
                            attempt,
                            outcome: r.outcome,
                            error: r.error.clone(),
                            retry_after: r.retry_after,
                            provider_message_id: String::new(),
                            started_at: r.started_at,
                            rate_limit_scope: r.scope,
                            ..Default::default()
                        }
                    })
                    .collect(),
            }),
            Step::Extend(tokens) => executor_message::Kind::Extend(Extend {
                leases: tokens
                    .iter()
                    .map(|t| lease_ref(resolve(t, &granted)))
                    .collect(),
            }),
            Step::Release(tokens) => executor_message::Kind::Release(Release {
                leases: tokens
                    .iter()
                    .map(|t| lease_ref(resolve(t, &granted)))
                    .collect(),
            }),
            Step::RevokeAck(token, result) => executor_message::Kind::RevokeAck(RevokeAck {
                lease: token.as_ref().map(|t| lease_ref(resolve(t, &granted))),
                result: *result,
            }),
            Step::Heartbeat => executor_message::Kind::Heartbeat(Heartbeat { sent_at: None }),
            Step::Hello => executor_message::Kind::Hello(hello.clone()),
            Step::Empty => {
                ended_by_script = true;
                let _ = outbound.send(ExecutorMessage { kind: None }).await;
                break;
            }
            Step::Pause(ms) => {
                tokio::time::sleep(Duration::from_millis(*ms)).await;
                continue;
            }
        };
        if matches!(step, Step::Hello) {
            ended_by_script = true;
        }
        if outbound.send(frame(kind)).await.is_err() {
            break;
        }
        if ended_by_script {
            break;
        }
    }

    // A heartbeat last: its reply means every frame before it was handled.
    if !ended_by_script && seen.lock().expect("seen lock").end.is_none() {
        let before = seen.lock().expect("seen lock").heartbeats;
        let _ = outbound
            .send(frame(executor_message::Kind::Heartbeat(Heartbeat {
                sent_at: None,
            })))
            .await;
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            {
                let s = seen.lock().expect("seen lock");
                if s.heartbeats > before || s.end.is_some() {
                    break;
                }
            }
            ensure!(
                tokio::time::timeout_at(deadline, heartbeat.notified())
                    .await
                    .is_ok(),
                "no heartbeat reply within {WAIT:?}"
            );
        }
    }
    executor_closed.store(true, Ordering::SeqCst);
    drop(outbound);
    tokio::time::timeout(WAIT, reader)
        .await
        .context("the scheduler did not close the stream after the executor did")??;

    let seen = std::mem::take(&mut *seen.lock().expect("seen lock"));
    eprintln!(
        "[fuzz_lease] {} steps: {} granted, {} acks ({} accepted), end {:?}",
        script.steps.len(),
        seen.granted.len(),
        seen.acks.len(),
        seen.acks.iter().filter(|a| a.accepted).count(),
        seen.end.as_ref().map(|e| e.as_ref().map(|s| s.code()))
    );
    match &seen.end {
        Some(Some(status)) => ensure!(
            matches!(
                status.code(),
                Code::InvalidArgument | Code::FailedPrecondition | Code::Cancelled
            ),
            "the stream ended with {status:?}"
        ),
        Some(None) => ensure!(
            !seen.closed_first,
            "the scheduler closed the stream without a status (a panicked session?)"
        ),
        None => bail!("the reader ended without recording how"),
    }
    if ended_by_script {
        ensure!(
            matches!(&seen.end, Some(Some(s)) if s.code() == Code::InvalidArgument),
            "a second Hello or an empty frame must end the stream with INVALID_ARGUMENT, got {:?}",
            seen.end
        );
    }
    check_world(world, &queue, &seen).await
}

/// Fencing, liveness and the witness executor, after a case.
async fn check_world(world: &mut World, queue: &str, seen: &Seen) -> Result<()> {
    // Only tokens the scheduler granted are ever accepted, each at most once.
    let granted: HashSet<(String, i32)> = seen.granted.iter().cloned().collect();
    let mut accepted = HashSet::new();
    for ack in seen.acks.iter().filter(|a| a.accepted) {
        let token = (ack.task_id.clone(), ack.attempt);
        ensure!(
            granted.contains(&token),
            "accepted a report for {token:?}, never granted"
        );
        ensure!(accepted.insert(token.clone()), "accepted {token:?} twice");
    }

    // The database agrees: every attempt an executor reported is an accepted one, and no task
    // was finished by a report that was not accepted.
    let conn = world.db.connect().await?;
    let rows = conn
        .query(
            "SELECT t.id::text, t.state::text, a.attempt, a.outcome::int
             FROM herald.tasks t LEFT JOIN herald.attempts a ON a.task_id = t.id
             WHERE t.queue = $1",
            &[&queue],
        )
        .await?;
    let accepted_tasks: HashSet<&str> = accepted.iter().map(|(id, _)| id.as_str()).collect();
    for row in &rows {
        let id: String = row.get(0);
        let state: String = row.get(1);
        let attempt: Option<i32> = row.get(2);
        let outcome: Option<i32> = row.get(3);
        if let (Some(attempt), Some(outcome)) = (attempt, outcome) {
            if outcome != OutcomeClass::LeaseExpired as i32 {
                ensure!(
                    accepted.contains(&(id.clone(), attempt)),
                    "task {id} has attempt {attempt} (outcome {outcome}) from a report never accepted"
                );
            }
        }
        if !matches!(state.as_str(), "scheduled" | "leased") {
            ensure!(
                accepted_tasks.contains(id.as_str()),
                "task {id} is {state} without an accepted report"
            );
        }
    }

    ensure!(
        !world.scheduler.stderr_tail().contains("panicked"),
        "the scheduler panicked:\n{}",
        world.scheduler.stderr_tail()
    );

    // The well-behaved executor is still served.
    let mut tasks = connect_tasks(&world.scheduler.grpc_url()).await?;
    tasks
        .create_tasks(CreateTasksRequest {
            tasks: vec![task_spec(&world.witness_queue, "+19990000", "witness")],
            ..Default::default()
        })
        .await?;
    let lease = world
        .witness
        .leases(1)
        .await
        .context("the witness executor got no lease")?
        .remove(0);
    let acks = world
        .witness
        .report(vec![result(&lease, OutcomeClass::Ok)])
        .await?;
    ensure!(
        acks.len() == 1 && acks[0].accepted && acks[0].state() == TaskState::Succeeded,
        "the witness's report: {acks:?}"
    );
    world.witness.credit(1).await?;
    Ok(())
}

fn config(default: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    Config {
        cases,
        // Shrinking replays whole streams; a few dozen steps find a small script.
        max_shrink_iters: 64,
        source_file: Some(file!()),
        ..Config::default()
    }
}

/// A database, a scheduler on it (with one account in [`POOL`] when `routing` says so), and
/// the witness executor connected.
async fn world(routing: Routing) -> Result<World> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    if routing == Routing::ThroughAccount {
        create_pool_account(&scheduler).await?;
    }
    let witness_queue = unique_id("witness");
    let witness =
        ScriptedExecutor::connect(&scheduler.grpc_url(), "witness", &[&witness_queue], 1).await?;
    Ok(World {
        db,
        scheduler,
        witness,
        witness_queue,
        routing,
    })
}

/// The account in [`POOL`] that makes every claim of the namespace routed.
async fn create_pool_account(scheduler: &SchedulerProcess) -> Result<()> {
    accounts_client(&scheduler.grpc_url())
        .await?
        .create_account(CreateAccountRequest {
            account: Some(Account {
                id: "fz-account".into(),
                sender_kind: "webhook".into(),
                pool: POOL.into(),
                limits: Some(AccountLimits {
                    rate_per_second: 1000.0,
                    burst: Some(1000),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .await?;
    Ok(())
}

#[test]
fn arbitrary_executor_scripts_never_break_the_scheduler() {
    fuzz_scripts(Routing::ThroughAccount);
}

#[test]
fn arbitrary_executor_scripts_never_break_the_scheduler_claiming_by_queue() {
    fuzz_scripts(Routing::ByQueue);
}

/// Plays generated executor scripts against one world with `routing`; a failing case panics
/// with the shrunk script and the scheduler's stderr.
fn fuzz_scripts(routing: Routing) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let world = runtime.block_on(world(routing));
    let world = Mutex::new(world.expect("scheduler, database and witness"));
    let mut runner = TestRunner::new(config(DEFAULT_CASES));
    let outcome = runner.run(&script(), |script| {
        let mut world = world.lock().expect("world lock");
        runtime
            .block_on(play(&mut world, &script))
            .map_err(|e| TestCaseError::fail(format!("{e:#}")))
    });
    if let Err(e) = outcome {
        let world = world.lock().expect("world lock");
        panic!("{e}\nscheduler stderr:\n{}", world.scheduler.stderr_tail());
    }
}

/// Regression (found by fuzzing, #10): two reports for the same fencing token in one batch
/// were both applied by one statement: the task took either outcome, the attempt recorded the
/// other, and both were acknowledged accepted. The first report wins; the repeat is refused,
/// as a repeat in a later batch is.
#[tokio::test]
async fn a_repeated_token_in_one_batch_is_applied_once() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let queue = unique_id("q");
    let id = herald_tests::create_task(&mut tasks, task_spec(&queue, "+1", "once"))
        .await?
        .id;
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "twice", &[&queue], 1).await?;
    let lease = exec.leases(1).await?.remove(0);
    let acks = exec
        .report(vec![
            result(&lease, OutcomeClass::Ok),
            result(&lease, OutcomeClass::Transient),
        ])
        .await?;
    assert_eq!(acks.len(), 2, "{acks:?}");
    let accepted: Vec<_> = acks.iter().filter(|a| a.accepted).collect();
    assert_eq!(accepted.len(), 1, "{acks:?}");
    assert_eq!(accepted[0].state(), TaskState::Succeeded);

    let conn = db.connect().await?;
    let task_id: uuid::Uuid = id.parse()?;
    let rows = conn
        .query(
            "SELECT outcome::int FROM herald.attempts WHERE task_id = $1",
            &[&task_id],
        )
        .await?;
    let outcomes: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(outcomes, vec![OutcomeClass::Ok as i32]);
    let state: String = conn
        .query_one(
            "SELECT state::text FROM herald.tasks WHERE id = $1",
            &[&task_id],
        )
        .await?
        .get(0);
    assert_eq!(state, "succeeded");
    Ok(())
}

/// Sends and receives frames as raw bytes, so a test can put anything on the stream.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes::Buf;
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// Frames that are not (or not quite) ExecutorMessages.
fn garbage() -> impl Strategy<Value = Vec<u8>> {
    use prost::Message;
    let valid = || {
        prop_oneof![
            Just(frame(executor_message::Kind::Credit(Credit { additional: 1 })).encode_to_vec()),
            Just(
                frame(executor_message::Kind::Heartbeat(Heartbeat {
                    sent_at: None
                }))
                .encode_to_vec()
            ),
            Just(
                frame(executor_message::Kind::Report(ReportBatch {
                    results: vec![AttemptResult {
                        task_id: uuid::Uuid::new_v4().to_string(),
                        attempt: 1,
                        outcome: OutcomeClass::Ok as i32,
                        ..AttemptResult::default()
                    }],
                }))
                .encode_to_vec()
            ),
        ]
    };
    prop_oneof![
        3 => prop::collection::vec(any::<u8>(), 0..64),
        1 => prop::collection::vec(any::<u8>(), 1000..5000),
        // A valid frame cut short, or with a byte flipped.
        2 => (valid(), any::<prop::sample::Index>()).prop_map(|(f, i)| f[..i.index(f.len())].to_vec()),
        2 => (valid(), any::<prop::sample::Index>(), any::<u8>()).prop_map(|(mut f, i, b)| {
            let at = i.index(f.len());
            f[at] ^= b | 1;
            f
        }),
        // Field numbers and wire types no ExecutorMessage has, or a length past the end.
        1 => Just(vec![0xf8, 0xff, 0xff, 0xff, 0x0f, 0x01]),
        1 => Just(vec![0x1a, 0xff, 0xff, 0xff, 0xff, 0x07, 0x00]),
    ]
}

/// Plays a valid Hello, then `frames` as raw bytes, then a heartbeat; the stream may end
/// anywhere, but only with a status or a clean close, and the scheduler must go on serving.
async fn play_garbage(world: &mut World, frames: Vec<Vec<u8>>) -> Result<()> {
    use prost::Message;
    let queue = unique_id("fz");
    let hello = frame(executor_message::Kind::Hello(Hello {
        executor_id: "raw".into(),
        protocol_version: 1,
        queues: vec![queue.clone()],
        initial_credit: 1,
        credentials_refs: Vec::new(),
    }))
    .encode_to_vec();
    let heartbeat = frame(executor_message::Kind::Heartbeat(Heartbeat {
        sent_at: None,
    }))
    .encode_to_vec();
    let all: Vec<Vec<u8>> = std::iter::once(hello)
        .chain(frames)
        .chain(std::iter::once(heartbeat))
        .collect();
    let channel = tonic::transport::Channel::from_shared(world.scheduler.grpc_url())?
        .connect()
        .await?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await?;
    let path = http::uri::PathAndQuery::from_static("/herald.v1.LeaseService/Lease");
    let call = grpc.streaming(tonic::Request::new(tokio_stream::iter(all)), path, RawCodec);
    let outcome = tokio::time::timeout(WAIT, async {
        let mut inbound = match call.await {
            Ok(response) => response.into_inner(),
            Err(status) => return Ok::<_, anyhow::Error>(Some(status)),
        };
        loop {
            match inbound.message().await {
                Ok(Some(_)) => {}
                Ok(None) => return Ok(None),
                Err(status) => return Ok(Some(status)),
            }
        }
    })
    .await
    .context("the stream neither ended nor failed")??;
    if let Some(status) = outcome {
        ensure!(
            !matches!(status.code(), Code::Unknown | Code::Unavailable),
            "the stream ended with {status:?}"
        );
    }
    check_world(world, &queue, &Seen::default()).await
}

#[test]
fn garbage_frames_never_break_the_scheduler() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let world = runtime.block_on(world(Routing::ThroughAccount));
    let world = Mutex::new(world.expect("scheduler, database and witness"));
    let mut runner = TestRunner::new(config(16));
    let outcome = runner.run(&prop::collection::vec(garbage(), 1..5), |frames| {
        let mut world = world.lock().expect("world lock");
        runtime
            .block_on(play_garbage(&mut world, frames))
            .map_err(|e| TestCaseError::fail(format!("{e:#}")))
    });
    if let Err(e) = outcome {
        let world = world.lock().expect("world lock");
        panic!("{e}\nscheduler stderr:\n{}", world.scheduler.stderr_tail());
    }
}
