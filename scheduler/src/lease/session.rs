//! One executor's lease session, on domain frames: after the Hello, a dispatcher grants leases
//! within the executor's credit while this session applies its reports, extensions, releases
//! and revoke answers. An [`Error`] ends the whole session; problems with one lease travel
//! in-band (a refused ack, a lost extension).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use futures::stream::{FuturesUnordered, StreamExt as _};
use tokio::sync::{broadcast, mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::claim::NoAccountsCache;
use super::dispatch::{Dispatcher, SESSION_ROLES};
use super::due_marks::PublishedMarks;
use super::events::Event;
use super::registry::{Outbound, Registry};
use super::reports::{self, ReportEntry};
use super::{Ack, FromExecutor, Hello, LeaseRef, LeaseSettings, ToExecutor, MAX_CREDIT};
use crate::db_watch::DatabaseReachable;
use crate::error::Error;
use crate::store::transaction;
use crate::store::StoreError;
use crate::store::{Db, Store};
use crate::tasks::model::GrantedLease;

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
    /// Namespaces known to have no accounts (claims take the one-statement path).
    pub no_accounts: NoAccountsCache,
}

impl SessionContext {
    /// Whether this replica takes a new session now; refused sessions let the executor try
    /// another replica at once rather than wait here.
    pub fn admit(&self) -> Result<(), Error> {
        if self.drain.is_cancelled() {
            return Err(Error::Unavailable("scheduler is shutting down".into()));
        }
        if !self.database.is_up() {
            return Err(Error::Unavailable(
                "this scheduler cannot reach its database; try another replica".into(),
            ));
        }
        Ok(())
    }
}

/// Starts a session for a checked Hello: sends Welcome, registers the executor and runs until
/// `frames` ends or a frame ends the session. The scheduler's frames go to `outbound`.
pub fn start(
    ctx: SessionContext,
    namespace: String,
    hello: Hello,
    frames: mpsc::Receiver<FromExecutor>,
    outbound: Outbound,
) {
    // Every line the session logs names its executor, on this task and the frame handler's.
    let span = tracing::info_span!(
        "lease_session",
        executor_id = %hello.executor_id,
        namespace = %namespace
    );
    tokio::spawn(run(ctx, namespace, hello, frames, outbound).instrument(span));
}

async fn run(
    ctx: SessionContext,
    namespace: String,
    hello: Hello,
    mut frames: mpsc::Receiver<FromExecutor>,
    tx: Outbound,
) {
    let welcome = ToExecutor::Welcome {
        protocol_version: hello.protocol_version.min(super::PROTOCOL_VERSION),
        heartbeat_interval: ctx.settings.heartbeat_interval,
        lease_ttl: ctx.settings.lease_ttl,
        scheduler_id: ctx.settings.scheduler_id.clone(),
    };
    if tx.send(welcome).await.is_err() {
        return;
    }
    let executor_id = hello.executor_id.clone();
    // Executor ids are unique per namespace only; revokes are addressed the same way.
    let registry_key = format!("{namespace}/{executor_id}");
    let generation = ctx.registry.insert(&registry_key, tx.clone());
    let presence = super::presence::Presence::start(
        ctx.store.clone(),
        super::presence::Present {
            namespace: namespace.clone(),
            executor_id: executor_id.clone(),
            scheduler_id: ctx.settings.scheduler_id.clone(),
            queues: hello.queues.clone(),
            credentials: hello.credentials_refs.clone(),
        },
    );
    let credit = Arc::new(Semaphore::new(hello.initial_credit as usize));
    let unreported = Unreported::default();
    let stop = CancellationToken::new();
    tracing::info!(executor_id = %executor_id, namespace = %namespace, queues = ?hello.queues,
        credit = hello.initial_credit, "executor connected");
    let dispatch = spawn_dispatcher(
        &ctx,
        &namespace,
        &hello,
        credit.clone(),
        stop.clone(),
        &tx,
        &unreported,
    );

    // Frames that touch the database are handled on their own task (`handle_frames`), so a
    // Credit frame never waits behind a report statement: the dispatcher can claim the next
    // batch while the last one's results are being written.
    let (work_tx, work_rx) = mpsc::channel::<FromExecutor>(64);
    let handler_failed = CancellationToken::new();
    let handler = tokio::spawn(
        handle_frames(
            ctx.clone(),
            namespace.clone(),
            tx.clone(),
            work_rx,
            handler_failed.clone(),
            unreported,
        )
        .instrument(tracing::Span::current()),
    );
    let mut drained = false;
    loop {
        let frame = tokio::select! {
            _ = ctx.drain.cancelled(), if !drained => {
                drained = true;
                stop.cancel();
                let _ = tx.send(ToExecutor::Drain("scheduler shutting down".into())).await;
                continue;
            }
            _ = handler_failed.cancelled() => break,
            frame = frames.recv() => frame,
        };
        match frame {
            None => break,
            Some(FromExecutor::Credit(more)) => {
                let room = (MAX_CREDIT as usize).saturating_sub(credit.available_permits());
                credit.add_permits((more as usize).min(room));
            }
            // Ends the session after the handler answered everything before it.
            Some(other) => {
                let last = matches!(other, FromExecutor::Violation(_));
                if work_tx.send(other).await.is_err() || last {
                    break;
                }
            }
        }
    }
    // Frames received before the end are still applied and acknowledged, and only then does the
    // stream end: an ack must never be lost behind the stream's status.
    drop(work_tx);
    let _ = handler.await;
    stop.cancel();
    let _ = dispatch.await;
    ctx.registry.remove(&registry_key, generation);
    presence.end().await;
    tracing::info!(executor_id = %executor_id, "executor disconnected");
}

/// Starts the dispatchers of a session (one per [`SESSION_ROLES`], sharing the executor's
/// credit; see [`Role`](super::dispatch::Role)): they grant leases within it and hand
/// each batch to the stream (or straight back to the queue if the stream is gone). The handle
/// ends when every one of them has.
fn spawn_dispatcher(
    ctx: &SessionContext,
    namespace: &str,
    hello: &Hello,
    credit: Arc<Semaphore>,
    stop: CancellationToken,
    tx: &Outbound,
    unreported: &Unreported,
) -> tokio::task::JoinHandle<()> {
    let main_marks = PublishedMarks::default();
    let dispatchers: Vec<_> = SESSION_ROLES
        .into_iter()
        .map(|role| {
            let dispatcher = Dispatcher {
                store: ctx.store.clone(),
                no_accounts: ctx.no_accounts.clone(),
                namespace: namespace.to_owned(),
                settings: ctx.settings.clone(),
                executor_id: hello.executor_id.clone(),
                queues: (!hello.queues.is_empty()).then(|| hello.queues.clone()),
                credentials: (!hello.credentials_refs.is_empty())
                    .then(|| hello.credentials_refs.clone()),
                credit: credit.clone(),
                events: ctx.events.subscribe(),
                stop: stop.clone(),
                role,
                main_marks: main_marks.clone(),
            };
            let tx = tx.clone();
            let store = ctx.store.clone();
            let namespace = namespace.to_owned();
            let executor_id = hello.executor_id.clone();
            let unreported = unreported.clone();
            tokio::spawn(dispatcher.run(move |leases, walked_all_due| {
                let tx = tx.clone();
                let store = store.clone();
                let namespace = namespace.clone();
                let unreported = unreported.clone();
                crate::telemetry::metrics::leases_granted(&leases);
                crate::telemetry::lease_grant_spans(&leases, &executor_id);
                async move {
                    deliver(&store, &namespace, &tx, &unreported, leases, walked_all_due).await
                }
            }))
        })
        .collect();
    tokio::spawn(async move {
        futures::future::join_all(dispatchers).await;
    })
}

/// How many reports queued-up batches are gathered into, at most, before one is applied.
const MAX_GATHERED_REPORTS: usize = 2048;

/// How many gathered report batches of one session are applied at once, each in its own
/// transaction. The second opens for a full gathered batch, that is for a backlog: with one
/// lane a drain's reports were written one statement after another on one backend, and once
/// the claims had caught up the results still queued were applied on one core while the other
/// idled. Opened for any batch waiting, it split a steady stream into smaller batches, and the
/// routed drain, whose account feedback costs per account and batch, slowed by a tenth
/// (docs/performance.md, "Reports in two lanes"). It also opens at the end of a burst
/// ([`Unreported::burst_over`]): then nothing more can join the batch, and waiting for the first
/// lane only delays the burst's last results.
const REPORT_LANES: usize = 2;

/// What a session's report gathering knows of the leases it has handed out: how many the
/// executor has not answered for yet (a report, a release, a revoke stopped before sending, an
/// extension found lost), and whether the main claim's last walk of the due queue came back
/// short of what it asked for. Only a hint for when a gathered batch stops waiting for more: a
/// report of an earlier stream's lease can take the count below the truth, and it then stays at
/// zero, which only applies a batch early.
#[derive(Debug, Clone, Default)]
struct Unreported {
    leases: Arc<AtomicUsize>,
    walked_all_due: Arc<AtomicBool>,
}

impl Unreported {
    /// `n` leases are on their way to the executor, from a walk that found every due task
    /// (`walked_all_due`) or not. Counted before they are sent, so that no report of theirs can
    /// be counted first.
    fn granted(&self, n: usize, walked_all_due: bool) {
        self.walked_all_due.store(walked_all_due, Ordering::Release);
        self.leases.fetch_add(n, Ordering::AcqRel);
    }

    /// The executor answered for `n` leases (or they never reached it).
    fn answered(&self, n: usize) {
        // Never fails: the closure always returns a value.
        let _ = self
            .leases
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(v.saturating_sub(n))
            });
    }

    /// Whether a burst of due work is over: the main claim's last walk found no more due tasks
    /// and every lease handed out has been answered for. Under a backlog every walk is full, and
    /// a gathered batch keeps waiting to grow: splitting a steady stream into small batches
    /// slowed the routed drain. Routed claims never end a burst here: they also come back short
    /// when the accounts' limits bind, with more due behind them.
    fn burst_over(&self) -> bool {
        self.walked_all_due.load(Ordering::Acquire) && self.leases.load(Ordering::Acquire) == 0
    }
}

/// Handles the executor's frames other than Credit; on an error, ends the stream with it and
/// tells the reader to stop. Report batches are applied up to [`REPORT_LANES`] at a time: they
/// are independent of each other (each result names its own lease, and a task's next lease
/// cannot exist before its report is written). Every other frame waits for the reports before
/// it and is handled alone, in the order it arrived.
async fn handle_frames(
    ctx: SessionContext,
    namespace: String,
    tx: Outbound,
    mut frames: mpsc::Receiver<FromExecutor>,
    failed: CancellationToken,
    unreported: Unreported,
) {
    let apply = |batch: Vec<ReportEntry>| handle_reports(&ctx, &namespace, &tx, batch);
    let mut applying = FuturesUnordered::new();
    // Reports received and not yet being applied: queued-up batches are applied together,
    // because the account feedback costs per account and batch, not per report, so a busy
    // database gets fewer, larger batches instead of falling further behind.
    let mut gathered: Vec<ReportEntry> = Vec::new();
    let mut error: Option<Error> = None;
    // Which frame the session ended on, for the log line that says so.
    let mut failed_on = "report batch";
    loop {
        if !gathered.is_empty()
            && (applying.is_empty()
                || (applying.len() < REPORT_LANES
                    && (gathered.len() >= MAX_GATHERED_REPORTS || unreported.burst_over())))
        {
            applying.push(apply(std::mem::take(&mut gathered)));
        }
        let frame = tokio::select! {
            biased;
            Some(applied) = applying.next(), if !applying.is_empty() => {
                if let Err(e) = applied {
                    error = Some(e);
                    break;
                }
                continue;
            }
            frame = frames.recv(), if gathered.len() < MAX_GATHERED_REPORTS => match frame {
                Some(frame) => frame,
                None => break,
            },
        };
        if let FromExecutor::Reports(batch) = frame {
            unreported.answered(batch.len());
            gathered.extend(batch);
            continue;
        }
        // Every other frame comes after the reports received before it.
        if !gathered.is_empty() {
            applying.push(apply(std::mem::take(&mut gathered)));
        }
        if let Err(e) = finish_all(&mut applying).await {
            error = Some(e);
            break;
        }
        failed_on = match &frame {
            FromExecutor::Extend(_) => "extend",
            FromExecutor::RevokeAck { .. } => "revoke ack",
            FromExecutor::Release(_) => "release",
            FromExecutor::Heartbeat => "heartbeat",
            FromExecutor::Violation(_) => "protocol violation",
            FromExecutor::Credit(_) | FromExecutor::Reports(_) => "credit",
        };
        let result = match frame {
            FromExecutor::Extend(leases) => {
                handle_extend(&ctx, &namespace, &tx, &unreported, leases).await
            }
            FromExecutor::RevokeAck {
                lease,
                stopped_before_send,
            } => {
                if stopped_before_send {
                    unreported.answered(1);
                }
                handle_revoke_ack(&ctx, &namespace, &lease, stopped_before_send).await
            }
            FromExecutor::Release(leases) => {
                unreported.answered(leases.len());
                handle_release(&ctx, &namespace, &leases).await
            }
            FromExecutor::Heartbeat => send(&tx, ToExecutor::Heartbeat(chrono::Utc::now())).await,
            FromExecutor::Violation(e) => Err(e),
            // The reader handles credit itself; reports are gathered above.
            FromExecutor::Credit(_) | FromExecutor::Reports(_) => Ok(()),
        };
        if let Err(e) = result {
            error = Some(e);
            break;
        }
        failed_on = "report batch";
    }
    // Reports received before the end are written and acknowledged before the stream ends, with
    // an error or without one: an ack must never be lost behind the stream's status. After an
    // error, what was gathered and not yet started is not applied here: the executor sends
    // every result it has no ack for again on its next stream.
    if error.is_none() && !gathered.is_empty() {
        applying.push(apply(std::mem::take(&mut gathered)));
    }
    let last = finish_all(&mut applying).await;
    if let Some(e) = error.or(last.err()) {
        tracing::warn!(frame = failed_on, error = %e, "ending lease stream");
        let _ = tx.send(ToExecutor::End(e)).await;
        failed.cancel();
    }
}

/// Waits for every report application in `applying`; the first error, if any.
async fn finish_all<F>(applying: &mut FuturesUnordered<F>) -> Result<(), Error>
where
    F: std::future::Future<Output = Result<(), Error>>,
{
    let mut first = Ok(());
    while let Some(applied) = applying.next().await {
        if first.is_ok() {
            first = applied;
        }
    }
    first
}

async fn send(tx: &Outbound, frame: ToExecutor) -> Result<(), Error> {
    tx.send(frame)
        .await
        .map_err(|_| Error::Cancelled("executor went away".into()))
}

/// Sends a claimed batch (`walked_all_due`: its walk found every due task, see
/// [`Unreported`]); if the stream is gone, hands the leases straight back (nothing was sent for
/// them) instead of letting them wait out their TTL.
async fn deliver(
    store: &Store,
    namespace: &str,
    tx: &Outbound,
    unreported: &Unreported,
    leases: Vec<GrantedLease>,
    walked_all_due: bool,
) -> bool {
    let refs: Vec<(uuid::Uuid, i32)> = leases.iter().map(|l| (l.task_id, l.attempt)).collect();
    unreported.granted(refs.len(), walked_all_due);
    if tx.send(ToExecutor::Leases(leases)).await.is_ok() {
        return true;
    }
    unreported.answered(refs.len());
    // Idempotent: fenced by the lease tokens, a second run releases nothing more.
    let released = transaction!(store, StoreError, idempotent = true, |db| db
        .leases()
        .release(namespace, &refs)
        .await);
    if let Err(e) = released {
        tracing::warn!(error = %e, "cannot release undelivered leases; they will expire");
    }
    false
}

async fn handle_reports(
    ctx: &SessionContext,
    namespace: &str,
    tx: &Outbound,
    batch: Vec<ReportEntry>,
) -> Result<(), Error> {
    let outcome = reports::apply(
        &ctx.store,
        namespace,
        &batch,
        ctx.settings.unknown_outcome_grace,
    )
    .await?;
    crate::telemetry::metrics::tasks_finished(&outcome.finished);
    let acks = batch
        .into_iter()
        .zip(outcome.verdicts)
        .map(|(entry, verdict)| Ack {
            lease: entry.lease,
            verdict,
        })
        .collect();
    send(tx, ToExecutor::Acks(acks)).await
}

async fn handle_extend(
    ctx: &SessionContext,
    namespace: &str,
    tx: &Outbound,
    unreported: &Unreported,
    leases: Vec<LeaseRef>,
) -> Result<(), Error> {
    let refs: Vec<(uuid::Uuid, i32)> = leases
        .iter()
        .filter_map(|l| l.task_id().map(|id| (id, l.attempt)))
        .collect();
    let conn = ctx.store.conn().await?;
    let extended = conn
        .leases()
        .extend(namespace, &refs, ctx.settings.lease_ttl)
        .await?;
    let held: std::collections::HashSet<(uuid::Uuid, i32)> =
        extended.iter().map(|(id, a, _)| (*id, *a)).collect();
    let (kept, lost): (Vec<LeaseRef>, Vec<LeaseRef>) = leases.into_iter().partition(|l| {
        l.task_id()
            .is_some_and(|id| held.contains(&(id, l.attempt)))
    });
    let expires_at = extended.iter().map(|(_, _, at)| *at).max();
    // The executor drops a lost lease it has not started sending, without a report.
    unreported.answered(lost.len());
    send(
        tx,
        ToExecutor::ExtendAck {
            extended: kept,
            lost,
            expires_at,
        },
    )
    .await
}

async fn handle_release(
    ctx: &SessionContext,
    namespace: &str,
    leases: &[LeaseRef],
) -> Result<(), Error> {
    let refs: Vec<(uuid::Uuid, i32)> = leases
        .iter()
        .filter_map(|l| l.task_id().map(|id| (id, l.attempt)))
        .collect();
    if refs.is_empty() {
        return Ok(());
    }
    // Idempotent: fenced by the lease tokens.
    transaction!(ctx.store, StoreError, idempotent = true, |db| db
        .leases()
        .release(namespace, &refs)
        .await)?;
    Ok(())
}

async fn handle_revoke_ack(
    ctx: &SessionContext,
    namespace: &str,
    lease: &LeaseRef,
    stopped_before_send: bool,
) -> Result<(), Error> {
    let Some(id) = lease.task_id().filter(|_| stopped_before_send) else {
        return Ok(());
    };
    // Idempotent: it sets the outcome only while it is still unknown.
    transaction!(ctx.store, StoreError, idempotent = true, |db| {
        db.leases()
            .revoked_before_send(namespace, id, lease.attempt)
            .await
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Unreported;

    /// A burst is over only when the main claim's last walk came back short and every lease is
    /// answered for; under a backlog (full walks) a gathered batch keeps waiting to grow.
    #[test]
    fn a_burst_is_over_after_a_short_walk_once_every_lease_is_answered_for() {
        let unreported = Unreported::default();
        unreported.granted(512, false);
        unreported.answered(512);
        assert!(
            !unreported.burst_over(),
            "the last walk was full: more may come"
        );

        unreported.granted(512, false);
        unreported.granted(300, true);
        unreported.answered(700);
        assert!(!unreported.burst_over(), "112 leases still out");
        unreported.answered(112);
        assert!(unreported.burst_over());

        unreported.granted(512, false);
        assert!(
            !unreported.burst_over(),
            "a full walk starts another backlog"
        );
    }

    /// Reports of an earlier stream's leases take the count to zero, not below: the next
    /// leases are counted from there.
    #[test]
    fn answers_for_leases_not_counted_stop_at_zero() {
        let unreported = Unreported::default();
        unreported.answered(5);
        unreported.granted(3, true);
        assert!(!unreported.burst_over(), "3 leases out");
        unreported.answered(3);
        assert!(unreported.burst_over());
    }
}
