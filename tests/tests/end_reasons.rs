//! Why a task ended (#16 item 6), end to end through the real scheduler: a scripted executor
//! reports each kind of outcome, and GetTask, ListTasks' `end_reasons` filter and CountTasks'
//! split by reason tell exhausted attempts, a provider's refusal, an invalid recipient, a
//! cancellation and an expiry apart from one another.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use anyhow::{bail, ensure, Context, Result};
use herald_proto::v1::stats_service_client::StatsServiceClient;
use herald_proto::v1::task_service_client::TaskServiceClient;
use herald_proto::v1::{
    CancelTaskRequest, CountTasksRequest, EndReason, ListTasksRequest, OutcomeClass, TaskState,
};
use herald_tests::lease::{result, ScriptedExecutor};
use herald_tests::{
    connect_tasks, create_task, task_spec, wait_for_task_state, SchedulerProcess, TaskSpecExt,
    TestDb,
};
use tonic::transport::Channel;
use tonic::Code;
use tonic_types::StatusExt;

const WAIT: Duration = Duration::from_secs(30);

/// The ids of the tasks ListTasks returns for `reasons`, sorted.
async fn listed(
    tasks: &mut TaskServiceClient<Channel>,
    reasons: &[EndReason],
) -> Result<Vec<String>> {
    let mut ids: Vec<String> = tasks
        .list_tasks(ListTasksRequest {
            end_reasons: reasons.iter().map(|r| *r as i32).collect(),
            ..ListTasksRequest::default()
        })
        .await?
        .into_inner()
        .tasks
        .into_iter()
        .map(|t| t.id)
        .collect();
    ids.sort();
    Ok(ids)
}

fn sorted(ids: &[&str]) -> Vec<String> {
    let mut ids: Vec<String> = ids.iter().map(|s| (*s).to_owned()).collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn each_way_of_ending_has_its_reason_and_can_be_filtered_and_counted() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;

    // One task per reported outcome, each to its own recipient so the leases can be told apart.
    let mut ids = HashMap::new();
    for (recipient, attempts) in [
        ("sent", 3),
        ("exhausted", 1),
        ("refused", 3),
        ("invalid", 3),
    ] {
        let spec = task_spec("ends", recipient, "hello").with_max_attempts(attempts);
        ids.insert(recipient, create_task(&mut tasks, spec).await?.id);
    }
    let mut executor =
        ScriptedExecutor::connect(&scheduler.grpc_url(), "ex-1", &["ends"], 4).await?;
    let leases = executor.leases(4).await?;
    let mut results = Vec::new();
    for lease in &leases {
        let mut r = match lease.recipient.as_str() {
            "sent" => result(lease, OutcomeClass::Ok),
            "exhausted" => result(lease, OutcomeClass::Transient),
            _ => result(lease, OutcomeClass::Permanent),
        };
        r.error_code = match lease.recipient.as_str() {
            "refused" => 132_000,
            "invalid" => 131_026,
            _ => 0,
        };
        results.push(r);
    }
    let acks = executor.report(results).await?;
    ensure!(acks.iter().all(|a| a.accepted), "reports refused: {acks:?}");
    executor.close();

    // Cancelled: a task due later, cancelled before it was leased.
    let later = create_task(
        &mut tasks,
        task_spec("ends", "later", "hello").with_delay(Duration::from_secs(3600)),
    )
    .await?;
    tasks
        .cancel_task(CancelTaskRequest {
            id: later.id.clone(),
        })
        .await?;
    // Expired: nothing leases it (no executor serves its queue) before its deadline.
    let late = create_task(
        &mut tasks,
        task_spec("unserved", "late", "hello")
            .with_expire_at(SystemTime::now() + Duration::from_secs(1)),
    )
    .await?;
    wait_for_task_state(&mut tasks, &late.id, TaskState::Expired, WAIT).await?;

    let expect = [
        ("sent", TaskState::Succeeded, EndReason::Sent, 0),
        ("exhausted", TaskState::Failed, EndReason::Exhausted, 0),
        (
            "refused",
            TaskState::Failed,
            EndReason::PermanentError,
            132_000,
        ),
        (
            "invalid",
            TaskState::Failed,
            EndReason::InvalidRecipient,
            131_026,
        ),
    ];
    for (recipient, state, reason, code) in expect {
        let task = wait_for_task_state(&mut tasks, &ids[recipient], state, WAIT).await?;
        ensure!(
            (task.end_reason(), task.end_code) == (reason, code),
            "{recipient}: {:?} code {}, expected {reason:?} code {code}",
            task.end_reason(),
            task.end_code
        );
    }
    let cancelled = wait_for_task_state(&mut tasks, &later.id, TaskState::Cancelled, WAIT).await?;
    ensure!(
        cancelled.end_reason() == EndReason::Cancelled,
        "{cancelled:?}"
    );
    let expired = wait_for_task_state(&mut tasks, &late.id, TaskState::Expired, WAIT).await?;
    ensure!(expired.end_reason() == EndReason::Expired, "{expired:?}");

    // ListTasks filters on the reason: exhausted apart from a refusal, and several at once.
    ensure!(
        listed(&mut tasks, &[EndReason::Exhausted]).await? == sorted(&[ids["exhausted"].as_str()])
    );
    ensure!(
        listed(
            &mut tasks,
            &[EndReason::PermanentError, EndReason::InvalidRecipient]
        )
        .await?
            == sorted(&[ids["refused"].as_str(), ids["invalid"].as_str()])
    );
    ensure!(listed(&mut tasks, &[EndReason::Expired]).await? == sorted(&[late.id.as_str()]));
    // A number that is no reason is refused, naming the entry.
    let refused = tasks
        .list_tasks(ListTasksRequest {
            end_reasons: vec![EndReason::Sent as i32, 99],
            ..ListTasksRequest::default()
        })
        .await;
    let Err(status) = refused else {
        bail!("an unknown end reason was accepted")
    };
    ensure!(status.code() == Code::InvalidArgument, "{status:?}");
    let fields: Vec<String> = status
        .get_details_bad_request()
        .context("no field violations")?
        .field_violations
        .into_iter()
        .map(|v| v.field)
        .collect();
    ensure!(fields == ["end_reasons[1]"], "{fields:?}");

    // CountTasks splits today's ended tasks by reason.
    let mut stats = StatsServiceClient::connect(scheduler.grpc_url()).await?;
    let counts = stats
        .count_tasks(CountTasksRequest::default())
        .await?
        .into_inner();
    let by_reason: Vec<(EndReason, i64)> = counts
        .end_reasons
        .iter()
        .map(|c| (c.reason(), c.tasks))
        .collect();
    ensure!(
        by_reason
            == [
                (EndReason::Sent, 1),
                (EndReason::Exhausted, 1),
                (EndReason::PermanentError, 1),
                (EndReason::Expired, 1),
                (EndReason::Cancelled, 1),
                (EndReason::InvalidRecipient, 1),
            ],
        "{by_reason:?}"
    );
    ensure!(counts.failed == 3, "{counts:?}");
    Ok(())
}
