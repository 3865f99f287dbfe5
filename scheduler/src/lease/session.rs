//! One executor's lease stream: the Hello/Welcome handshake, then a dispatcher granting leases
//! within the executor's credit while this task applies its reports, extensions and revoke
//! answers. A `Status` ends the whole stream; problems with one lease travel in-band.

use std::sync::Arc;
use std::time::Duration;

use herald_proto::v1::{
    self as pb, executor_message, scheduler_message, ExecutorMessage, SchedulerMessage,
};
use tokio::sync::{broadcast, mpsc, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Status, Streaming};
use uuid::Uuid;

use super::dispatch::Dispatcher;
use super::events::Event;
use super::registry::{Outbound, Registry};
use super::LeaseSettings;
use crate::api::convert;
use crate::api::validate::queue_name_problem;
use crate::db_watch::DatabaseReachable;
use crate::model::{AttemptReport, GrantedLease, Outcome, TaskState};
use crate::store::Store;

/// The most credit an executor may hold at once.
const MAX_CREDIT: usize = 100_000;
/// How long an executor has to send Hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest error text kept per attempt.
const MAX_ERROR_BYTES: usize = 4096;
/// Longest retry-after honoured from a report (a retry policy's own delays are capped alike).
pub const MAX_RETRY_AFTER_MS: i64 = 7 * 24 * 3_600_000;

/// What every session of a replica shares.
#[derive(Clone)]
pub struct SessionContext {
    /// Database access.
    pub store: Store,
    /// Replica settings.
    pub settings: Arc<LeaseSettings>,
    /// Cluster events.
    pub events: broadcast::Sender<Event>,
    /// Executors connected here.
    pub registry: Registry,
    /// Cancelled when the replica drains: sessions stop granting and send `Drain`.
    pub drain: CancellationToken,
    /// Whether this replica reaches the database: without it a session could lease nothing.
    pub database: DatabaseReachable,
}

/// Performs the handshake and starts the session; the returned stream carries the scheduler's
/// frames.
pub async fn open(
    ctx: SessionContext,
    namespace: String,
    mut inbound: Streaming<ExecutorMessage>,
) -> Result<ReceiverStream<Result<SchedulerMessage, Status>>, Status> {
    if ctx.drain.is_cancelled() {
        return Err(Status::unavailable("scheduler is shutting down"));
    }
    // Refused rather than held open: the executor tries its other endpoints at once.
    if !ctx.database.is_up() {
        return Err(Status::unavailable(
            "this scheduler cannot reach its database; try another replica",
        ));
    }
    let first = tokio::time::timeout(HELLO_TIMEOUT, inbound.message())
        .await
        .map_err(|_| Status::deadline_exceeded("no Hello within 10s"))??;
    let hello = match first.and_then(|m| m.kind) {
        Some(executor_message::Kind::Hello(h)) => h,
        _ => return Err(Status::invalid_argument("the first frame must be Hello")),
    };
    validate_hello(&hello)?;
    let version = hello
        .protocol_version
        .min(herald_proto::LEASE_PROTOCOL_VERSION);

    let (tx, rx) = mpsc::channel(256);
    let welcome = SchedulerMessage {
        kind: Some(scheduler_message::Kind::Welcome(pb::Welcome {
            protocol_version: version,
            heartbeat_interval: Some(duration(ctx.settings.heartbeat_interval)),
            lease_ttl: Some(duration(ctx.settings.lease_ttl)),
            scheduler_id: ctx.settings.scheduler_id.clone(),
        })),
    };
    tx.send(Ok(welcome))
        .await
        .map_err(|_| Status::cancelled("executor went away"))?;
    tokio::spawn(run(ctx, namespace, hello, inbound, tx));
    Ok(ReceiverStream::new(rx))
}

/// Checks an executor's Hello; the status says which field is wrong.
pub fn validate_hello(hello: &pb::Hello) -> Result<(), Status> {
    // No control characters: the id is stored with every lease (and PostgreSQL refuses NUL).
    if hello.executor_id.is_empty()
        || hello.executor_id.chars().count() > 128
        || hello.executor_id.chars().any(char::is_control)
    {
        return Err(Status::invalid_argument(
            "hello.executor_id: must be 1 to 128 printable characters",
        ));
    }
    if hello.protocol_version == 0 {
        return Err(Status::failed_precondition(
            "hello.protocol_version: 0 is not a protocol version; this scheduler speaks 1",
        ));
    }
    if hello.initial_credit as usize > MAX_CREDIT {
        return Err(Status::invalid_argument(
            "hello.initial_credit: at most 100000",
        ));
    }
    for (i, q) in hello.queues.iter().enumerate() {
        if let Some(problem) = queue_name_problem(q) {
            return Err(Status::invalid_argument(format!(
                "hello.queues[{i}]: {problem}"
            )));
        }
    }
    for (i, c) in hello.credentials_refs.iter().enumerate() {
        if c.is_empty() || c.len() > 128 || c.chars().any(char::is_control) {
            return Err(Status::invalid_argument(format!(
                "hello.credentials_refs[{i}]: must be 1 to 128 printable characters"
            )));
        }
    }
    Ok(())
}

async fn run(
    ctx: SessionContext,
    namespace: String,
    hello: pb::Hello,
    mut inbound: Streaming<ExecutorMessage>,
    tx: Outbound,
) {
    let executor_id = hello.executor_id.clone();
    // Executor ids are unique per namespace only; revokes are addressed the same way.
    let registry_key = format!("{namespace}/{executor_id}");
    let generation = ctx.registry.insert(&registry_key, tx.clone());
    let credit = Arc::new(Semaphore::new(hello.initial_credit as usize));
    let stop = CancellationToken::new();
    tracing::info!(executor_id = %executor_id, namespace = %namespace, queues = ?hello.queues, credit = hello.initial_credit, "executor connected");

    let dispatcher = Dispatcher {
        store: ctx.store.clone(),
        namespace: namespace.clone(),
        settings: ctx.settings.clone(),
        executor_id: executor_id.clone(),
        queues: (!hello.queues.is_empty()).then(|| hello.queues.clone()),
        credentials: (!hello.credentials_refs.is_empty()).then(|| hello.credentials_refs.clone()),
        credit: credit.clone(),
        events: ctx.events.subscribe(),
        stop: stop.clone(),
    };
    let deliver_tx = tx.clone();
    let deliver_store = ctx.store.clone();
    let deliver_executor = executor_id.clone();
    let deliver_namespace = namespace.clone();
    let dispatch = tokio::spawn(dispatcher.run(move |leases| {
        let tx = deliver_tx.clone();
        let store = deliver_store.clone();
        let namespace = deliver_namespace.clone();
        crate::telemetry::metrics::leases_granted(&leases);
        crate::telemetry::lease_grant_spans(&leases, &deliver_executor);
        async move { deliver(&store, &namespace, &tx, leases).await }
    }));

    // Frames that touch the database are handled in order on their own task, so a Credit
    // frame never waits behind a report statement: the dispatcher can claim the next batch
    // while the last one's results are being written.
    let (frames_tx, frames_rx) = mpsc::channel::<executor_message::Kind>(64);
    let handler_failed = CancellationToken::new();
    let handler = tokio::spawn(handle_frames(
        ctx.clone(),
        namespace.clone(),
        executor_id.clone(),
        tx.clone(),
        frames_rx,
        handler_failed.clone(),
    ));

    let mut drained = false;
    let mut end_status = None;
    loop {
        let frame = tokio::select! {
            _ = ctx.drain.cancelled(), if !drained => {
                drained = true;
                stop.cancel();
                let _ = tx.send(Ok(SchedulerMessage {
                    kind: Some(scheduler_message::Kind::Drain(pb::Drain {
                        reason: "scheduler shutting down".into(),
                    })),
                })).await;
                continue;
            }
            _ = handler_failed.cancelled() => break,
            frame = inbound.message() => frame,
        };
        let message = match frame {
            Ok(Some(m)) => m,
            Ok(None) => break,
            Err(status) => {
                tracing::debug!(executor_id = %executor_id, %status, "lease stream ended");
                break;
            }
        };
        let result = match message.kind {
            Some(executor_message::Kind::Credit(c)) => {
                let room = MAX_CREDIT.saturating_sub(credit.available_permits());
                credit.add_permits((c.additional as usize).min(room));
                Ok(())
            }
            Some(executor_message::Kind::Hello(_)) => Err(Status::invalid_argument(
                "Hello may only be the first frame",
            )),
            None => Err(Status::invalid_argument("empty frame")),
            Some(other) => {
                if frames_tx.send(other).await.is_err() {
                    // The handler stopped on an error it has already sent.
                    break;
                }
                Ok(())
            }
        };
        if let Err(status) = result {
            tracing::warn!(executor_id = %executor_id, %status, "ending lease stream");
            end_status = Some(status);
            break;
        }
    }
    // Frames received before the end are still applied and acknowledged, and only then does the
    // stream end with its status: an ack must never be lost behind it.
    drop(frames_tx);
    let _ = handler.await;
    if let Some(status) = end_status {
        let _ = tx.send(Err(status)).await;
    }
    stop.cancel();
    let _ = dispatch.await;
    ctx.registry.remove(&registry_key, generation);
    tracing::info!(executor_id = %executor_id, "executor disconnected");
}

/// Handles the executor's frames other than Credit, in the order they arrived; on an error,
/// sends it as the stream's status and tells the reader to stop.
async fn handle_frames(
    ctx: SessionContext,
    namespace: String,
    executor_id: String,
    tx: Outbound,
    mut frames: mpsc::Receiver<executor_message::Kind>,
    failed: CancellationToken,
) {
    while let Some(kind) = frames.recv().await {
        let result = match kind {
            executor_message::Kind::Report(batch) => {
                handle_reports(&ctx, &namespace, &tx, &executor_id, batch).await
            }
            executor_message::Kind::Extend(extend) => {
                handle_extend(&ctx, &namespace, &tx, extend).await
            }
            executor_message::Kind::RevokeAck(ack) => {
                handle_revoke_ack(&ctx, &namespace, ack).await
            }
            executor_message::Kind::Release(release) => {
                handle_release(&ctx, &namespace, release).await
            }
            executor_message::Kind::Heartbeat(_) => tx
                .send(Ok(SchedulerMessage {
                    kind: Some(scheduler_message::Kind::Heartbeat(pb::Heartbeat {
                        sent_at: Some(convert::timestamp(chrono::Utc::now())),
                    })),
                }))
                .await
                .map_err(|_| Status::cancelled("executor went away")),
            // The reader handles these itself.
            executor_message::Kind::Credit(_) | executor_message::Kind::Hello(_) => Ok(()),
        };
        if let Err(status) = result {
            tracing::warn!(executor_id = %executor_id, %status, "ending lease stream");
            let _ = tx.send(Err(status)).await;
            failed.cancel();
            return;
        }
    }
}

/// Sends a claimed batch; if the stream is gone, hands the leases straight back (nothing was
/// sent for them) instead of letting them wait out their TTL.
async fn deliver(store: &Store, namespace: &str, tx: &Outbound, leases: Vec<GrantedLease>) -> bool {
    let mut frames = Vec::with_capacity(leases.len());
    for l in &leases {
        match convert::lease(l) {
            Ok(f) => frames.push(f),
            Err(e) => tracing::error!(task_id = %l.task_id, error = %e, "undeliverable lease"),
        }
    }
    let frame = SchedulerMessage {
        kind: Some(scheduler_message::Kind::Leases(pb::LeaseBatch {
            leases: frames,
        })),
    };
    if tx.send(Ok(frame)).await.is_ok() {
        return true;
    }
    let refs: Vec<(Uuid, i32)> = leases.iter().map(|l| (l.task_id, l.attempt)).collect();
    if let Err(e) = store.release_leases(namespace, &refs).await {
        tracing::warn!(error = %e, "cannot release undelivered leases; they will expire");
    }
    false
}

async fn handle_reports(
    ctx: &SessionContext,
    namespace: &str,
    tx: &Outbound,
    executor_id: &str,
    batch: pb::ReportBatch,
) -> Result<(), Status> {
    let mut reports = Vec::with_capacity(batch.results.len());
    let mut invalid = Vec::new();
    let mut tokens = std::collections::HashSet::with_capacity(batch.results.len());
    for r in batch.results {
        match report_from_wire(&r) {
            // One outcome per fencing token: a repeat within a batch is refused as a repeat in a
            // later batch is. Applied together, one statement picked either outcome for the task,
            // recorded the other as the attempt and freed the account slot twice (found by
            // fuzzing, #10).
            Some(report) if tokens.insert((report.task_id, report.attempt)) => reports.push(report),
            _ => invalid.push(pb::ReportAck {
                task_id: r.task_id,
                attempt: r.attempt,
                accepted: false,
                state: pb::TaskState::Unspecified as i32,
            }),
        }
    }
    let mut acks = invalid;
    if !reports.is_empty() {
        let outcome = ctx
            .store
            .complete_attempts(namespace, &reports)
            .await
            .map_err(|e| {
                tracing::warn!(executor_id, error = %e, "cannot apply reports");
                Status::unavailable(format!("cannot record reports: {e}"))
            })?;
        let wake_at = if outcome.capacity_freed {
            // An account had no in-flight room; dispatchers on every replica look again now.
            Some(chrono::DateTime::<chrono::Utc>::UNIX_EPOCH)
        } else {
            outcome.earliest_retry
        };
        if let Some(at) = wake_at {
            if let Err(e) = ctx.store.announce_due(at).await {
                tracing::warn!(error = %e, "cannot announce retries");
            }
        }
        for v in outcome.verdicts.iter().filter(|v| v.accepted) {
            if let Some(state) = v.state {
                crate::telemetry::metrics::task_finished(state, v.attempt);
            }
        }
        let resolved: Vec<Uuid> = outcome
            .verdicts
            .iter()
            .filter(|v| v.accepted && v.state == Some(TaskState::Cancelled))
            .map(|v| v.task_id)
            .collect();
        if !resolved.is_empty() {
            if let Err(e) = ctx.store.announce_cancels_resolved(&resolved).await {
                tracing::warn!(error = %e, "cannot announce cancel outcomes");
            }
        }
        acks.extend(outcome.verdicts.into_iter().map(|v| {
            pb::ReportAck {
                task_id: v.task_id.to_string(),
                attempt: v.attempt,
                accepted: v.accepted,
                state: v
                    .state
                    .map(|s| convert::state(s) as i32)
                    .unwrap_or_default(),
            }
        }));
    }
    tx.send(Ok(SchedulerMessage {
        kind: Some(scheduler_message::Kind::ReportAcks(pb::ReportAckBatch {
            acks,
        })),
    }))
    .await
    .map_err(|_| Status::cancelled("executor went away"))
}

/// A wire report as a domain report; None when its outcome or task id is not one a report can
/// carry (it is acknowledged `accepted = false`).
pub fn report_from_wire(r: &pb::AttemptResult) -> Option<AttemptReport> {
    let outcome = match pb::OutcomeClass::try_from(r.outcome).ok()? {
        pb::OutcomeClass::Ok => Outcome::Ok,
        pb::OutcomeClass::RateLimited => Outcome::RateLimited,
        pb::OutcomeClass::Transient => Outcome::Transient,
        pb::OutcomeClass::Permanent => Outcome::Permanent,
        pb::OutcomeClass::AccountUnavailable => Outcome::AccountUnavailable,
        pb::OutcomeClass::Unspecified | pb::OutcomeClass::LeaseExpired => return None,
    };
    let retry_after_ms = r
        .retry_after
        .as_ref()
        .filter(|d| d.seconds >= 0 && d.nanos >= 0)
        // Saturating, then capped: a provider's absurd Retry-After must neither overflow (a panic
        // in the session) nor push the due time out of the database's range (a batch that fails
        // on every reconnect). Found by fuzzing, #10.
        .map(|d| {
            d.seconds
                .saturating_mul(1000)
                .saturating_add(i64::from(d.nanos / 1_000_000))
                .min(MAX_RETRY_AFTER_MS)
        });
    Some(AttemptReport {
        task_id: r.task_id.parse().ok()?,
        attempt: r.attempt,
        outcome,
        error: (!r.error.is_empty()).then(|| truncate(&r.error, MAX_ERROR_BYTES)),
        provider_message_id: (!r.provider_message_id.is_empty())
            .then(|| truncate(&r.provider_message_id, 512)),
        retry_after_ms,
        started_at: r.started_at.as_ref().and_then(convert::from_timestamp),
        recipient_scoped: r.rate_limit_scope == pb::RateLimitScope::Recipient as i32,
    })
}

async fn handle_extend(
    ctx: &SessionContext,
    namespace: &str,
    tx: &Outbound,
    extend: pb::Extend,
) -> Result<(), Status> {
    let mut refs = Vec::with_capacity(extend.leases.len());
    let mut lost = Vec::new();
    for l in extend.leases {
        match l.task_id.parse::<Uuid>() {
            Ok(id) => refs.push((id, l.attempt)),
            Err(_) => lost.push(l),
        }
    }
    let extended = ctx
        .store
        .extend_leases(namespace, &refs, ctx.settings.lease_ttl)
        .await
        .map_err(|e| Status::unavailable(format!("cannot extend leases: {e}")))?;
    let held: std::collections::HashSet<(Uuid, i32)> = extended
        .extended
        .iter()
        .map(|(id, a, _)| (*id, *a))
        .collect();
    lost.extend(
        refs.iter()
            .filter(|r| !held.contains(r))
            .map(|(id, attempt)| pb::LeaseRef {
                task_id: id.to_string(),
                attempt: *attempt,
            }),
    );
    let expires_at = extended.extended.iter().map(|(_, _, at)| *at).max();
    tx.send(Ok(SchedulerMessage {
        kind: Some(scheduler_message::Kind::ExtendAck(pb::ExtendAck {
            extended: extended
                .extended
                .iter()
                .map(|(id, attempt, _)| pb::LeaseRef {
                    task_id: id.to_string(),
                    attempt: *attempt,
                })
                .collect(),
            lost,
            expires_at: expires_at.map(convert::timestamp),
        })),
    }))
    .await
    .map_err(|_| Status::cancelled("executor went away"))
}

async fn handle_release(
    ctx: &SessionContext,
    namespace: &str,
    release: pb::Release,
) -> Result<(), Status> {
    let refs: Vec<(Uuid, i32)> = release
        .leases
        .iter()
        .filter_map(|l| l.task_id.parse().ok().map(|id| (id, l.attempt)))
        .collect();
    if refs.is_empty() {
        return Ok(());
    }
    ctx.store
        .release_leases(namespace, &refs)
        .await
        .map_err(|e| Status::unavailable(format!("cannot release leases: {e}")))
}

async fn handle_revoke_ack(
    ctx: &SessionContext,
    namespace: &str,
    ack: pb::RevokeAck,
) -> Result<(), Status> {
    let Some(lease) = ack.lease else {
        return Ok(());
    };
    if ack.result == pb::RevokeResult::StoppedBeforeSend as i32 {
        if let Ok(id) = lease.task_id.parse::<Uuid>() {
            ctx.store
                .record_revoked_before_send(namespace, id, lease.attempt)
                .await
                .map_err(|e| Status::unavailable(format!("cannot record revoke: {e}")))?;
        }
    }
    Ok(())
}

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// `s` cut to at most `max` bytes, without NUL characters: a provider's response excerpt may
/// hold them and PostgreSQL text cannot, which failed the whole report batch on every
/// reconnect (found by fuzzing, #10).
fn truncate(s: &str, max: usize) -> String {
    if s.contains('\0') {
        return truncate(&s.replace('\0', ""), max);
    }
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}
