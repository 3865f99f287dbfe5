//! The task history (migration V28) on the real scheduler binary: finished tasks and their
//! attempts leave `herald.tasks` for the partitioned history after the history delay; GetTask,
//! ListTasks, ListAttempts, the statistics and CancelTask answer for them as before; RetryTask
//! brings a failed one back and it is sent again, one by one or by a bulk operation; and partitions past the task retention are
//! dropped whole, with their tasks' delivery reports.

use anyhow::{Context, Result};
use herald_proto::v1::stats_service_client::StatsServiceClient;
use herald_proto::v1::task_service_client::TaskServiceClient;
use herald_proto::v1::{
    retry_policy, BulkAction, BulkOperation, BulkOperationState, CancelTaskRequest,
    CountTasksRequest, FixedDelays, GetBulkOperationRequest, GetTaskRequest, ListAttemptsRequest,
    ListTasksRequest, OutcomeClass, RetryPolicy, RetryTaskRequest, StartBulkOperationRequest,
    StatsWindow, Task, TaskFilter, TaskSpec, TaskState,
};
use herald_tests::lease::{result, ScriptedExecutor};
use herald_tests::{
    connect_tasks, create_task, task_spec, until, until_moved_to_history, SchedulerProcess,
    TaskSpecExt, TestDb,
};
use tonic::transport::Channel;
use tonic::Code;

/// The advisory lock key every change to the history's partitions takes
/// (scheduler/src/store/history/lock_partitions.sql).
const PARTITION_CHANGES_LOCK: i64 = 7_526_744_137_461_661_953;

type Client = TaskServiceClient<Channel>;

/// A scheduler whose retention job runs every 100 ms and moves tasks into the history as soon
/// as they end, plus `vars`; with its client and a direct database connection.
async fn env_with(
    vars: &[(&str, &str)],
) -> Result<(SchedulerProcess, TestDb, Client, tokio_postgres::Client)> {
    let db = TestDb::new().await?;
    let mut builder = SchedulerProcess::builder(&db)
        .env("HERALD_HISTORY_AFTER", "0s")
        .env("HERALD_RETENTION_INTERVAL", "100ms");
    for (key, value) in vars {
        builder = builder.env(key, value);
    }
    let scheduler = builder.spawn().await?;
    let client = connect_tasks(&scheduler.grpc_url()).await?;
    let sql = db.connect().await?;
    Ok((scheduler, db, client, sql))
}

/// How many rows of `id` are in `table`.
async fn rows(sql: &tokio_postgres::Client, table: &str, id: &str) -> Result<i64> {
    let column = if table.starts_with("herald.attempt") {
        "task_id"
    } else {
        "id"
    };
    Ok(sql
        .query_one(
            &format!("SELECT count(*) FROM {table} WHERE {column}::text = $1"),
            &[&id],
        )
        .await?
        .get(0))
}

/// Waits until the retention job has made the partition the history needs now.
async fn until_partitions_made(sql: &tokio_postgres::Client) -> Result<()> {
    until(
        "the retention job to make the history's partitions",
        || async {
            Ok(sql
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM herald.history_partitions
                                WHERE lower <= herald.now() AND upper > herald.now())",
                    &[],
                )
                .await?
                .get(0))
        },
    )
    .await
}

/// What archive_tasks.sql does to `ids`, under its lock, left uncommitted in the returned
/// transaction: a move under way.
async fn move_uncommitted<'c>(
    mover: &'c mut tokio_postgres::Client,
    ids: &[String],
) -> Result<tokio_postgres::Transaction<'c>> {
    let moving = mover.transaction().await?;
    moving
        .execute("SELECT pg_advisory_xact_lock(7526744137461661954)", &[])
        .await?;
    moving
        .execute(
            "WITH moved AS (DELETE FROM herald.tasks WHERE id::text = ANY($1) RETURNING *),
                  tasks_out AS (INSERT INTO herald.task_history SELECT * FROM moved),
                  attempts_moved AS (
                      DELETE FROM herald.attempts a USING moved m WHERE a.task_id = m.id
                      RETURNING jsonb_populate_record(
                          a, jsonb_build_object('task_finished_at', m.finished_at)) AS r)
             INSERT INTO herald.attempt_history SELECT (r).* FROM attempts_moved",
            &[&ids],
        )
        .await?;
    Ok(moving)
}

/// Waits until bulk operation `id` is DONE; returns it.
async fn until_bulk_done(client: &Client, id: &str) -> Result<BulkOperation> {
    until("the bulk operation to finish", || {
        let mut client = client.clone();
        let id = id.to_owned();
        async move {
            let op = client
                .get_bulk_operation(GetBulkOperationRequest { id })
                .await?
                .into_inner();
            Ok(op.state() == BulkOperationState::Done)
        }
    })
    .await?;
    Ok(client
        .clone()
        .get_bulk_operation(GetBulkOperationRequest { id: id.to_owned() })
        .await?
        .into_inner())
}

async fn get(client: &mut Client, id: &str) -> Result<Task> {
    Ok(client
        .get_task(GetTaskRequest { id: id.into() })
        .await?
        .into_inner())
}

/// Creates a task to `recipient`, cancels it and waits for it to move into the history;
/// returns its id and the tables of its partition pair (task_history, attempt_history).
async fn a_moved_task(
    client: &mut Client,
    sql: &tokio_postgres::Client,
    recipient: &str,
) -> Result<(String, String, String)> {
    let created = create_task(client, task_spec("default", recipient, "ended")).await?;
    client
        .cancel_task(CancelTaskRequest {
            id: created.id.clone(),
        })
        .await?;
    until_moved_to_history(sql, &created.id).await?;
    let partition: String = sql
        .query_one(
            "SELECT tableoid::regclass::text FROM herald.task_history WHERE id::text = $1",
            &[&created.id],
        )
        .await?
        .get(0);
    let attempts_partition = partition.replace("task_history_", "attempt_history_");
    Ok((created.id, partition, attempts_partition))
}

/// Runs one task to the end through a scripted executor: leased, then reported `outcome`.
async fn run_once(exec: &mut ScriptedExecutor, outcome: OutcomeClass) -> Result<String> {
    let lease = exec.leases(1).await?.remove(0);
    exec.report(vec![result(&lease, outcome)]).await?;
    Ok(lease.task_id)
}

#[tokio::test]
async fn finished_tasks_move_into_the_history_and_every_read_still_finds_them() -> Result<()> {
    let (scheduler, _db, mut client, sql) = env_with(&[]).await?;
    let sent = client
        .create_task(herald_proto::v1::CreateTaskRequest {
            task: Some(task_spec("default", "+15550001", "sent")),
        })
        .await?
        .into_inner()
        .task
        .context("no task")?;
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "history-1", &[], 1).await?;
    assert_eq!(run_once(&mut exec, OutcomeClass::Ok).await?, sent.id);
    until_moved_to_history(&sql, &sent.id).await?;
    assert_eq!(
        rows(&sql, "herald.attempts", &sent.id).await?,
        0,
        "the attempts leave with their task"
    );
    assert_eq!(rows(&sql, "herald.attempt_history", &sent.id).await?, 1);

    let task = get(&mut client, &sent.id).await?;
    assert_eq!(task.state(), TaskState::Succeeded);
    assert_eq!(task.attempts, 1);
    let listed = client
        .list_tasks(ListTasksRequest {
            states: vec![TaskState::Succeeded as i32],
            ..ListTasksRequest::default()
        })
        .await?
        .into_inner()
        .tasks;
    assert_eq!(
        listed.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
        vec![sent.id.as_str()],
        "ListTasks finds the moved task by its state"
    );
    let attempts = client
        .list_attempts(ListAttemptsRequest {
            task_id: sent.id.clone(),
        })
        .await?
        .into_inner()
        .attempts;
    assert_eq!(attempts.len(), 1, "ListAttempts reads the history too");
    assert_eq!(attempts[0].outcome(), OutcomeClass::Ok);

    let mut stats = StatsServiceClient::connect(scheduler.grpc_url()).await?;
    let counts = stats
        .count_tasks(CountTasksRequest {
            window: Some(StatsWindow {
                time_zone: "UTC".into(),
                ..StatsWindow::default()
            }),
            ..CountTasksRequest::default()
        })
        .await?
        .into_inner();
    assert_eq!(
        counts.succeeded, 1,
        "the statistics count moved tasks: {counts:?}"
    );

    let cancel = client
        .cancel_task(CancelTaskRequest {
            id: sent.id.clone(),
        })
        .await;
    let status = cancel.err().context("cancelling an ended task must fail")?;
    assert_eq!(
        status.code(),
        Code::FailedPrecondition,
        "a moved task has ended; it is not missing: {status:?}"
    );
    assert_eq!(rows(&sql, "herald.task_history", &sent.id).await?, 1);

    // A retry refused (the task SUCCEEDED) changes nothing: the task is looked for in the
    // history, but it stays there with its attempts.
    let status = client
        .retry_task(RetryTaskRequest {
            id: sent.id.clone(),
            ..RetryTaskRequest::default()
        })
        .await
        .err()
        .context("retrying a succeeded task must fail")?;
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("is succeeded"), "{status:?}");
    assert_eq!(rows(&sql, "herald.task_history", &sent.id).await?, 1);
    assert_eq!(rows(&sql, "herald.tasks", &sent.id).await?, 0);
    assert_eq!(rows(&sql, "herald.attempt_history", &sent.id).await?, 1);
    Ok(())
}

#[tokio::test]
async fn a_failed_task_in_the_history_is_retried_and_sent_again() -> Result<()> {
    let (scheduler, _db, mut client, sql) = env_with(&[]).await?;
    let created = client
        .create_task(herald_proto::v1::CreateTaskRequest {
            task: Some(task_spec("default", "+15550002", "again")),
        })
        .await?
        .into_inner()
        .task
        .context("no task")?;
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "history-2", &[], 1).await?;
    run_once(&mut exec, OutcomeClass::Permanent).await?;
    until_moved_to_history(&sql, &created.id).await?;
    assert_eq!(
        get(&mut client, &created.id).await?.state(),
        TaskState::Failed
    );

    let retried = client
        .retry_task(RetryTaskRequest {
            id: created.id.clone(),
            ..RetryTaskRequest::default()
        })
        .await?
        .into_inner();
    assert_eq!(retried.state(), TaskState::Scheduled);
    assert_eq!(rows(&sql, "herald.tasks", &created.id).await?, 1);
    assert_eq!(rows(&sql, "herald.task_history", &created.id).await?, 0);
    assert_eq!(
        rows(&sql, "herald.attempts", &created.id).await?,
        1,
        "its first attempt came back with it"
    );

    exec.credit(1).await?;
    let lease = exec.leases(1).await?.remove(0);
    assert_eq!(lease.task_id, created.id);
    assert_eq!(
        lease.attempt, 2,
        "the retry is a new attempt, fenced past the first"
    );
    exec.report(vec![result(&lease, OutcomeClass::Ok)]).await?;
    until_moved_to_history(&sql, &created.id).await?;
    let task = get(&mut client, &created.id).await?;
    assert_eq!(task.state(), TaskState::Succeeded);
    let attempts = client
        .list_attempts(ListAttemptsRequest {
            task_id: created.id.clone(),
        })
        .await?
        .into_inner()
        .attempts;
    assert_eq!(
        attempts.iter().map(|a| a.outcome()).collect::<Vec<_>>(),
        vec![OutcomeClass::Permanent, OutcomeClass::Ok]
    );
    Ok(())
}

#[tokio::test]
async fn history_partitions_past_the_retention_are_dropped_with_their_tasks() -> Result<()> {
    let (_scheduler, _db, mut client, sql) = env_with(&[
        ("HERALD_TASK_RETENTION", "3s"),
        ("HERALD_HISTORY_PARTITION", "1s"),
    ])
    .await?;
    let (id, partition, attempts_partition) = a_moved_task(&mut client, &sql, "+15550003").await?;

    // What a drop cut short leaves behind is finished by a later pass: a partition already
    // detached (here the task's attempts' one, by hand), and the record of a pair whose tables
    // are gone.
    sql.batch_execute(&format!(
        "ALTER TABLE herald.attempt_history DETACH PARTITION {attempts_partition};
         INSERT INTO herald.history_partitions (lower, upper, suffix)
         VALUES (herald.now() - interval '1 hour', herald.now() - interval '59 minutes', '1')"
    ))
    .await?;
    until(
        "the task's partitions and the stale record to be dropped",
        || async {
            Ok(sql
                .query_one(
                    "SELECT to_regclass($1) IS NULL AND to_regclass($2) IS NULL
                        AND NOT EXISTS (SELECT 1 FROM herald.history_partitions
                                        WHERE suffix = '1')",
                    &[&partition, &attempts_partition],
                )
                .await?
                .get(0))
        },
    )
    .await?;
    let status = client
        .get_task(GetTaskRequest { id })
        .await
        .err()
        .context("a task past its retention must be gone")?;
    assert_eq!(status.code(), Code::NotFound);
    Ok(())
}

/// A concurrent detach cut short between its two transactions (the scheduler killed, the
/// statement cancelled) leaves its partition "detach pending": attached in the catalog but no
/// longer routed to. Retention finishes it with `DETACH … FINALIZE` when it drops the pair.
#[tokio::test]
async fn a_detach_cut_short_is_finished_when_its_partition_is_dropped() -> Result<()> {
    let (_scheduler, db, mut client, sql) = env_with(&[
        ("HERALD_TASK_RETENTION", "1h"),
        ("HERALD_HISTORY_PARTITION", "10s"),
    ])
    .await?;
    let (_, partition, attempts_partition) = a_moved_task(&mut client, &sql, "+15550004").await?;
    // Retention's own passes stay out until the half-done detach is staged: a pass dropping a
    // pair that expired meanwhile (the oldest start-up pair expires every 10 s here) would
    // itself wait for the reader below, be cut short by its lock timeout and leave a detach
    // pending, which makes the test's own detach fail. The key is the one every partition
    // change takes (store/history/lock_partitions.sql); a pass that finds it taken skips.
    sql.execute(
        &format!("SELECT pg_advisory_lock({PARTITION_CHANGES_LOCK})"),
        &[],
    )
    .await?;
    // An older pair, which a pass reaches first in age order: its detach fails while another
    // partition of the same parent is pending, so the pending one must go before it.
    sql.execute(
        "SELECT herald.ensure_history_partitions(herald.now() - interval '30 minutes',
                    herald.now() - interval '29 minutes 55 seconds', interval '10 seconds',
                    interval '2 seconds')",
        &[],
    )
    .await?;
    let older: String = sql
        .query_one(
            "SELECT format('herald.%I', 'task_history_' || suffix) FROM herald.history_partitions
             WHERE upper <= herald.now() - interval '29 minutes' ORDER BY lower LIMIT 1",
            &[],
        )
        .await?
        .get(0);

    // A reader of the history holds the detach in its second transaction, where it is
    // cancelled: the state a crash between the two transactions leaves.
    let reader = db.connect().await?;
    reader
        .batch_execute(
            "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM herald.task_history",
        )
        .await?;
    let detacher = db.connect().await?;
    let detach =
        format!("ALTER TABLE herald.task_history DETACH PARTITION {partition} CONCURRENTLY");
    let detaching = tokio::spawn(async move { detacher.batch_execute(&detach).await });
    let pending = || async {
        Ok(sql
            .query_one(
                "SELECT coalesce(bool_or(inhdetachpending), false) FROM pg_inherits
                 WHERE inhrelid = to_regclass($1)",
                &[&partition],
            )
            .await?
            .get::<_, bool>(0))
    };
    until("the detach to wait for the reader", &pending).await?;
    sql.execute(
        "SELECT pg_cancel_backend(pid) FROM pg_stat_activity
         WHERE query LIKE 'ALTER TABLE herald.task_history DETACH%' AND pid <> pg_backend_pid()",
        &[],
    )
    .await?;
    assert!(
        detaching.await?.is_err(),
        "the detach was cancelled in its second transaction"
    );
    reader.batch_execute("COMMIT").await?;
    assert!(pending().await?, "the partition is left detach pending");
    sql.execute(
        &format!("SELECT pg_advisory_unlock({PARTITION_CHANGES_LOCK})"),
        &[],
    )
    .await?;

    // Past the retention, the next pass finishes the detach and drops the pair.
    sql.execute("SELECT herald.set_test_clock(interval '2 hours')", &[])
        .await?;
    until(
        "the half-detached pair and the older one to be dropped",
        || async {
            Ok(sql
                .query_one(
                    "SELECT to_regclass($1) IS NULL AND to_regclass($2) IS NULL
                    AND to_regclass($3) IS NULL
                    AND NOT EXISTS (SELECT 1 FROM herald.history_partitions
                                    WHERE format('herald.%I', 'task_history_' || suffix)
                                          IN ($1, $3))",
                    &[&partition, &attempts_partition, &older],
                )
                .await?
                .get(0))
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_bulk_retry_selects_and_re_drives_failed_tasks_in_the_history() -> Result<()> {
    // Batches of 7: the selection pages across the history by its cursor.
    let (scheduler, _db, mut client, sql) = env_with(&[("HERALD_BULK_BATCH_SIZE", "7")]).await?;
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "history-4", &[], 20).await?;
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(
            create_task(
                &mut client,
                task_spec("default", &format!("+1555010{i:02}"), "bulk").with_max_attempts(1),
            )
            .await?
            .id,
        );
    }
    let leases = exec.leases(20).await?;
    exec.report_each(&leases, OutcomeClass::Permanent).await?;
    for id in &ids {
        until_moved_to_history(&sql, id).await?;
    }

    let retry = |dry_run| StartBulkOperationRequest {
        action: BulkAction::Retry as i32,
        filter: Some(TaskFilter {
            queue: "default".into(),
            states: vec![TaskState::Failed as i32],
            ..TaskFilter::default()
        }),
        dry_run,
        reschedule: None,
    };
    let dry = client.start_bulk_operation(retry(true)).await?.into_inner();
    assert_eq!(dry.matched, 20, "the dry run counts the history's tasks");
    let op = client
        .start_bulk_operation(retry(false))
        .await?
        .into_inner()
        .operation
        .context("no operation")?;
    let done = until_bulk_done(&client, &op.id).await?;
    assert_eq!(done.changed, 20);
    exec.credit(20).await?;
    let again = exec.leases(20).await?;
    assert!(
        again.iter().all(|l| l.attempt == 2),
        "each was re-driven once, fenced past its first attempt"
    );
    Ok(())
}

#[tokio::test]
async fn a_retry_that_meets_its_task_mid_move_waits_for_the_move_and_finds_it() -> Result<()> {
    // The job never moves anything here: the move is made by hand, held open.
    let (scheduler, db, mut client, sql) = env_with(&[("HERALD_HISTORY_AFTER", "1h")]).await?;
    let created = create_task(
        &mut client,
        task_spec("default", "+15550005", "mid-move").with_max_attempts(1),
    )
    .await?;
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "history-5", &[], 1).await?;
    run_once(&mut exec, OutcomeClass::Permanent).await?;

    until_partitions_made(&sql).await?;
    let mut mover = db.connect().await?;
    let moving = move_uncommitted(&mut mover, std::slice::from_ref(&created.id)).await?;

    let mut retrier = client.clone();
    let id = created.id.clone();
    let retry = tokio::spawn(async move {
        retrier
            .retry_task(RetryTaskRequest {
                id,
                ..RetryTaskRequest::default()
            })
            .await
    });
    until("the retry to wait for the move's row lock", || async {
        Ok(sql
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted)",
                &[],
            )
            .await?
            .get(0))
    })
    .await?;
    moving.commit().await?;

    let retried = retry.await??.into_inner();
    assert_eq!(
        retried.state(),
        TaskState::Scheduled,
        "the retry found the task in the history once the move committed"
    );
    assert_eq!(rows(&sql, "herald.tasks", &created.id).await?, 1);
    assert_eq!(rows(&sql, "herald.task_history", &created.id).await?, 0);
    Ok(())
}

#[tokio::test]
async fn a_partition_width_that_does_not_fit_the_retention_stops_the_scheduler() -> Result<()> {
    let db = TestDb::new().await?;
    for (width, says) in [
        ("500ms", "at least 1s"),
        ("1m", "10080 partitions"),
        ("86s 400ms", "whole number of seconds"),
    ] {
        let refused = SchedulerProcess::builder(&db)
            .env("HERALD_HISTORY_PARTITION", width)
            .spawn()
            .await;
        let message = match refused {
            Ok(_) => anyhow::bail!("HERALD_HISTORY_PARTITION={width} was accepted"),
            Err(e) => format!("{e:#}"),
        };
        assert!(
            message.contains("HERALD_HISTORY_PARTITION") && message.contains(says),
            "{width}: {message}"
        );
    }
    let tables: i64 = db
        .connect()
        .await?
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'herald'",
            &[],
        )
        .await?
        .get(0);
    assert_eq!(tables, 0, "refused before touching the database");
    Ok(())
}

/// A moved task's idempotency key is kept at least as long as the task can still be read: its
/// partition is dropped only once all of it is past the task retention, so the key is kept
/// until then. Kept only the retention from the task's end, it went up to a partition's width
/// before the task, and a create with it made a second task while the first was still listed.
#[tokio::test]
async fn a_moved_tasks_key_outlives_the_partition_that_holds_the_task() -> Result<()> {
    let (_scheduler, _db, mut client, sql) = env_with(&[]).await?;
    let created = create_task(
        &mut client,
        task_spec("default", "+15550123", "keyed").with_idempotency_key("k-moved"),
    )
    .await?;
    client
        .cancel_task(CancelTaskRequest {
            id: created.id.clone(),
        })
        .await?;
    until_moved_to_history(&sql, &created.id).await?;
    let row = sql
        .query_one(
            "SELECT k.forget_after >= p.upper + interval '7 days' AS kept,
                    k.forget_after::text AS forget_after, p.upper::text AS upper
             FROM herald.idempotency_keys k
             JOIN herald.task_history h ON h.id = k.task_id
             JOIN herald.history_partitions p
               ON p.lower <= h.finished_at AND p.upper > h.finished_at
             WHERE k.key = 'k-moved'",
            &[],
        )
        .await?;
    let (forget_after, upper): (String, String) = (row.get("forget_after"), row.get("upper"));
    assert!(
        row.get::<_, bool>("kept"),
        "the key goes at {forget_after}, before its partition (up to {upper}) is past retention"
    );
    Ok(())
}

/// A bulk retry chosen while the retention job is moving its tasks into the history (deleted
/// from the hot table, not yet committed there) waits for the move and retries them from the
/// history. It skipped them before: the cursor passed them, and with nothing else selected
/// the operation ended DONE having retried none.
#[tokio::test]
async fn a_bulk_retry_that_meets_its_tasks_mid_move_waits_and_retries_them() -> Result<()> {
    const N: usize = 3;
    let (scheduler, db, mut client, sql) = env_with(&[("HERALD_HISTORY_AFTER", "1h")]).await?;
    let mut exec =
        ScriptedExecutor::connect(&scheduler.grpc_url(), "history-6", &[], N as u32).await?;
    let mut ids = Vec::new();
    for i in 0..N {
        ids.push(
            create_task(
                &mut client,
                task_spec("default", &format!("+155502{i:02}"), "bulk").with_max_attempts(1),
            )
            .await?
            .id,
        );
    }
    let leases = exec.leases(N).await?;
    exec.report_each(&leases, OutcomeClass::Permanent).await?;
    until_partitions_made(&sql).await?;
    let mut mover = db.connect().await?;
    let moving = move_uncommitted(&mut mover, &ids).await?;

    let op = client
        .start_bulk_operation(StartBulkOperationRequest {
            action: BulkAction::Retry as i32,
            filter: Some(TaskFilter {
                queue: "default".into(),
                states: vec![TaskState::Failed as i32],
                ..TaskFilter::default()
            }),
            dry_run: false,
            reschedule: None,
        })
        .await?
        .into_inner()
        .operation
        .context("no operation")?;
    until("the bulk batch to wait for the move", || async {
        Ok(sql
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted)",
                &[],
            )
            .await?
            .get(0))
    })
    .await?;
    moving.commit().await?;
    let done = until_bulk_done(&client, &op.id).await?;
    assert_eq!(done.changed, N as i64, "{done:?}");
    Ok(())
}

/// A status saying an earlier attempt's message failed, arriving while the retention job moves
/// the task into the history: the message is still pinned to that attempt (the batch waits for
/// the move and brings the task back first), so its failure is not taken for the current
/// send's. Pinned to nothing, it was: the task, delivered by its second attempt, was sent again
/// or ended FAILED.
#[tokio::test]
async fn an_earlier_messages_failure_during_a_move_is_still_that_messages() -> Result<()> {
    use herald_proto::v1::{
        provider_event, DeliveryState, DeliveryStatusEvent, ProviderEvent,
        RecordProviderEventsRequest,
    };
    let (scheduler, db, mut client, sql) = env_with(&[("HERALD_HISTORY_AFTER", "1h")]).await?;
    let created = create_task(
        &mut client,
        TaskSpec {
            retry_policy: Some(RetryPolicy {
                strategy: Some(retry_policy::Strategy::Delays(FixedDelays {
                    delays: vec![prost_types::Duration::default()],
                })),
            }),
            ..task_spec("default", "+15550301", "twice").with_max_attempts(3)
        },
    )
    .await?;
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "history-7", &[], 1).await?;
    // The first attempt's answer was lost (no message id); the second was sent as wamid-2.
    let first = exec.leases(1).await?.remove(0);
    exec.report(vec![result(&first, OutcomeClass::Transient)])
        .await?;
    exec.credit(1).await?;
    let second = exec.leases(1).await?.remove(0);
    let mut sent = result(&second, OutcomeClass::Ok);
    sent.provider_message_id = "wamid-2".into();
    exec.report(vec![sent]).await?;
    until_partitions_made(&sql).await?;
    let mut mover = db.connect().await?;
    let moving = move_uncommitted(&mut mover, std::slice::from_ref(&created.id)).await?;
    // Meta says the first attempt's message (wamid-1) failed.
    let mut lease_client = herald_tests::connect_lease(&scheduler.grpc_url()).await?;
    let task_id = created.id.clone();
    let webhook = tokio::spawn(async move {
        lease_client
            .record_provider_events(RecordProviderEventsRequest {
                events: vec![ProviderEvent {
                    kind: Some(provider_event::Kind::Delivery(DeliveryStatusEvent {
                        provider_message_id: "wamid-1".into(),
                        state: DeliveryState::FailedAfterAcceptance as i32,
                        task_id,
                        attempt: 1,
                        error_code: 131_000,
                        error: "something went wrong".into(),
                        ..Default::default()
                    })),
                }],
            })
            .await
    });
    until("the webhook batch to wait for the move", || async {
        Ok(sql
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted)",
                &[],
            )
            .await?
            .get(0))
    })
    .await?;
    moving.commit().await?;
    webhook.await??;
    let task = get(&mut client, &created.id).await?;
    assert_eq!(
        task.state(),
        TaskState::Succeeded,
        "the first message's failure was taken for the second's: {task:?}"
    );
    Ok(())
}

/// An executor cut off past its task's last lease reports OK once the sweeper has ended the
/// task FAILED and the retention job has moved it into the history: the task comes back and
/// ends SUCCEEDED. Refused, it stayed FAILED, and a retry sent the message a second time.
#[tokio::test]
async fn a_late_ok_for_a_task_moved_into_the_history_settles_it() -> Result<()> {
    let (scheduler, _db, mut client, sql) = env_with(&[("HERALD_LEASE_TTL", "2s")]).await?;
    let created = create_task(
        &mut client,
        task_spec("default", "+15550401", "late").with_max_attempts(1),
    )
    .await?;
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "history-8", &[], 1).await?;
    let lease = exec.leases(1).await?.remove(0);
    until_moved_to_history(&sql, &created.id).await?;
    assert_eq!(
        get(&mut client, &created.id).await?.state(),
        TaskState::Failed
    );
    exec.report(vec![result(&lease, OutcomeClass::Ok)]).await?;
    let task = get(&mut client, &created.id).await?;
    assert_eq!(task.state(), TaskState::Succeeded, "{task:?}");
    Ok(())
}

/// A task cancelled while leased stays in the hot table until its executor reports, and the
/// report says the message went: moved first, the report was dropped and the cancel stayed
/// unconfirmed for ever.
#[tokio::test]
async fn a_task_cancelled_while_leased_waits_for_its_report_before_it_moves() -> Result<()> {
    use herald_proto::v1::CancelOutcome;
    let (scheduler, _db, mut client, sql) = env_with(&[]).await?;
    let leased = create_task(&mut client, task_spec("default", "+15550501", "held")).await?;
    let mut exec = ScriptedExecutor::connect(&scheduler.grpc_url(), "history-9", &[], 1).await?;
    let lease = exec.leases(1).await?.remove(0);
    assert_eq!(lease.task_id, leased.id);
    // Cancelled while its send is under way: the executor says so, and reports later.
    let cancel = {
        let mut client = client.clone();
        let id = leased.id.clone();
        tokio::spawn(async move { client.cancel_task(CancelTaskRequest { id }).await })
    };
    match exec.next().await? {
        herald_proto::v1::scheduler_message::Kind::Revoke(revoke) => {
            exec.revoke_ack(
                revoke.lease.context("a revoke names its lease")?,
                herald_proto::v1::RevokeResult::SendInProgress,
            )
            .await?;
        }
        other => anyhow::bail!("expected the revoke, got {other:?}"),
    }
    cancel.await??;
    // A task that ended after it moves: the pass that moved it walked past the first.
    let later = create_task(&mut client, task_spec("default", "+15550502", "later")).await?;
    client
        .cancel_task(CancelTaskRequest {
            id: later.id.clone(),
        })
        .await?;
    until_moved_to_history(&sql, &later.id).await?;
    assert_eq!(
        rows(&sql, "herald.tasks", &leased.id).await?,
        1,
        "moved before its executor reported"
    );
    exec.report(vec![result(&lease, OutcomeClass::Ok)]).await?;
    let task = get(&mut client, &leased.id).await?;
    assert_eq!(
        task.cancel_outcome(),
        CancelOutcome::AlreadySent,
        "{task:?}"
    );
    until_moved_to_history(&sql, &leased.id).await?;
    assert_eq!(rows(&sql, "herald.attempts", &leased.id).await?, 0);
    Ok(())
}
