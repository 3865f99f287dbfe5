//! TaskService end to end: the real scheduler binary over loopback gRPC, a fresh database per
//! test. Covers creation (every field round-tripped, validation naming the field, idempotency
//! including key retention after the task is pruned), listing with filters and paging, and the
//! id-addressed calls (GetTask, CancelTask, RetryTask, ListAttempts).

use std::collections::{BTreeMap, HashSet};
use std::fmt::Debug;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use herald_proto::v1::task_service_client::TaskServiceClient;
use herald_proto::v1::{
    content, retry_policy, task_spec, CancelOutcome, CancelTaskRequest, Content, CreateTaskRequest,
    CreateTaskResponse, CreateTasksRequest, ExponentialBackoff, FixedDelays, GetTaskRequest,
    ListAttemptsRequest, ListTasksRequest, ResponseView, RetryPolicy, RetryTaskRequest, Task,
    TaskSpec, TaskState, TemplateContent,
};
use herald_tests::{
    connect_tasks, read_every_page, task_spec, unique_id, SchedulerProcess, TaskSpecExt, TestDb,
};
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_types::StatusExt;

type Client = TaskServiceClient<Channel>;

/// Upper bound for waiting on the retention job; it runs every 100 ms in that test.
const PRUNE_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// What keeps a test's scheduler and database alive; when it goes, the scheduler stops and then
/// the database is dropped. Tests bind it first, so it goes last.
struct Running {
    _scheduler: SchedulerProcess,
    _db: TestDb,
}

/// A scheduler on a fresh database: what keeps it running, a client for it, and a direct
/// database connection.
async fn env() -> Result<(Running, Client, tokio_postgres::Client)> {
    env_with(&[]).await
}

async fn env_with(vars: &[(&str, &str)]) -> Result<(Running, Client, tokio_postgres::Client)> {
    let db = TestDb::new().await?;
    let mut builder = SchedulerProcess::builder(&db);
    for (key, value) in vars {
        builder = builder.env(key, value);
    }
    let scheduler = builder.spawn().await?;
    let client = connect_tasks(&scheduler.grpc_url()).await?;
    let sql = db.connect().await?;
    let running = Running {
        _scheduler: scheduler,
        _db: db,
    };
    Ok((running, client, sql))
}

/// `(rows in herald.tasks, rows in herald.idempotency_keys)`.
async fn row_counts(sql: &tokio_postgres::Client) -> Result<(i64, i64)> {
    let tasks: i64 = sql
        .query_one("SELECT count(*) FROM herald.tasks", &[])
        .await?
        .get(0);
    let keys: i64 = sql
        .query_one("SELECT count(*) FROM herald.idempotency_keys", &[])
        .await?
        .get(0);
    Ok((tasks, keys))
}

/// The error of `result`, failing when it succeeded or has another code.
fn expect_code<T: Debug>(result: Result<tonic::Response<T>, Status>, code: Code) -> Result<Status> {
    match result {
        Ok(response) => bail!("expected {code:?}, got OK: {:?}", response.into_inner()),
        Err(status) if status.code() == code => Ok(status),
        Err(status) => bail!("expected {code:?}, got {status:?}"),
    }
}

/// The fields named by the `google.rpc.BadRequest` details of `status`.
fn violated_fields(status: &Status) -> Result<Vec<String>> {
    let bad_request = status
        .get_details_bad_request()
        .with_context(|| format!("no google.rpc.BadRequest details on {status:?}"))?;
    Ok(bad_request
        .field_violations
        .into_iter()
        .map(|v| v.field)
        .collect())
}

/// Fails unless `result` is INVALID_ARGUMENT naming exactly `field`.
fn expect_invalid<T: Debug>(result: Result<tonic::Response<T>, Status>, field: &str) -> Result<()> {
    let status = expect_code(result, Code::InvalidArgument)?;
    let fields = violated_fields(&status)?;
    ensure!(
        fields == [field],
        "expected a violation of exactly {field:?}, got {fields:?} ({status:?})"
    );
    Ok(())
}

async fn create(client: &mut Client, spec: TaskSpec) -> Result<CreateTaskResponse> {
    Ok(client
        .create_task(CreateTaskRequest { task: Some(spec) })
        .await?
        .into_inner())
}

async fn create_task(client: &mut Client, spec: TaskSpec) -> Result<Task> {
    create(client, spec)
        .await?
        .task
        .context("CreateTask answered without a task")
}

async fn get(client: &mut Client, id: &str) -> Result<Task> {
    Ok(client
        .get_task(GetTaskRequest { id: id.to_owned() })
        .await?
        .into_inner())
}

/// `at` with its sub-microsecond part dropped: PostgreSQL stores microseconds, so only such
/// times can round-trip exactly.
fn micros(at: SystemTime) -> Result<SystemTime> {
    let since_epoch = at.duration_since(UNIX_EPOCH)?;
    let micros = u64::try_from(since_epoch.as_micros())?;
    Ok(UNIX_EPOCH + Duration::from_micros(micros))
}

fn nanos(ts: &prost_types::Timestamp) -> i128 {
    i128::from(ts.seconds) * 1_000_000_000 + i128::from(ts.nanos)
}

/// `a - b` in nanoseconds.
fn diff_nanos(
    a: Option<&prost_types::Timestamp>,
    b: Option<&prost_types::Timestamp>,
) -> Result<i128> {
    let a = a.context("missing timestamp")?;
    let b = b.context("missing timestamp")?;
    Ok(nanos(a) - nanos(b))
}

fn duration(seconds: i64, nanos: i32) -> prost_types::Duration {
    prost_types::Duration { seconds, nanos }
}

fn text(body: &str) -> Option<Content> {
    Some(Content {
        body: Some(content::Body::Text(body.to_owned())),
        ..Default::default()
    })
}

fn ids(tasks: &[Task]) -> Vec<String> {
    tasks.iter().map(|t| t.id.clone()).collect()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// Creates `specs` in one CreateTasks call, checks that every answer is what GetTask then reads,
/// and returns the tasks as read, in request order.
async fn create_batch_as_read(client: &mut Client, specs: Vec<TaskSpec>) -> Result<Vec<Task>> {
    let asked = specs.len();
    let results = client
        .create_tasks(CreateTasksRequest {
            tasks: specs,
            ..Default::default()
        })
        .await
        .context("CreateTasks")?
        .into_inner()
        .results;
    ensure!(results.len() == asked, "one answer per spec: {results:?}");
    let mut stored = Vec::with_capacity(asked);
    for (i, result) in results.into_iter().enumerate() {
        let created = result
            .task
            .with_context(|| format!("answer {i} has no task"))?;
        let fetched = get(client, &created.id).await?;
        assert_eq!(
            fetched, created,
            "answer {i}: GetTask differs from CreateTasks' answer"
        );
        stored.push(fetched);
    }
    Ok(stored)
}

async fn list(client: &mut Client, request: ListTasksRequest) -> Result<Vec<Task>> {
    let response = client.list_tasks(request).await?.into_inner();
    ensure!(
        response.next_page_token.is_empty(),
        "expected one page, got a next_page_token"
    );
    Ok(response.tasks)
}

// ---------------------------------------------------------------------------------------------
// 1. Create and read back
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn create_then_get_round_trips_every_field() -> Result<()> {
    let (_running, mut client, sql) = env().await?;

    // Everything explicit, with template content and explicit retry delays.
    let run_at = micros(SystemTime::now() + Duration::from_secs(2 * 3600))?;
    let expire_at = micros(SystemTime::now() + Duration::from_secs(26 * 3600))?;
    let template = TemplateContent {
        template_id: "order_shipped".to_owned(),
        language: "de_DE".to_owned(),
        variables: BTreeMap::from([
            ("name".to_owned(), "Ada Lovelace".to_owned()),
            ("order".to_owned(), "42-ß".to_owned()),
        ]),
        ..Default::default()
    };
    let delays = vec![duration(30, 0), duration(120, 0), duration(1, 500_000_000)];
    let key = unique_id("round-trip");
    let full = TaskSpec {
        queue: "orders.eu_1-x".to_owned(),
        recipient: "+4915112345678".to_owned(),
        content: Some(Content {
            body: Some(content::Body::Template(template.clone())),
            ..Default::default()
        }),
        when: Some(task_spec::When::RunAt(run_at.into())),
        priority: Some(8),
        idempotency_key: key.clone(),
        max_attempts: Some(7),
        retry_policy: Some(RetryPolicy {
            strategy: Some(retry_policy::Strategy::Delays(FixedDelays {
                delays: delays.clone(),
            })),
        }),
        expire_at: Some(expire_at.into()),
        labels: BTreeMap::from([
            ("tenant".to_owned(), "acme".to_owned()),
            ("campaign".to_owned(), "spring sale".to_owned()),
        ]),
        ..TaskSpec::default()
    };
    let response = create(&mut client, full.clone()).await?;
    assert!(!response.existing, "a fresh key must not be `existing`");
    let created = response.task.context("no task")?;
    let fetched = get(&mut client, &created.id).await?;
    assert_eq!(fetched, created, "GetTask differs from CreateTask's answer");

    let id: uuid::Uuid = fetched.id.parse().context("task id is not a UUID")?;
    assert_eq!(
        id.get_version(),
        Some(uuid::Version::SortRand),
        "ids are documented as time-ordered UUIDs (v7)"
    );
    assert_eq!(fetched.queue, full.queue);
    assert_eq!(fetched.recipient, full.recipient);
    assert_eq!(fetched.content, full.content);
    assert_eq!(fetched.state(), TaskState::Scheduled);
    assert_eq!(fetched.priority, 8);
    assert_eq!(fetched.run_at, Some(run_at.into()));
    assert_eq!(fetched.expire_at, Some(expire_at.into()));
    assert_eq!(fetched.idempotency_key, key);
    assert_eq!(fetched.attempts, 0);
    assert_eq!(fetched.max_attempts, 7);
    assert_eq!(fetched.retry_policy, full.retry_policy);
    assert_eq!(fetched.labels, full.labels);
    assert!(fetched.created_at.is_some() && fetched.updated_at.is_some());
    assert_eq!(fetched.finished_at, None);
    assert_eq!(fetched.last_error, "");
    assert_eq!(fetched.lease, None);
    assert_eq!(fetched.lease_count, 0);
    assert_eq!(fetched.cancel_outcome(), CancelOutcome::Unspecified);

    // Text content, every optional field absent: the defaults are filled in.
    let minimal = task_spec("default", "user-17", "hello, world");
    let created = create_task(&mut client, minimal.clone()).await?;
    let fetched = get(&mut client, &created.id).await?;
    assert_eq!(fetched, created);
    fetched
        .id
        .parse::<uuid::Uuid>()
        .context("task id is not a UUID")?;
    assert_eq!(fetched.content, minimal.content);
    assert_eq!(fetched.state(), TaskState::Scheduled);
    assert_eq!(fetched.priority, 5);
    assert_eq!(fetched.max_attempts, 10);
    assert_eq!(fetched.idempotency_key, "");
    assert_eq!(fetched.expire_at, None);
    assert!(fetched.labels.is_empty());
    assert_eq!(
        fetched.retry_policy,
        Some(RetryPolicy {
            strategy: Some(retry_policy::Strategy::Exponential(ExponentialBackoff {
                initial: Some(duration(1, 0)),
                max: Some(duration(3600, 0)),
                multiplier: 2.0,
                jitter: Some(0.2),
            })),
        }),
        "absent retry policy must read back as exponential with its defaults"
    );
    let due_after_creation = diff_nanos(fetched.run_at.as_ref(), fetched.created_at.as_ref())?;
    assert!(
        due_after_creation.abs() < 1_000_000_000,
        "a task without run_at/delay is due at creation; run_at - created_at = {due_after_creation} ns"
    );

    // A delay: due that long after creation (both on the database clock).
    let delay = Duration::from_secs(90);
    let created = create_task(
        &mut client,
        task_spec("default", "user-18", "later").with_delay(delay),
    )
    .await?;
    let fetched = get(&mut client, &created.id).await?;
    let offset = diff_nanos(fetched.run_at.as_ref(), fetched.created_at.as_ref())?;
    let error = offset - i128::try_from(delay.as_nanos())?;
    assert!(
        error.abs() <= 1_000_000_000,
        "run_at - created_at should be {delay:?} (±1 s), was {offset} ns"
    );

    assert_eq!(row_counts(&sql).await?, (3, 1));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 2. Validation
// ---------------------------------------------------------------------------------------------

/// CreateTasks answers new tasks from what it sent and what the insert computed, not from a
/// read: every kind of spec must come back exactly as GetTask later reads it. Covers what the
/// database rounds (nanoseconds), fills in (the due time of a delay, the window's spread) or
/// decides (a suppressed recipient is created CANCELLED).
#[tokio::test]
async fn create_tasks_answers_what_get_task_reads_for_every_kind_of_spec() -> Result<()> {
    let (_running, mut client, sql) = env().await?;
    sql.execute(
        "INSERT INTO herald.suppressions (namespace, recipient, reason) \
         VALUES ('default', '4915100000001', 'opt_out')",
        &[],
    )
    .await
    .context("suppressing a recipient")?;
    let deadline =
        SystemTime::now() + Duration::from_secs(26 * 3600) + Duration::from_nanos(123_456_789);
    let specs = vec![
        // Nanoseconds the column cannot keep, exponential backoff, a send window.
        TaskSpec {
            expire_at: Some(deadline.into()),
            retry_policy: Some(RetryPolicy {
                strategy: Some(retry_policy::Strategy::Exponential(ExponentialBackoff {
                    initial: Some(duration(2, 0)),
                    max: Some(duration(600, 0)),
                    multiplier: 3.0,
                    jitter: Some(0.25),
                })),
            }),
            send_window: Some(herald_proto::v1::SendWindow {
                start: "09:00".into(),
                end: "17:30".into(),
                time_zone: "Europe/Berlin".into(),
                spread: None,
            }),
            labels: BTreeMap::from([("tenant".to_owned(), "acme".to_owned())]),
            ..task_spec("default", "+4915100000002", "window")
        },
        // Due after a delay, in the recipient's local time, and the default policy.
        task_spec("default", "+4915100000003", "delay").with_delay(Duration::from_millis(1500)),
        TaskSpec {
            local_time: (chrono::Utc::now() + chrono::Duration::days(3))
                .format("%Y-%m-%dT09:15:00")
                .to_string(),
            local_time_zone: "Asia/Tokyo".into(),
            ..task_spec("default", "+4915100000004", "local")
        },
        // A suppressed recipient: created already ended.
        task_spec("default", "+4915100000001", "suppressed"),
    ];
    let stored = create_batch_as_read(&mut client, specs).await?;
    assert_eq!(
        stored[3].state,
        TaskState::Cancelled as i32,
        "suppressed: {:?}",
        stored[3]
    );
    Ok(())
}

/// A batch whose tasks share every value but the recipient sends each shared input once
/// (store/arrays.rs): each task must still be stored with the batch's values, none of them a
/// default, and the one task that differs in a shared input keeps its own.
#[tokio::test]
async fn create_tasks_stores_what_the_whole_batch_shares_for_every_task() -> Result<()> {
    let (_running, mut client, _sql) = env().await?;
    let shared = |recipient: &str| TaskSpec {
        priority: Some(7),
        max_attempts: Some(3),
        retry_policy: Some(RetryPolicy {
            strategy: Some(retry_policy::Strategy::Delays(FixedDelays {
                delays: vec![duration(5, 0), duration(60, 0)],
            })),
        }),
        labels: BTreeMap::from([("batch".to_owned(), "spring".to_owned())]),
        ..task_spec("shared", recipient, "the same words for everyone")
            .with_delay(Duration::from_secs(3600))
    };
    let mut specs: Vec<TaskSpec> = (0..4)
        .map(|i| shared(&format!("+49151000001{i}")))
        .collect();
    // One task differs in a shared input: the batch then sends that input per task.
    let mut different = shared("+4915100000019");
    different.priority = Some(2);
    specs.push(different);
    let stored = create_batch_as_read(&mut client, specs).await?;
    for task in &stored {
        assert_eq!(task.queue, "shared", "{task:?}");
        assert_eq!(task.max_attempts, 3, "{task:?}");
        assert_eq!(
            task.labels.get("batch").map(String::as_str),
            Some("spring"),
            "{task:?}"
        );
        assert_eq!(
            task.retry_policy.as_ref().and_then(|p| p.strategy.clone()),
            Some(retry_policy::Strategy::Delays(FixedDelays {
                delays: vec![duration(5, 0), duration(60, 0)],
            })),
            "{task:?}"
        );
        let body = task.content.as_ref().and_then(|c| c.body.clone());
        assert_eq!(
            body,
            Some(content::Body::Text(
                "the same words for everyone".to_owned()
            )),
            "{task:?}"
        );
    }
    let priorities: Vec<i32> = stored.iter().map(|t| t.priority).collect();
    assert_eq!(priorities, vec![7, 7, 7, 7, 2]);
    Ok(())
}

#[tokio::test]
async fn create_task_rejects_each_bad_field_and_writes_nothing() -> Result<()> {
    let (_running, mut client, sql) = env().await?;
    let now = SystemTime::now();
    let day = Duration::from_secs(86_400);
    let base =
        || task_spec("default", "+15550001", "hello").with_idempotency_key(&unique_id("bad"));
    let with = |change: &dyn Fn(&mut TaskSpec)| {
        let mut spec = base();
        change(&mut spec);
        Some(spec)
    };
    let run_at = |ts: prost_types::Timestamp| Some(task_spec::When::RunAt(ts));

    let cases: Vec<(&str, Option<TaskSpec>, &str)> = vec![
        ("missing task", None, "task"),
        (
            "missing recipient",
            with(&|s| s.recipient.clear()),
            "task.recipient",
        ),
        (
            "blank recipient",
            with(&|s| s.recipient = " \t ".into()),
            "task.recipient",
        ),
        (
            "recipient of 257 characters",
            with(&|s| s.recipient = "r".repeat(257)),
            "task.recipient",
        ),
        (
            "missing content",
            with(&|s| s.content = None),
            "task.content",
        ),
        (
            "content without a body",
            with(&|s| {
                s.content = Some(Content {
                    body: None,
                    ..Default::default()
                })
            }),
            "task.content",
        ),
        (
            "empty text",
            with(&|s| s.content = text("")),
            "task.content.text",
        ),
        (
            "text over 64 KiB",
            with(&|s| s.content = text(&"x".repeat(64 * 1024 + 1))),
            "task.content.text",
        ),
        ("empty queue", with(&|s| s.queue.clear()), "task.queue"),
        (
            "upper-case queue",
            with(&|s| s.queue = "Upper".into()),
            "task.queue",
        ),
        (
            "queue starting with '-'",
            with(&|s| s.queue = "-lead".into()),
            "task.queue",
        ),
        (
            "queue of 64 characters",
            with(&|s| s.queue = "q".repeat(64)),
            "task.queue",
        ),
        (
            "queue with a space",
            with(&|s| s.queue = "has space".into()),
            "task.queue",
        ),
        (
            "run_at 2 days in the past",
            with(&|s| s.when = run_at((now - 2 * day).into())),
            "task.run_at",
        ),
        (
            "run_at with nanos -1",
            with(&|s| {
                s.when = run_at(prost_types::Timestamp {
                    seconds: 1_900_000_000,
                    nanos: -1,
                })
            }),
            "task.run_at",
        ),
        (
            "run_at 400 days ahead",
            with(&|s| s.when = run_at((now + 400 * day).into())),
            "task.run_at",
        ),
        (
            "negative delay",
            with(&|s| s.when = Some(task_spec::When::Delay(duration(-5, 0)))),
            "task.delay",
        ),
        (
            "priority -1",
            with(&|s| s.priority = Some(-1)),
            "task.priority",
        ),
        (
            "priority 10",
            with(&|s| s.priority = Some(10)),
            "task.priority",
        ),
        (
            "max_attempts 0",
            with(&|s| s.max_attempts = Some(0)),
            "task.max_attempts",
        ),
        (
            "max_attempts 101",
            with(&|s| s.max_attempts = Some(101)),
            "task.max_attempts",
        ),
        (
            "non-ASCII idempotency key",
            with(&|s| s.idempotency_key = "clé-1".into()),
            "task.idempotency_key",
        ),
        (
            "idempotency key of 201 characters",
            with(&|s| s.idempotency_key = "k".repeat(201)),
            "task.idempotency_key",
        ),
        (
            "expire_at before run_at",
            with(&|s| {
                s.when = run_at((now + 2 * 3600 * Duration::from_secs(1)).into());
                s.expire_at = Some((now + Duration::from_secs(3600)).into());
            }),
            "task.expire_at",
        ),
        (
            "21 retry delays",
            with(&|s| {
                s.retry_policy = Some(RetryPolicy {
                    strategy: Some(retry_policy::Strategy::Delays(FixedDelays {
                        delays: vec![duration(60, 0); 21],
                    })),
                })
            }),
            "task.retry_policy.delays.delays",
        ),
        (
            "exponential initial 1 ms",
            with(&|s| {
                s.retry_policy = Some(RetryPolicy {
                    strategy: Some(retry_policy::Strategy::Exponential(ExponentialBackoff {
                        initial: Some(duration(0, 1_000_000)),
                        ..ExponentialBackoff::default()
                    })),
                })
            }),
            "task.retry_policy.exponential.initial",
        ),
        // Labels are stored as jsonb, which refuses \u0000: caught by the check, not left
        // to fail the insert with INTERNAL.
        (
            "label value with a NUL character",
            with(&|s| {
                s.labels.insert("team".into(), "a\0b".into());
            }),
            "task.labels[team]",
        ),
        (
            "a label herald keeps for itself",
            with(&|s| {
                s.labels.insert("herald.schedule_id".into(), "spoof".into());
            }),
            "task.labels",
        ),
        (
            "label key with a NUL character",
            with(&|s| {
                s.labels.insert("te\0am".into(), "ops".into());
            }),
            "task.labels[te\\0am]",
        ),
    ];

    let mut failures = Vec::new();
    for (name, task, field) in cases {
        let result = client.create_task(CreateTaskRequest { task }).await;
        if let Err(error) = expect_invalid(result, field) {
            failures.push(format!("{name}: {error:#}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(
        row_counts(&sql).await?,
        (0, 0),
        "a rejected create wrote rows"
    );

    // Control: the base every case was derived from is valid, so each rejection above came from
    // the one field the case changed.
    create_task(&mut client, base()).await?;
    assert_eq!(row_counts(&sql).await?, (1, 1));
    Ok(())
}

#[tokio::test]
async fn create_tasks_names_the_bad_entry_and_writes_nothing() -> Result<()> {
    let (_running, mut client, sql) = env().await?;
    let good = |n: usize| {
        task_spec("default", &format!("+1555000{n}"), "hi")
            .with_idempotency_key(&unique_id("batch"))
    };
    let mut bad = good(2);
    bad.recipient.clear();
    let result = client
        .create_tasks(CreateTasksRequest {
            tasks: vec![good(0), good(1), bad, good(3)],
            ..Default::default()
        })
        .await;
    expect_invalid(result, "tasks[2].recipient")?;

    let mut bad_queue = good(1);
    bad_queue.queue = "Upper".into();
    let result = client
        .create_tasks(CreateTasksRequest {
            tasks: vec![good(0), bad_queue],
            ..Default::default()
        })
        .await;
    expect_invalid(result, "tasks[1].queue")?;
    assert_eq!(
        row_counts(&sql).await?,
        (0, 0),
        "a rejected batch wrote rows"
    );

    let result = client
        .create_tasks(CreateTasksRequest {
            tasks: Vec::new(),
            ..Default::default()
        })
        .await;
    expect_invalid(result, "tasks")?;
    let too_many: Vec<TaskSpec> = (0..1001)
        .map(|n| task_spec("default", &format!("r{n}"), "hi"))
        .collect();
    let result = client
        .create_tasks(CreateTasksRequest {
            tasks: too_many,
            ..Default::default()
        })
        .await;
    expect_invalid(result, "tasks")?;
    assert_eq!(
        row_counts(&sql).await?,
        (0, 0),
        "a rejected batch wrote rows"
    );

    // Control: the same batch without the bad entry is created whole.
    let response = client
        .create_tasks(CreateTasksRequest {
            tasks: vec![good(0), good(1), good(3)],
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(response.results.len(), 3);
    assert_eq!(row_counts(&sql).await?, (3, 3));
    Ok(())
}

#[tokio::test]
async fn create_tasks_answers_without_contents_when_asked_for_the_basic_view() -> Result<()> {
    let (_running, mut client, sql) = env().await?;
    let specs = |view: &str| {
        (0..3)
            .map(|n| task_spec("default", &format!("+1555000{n}"), &format!("{view} {n}")))
            .collect::<Vec<_>>()
    };

    let basic = client
        .create_tasks(CreateTasksRequest {
            tasks: specs("basic"),
            response_view: ResponseView::Basic.into(),
        })
        .await?
        .into_inner();
    ensure!(
        basic.content_omitted,
        "a BASIC answer must say it omits the contents"
    );
    assert_eq!(basic.results.len(), 3);
    for (n, result) in basic.results.iter().enumerate() {
        let task = result.task.as_ref().context("a result without its task")?;
        ensure!(
            task.content.is_none(),
            "a BASIC answer carried content: {task:?}"
        );
        ensure!(!task.id.is_empty() && task.state() == TaskState::Scheduled);
        // The content was stored all the same.
        let stored = get(&mut client, &task.id).await?;
        assert_eq!(stored.content, specs("basic")[n].content);
    }

    // Unset and FULL answer whole, and do not claim to omit anything.
    for view in [ResponseView::Unspecified, ResponseView::Full] {
        let full = client
            .create_tasks(CreateTasksRequest {
                tasks: specs("full"),
                response_view: view.into(),
            })
            .await?
            .into_inner();
        ensure!(!full.content_omitted, "{view:?} claimed to omit contents");
        let contents: Vec<_> = full
            .results
            .iter()
            .map(|r| r.task.as_ref().and_then(|t| t.content.clone()))
            .collect();
        let sent: Vec<_> = specs("full").into_iter().map(|s| s.content).collect();
        assert_eq!(contents, sent, "{view:?} answered without the contents");
    }

    // A view that does not exist is refused by name and creates nothing.
    let before = row_counts(&sql).await?;
    let result = client
        .create_tasks(CreateTasksRequest {
            tasks: specs("unknown"),
            response_view: 7,
        })
        .await;
    expect_invalid(result, "response_view")?;
    assert_eq!(
        row_counts(&sql).await?,
        before,
        "a refused batch wrote rows"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 3. Idempotency
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn same_key_and_request_returns_the_existing_task() -> Result<()> {
    let (_running, mut client, sql) = env().await?;
    let spec = task_spec("default", "+15550001", "once")
        .with_idempotency_key(&unique_id("idem"))
        .with_delay(Duration::from_secs(600));
    let first = create(&mut client, spec.clone()).await?;
    let second = create(&mut client, spec).await?;
    assert!(!first.existing, "first create must be new");
    assert!(second.existing, "second create must be `existing`");
    let (first, second) = (
        first.task.context("no task")?,
        second.task.context("no task")?,
    );
    assert_eq!(second.id, first.id);
    assert_eq!(
        second, first,
        "the existing task must be answered as stored"
    );
    assert_eq!(row_counts(&sql).await?, (1, 1));
    Ok(())
}

#[tokio::test]
async fn one_key_named_twice_in_a_batch_answers_the_one_task_twice() -> Result<()> {
    let (_running, mut client, sql) = env().await?;
    let twice = task_spec("default", "+15550001", "once")
        .with_idempotency_key(&unique_id("idem"))
        .with_delay(Duration::from_secs(600));
    let other = task_spec("default", "+15550002", "other").with_delay(Duration::from_secs(600));
    let results = client
        .create_tasks(CreateTasksRequest {
            tasks: vec![twice.clone(), other, twice],
            ..Default::default()
        })
        .await?
        .into_inner()
        .results;
    let tasks: Vec<_> = results
        .iter()
        .map(|r| r.task.clone().context("every answer carries its task"))
        .collect::<Result<_>>()?;
    assert_eq!(tasks[0], tasks[2], "both answers are the one stored task");
    assert_ne!(tasks[0].id, tasks[1].id);
    assert_eq!(tasks[1].recipient, "+15550002");
    assert_eq!(row_counts(&sql).await?, (2, 1));
    Ok(())
}

#[tokio::test]
async fn same_key_with_a_different_request_is_already_exists() -> Result<()> {
    let (_running, mut client, sql) = env().await?;
    let key = unique_id("idem");
    let spec = task_spec("default", "+15550001", "once").with_idempotency_key(&key);
    let first = create_task(&mut client, spec.clone()).await?;

    let mut other_text = spec.clone();
    other_text.content = text("twice");
    expect_code(
        client
            .create_task(CreateTaskRequest {
                task: Some(other_text),
            })
            .await,
        Code::AlreadyExists,
    )?;
    let other_priority = spec.clone().with_label("x", "y");
    expect_code(
        client
            .create_task(CreateTaskRequest {
                task: Some(other_priority),
            })
            .await,
        Code::AlreadyExists,
    )?;
    assert_eq!(
        row_counts(&sql).await?,
        (1, 1),
        "a conflicting create wrote rows"
    );
    assert_eq!(
        get(&mut client, &first.id).await?,
        first,
        "the original changed"
    );
    Ok(())
}

#[tokio::test]
async fn create_tasks_resolves_a_known_key_and_creates_the_rest() -> Result<()> {
    let (_running, mut client, sql) = env().await?;
    let known = task_spec("default", "+15550001", "first").with_idempotency_key(&unique_id("k"));
    let original = create_task(&mut client, known.clone()).await?;

    let fresh_keyed =
        task_spec("default", "+15550002", "second").with_idempotency_key(&unique_id("k"));
    let unkeyed = task_spec("default", "+15550003", "third");
    let response = client
        .create_tasks(CreateTasksRequest {
            tasks: vec![fresh_keyed.clone(), known, unkeyed.clone()],
            ..Default::default()
        })
        .await?
        .into_inner();
    let results = response.results;
    assert_eq!(results.len(), 3, "one result per entry, in order");
    let existing: Vec<bool> = results.iter().map(|r| r.existing).collect();
    assert_eq!(existing, [false, true, false]);
    let tasks: Vec<Task> = results
        .into_iter()
        .map(|r| r.task.context("result without a task"))
        .collect::<Result<_>>()?;
    assert_eq!(
        tasks[1].id, original.id,
        "the known key resolves to its task"
    );
    assert_ne!(tasks[0].id, original.id);
    assert_ne!(tasks[2].id, original.id);
    assert_ne!(tasks[0].id, tasks[2].id);
    assert_eq!(tasks[0].recipient, fresh_keyed.recipient);
    assert_eq!(tasks[2].recipient, unkeyed.recipient);
    for task in &tasks {
        assert_eq!(&get(&mut client, &task.id).await?, task);
    }
    assert_eq!(row_counts(&sql).await?, (3, 2));
    Ok(())
}

#[tokio::test]
async fn create_tasks_with_one_conflicting_key_creates_nothing() -> Result<()> {
    let (_running, mut client, sql) = env().await?;
    let key = unique_id("k");
    let original = task_spec("default", "+15550001", "first").with_idempotency_key(&key);
    create_task(&mut client, original).await?;

    let conflicting = task_spec("default", "+15550001", "not the first").with_idempotency_key(&key);
    let status = expect_code(
        client
            .create_tasks(CreateTasksRequest {
                tasks: vec![
                    task_spec("default", "+15550002", "a").with_idempotency_key(&unique_id("k")),
                    task_spec("default", "+15550003", "b"),
                    conflicting,
                ],
                ..Default::default()
            })
            .await,
        Code::AlreadyExists,
    )?;
    assert!(
        status.message().contains("tasks[2]"),
        "the message should name the entry: {status:?}"
    );
    assert_eq!(
        row_counts(&sql).await?,
        (1, 1),
        "a batch with a conflicting key must create nothing (nor reserve its other keys)"
    );
    Ok(())
}

#[tokio::test]
async fn concurrent_creates_with_one_key_make_one_task() -> Result<()> {
    let (_running, client, sql) = env().await?;
    let spec = task_spec("default", "+15550001", "race").with_idempotency_key(&unique_id("race"));
    let mut handles = Vec::new();
    for _ in 0..10 {
        let mut client = client.clone();
        let spec = spec.clone();
        handles.push(tokio::spawn(async move { create(&mut client, spec).await }));
    }
    let mut ids = HashSet::new();
    let mut new = 0;
    for handle in handles {
        let response = handle.await??;
        ids.insert(response.task.context("no task")?.id);
        if !response.existing {
            new += 1;
        }
    }
    assert_eq!(
        ids.len(),
        1,
        "concurrent creates answered several ids: {ids:?}"
    );
    assert_eq!(new, 1, "exactly one create must report a new task");
    assert_eq!(row_counts(&sql).await?, (1, 1));
    Ok(())
}

#[tokio::test]
async fn idempotency_key_outlives_its_pruned_task() -> Result<()> {
    let (_running, mut client, sql) = env_with(&[
        ("HERALD_TASK_RETENTION", "0s"),
        ("HERALD_RETENTION_INTERVAL", "100ms"),
    ])
    .await?;
    let key = unique_id("kept");
    let spec = task_spec("default", "+15550001", "once").with_idempotency_key(&key);
    let created = create_task(&mut client, spec.clone()).await?;
    let cancelled = client
        .cancel_task(CancelTaskRequest {
            id: created.id.clone(),
        })
        .await?
        .into_inner();
    assert_eq!(
        cancelled.task.context("no task")?.state(),
        TaskState::Cancelled
    );

    wait_pruned(&sql, &created.id).await?;
    let keys: i64 = sql
        .query_one(
            "SELECT count(*) FROM herald.idempotency_keys WHERE key = $1",
            &[&key],
        )
        .await?
        .get(0);
    assert_eq!(keys, 1, "the key must be kept after its task was pruned");

    let again = create(&mut client, spec.clone()).await?;
    assert!(
        again.existing,
        "the same request must resolve to the pruned task"
    );
    assert_eq!(again.task.context("no task")?.id, created.id);
    assert_eq!(
        row_counts(&sql).await?,
        (0, 1),
        "the pruned task must not be re-created"
    );

    let mut different = spec;
    different.content = text("twice");
    expect_code(
        client
            .create_task(CreateTaskRequest {
                task: Some(different),
            })
            .await,
        Code::AlreadyExists,
    )?;
    assert_eq!(row_counts(&sql).await?, (0, 1));
    Ok(())
}

#[tokio::test]
async fn a_finished_task_retention_passed_while_it_was_locked_is_pruned_once_released() -> Result<()>
{
    // Long enough to lock the first task before it is due for pruning.
    let (_running, mut client, sql) = env_with(&[
        ("HERALD_TASK_RETENTION", "3s"),
        ("HERALD_RETENTION_INTERVAL", "100ms"),
    ])
    .await?;
    let mut ended = Vec::new();
    for body in ["first", "second"] {
        let created = create_task(&mut client, task_spec("default", "+15550001", body)).await?;
        client
            .cancel_task(CancelTaskRequest {
                id: created.id.clone(),
            })
            .await?;
        ended.push(created.id);
    }
    let (first, second) = (&ended[0], &ended[1]);
    // Another transaction holds the task that ended first: retention skips it and deletes the
    // one that ended after it, so its walks now start past the held task's end time.
    sql.batch_execute("BEGIN").await?;
    let held = sql
        .query(
            "SELECT id FROM herald.tasks WHERE id = $1::text::uuid FOR UPDATE",
            &[first],
        )
        .await?;
    ensure!(
        held.len() == 1,
        "the first task was pruned before it was locked"
    );
    wait_pruned(&sql, second).await?;
    assert_eq!(task_rows(&sql, first).await?, 1, "a locked task was pruned");
    sql.batch_execute("COMMIT").await?;
    // Released, it is still found: a walk from the oldest end time comes round.
    wait_pruned(&sql, first).await
}

/// How many rows herald.tasks has for task `id` (0 or 1).
async fn task_rows(sql: &tokio_postgres::Client, id: &str) -> Result<i64> {
    Ok(sql
        .query_one(
            "SELECT count(*) FROM herald.tasks WHERE id = $1::text::uuid",
            &[&id],
        )
        .await?
        .get(0))
}

/// Waits until retention has deleted task `id`.
async fn wait_pruned(sql: &tokio_postgres::Client, id: &str) -> Result<()> {
    let deadline = tokio::time::Instant::now() + PRUNE_TIMEOUT;
    let mut poll = tokio::time::interval(Duration::from_millis(50));
    loop {
        poll.tick().await;
        if task_rows(sql, id).await? == 0 {
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "task {id} was not pruned within {PRUNE_TIMEOUT:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 4. ListTasks
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn list_tasks_filters_by_state_and_queue() -> Result<()> {
    let (_running, mut client, _) = env().await?;
    let a1 = create_task(&mut client, task_spec("alpha", "r1", "a1")).await?;
    let a2 = create_task(&mut client, task_spec("alpha", "r2", "a2")).await?;
    let b1 = create_task(&mut client, task_spec("beta", "r3", "b1")).await?;
    client
        .cancel_task(CancelTaskRequest { id: a2.id.clone() })
        .await?;

    let all = list(&mut client, ListTasksRequest::default()).await?;
    assert_eq!(
        sorted(ids(&all)),
        sorted(vec![a1.id.clone(), a2.id.clone(), b1.id.clone()])
    );

    let states = |states: &[TaskState]| ListTasksRequest {
        states: states.iter().map(|s| *s as i32).collect(),
        ..ListTasksRequest::default()
    };
    let cancelled = list(&mut client, states(&[TaskState::Cancelled])).await?;
    assert_eq!(ids(&cancelled), vec![a2.id.clone()]);
    assert_eq!(cancelled[0].state(), TaskState::Cancelled);
    let scheduled = list(&mut client, states(&[TaskState::Scheduled])).await?;
    assert_eq!(
        sorted(ids(&scheduled)),
        sorted(vec![a1.id.clone(), b1.id.clone()])
    );
    let either = list(
        &mut client,
        states(&[TaskState::Scheduled, TaskState::Cancelled]),
    )
    .await?;
    assert_eq!(either.len(), 3);
    let failed = list(&mut client, states(&[TaskState::Failed])).await?;
    assert!(failed.is_empty());

    let queue = |queue: &str| ListTasksRequest {
        queue: queue.to_owned(),
        ..ListTasksRequest::default()
    };
    let alpha = list(&mut client, queue("alpha")).await?;
    assert_eq!(
        sorted(ids(&alpha)),
        sorted(vec![a1.id.clone(), a2.id.clone()])
    );
    let beta = list(&mut client, queue("beta")).await?;
    assert_eq!(ids(&beta), vec![b1.id.clone()]);
    assert!(list(&mut client, queue("gamma")).await?.is_empty());

    let alpha_scheduled = list(
        &mut client,
        ListTasksRequest {
            states: vec![TaskState::Scheduled as i32],
            queue: "alpha".to_owned(),
            ..ListTasksRequest::default()
        },
    )
    .await?;
    assert_eq!(ids(&alpha_scheduled), vec![a1.id.clone()]);
    Ok(())
}

#[tokio::test]
async fn list_tasks_filters_by_created_and_run_ranges() -> Result<()> {
    let (_running, mut client, _) = env().await?;
    let now = SystemTime::now();
    let hour = Duration::from_secs(3600);
    // Created in this order; due in the opposite order, so the two ranges pick differently.
    let t1 = create_task(
        &mut client,
        task_spec("default", "r1", "1").with_run_at(now + 3 * hour),
    )
    .await?;
    let t2 = create_task(
        &mut client,
        task_spec("default", "r2", "2").with_run_at(now + 2 * hour),
    )
    .await?;
    let t3 = create_task(
        &mut client,
        task_spec("default", "r3", "3").with_run_at(now + hour),
    )
    .await?;
    assert!(
        nanos(t1.created_at.as_ref().context("created_at")?)
            < nanos(t2.created_at.as_ref().context("created_at")?)
            && nanos(t2.created_at.as_ref().context("created_at")?)
                < nanos(t3.created_at.as_ref().context("created_at")?),
        "sequential creates must have increasing created_at"
    );

    // created_after is inclusive, created_before exclusive.
    let from_t2 = list(
        &mut client,
        ListTasksRequest {
            created_after: t2.created_at,
            ..ListTasksRequest::default()
        },
    )
    .await?;
    assert_eq!(
        sorted(ids(&from_t2)),
        sorted(vec![t2.id.clone(), t3.id.clone()])
    );
    let before_t2 = list(
        &mut client,
        ListTasksRequest {
            created_before: t2.created_at,
            ..ListTasksRequest::default()
        },
    )
    .await?;
    assert_eq!(ids(&before_t2), vec![t1.id.clone()]);
    let only_t2 = list(
        &mut client,
        ListTasksRequest {
            created_after: t2.created_at,
            created_before: t3.created_at,
            ..ListTasksRequest::default()
        },
    )
    .await?;
    assert_eq!(ids(&only_t2), vec![t2.id.clone()]);

    // run_after is inclusive, run_before exclusive.
    let due_late = list(
        &mut client,
        ListTasksRequest {
            run_after: Some((now + 90 * Duration::from_secs(60)).into()),
            ..ListTasksRequest::default()
        },
    )
    .await?;
    assert_eq!(
        sorted(ids(&due_late)),
        sorted(vec![t1.id.clone(), t2.id.clone()])
    );
    let due_early = list(
        &mut client,
        ListTasksRequest {
            run_before: t2.run_at,
            ..ListTasksRequest::default()
        },
    )
    .await?;
    assert_eq!(ids(&due_early), vec![t3.id.clone()]);
    let due_middle = list(
        &mut client,
        ListTasksRequest {
            run_after: t2.run_at,
            run_before: t1.run_at,
            ..ListTasksRequest::default()
        },
    )
    .await?;
    assert_eq!(ids(&due_middle), vec![t2.id.clone()]);
    Ok(())
}

#[tokio::test]
async fn list_tasks_pages_newest_first() -> Result<()> {
    let (_running, mut client, _) = env().await?;
    let mut created = Vec::new();
    for n in 0..5 {
        created.push(
            create_task(&mut client, task_spec("default", &format!("r{n}"), "hi"))
                .await?
                .id,
        );
    }
    let newest_first: Vec<String> = created.iter().rev().cloned().collect();

    let mut seen = Vec::new();
    let mut pages = Vec::new();
    let mut token = String::new();
    loop {
        ensure!(pages.len() < 10, "paging does not end: {pages:?}");
        let page = client
            .list_tasks(ListTasksRequest {
                page_size: 2,
                page_token: token.clone(),
                ..ListTasksRequest::default()
            })
            .await?
            .into_inner();
        ensure!(
            page.tasks.len() <= 2,
            "page larger than page_size: {}",
            page.tasks.len()
        );
        pages.push(page.tasks.len());
        seen.extend(ids(&page.tasks));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(seen, newest_first, "every task exactly once, newest first");
    assert_eq!(pages, [2, 2, 1]);
    Ok(())
}

#[tokio::test]
async fn a_page_of_large_tasks_is_cut_to_what_a_client_accepts() -> Result<()> {
    // 100 tasks of 60 KB: one page of all of them would be 6 MB, more than the 4 MiB a gRPC
    // client decodes by default.
    let (_running, mut client, _) = env().await?;
    let body = "y".repeat(60_000);
    let mut created = Vec::new();
    for batch in 0..5 {
        let specs = (0..20)
            .map(|i| task_spec("default", &format!("r{batch}-{i}"), &body))
            .collect();
        let answer = client
            .create_tasks(CreateTasksRequest {
                tasks: specs,
                ..Default::default()
            })
            .await?
            .into_inner();
        created.extend(
            answer
                .results
                .into_iter()
                .filter_map(|r| r.task)
                .map(|t| t.id),
        );
    }
    let (seen, pages) = read_every_page(20, |token| {
        let mut client = client.clone();
        async move {
            let page = client
                .list_tasks(ListTasksRequest {
                    page_size: 100,
                    page_token: token,
                    ..ListTasksRequest::default()
                })
                .await?
                .into_inner();
            Ok((ids(&page.tasks), page.next_page_token))
        }
    })
    .await?;
    assert!(pages > 1, "the tasks did not fit one page");
    let mut expected = created.clone();
    expected.sort();
    let mut got = seen.clone();
    got.sort();
    assert_eq!(got, expected, "every task exactly once");
    assert_eq!(seen.len(), created.len(), "no task twice");
    Ok(())
}

#[tokio::test]
async fn list_tasks_rejects_bad_tokens_and_unspecified_state() -> Result<()> {
    let (_running, mut client, _) = env().await?;
    create_task(&mut client, task_spec("default", "r", "hi")).await?;
    for token in ["not a token!", "AAAA"] {
        let result = client
            .list_tasks(ListTasksRequest {
                page_token: token.to_owned(),
                ..ListTasksRequest::default()
            })
            .await;
        expect_invalid(result, "page_token").with_context(|| format!("token {token:?}"))?;
    }
    let result = client
        .list_tasks(ListTasksRequest {
            states: vec![TaskState::Unspecified as i32],
            ..ListTasksRequest::default()
        })
        .await;
    expect_invalid(result, "states[0]")?;
    let result = client
        .list_tasks(ListTasksRequest {
            states: vec![TaskState::Scheduled as i32, TaskState::Unspecified as i32],
            ..ListTasksRequest::default()
        })
        .await;
    expect_invalid(result, "states[1]")?;
    Ok(())
}

/// A page token goes on only with the filters it was made for (AIP-158): handed back with
/// another filter it is refused, naming `page_token`, rather than paging through a selection the
/// client did not ask for; the page size may change between pages.
#[tokio::test]
async fn a_page_token_is_refused_with_other_filters() -> Result<()> {
    let (_running, mut client, _) = env().await?;
    for queue in ["alpha", "alpha", "alpha", "beta", "beta"] {
        create_task(&mut client, task_spec(queue, "r", "hi")).await?;
    }
    let list = |queue: &str, page_size: i32, token: &str| ListTasksRequest {
        queue: queue.to_owned(),
        page_size,
        page_token: token.to_owned(),
        ..ListTasksRequest::default()
    };
    let first = client.list_tasks(list("alpha", 1, "")).await?.into_inner();
    ensure!(
        !first.next_page_token.is_empty(),
        "one page held every task"
    );
    let token = first.next_page_token;
    let status = expect_code(
        client.list_tasks(list("beta", 1, &token)).await,
        Code::InvalidArgument,
    )?;
    ensure!(
        violated_fields(&status)? == ["page_token"] && status.message().contains("other filters"),
        "{status:?}"
    );
    let narrower = ListTasksRequest {
        states: vec![TaskState::Scheduled as i32],
        ..list("alpha", 1, &token)
    };
    expect_invalid(client.list_tasks(narrower).await, "page_token")?;
    let rest = client
        .list_tasks(list("alpha", 10, &token))
        .await?
        .into_inner();
    assert_eq!(rest.tasks.len(), 2, "the rest of alpha, with a larger page");
    assert!(rest.tasks.iter().all(|t| t.queue == "alpha"));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 5. Id-addressed calls
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn malformed_ids_are_invalid_argument() -> Result<()> {
    let (_running, mut client, _) = env().await?;
    for bad in ["", "not-a-uuid", "12345"] {
        let context = || format!("id {bad:?}");
        expect_invalid(
            client.get_task(GetTaskRequest { id: bad.to_owned() }).await,
            "id",
        )
        .with_context(|| format!("GetTask {}", context()))?;
        expect_invalid(
            client
                .cancel_task(CancelTaskRequest { id: bad.to_owned() })
                .await,
            "id",
        )
        .with_context(|| format!("CancelTask {}", context()))?;
        expect_invalid(
            client
                .retry_task(RetryTaskRequest {
                    id: bad.to_owned(),
                    run_at: None,
                })
                .await,
            "id",
        )
        .with_context(|| format!("RetryTask {}", context()))?;
        expect_invalid(
            client
                .list_attempts(ListAttemptsRequest {
                    task_id: bad.to_owned(),
                })
                .await,
            "task_id",
        )
        .with_context(|| format!("ListAttempts {}", context()))?;
    }
    Ok(())
}

#[tokio::test]
async fn unknown_ids_are_not_found() -> Result<()> {
    let (_running, mut client, sql) = env().await?;
    // A task exists, so NOT_FOUND below is about the id, not an empty table.
    create_task(&mut client, task_spec("default", "r", "hi")).await?;
    let unknown = uuid::Uuid::now_v7().to_string();
    expect_code(
        client
            .get_task(GetTaskRequest {
                id: unknown.clone(),
            })
            .await,
        Code::NotFound,
    )
    .context("GetTask")?;
    expect_code(
        client
            .cancel_task(CancelTaskRequest {
                id: unknown.clone(),
            })
            .await,
        Code::NotFound,
    )
    .context("CancelTask")?;
    expect_code(
        client
            .retry_task(RetryTaskRequest {
                id: unknown.clone(),
                run_at: None,
            })
            .await,
        Code::NotFound,
    )
    .context("RetryTask")?;
    expect_code(
        client
            .list_attempts(ListAttemptsRequest { task_id: unknown })
            .await,
        Code::NotFound,
    )
    .context("ListAttempts")?;
    assert_eq!(row_counts(&sql).await?, (1, 0));
    Ok(())
}

#[tokio::test]
async fn cancelling_a_scheduled_task_is_not_started_and_repeatable() -> Result<()> {
    let (_running, mut client, _) = env().await?;
    let created = create_task(
        &mut client,
        task_spec("default", "r", "hi").with_delay(Duration::from_secs(3600)),
    )
    .await?;

    let first = client
        .cancel_task(CancelTaskRequest {
            id: created.id.clone(),
        })
        .await?
        .into_inner();
    assert_eq!(first.outcome(), CancelOutcome::NotStarted);
    let task = first.task.context("no task")?;
    assert_eq!(task.id, created.id);
    assert_eq!(task.state(), TaskState::Cancelled);
    assert_eq!(task.cancel_outcome(), CancelOutcome::NotStarted);
    assert!(task.finished_at.is_some(), "a cancelled task has ended");
    assert_eq!(get(&mut client, &created.id).await?, task);

    let again = client
        .cancel_task(CancelTaskRequest {
            id: created.id.clone(),
        })
        .await?
        .into_inner();
    assert_eq!(again.outcome(), CancelOutcome::NotStarted);
    assert_eq!(
        again.task.context("no task")?,
        task,
        "a repeated cancel changes nothing"
    );

    let attempts = client
        .list_attempts(ListAttemptsRequest {
            task_id: created.id.clone(),
        })
        .await?
        .into_inner();
    assert!(attempts.attempts.is_empty());
    Ok(())
}

#[tokio::test]
async fn retry_task_requires_a_failed_task() -> Result<()> {
    let (_running, mut client, _) = env().await?;
    let scheduled = create_task(
        &mut client,
        task_spec("default", "r1", "hi").with_delay(Duration::from_secs(3600)),
    )
    .await?;
    let cancelled = create_task(
        &mut client,
        task_spec("default", "r2", "hi").with_delay(Duration::from_secs(3600)),
    )
    .await?;
    client
        .cancel_task(CancelTaskRequest {
            id: cancelled.id.clone(),
        })
        .await?;
    let cancelled = get(&mut client, &cancelled.id).await?;

    for (task, state) in [
        (&scheduled, TaskState::Scheduled),
        (&cancelled, TaskState::Cancelled),
    ] {
        expect_code(
            client
                .retry_task(RetryTaskRequest {
                    id: task.id.clone(),
                    run_at: None,
                })
                .await,
            Code::FailedPrecondition,
        )
        .with_context(|| format!("RetryTask on a {} task", state.as_str_name()))?;
        assert_eq!(
            &get(&mut client, &task.id).await?,
            task,
            "a refused retry must not change the task"
        );
    }
    // A due time outside a create's bounds is bad input, checked before the task's state.
    for year in [1970, 9999] {
        let at = prost_types::Timestamp::date_time(year, 1, 1, 0, 0, 0)?;
        let status = expect_code(
            client
                .retry_task(RetryTaskRequest {
                    id: scheduled.id.clone(),
                    run_at: Some(at),
                })
                .await,
            Code::InvalidArgument,
        )?;
        assert!(status.message().contains("run_at"), "{status:?}");
    }
    Ok(())
}
