//! The suppression list (#16 item 2) through the real scheduler: SuppressionService's add,
//! check, list (with page tokens) and remove; a task to a listed recipient is created already
//! ended SUPPRESSED; one queued before its recipient was listed is ended by the claim instead
//! of being leased. Suppression by an opt-out reply through the executor's WhatsApp webhook is
//! in whatsapp_callbacks/replies.rs.

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use herald_proto::v1::suppression_service_client::SuppressionServiceClient;
use herald_proto::v1::{
    AddSuppressionsRequest, CancelOutcome, CheckSuppressionsRequest, EndReason,
    ListSuppressionsRequest, RemoveSuppressionRequest, SuppressionReason, TaskState,
};
use herald_tests::lease::ScriptedExecutor;
use herald_tests::{
    connect_tasks, create_task, task_spec, wait_for_task_state, SchedulerProcess, TestDb,
};
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_types::StatusExt;

const WAIT: Duration = Duration::from_secs(30);

async fn suppressions(url: &str) -> Result<SuppressionServiceClient<Channel>> {
    Ok(SuppressionServiceClient::connect(url.to_owned()).await?)
}

async fn add(
    client: &mut SuppressionServiceClient<Channel>,
    recipients: &[&str],
) -> Result<u32, Status> {
    Ok(client
        .add_suppressions(AddSuppressionsRequest {
            recipients: recipients.iter().map(|r| (*r).to_owned()).collect(),
            reason: SuppressionReason::Manual as i32,
            note: "asked by phone".into(),
        })
        .await?
        .into_inner()
        .added)
}

/// The fields an INVALID_ARGUMENT names; fails on any other answer.
fn invalid_fields<T: std::fmt::Debug>(result: Result<T, Status>) -> Result<Vec<String>> {
    let status = match result {
        Ok(answer) => bail!("expected INVALID_ARGUMENT, got {answer:?}"),
        Err(status) => status,
    };
    ensure!(status.code() == Code::InvalidArgument, "{status:?}");
    Ok(status
        .get_details_bad_request()
        .context("no field violations")?
        .field_violations
        .into_iter()
        .map(|v| v.field)
        .collect())
}

#[tokio::test]
async fn entries_are_added_checked_listed_by_page_and_removed() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut client = suppressions(&scheduler.grpc_url()).await?;

    // A leading '+' names the same entry; listing again adds nothing.
    ensure!(add(&mut client, &["+15550001", "15550002", "15550003"]).await? == 3);
    ensure!(add(&mut client, &["15550001"]).await? == 0);

    let checked = client
        .check_suppressions(CheckSuppressionsRequest {
            recipients: vec!["+15550002".into(), "15559999".into()],
        })
        .await?
        .into_inner()
        .suppressions;
    ensure!(checked.len() == 1, "{checked:?}");
    ensure!(
        (
            checked[0].recipient.as_str(),
            checked[0].reason(),
            checked[0].note.as_str()
        ) == ("15550002", SuppressionReason::Manual, "asked by phone"),
        "{checked:?}"
    );

    // Two pages of two and one, in recipient order.
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let page = client
            .list_suppressions(ListSuppressionsRequest {
                page_size: 2,
                page_token: token.clone(),
                ..ListSuppressionsRequest::default()
            })
            .await?
            .into_inner();
        pages += 1;
        seen.extend(page.suppressions.into_iter().map(|s| s.recipient));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    ensure!(pages == 2, "{pages} pages");
    ensure!(seen == ["15550001", "15550002", "15550003"], "{seen:?}");
    // Filtered by a reason no entry has: none.
    let opt_outs = client
        .list_suppressions(ListSuppressionsRequest {
            reason: SuppressionReason::OptOut as i32,
            ..ListSuppressionsRequest::default()
        })
        .await?
        .into_inner();
    ensure!(opt_outs.suppressions.is_empty(), "{opt_outs:?}");

    let removed = client
        .remove_suppression(RemoveSuppressionRequest {
            recipient: "+15550001".into(),
        })
        .await?
        .into_inner();
    ensure!(removed.recipient == "15550001", "{removed:?}");
    let again = client
        .remove_suppression(RemoveSuppressionRequest {
            recipient: "15550001".into(),
        })
        .await;
    ensure!(
        again.as_ref().err().map(Status::code) == Some(Code::NotFound),
        "{again:?}"
    );

    // Bad input names the field and lists nothing.
    ensure!(invalid_fields(add(&mut client, &[]).await)? == ["recipients"]);
    ensure!(invalid_fields(add(&mut client, &["15550009", "+"]).await)? == ["recipients[1]"]);
    let bad_reason = client
        .add_suppressions(AddSuppressionsRequest {
            recipients: vec!["15550009".into()],
            reason: 42,
            note: String::new(),
        })
        .await;
    let message = bad_reason
        .as_ref()
        .err()
        .map(|s| s.message().to_owned())
        .unwrap_or_default();
    ensure!(
        message == "reason: is not a suppression reason",
        "the message says it once: {message}"
    );
    ensure!(invalid_fields(bad_reason)? == ["reason"]);
    // PostgreSQL refuses NUL characters: caught as bad input, not a failed insert.
    ensure!(
        invalid_fields(add(&mut client, &["15550009", "1555\u{0}0010"]).await)?
            == ["recipients[1]"]
    );
    let nul_note = client
        .add_suppressions(AddSuppressionsRequest {
            recipients: vec!["15550009".into()],
            reason: SuppressionReason::Manual as i32,
            note: "a\u{0}b".into(),
        })
        .await;
    ensure!(invalid_fields(nul_note)? == ["note"]);
    let bad_token = client
        .list_suppressions(ListSuppressionsRequest {
            page_token: "not a token!".into(),
            ..ListSuppressionsRequest::default()
        })
        .await;
    ensure!(invalid_fields(bad_token)? == ["page_token"]);
    let none = client
        .check_suppressions(CheckSuppressionsRequest {
            recipients: vec!["15550009".into()],
        })
        .await?
        .into_inner();
    ensure!(none.suppressions.is_empty(), "{none:?}");
    Ok(())
}

#[tokio::test]
async fn a_task_to_a_listed_recipient_ends_suppressed_at_creation_and_after_removal_is_sent(
) -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut client = suppressions(&scheduler.grpc_url()).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    add(&mut client, &["+15550100"]).await?;

    // Created, visible, and already ended: nothing is ever leased for it.
    let task = create_task(&mut tasks, task_spec("promo", "15550100", "hi")).await?;
    ensure!(
        (task.state(), task.end_reason(), task.cancel_outcome())
            == (
                TaskState::Cancelled,
                EndReason::Suppressed,
                CancelOutcome::NotStarted
            ),
        "{task:?}"
    );
    ensure!(
        task.finished_at.is_some() && task.lease_count == 0,
        "{task:?}"
    );

    // Off the list, the next task to the recipient is sent.
    client
        .remove_suppression(RemoveSuppressionRequest {
            recipient: "15550100".into(),
        })
        .await?;
    let next = create_task(&mut tasks, task_spec("promo", "+15550100", "hi")).await?;
    ensure!(next.state() == TaskState::Scheduled, "{next:?}");
    let mut executor = ScriptedExecutor::connect(&scheduler.grpc_url(), "ex-1", &[], 1).await?;
    let leases = executor.leases(1).await?;
    ensure!(leases[0].task_id == next.id, "{leases:?}");
    Ok(())
}

#[tokio::test]
async fn a_recipient_listed_after_queueing_is_not_leased_the_claim_ends_the_task() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut client = suppressions(&scheduler.grpc_url()).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;

    // Both due now, queued while no executor is connected; then one recipient opts out.
    let queued = create_task(&mut tasks, task_spec("promo", "+15550200", "hi")).await?;
    let control = create_task(&mut tasks, task_spec("promo", "15550201", "hi")).await?;
    ensure!(queued.state() == TaskState::Scheduled, "{queued:?}");
    add(&mut client, &["15550200"]).await?;

    // The claim that leases the control task ends the other one in the same statement.
    let mut executor = ScriptedExecutor::connect(&scheduler.grpc_url(), "ex-1", &[], 2).await?;
    let leases = executor.leases(1).await?;
    ensure!(leases[0].task_id == control.id, "{leases:?}");
    let ended = wait_for_task_state(&mut tasks, &queued.id, TaskState::Cancelled, WAIT).await?;
    // Never leased (lease_count 0), and a terminal task is never leased again.
    ensure!(
        (ended.end_reason(), ended.lease_count) == (EndReason::Suppressed, 0),
        "{ended:?}"
    );
    Ok(())
}

/// A recipient listed while an executor holds a task to them (queued behind its pacing, say):
/// the claim's check came before, so the lease is revoked as CancelTask revokes one, and a
/// task not sent yet is never sent.
#[tokio::test]
async fn a_recipient_listed_while_their_task_is_leased_has_it_revoked() -> Result<()> {
    use herald_proto::v1::{scheduler_message, RevokeResult};
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut client = suppressions(&scheduler.grpc_url()).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let held = create_task(&mut tasks, task_spec("promo", "+15550300", "hi")).await?;
    let mut executor = ScriptedExecutor::connect(&scheduler.grpc_url(), "ex-1", &[], 1).await?;
    let lease = executor.leases(1).await?.remove(0);
    ensure!(lease.task_id == held.id, "{lease:?}");
    add(&mut client, &["15550300"]).await?;
    match executor.next().await? {
        scheduler_message::Kind::Revoke(r) => ensure!(
            r.lease == Some(herald_tests::lease::lease_ref(&lease)),
            "{r:?}"
        ),
        other => bail!("expected a revoke, got {other:?}"),
    }
    executor
        .revoke_ack(
            herald_tests::lease::lease_ref(&lease),
            RevokeResult::StoppedBeforeSend,
        )
        .await?;
    // CANCELLED at once; the executor's answer then says it was stopped before sending.
    herald_tests::until("the revoke's answer", || {
        let mut tasks = tasks.clone();
        let id = held.id.clone();
        async move {
            let task = tasks
                .get_task(herald_proto::v1::GetTaskRequest { id })
                .await?
                .into_inner();
            Ok(task.state() == TaskState::Cancelled
                && task.cancel_outcome() == CancelOutcome::StoppedBeforeSend)
        }
    })
    .await?;
    Ok(())
}

/// A claim that checked the list before a recipient was listed, and has locked the task but
/// not yet committed its lease, is waited for: the listing then finds the lease and revokes
/// it, where a plain read saw the task still SCHEDULED and let the send through.
#[tokio::test]
async fn a_listing_waits_for_a_claim_in_progress_and_revokes_what_it_leased() -> Result<()> {
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let client = suppressions(&scheduler.grpc_url()).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    let task = create_task(&mut tasks, task_spec("promo", "+15550400", "hi")).await?;
    // The claim, played on a connection of its own: the task locked and found not listed.
    let mut claimer = db.connect().await?;
    let claimer_pid: i32 = claimer
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get(0);
    let claim = claimer.transaction().await?;
    claim
        .execute(
            "SELECT 1 FROM herald.tasks WHERE id = $1::text::uuid FOR UPDATE",
            &[&task.id],
        )
        .await?;
    let listing = tokio::spawn({
        let mut client = client.clone();
        async move { add(&mut client, &["15550400"]).await }
    });
    let watcher = db.connect().await?;
    herald_tests::accounts::until_blocked_by(&watcher, claimer_pid, "the listing to wait").await?;
    // The claim commits its lease.
    claim
        .execute(
            "UPDATE herald.tasks SET state = 'leased', leased_at = now(),
                 lease_expires_at = now() + interval '5 minutes', lease_count = lease_count + 1,
                 executor_id = 'ex-gone'
             WHERE id = $1::text::uuid",
            &[&task.id],
        )
        .await?;
    claim.commit().await?;
    listing.await??;
    let after = tasks
        .get_task(herald_proto::v1::GetTaskRequest {
            id: task.id.clone(),
        })
        .await?
        .into_inner();
    assert_eq!(after.state(), TaskState::Cancelled, "{after:?}");
    Ok(())
}

/// AddSuppressions retried after a first call that listed the recipient but failed before it
/// revoked their leased task: the retry revokes it, though it adds nobody.
#[tokio::test]
async fn a_retried_listing_revokes_what_the_first_call_left_leased() -> Result<()> {
    use herald_proto::v1::scheduler_message;
    let db = TestDb::new().await?;
    let scheduler = SchedulerProcess::spawn(&db).await?;
    let mut client = suppressions(&scheduler.grpc_url()).await?;
    let mut tasks = connect_tasks(&scheduler.grpc_url()).await?;
    create_task(&mut tasks, task_spec("promo", "+15550500", "hi")).await?;
    let mut executor = ScriptedExecutor::connect(&scheduler.grpc_url(), "ex-1", &[], 1).await?;
    let lease = executor.leases(1).await?.remove(0);
    // The first call's insert committed; its revoke never ran.
    db.connect()
        .await?
        .execute(
            "INSERT INTO herald.suppressions (namespace, recipient, reason)
             SELECT namespace, '15550500', 'manual' FROM herald.tasks LIMIT 1",
            &[],
        )
        .await?;
    let added = add(&mut client, &["+15550500"]).await?;
    assert_eq!(added, 0);
    match executor.next().await? {
        scheduler_message::Kind::Revoke(r) => ensure!(
            r.lease == Some(herald_tests::lease::lease_ref(&lease)),
            "{r:?}"
        ),
        other => bail!("expected a revoke, got {other:?}"),
    }
    Ok(())
}
