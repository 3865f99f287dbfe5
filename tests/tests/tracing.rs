//! Traces on the real binaries: with OTEL_EXPORTER_OTLP_ENDPOINT pointing at the harness's OTLP
//! receiver, one task yields one trace across CreateTask (continuing the caller's
//! `traceparent`), the scheduler's lease grant and the executor's send, with the parent links
//! CreateTask ← lease.grant and CreateTask ← send; a schedule run's tasks join the trace of a
//! `schedule.run` span the same way.

use std::time::Duration;

use anyhow::Result;
use herald_proto::v1::schedule_service_client::ScheduleServiceClient;
use herald_proto::v1::{
    content, Content, CreateScheduleRequest, CreateTaskRequest, RunScheduleNowRequest,
    ScheduleSpec, TaskState,
};
use herald_tests::otlp::{OtlpReceiver, RecordedSpan};
use herald_tests::{
    connect_tasks, task_spec, unique_id, wait_for_task_state, ExecutorProcess, SchedulerProcess,
    TestDb,
};

const WAIT: Duration = Duration::from_secs(30);
/// The caller's trace: its id and the client span CreateTask continues.
const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// A scheduler and an executor exporting their spans to `otlp`.
async fn traced_stack(
    otlp: &OtlpReceiver,
    db: &TestDb,
) -> Result<(SchedulerProcess, ExecutorProcess)> {
    let scheduler = SchedulerProcess::builder(db)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.url())
        // Export every 100 ms so the test waits for spans, not for the default 5 s batch.
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .spawn()
        .await?;
    let executor = ExecutorProcess::builder(&[scheduler.grpc_url()])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.url())
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .spawn()
        .await?;
    Ok((scheduler, executor))
}

#[tokio::test]
async fn one_trace_runs_from_create_task_through_the_lease_to_the_send() -> Result<()> {
    let otlp = OtlpReceiver::start().await?;
    let db = TestDb::new().await?;
    let (scheduler, _executor) = traced_stack(&otlp, &db).await?;

    let mut client = connect_tasks(&scheduler.grpc_url()).await?;
    let mut request = tonic::Request::new(CreateTaskRequest {
        task: Some(task_spec("traced", &unique_id("someone"), "hello")),
    });
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01").parse()?,
    );
    let task = client
        .create_task(request)
        .await?
        .into_inner()
        .task
        .ok_or_else(|| anyhow::anyhow!("no task in the response"))?;
    wait_for_task_state(&mut client, &task.id, TaskState::Succeeded, WAIT).await?;

    let named = |spans: &[RecordedSpan], service: &str, name: &str| {
        spans
            .iter()
            .find(|s| {
                s.service == service
                    && s.name == name
                    && s.attribute("task_id") == Some(task.id.as_str())
            })
            .cloned()
    };
    let spans = otlp
        .wait_for(WAIT, |spans| {
            named(spans, "herald-scheduler", "CreateTask").is_some()
                && named(spans, "herald-scheduler", "lease.grant").is_some()
                && named(spans, "herald-executor", "send").is_some()
        })
        .await?;
    let create = named(&spans, "herald-scheduler", "CreateTask").unwrap();
    let grant = named(&spans, "herald-scheduler", "lease.grant").unwrap();
    let send = named(&spans, "herald-executor", "send").unwrap();

    // One trace, the caller's.
    assert_eq!(create.trace_id, CALLER_TRACE);
    assert_eq!(grant.trace_id, CALLER_TRACE);
    assert_eq!(send.trace_id, CALLER_TRACE);
    // Parent links: caller ← CreateTask ← lease.grant, CreateTask ← send.
    assert_eq!(create.parent_span_id, CALLER_SPAN);
    assert_eq!(grant.parent_span_id, create.span_id);
    assert_eq!(send.parent_span_id, create.span_id);
    // Spans carry the task's fields.
    assert_eq!(grant.attribute("attempt"), Some("1"));
    assert_eq!(send.attribute("attempt"), Some("1"));
    assert_eq!(send.attribute("queue"), Some("traced"));
    Ok(())
}

/// Also with the logs quieted (`RUST_LOG=warn`): the log filter is the logs' alone, and the
/// spans still go out.
#[tokio::test]
async fn create_task_without_a_caller_trace_starts_a_root_span() -> Result<()> {
    let otlp = OtlpReceiver::start().await?;
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::builder(&db)
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.url())
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("RUST_LOG", "warn")
        .spawn()
        .await?;
    let mut client = connect_tasks(&scheduler.grpc_url()).await?;
    let task = herald_tests::create_task(
        &mut client,
        task_spec("traced", &unique_id("someone"), "hello"),
    )
    .await?;
    let spans = otlp
        .wait_for(WAIT, |spans| {
            spans
                .iter()
                .any(|s| s.name == "CreateTask" && s.attribute("task_id") == Some(task.id.as_str()))
        })
        .await?;
    let create = spans
        .iter()
        .find(|s| s.name == "CreateTask")
        .ok_or_else(|| anyhow::anyhow!("no CreateTask span"))?;
    assert!(create.parent_span_id.is_empty(), "a root span: {create:?}");
    // The stored traceparent names the CreateTask span.
    let conn = db.connect().await?;
    let row = conn
        .query_one(
            "SELECT trace_parent FROM herald.tasks WHERE id = $1::text::uuid",
            &[&task.id],
        )
        .await?;
    let stored: Option<String> = row.get(0);
    assert_eq!(
        stored,
        Some(format!("00-{}-{}-01", create.trace_id, create.span_id))
    );
    Ok(())
}

/// Tasks no request made (a schedule's run, a campaign's page) start their own trace: the
/// run's `schedule.run` span is the parent of their lease grants and sends.
#[tokio::test]
async fn a_schedule_runs_tasks_are_traced_from_the_run_through_the_send() -> Result<()> {
    let otlp = OtlpReceiver::start().await?;
    let db = TestDb::new().await?;
    let (scheduler, _executor) = traced_stack(&otlp, &db).await?;
    let mut schedules = ScheduleServiceClient::connect(scheduler.grpc_url()).await?;
    schedules
        .create_schedule(CreateScheduleRequest {
            schedule: Some(ScheduleSpec {
                id: "report".into(),
                cron: "0 9 * * *".into(),
                queue: "traced".into(),
                recipients: vec!["ann".into()],
                content: Some(Content {
                    body: Some(content::Body::Text("daily report".into())),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .await?;
    schedules
        .run_schedule_now(RunScheduleNowRequest {
            id: "report".into(),
        })
        .await?;
    let sql = db.connect().await?;
    let id: String = sql
        .query_one(
            "SELECT id::text FROM herald.tasks WHERE schedule_id = 'report'",
            &[],
        )
        .await?
        .get(0);
    let mut client = connect_tasks(&scheduler.grpc_url()).await?;
    wait_for_task_state(&mut client, &id, TaskState::Succeeded, WAIT).await?;

    let of_task = |spans: &[RecordedSpan], service: &str, name: &str| {
        spans
            .iter()
            .find(|s| {
                s.service == service
                    && s.name == name
                    && s.attribute("task_id") == Some(id.as_str())
            })
            .cloned()
    };
    let run_span = |spans: &[RecordedSpan]| {
        spans
            .iter()
            .find(|s| s.name == "schedule.run" && s.attribute("schedule_id") == Some("report"))
            .cloned()
    };
    let spans = otlp
        .wait_for(WAIT, |spans| {
            run_span(spans).is_some()
                && of_task(spans, "herald-scheduler", "lease.grant").is_some()
                && of_task(spans, "herald-executor", "send").is_some()
        })
        .await?;
    let run = run_span(&spans).ok_or_else(|| anyhow::anyhow!("no schedule.run span"))?;
    let grant = of_task(&spans, "herald-scheduler", "lease.grant")
        .ok_or_else(|| anyhow::anyhow!("no lease.grant span"))?;
    let send = of_task(&spans, "herald-executor", "send")
        .ok_or_else(|| anyhow::anyhow!("no send span"))?;
    assert!(run.parent_span_id.is_empty(), "a root span: {run:?}");
    assert_eq!(grant.trace_id, run.trace_id);
    assert_eq!(send.trace_id, run.trace_id);
    assert_eq!(grant.parent_span_id, run.span_id);
    assert_eq!(send.parent_span_id, run.span_id);
    Ok(())
}
