//! The whole path on the real binaries: a task created over gRPC is leased by a real executor,
//! sent by its webhook sender to a local receiver, and reported back; retries, failures,
//! crashes, two executors at once, claims of large tasks, cancellation and a graceful executor
//! shutdown.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use base64::Engine;
use herald_proto::v1::{
    retry_policy, task_service_client::TaskServiceClient, CancelOutcome, CancelTaskRequest,
    CreateTaskRequest, CreateTasksRequest, FixedDelays, ListAttemptsRequest, OutcomeClass,
    RetryPolicy, TaskSpec, TaskState,
};
use herald_tests::{
    connect_tasks, task_spec, unique_id, wait_for_task_state, ExecutorProcess, Gate,
    RecordedRequest, Response, SchedulerProcess, TaskSpecExt, TestDb, WebhookReceiver,
};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tonic::transport::Channel;

const WAIT: Duration = Duration::from_secs(30);
const QUEUE: &str = "hooks";
const SECRET_BYTES: &[u8] = b"an example signing key of 32 b!!";

fn secret() -> String {
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(SECRET_BYTES)
    )
}

/// Executor configuration sending queue `hooks` to `receiver`.
fn webhook_config(receiver: &WebhookReceiver, extra: &str) -> String {
    format!(
        "[queues.{QUEUE}]\nsender = \"webhook\"\nurl = \"{}/hook\"\nsecret = \"{}\"\n{extra}",
        receiver.url(),
        secret()
    )
}

async fn executor(
    scheduler: &SchedulerProcess,
    receiver: &WebhookReceiver,
    id: &str,
    extra: &str,
) -> Result<ExecutorProcess> {
    ExecutorProcess::builder(&[scheduler.grpc_url()])
        .config_toml(webhook_config(receiver, extra))
        .env("HERALD_EXECUTOR_ID", id)
        .name(id)
        .spawn()
        .await
}

async fn create(client: &mut TaskServiceClient<Channel>, spec: TaskSpec) -> Result<String> {
    Ok(client
        .create_task(CreateTaskRequest { task: Some(spec) })
        .await?
        .into_inner()
        .task
        .context("no task in the response")?
        .id)
}

fn delays(ms: u64) -> RetryPolicy {
    RetryPolicy {
        strategy: Some(retry_policy::Strategy::Delays(FixedDelays {
            delays: vec![prost_types::Duration {
                seconds: 0,
                nanos: (ms * 1_000_000) as i32,
            }],
        })),
    }
}

async fn outcomes(client: &mut TaskServiceClient<Channel>, id: &str) -> Result<Vec<OutcomeClass>> {
    Ok(client
        .list_attempts(ListAttemptsRequest {
            task_id: id.to_owned(),
        })
        .await?
        .into_inner()
        .attempts
        .iter()
        .map(|a| a.outcome())
        .collect())
}

/// Checks a Standard Webhooks signature: v1,base64(HMAC-SHA256(key, "id.timestamp.body")).
fn assert_signed(request: &RecordedRequest) {
    let id = request.header("webhook-id").expect("webhook-id");
    let timestamp = request
        .header("webhook-timestamp")
        .expect("webhook-timestamp");
    let signature = request
        .header("webhook-signature")
        .expect("webhook-signature");
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET_BYTES).expect("any key length");
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(&request.body);
    let expected = format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    );
    assert!(
        signature.split(' ').any(|s| s == expected),
        "signature {signature} does not match {expected}"
    );
}

#[tokio::test]
async fn a_task_is_delivered_to_the_webhook_and_succeeds() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let receiver = WebhookReceiver::start().await?;
    let _executor = executor(&scheduler, &receiver, "exec-1", "").await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;

    let id = create(
        &mut tasks,
        task_spec(QUEUE, "+15550001", "Your order has shipped").with_label("order", "A-17"),
    )
    .await?;
    let task = wait_for_task_state(&mut tasks, &id, TaskState::Succeeded, WAIT).await?;
    assert_eq!(task.attempts, 1);

    let requests = receiver.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.method, http::Method::POST);
    assert_eq!(request.path, "/hook");
    assert_signed(request);
    // Without a client idempotency key, the task id is the provider-facing key.
    assert_eq!(request.header("webhook-id"), Some(id.as_str()));
    assert_eq!(request.header("idempotency-key"), Some(id.as_str()));
    let body: serde_json::Value = serde_json::from_slice(&request.body)?;
    assert_eq!(body["task_id"], id.as_str());
    assert_eq!(body["recipient"], "+15550001");
    assert_eq!(body["content"]["text"], "Your order has shipped");
    assert_eq!(body["labels"]["order"], "A-17");
    assert_eq!(outcomes(&mut tasks, &id).await?, vec![OutcomeClass::Ok]);
    Ok(())
}

#[tokio::test]
async fn failed_sends_are_retried_with_backoff_until_one_succeeds() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let receiver = WebhookReceiver::start().await?;
    receiver.respond_with(vec![Response::status(503), Response::status(503)]);
    let _executor = executor(&scheduler, &receiver, "exec-1", "").await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;

    let mut spec = task_spec(QUEUE, "+1", "retry").with_idempotency_key(&unique_id("key"));
    spec.retry_policy = Some(delays(200));
    let key = spec.idempotency_key.clone();
    let id = create(&mut tasks, spec).await?;
    let task = wait_for_task_state(&mut tasks, &id, TaskState::Succeeded, WAIT).await?;
    assert_eq!(task.attempts, 3);
    assert_eq!(
        outcomes(&mut tasks, &id).await?,
        vec![
            OutcomeClass::Transient,
            OutcomeClass::Transient,
            OutcomeClass::Ok
        ]
    );
    let requests = receiver.requests();
    assert_eq!(requests.len(), 3);
    // Every attempt carries the task's idempotency key, and waited out its backoff.
    assert!(requests
        .iter()
        .all(|r| r.header("webhook-id") == Some(key.as_str())));
    for pair in requests.windows(2) {
        let gap = pair[1].received_at - pair[0].received_at;
        assert!(gap >= Duration::from_millis(200), "retried after {gap:?}");
    }
    Ok(())
}

#[tokio::test]
async fn a_permanent_error_fails_the_task_without_retrying() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let receiver = WebhookReceiver::start().await?;
    receiver.set_default(Response::status(422).body("recipient unknown"));
    let _executor = executor(&scheduler, &receiver, "exec-1", "").await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;

    let id = create(&mut tasks, task_spec(QUEUE, "+1", "nope")).await?;
    let task = wait_for_task_state(&mut tasks, &id, TaskState::Failed, WAIT).await?;
    assert_eq!(task.attempts, 1);
    assert!(task.last_error.contains("422"), "{}", task.last_error);
    assert!(
        task.last_error.contains("recipient unknown"),
        "{}",
        task.last_error
    );
    assert_eq!(
        outcomes(&mut tasks, &id).await?,
        vec![OutcomeClass::Permanent]
    );
    assert_eq!(receiver.requests().len(), 1);
    Ok(())
}

#[tokio::test]
async fn a_task_whose_stored_content_cannot_be_read_fails_at_once_and_sends_nothing() -> Result<()>
{
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let receiver = WebhookReceiver::start().await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let id = create(&mut tasks, task_spec(QUEUE, "+1", "hello")).await?;
    let sql = db.connect().await?;
    // Bytes that are no Content message (a varint that never ends).
    sql.execute(
        "UPDATE herald.tasks SET content = '\\xffffffffffffffffffffff'::bytea WHERE id::text = $1",
        &[&id],
    )
    .await?;
    let _executor = executor(&scheduler, &receiver, "exec-1", "").await?;
    // Read in SQL: GetTask cannot show content it cannot read either.
    herald_tests::until("the unreadable task to fail", || async {
        let row = sql
            .query_one(
                "SELECT state::text AS state, attempts, last_error FROM herald.tasks
                 WHERE id::text = $1",
                &[&id],
            )
            .await?;
        let state: String = row.get("state");
        if state != "failed" {
            return Ok(false);
        }
        let attempts: i32 = row.get("attempts");
        let error: Option<String> = row.get("last_error");
        anyhow::ensure!(attempts == 1, "failed after {attempts} attempts");
        anyhow::ensure!(
            error.as_deref().is_some_and(|e| e.contains("no content")),
            "{error:?}"
        );
        Ok(true)
    })
    .await?;
    assert!(receiver.requests().is_empty(), "nothing was sent");
    Ok(())
}

#[tokio::test]
async fn a_task_fails_once_its_attempts_are_used_up() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let receiver = WebhookReceiver::start().await?;
    receiver.set_default(Response::status(500));
    let _executor = executor(&scheduler, &receiver, "exec-1", "").await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;

    let mut spec = task_spec(QUEUE, "+1", "flaky").with_max_attempts(3);
    spec.retry_policy = Some(delays(50));
    let id = create(&mut tasks, spec).await?;
    let task = wait_for_task_state(&mut tasks, &id, TaskState::Failed, WAIT).await?;
    assert_eq!(task.attempts, 3);
    assert_eq!(
        outcomes(&mut tasks, &id).await?,
        vec![OutcomeClass::Transient; 3]
    );
    assert_eq!(receiver.requests().len(), 3);
    Ok(())
}

#[tokio::test]
async fn a_killed_executors_task_is_leased_again_and_sent_with_the_same_key() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::builder(&db)
        .env("HERALD_LEASE_TTL", "2s")
        .spawn()
        .await?;
    let receiver = WebhookReceiver::start().await?;
    // The first delivery hangs: the executor dies mid-send, before it can report.
    let never = Gate::new();
    receiver.respond_with(vec![Response::ok().hold_until(&never)]);
    let mut doomed = executor(&scheduler, &receiver, "doomed", "").await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let id = create(&mut tasks, task_spec(QUEUE, "+1", "survive a crash")).await?;

    receiver.wait_for_requests(1, WAIT).await?;
    doomed.kill()?;
    doomed.wait().await?;
    let _survivor = executor(&scheduler, &receiver, "survivor", "").await?;

    let task = wait_for_task_state(&mut tasks, &id, TaskState::Succeeded, WAIT).await?;
    assert_eq!(task.lease_count, 2);
    assert_eq!(
        outcomes(&mut tasks, &id).await?,
        vec![OutcomeClass::LeaseExpired, OutcomeClass::Ok]
    );
    let requests = receiver.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].header("webhook-id"), Some(id.as_str()));
    assert_eq!(requests[1].header("webhook-id"), Some(id.as_str()));
    assert_eq!(requests[1].header("herald-attempt"), Some("2"));
    never.release();
    Ok(())
}

#[tokio::test]
async fn two_executors_deliver_ten_thousand_tasks_exactly_once() -> Result<()> {
    const TOTAL: usize = 10_000;
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let receiver = WebhookReceiver::start().await?;
    let _a = executor(&scheduler, &receiver, "exec-a", "").await?;
    let _b = executor(&scheduler, &receiver, "exec-b", "").await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;

    for batch in 0..TOTAL / 1_000 {
        let specs = (0..1_000)
            .map(|i| task_spec(QUEUE, &format!("+1555{batch:02}{i:04}"), "bulk"))
            .collect();
        tasks
            .create_tasks(CreateTasksRequest {
                tasks: specs,
                ..Default::default()
            })
            .await?;
    }
    receiver
        .wait_for_requests(TOTAL, Duration::from_secs(180))
        .await?;

    let conn = db.connect().await?;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let row = conn
            .query_one(
                "SELECT count(*) FILTER (WHERE state = 'succeeded'), count(*) FROM herald.tasks",
                &[],
            )
            .await?;
        let (succeeded, total): (i64, i64) = (row.get(0), row.get(1));
        assert_eq!(total, TOTAL as i64);
        if succeeded == total {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "only {succeeded} of {total} succeeded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let deliveries = receiver.deliveries_by_webhook_id();
    assert_eq!(deliveries.len(), TOTAL, "every task delivered");
    assert!(
        deliveries.values().all(|n| *n == 1),
        "repeats: {:?}",
        deliveries
            .iter()
            .filter(|(_, n)| **n > 1)
            .take(5)
            .collect::<Vec<_>>()
    );
    assert_eq!(receiver.requests().len(), TOTAL, "no delivery twice");
    let rows = conn
        .query(
            "SELECT executor_id, count(*) FROM herald.attempts GROUP BY executor_id",
            &[],
        )
        .await?;
    let per_executor: BTreeMap<String, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(
        per_executor.values().sum::<i64>(),
        TOTAL as i64,
        "one attempt per task"
    );
    assert_eq!(
        per_executor.len(),
        2,
        "both executors worked: {per_executor:?}"
    );
    Ok(())
}

#[tokio::test]
async fn cancelling_a_scheduled_task_means_it_is_never_sent() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let receiver = WebhookReceiver::start().await?;
    let _executor = executor(&scheduler, &receiver, "exec-1", "").await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;

    let later = create(
        &mut tasks,
        task_spec(QUEUE, "+1", "cancelled").with_delay(Duration::from_millis(500)),
    )
    .await?;
    let answer = tasks
        .cancel_task(CancelTaskRequest { id: later.clone() })
        .await?
        .into_inner();
    assert_eq!(answer.outcome(), CancelOutcome::NotStarted);
    // A task created after it and due after its due time is delivered: the executor was live
    // past the cancelled task's due time, and still nothing was sent for it.
    let marker = create(
        &mut tasks,
        task_spec(QUEUE, "+2", "marker").with_delay(Duration::from_millis(700)),
    )
    .await?;
    wait_for_task_state(&mut tasks, &marker, TaskState::Succeeded, WAIT).await?;
    let requests = receiver.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].header("webhook-id"), Some(marker.as_str()));
    assert!(outcomes(&mut tasks, &later).await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn cancelling_mid_send_answers_already_sent() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let receiver = WebhookReceiver::start().await?;
    let gate = Gate::new();
    receiver.respond_with(vec![Response::ok().hold_until(&gate)]);
    let _executor = executor(&scheduler, &receiver, "exec-1", "").await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let id = create(&mut tasks, task_spec(QUEUE, "+1", "in flight")).await?;
    receiver.wait_for_requests(1, WAIT).await?;

    let mut canceller = tasks.clone();
    let cancel_id = id.clone();
    let cancel = tokio::spawn(async move {
        canceller
            .cancel_task(CancelTaskRequest { id: cancel_id })
            .await
            .map(|r| r.into_inner())
    });
    // The scheduler has marked it cancelled (so nothing revives it) before the send finishes.
    wait_for_task_state(&mut tasks, &id, TaskState::Cancelled, WAIT).await?;
    gate.release();
    let answer = cancel.await??;
    assert_eq!(answer.outcome(), CancelOutcome::AlreadySent);
    assert_eq!(outcomes(&mut tasks, &id).await?, vec![OutcomeClass::Ok]);
    Ok(())
}

#[tokio::test]
async fn cancelling_a_send_waiting_its_turn_stops_it_before_sending() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let receiver = WebhookReceiver::start().await?;
    let gate = Gate::new();
    receiver.respond_with(vec![Response::ok().hold_until(&gate)]);
    // One send at a time on this queue: the second task waits behind the held first one.
    let _executor = executor(&scheduler, &receiver, "exec-1", "concurrency = 1\n").await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let first = create(&mut tasks, task_spec(QUEUE, "+1", "first")).await?;
    receiver.wait_for_requests(1, WAIT).await?;
    let second = create(&mut tasks, task_spec(QUEUE, "+2", "second")).await?;
    wait_for_task_state(&mut tasks, &second, TaskState::Leased, WAIT).await?;

    let answer = tasks
        .cancel_task(CancelTaskRequest { id: second.clone() })
        .await?
        .into_inner();
    assert_eq!(answer.outcome(), CancelOutcome::StoppedBeforeSend);
    gate.release();
    wait_for_task_state(&mut tasks, &first, TaskState::Succeeded, WAIT).await?;
    // A third task goes through the same (now free) slot, so anything queued before it would
    // have been sent by the time it is.
    let third = create(&mut tasks, task_spec(QUEUE, "+3", "third")).await?;
    wait_for_task_state(&mut tasks, &third, TaskState::Succeeded, WAIT).await?;
    let sent: Vec<_> = receiver
        .requests()
        .iter()
        .filter_map(|r| r.header("webhook-id").map(str::to_owned))
        .collect();
    assert_eq!(sent, vec![first, third]);
    Ok(())
}

#[tokio::test]
async fn an_executor_stopped_with_sigterm_finishes_its_send_first() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let receiver = WebhookReceiver::start().await?;
    let gate = Gate::new();
    receiver.respond_with(vec![Response::ok().hold_until(&gate)]);
    let mut exec = executor(&scheduler, &receiver, "exec-1", "").await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let id = create(&mut tasks, task_spec(QUEUE, "+1", "finish me")).await?;
    receiver.wait_for_requests(1, WAIT).await?;

    exec.terminate()?;
    // Created once the executor has acted on the signal: it must not take it. (Created as soon
    // as the signal was sent, it raced the signal's handling with its lease's arrival.)
    herald_tests::until("the executor to start shutting down", || async {
        Ok(exec.stderr_all().contains("shutting down: no more credit"))
    })
    .await?;
    let after = create(&mut tasks, task_spec(QUEUE, "+2", "not for you")).await?;
    gate.release();
    let status = exec.wait().await?;
    assert!(status.success(), "exit status {status}");
    let task = wait_for_task_state(&mut tasks, &id, TaskState::Succeeded, WAIT).await?;
    assert_eq!(task.attempts, 1);
    let still = tasks
        .get_task(herald_proto::v1::GetTaskRequest { id: after })
        .await?
        .into_inner();
    assert_eq!(still.state(), TaskState::Scheduled);
    assert_eq!(receiver.requests().len(), 1);
    Ok(())
}

#[tokio::test]
async fn a_claim_of_large_tasks_reaches_the_executor_in_messages_it_accepts() -> Result<()> {
    // 300 tasks of 40 KB each: one claim's leases are about 10 MB together, more than the
    // 4 MiB a gRPC client decodes by default.
    const TOTAL: usize = 300;
    let body = "x".repeat(40_000);
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let receiver = WebhookReceiver::start().await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    for batch in 0..TOTAL / 50 {
        let specs = (0..50)
            .map(|i| task_spec(QUEUE, &format!("+1555{batch:02}{i:04}"), &body))
            .collect();
        tasks
            .create_tasks(CreateTasksRequest {
                tasks: specs,
                ..Default::default()
            })
            .await?;
    }
    let _executor = executor(&scheduler, &receiver, "exec-large", "").await?;
    receiver
        .wait_for_requests(TOTAL, Duration::from_secs(60))
        .await?;
    let deliveries = receiver.deliveries_by_webhook_id();
    assert_eq!(deliveries.len(), TOTAL, "every task delivered");
    assert!(deliveries.values().all(|n| *n == 1), "none delivered twice");
    Ok(())
}
