//! The lease stream client: one session at a time with one scheduler endpoint, reconnecting
//! round-robin with backoff. Leases, their workers and the results not yet acknowledged live
//! here, outside any one stream, so they survive a reconnect or a Drain.

mod backoff;
mod closing;
pub(crate) mod events;
mod inflight;
mod report_frames;
mod stream;
mod worker;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use herald_proto::v1 as pb;
use pb::executor_message::Kind as Out;
use pb::scheduler_message::Kind as In;
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, instrument, warn};

use crate::routes::BuiltRoutes;
use crate::senders::{Content, SendError, SendRequest};
use crate::telemetry::metrics::SendMetrics;
use inflight::{InFlight, LeaseKey};
use stream::{open, Stream, CONNECT_TIMEOUT, WELCOME_TIMEOUT};
pub(crate) use worker::truncate;
use worker::{Done, Job};

/// Most results in one ReportBatch (and leases in one Extend).
const MAX_BATCH: usize = 1000;
/// Used when Welcome carries no usable heartbeat interval.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);
/// Used when Welcome carries no usable lease TTL.
const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(60);
/// A stream with nothing received for this many heartbeat intervals is considered dead.
const SILENCE_LIMIT: u32 = 3;

/// The longest heartbeat, lease TTL or send delay taken from the scheduler: what the clock
/// arithmetic on them can hold without overflowing (none the scheduler sends comes near).
const LONGEST_SCHEDULER_DURATION: Duration = Duration::from_secs(86_400);

/// Why one session ended with an error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionError {
    #[error("bad endpoint {endpoint}: {source}")]
    Endpoint {
        endpoint: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("cannot connect to {endpoint}: {source}")]
    Connect {
        endpoint: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("refusing plaintext endpoint {0} (HERALD_ALLOW_PLAINTEXT is not set)")]
    Plaintext(String),
    #[error("lease stream refused: {0}")]
    Refused(#[source] tonic::Status),
    #[error("lease stream failed: {0}")]
    Stream(#[source] tonic::Status),
    #[error("scheduler closed the lease stream")]
    Closed,
    #[error("no Welcome within {0:?}")]
    WelcomeTimeout(Duration),
    #[error("no lease stream within {0:?}")]
    OpenTimeout(Duration),
    #[error("expected Welcome, got another frame first")]
    NoWelcome,
    #[error("scheduler silent for {0:?}")]
    Silent(Duration),
    #[error("outgoing stream closed")]
    OutgoingClosed,
    #[error("the scheduler took no frame for {0:?}")]
    Stalled(Duration),
}

/// How a session ended.
enum SessionEnd {
    /// The scheduler sent Drain: move to the next endpoint at once.
    Drained,
    /// Shutdown finished: nothing left to report (or the grace period ran out).
    Finished,
    /// Shutdown started with work in flight: open a fresh stream (same endpoint, no credit)
    /// to report it.
    Reopen,
    /// The stream broke; `useful` says whether it did any work first (`progressed`).
    Failed { error: SessionError, useful: bool },
}

/// Counters the HTTP endpoint shows.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) in_flight: AtomicUsize,
    pub(crate) unacked: AtomicUsize,
    pub(crate) connected: AtomicUsize,
    /// When a lease session was last open (None: never yet).
    last_connected: std::sync::Mutex<Option<Instant>>,
}

impl Stats {
    /// Records whether a lease session is open now.
    pub(crate) fn set_connected(&self, open: bool) {
        self.connected.store(usize::from(open), Ordering::Relaxed);
        if let Ok(mut last) = self.last_connected.lock() {
            *last = Some(Instant::now());
        }
    }

    /// Whether the executor can take work: a lease session is open, or one was within `grace`
    /// (a scheduler's restart or a reconnect to another replica is not a reason to take the
    /// executor out of its Service). Never before its first session: an executor that cannot
    /// reach or authenticate to any scheduler is not ready, so a rollout with a wrong address,
    /// token or CA stops at its first pod instead of replacing every working one.
    pub(crate) fn ready(&self, grace: Duration) -> bool {
        if self.connected.load(Ordering::Relaxed) > 0 {
            return true;
        }
        self.last_connected
            .lock()
            .ok()
            .and_then(|last| *last)
            .is_some_and(|at| at.elapsed() < grace)
    }
}

/// Settings of the lease client.
pub(crate) struct ClientSettings {
    pub(crate) endpoints: Vec<String>,
    pub(crate) executor_id: String,
    pub(crate) queues: Vec<String>,
    /// The accounts this executor holds credentials for (empty: none configured).
    pub(crate) credentials_refs: Vec<String>,
    pub(crate) max_in_flight: u32,
    pub(crate) shutdown_grace: Duration,
    /// TLS, token and namespace of every stream.
    pub(crate) connection: crate::connection::Connection,
}

/// The executor's side of the lease protocol.
pub(crate) struct LeaseClient {
    settings: ClientSettings,
    routes: BuiltRoutes,
    inflight: InFlight,
    done_tx: mpsc::UnboundedSender<Done>,
    done_rx: mpsc::UnboundedReceiver<Done>,
    /// Results waiting for their ReportAck.
    outbox: BTreeMap<LeaseKey, pb::AttemptResult>,
    /// Results of `outbox` not yet sent on the current stream, in the order they ended: a
    /// flush sends these alone instead of scanning every result still waiting for its ack.
    unsent: Vec<LeaseKey>,
    /// Slots freed since credit was last granted on the current stream.
    freed: u32,
    /// Leases to hand back unsent (shutdown), on the next flush.
    to_release: Vec<pb::LeaseRef>,
    /// Leases whose revoke came first, dropped unsent: told StoppedBeforeSend on the next flush.
    stopped_early: Vec<pb::LeaseRef>,
    /// Set once shutdown starts: the deadline for reporting what is in flight.
    shutdown_deadline: Option<Instant>,
    stats: Arc<Stats>,
    /// Each sending account's send metrics, looked up at its first lease.
    send_metrics: HashMap<String, Arc<SendMetrics>>,
    /// Whether the current stream did any work (leases, report or extension answers). Only
    /// such a stream (or one that stayed up for a while) resets the reconnect backoff: one that is welcomed and then breaks at once
    /// — a scheduler whose database is down answers Hello but not the first report — must not
    /// be reopened ten times a second.
    progressed: bool,
}

impl LeaseClient {
    pub(crate) fn new(settings: ClientSettings, routes: BuiltRoutes, stats: Arc<Stats>) -> Self {
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        LeaseClient {
            settings,
            routes,
            inflight: InFlight::default(),
            done_tx,
            done_rx,
            outbox: BTreeMap::new(),
            unsent: Vec::new(),
            freed: 0,
            to_release: Vec::new(),
            stopped_early: Vec::new(),
            shutdown_deadline: None,
            stats,
            send_metrics: HashMap::new(),
            progressed: false,
        }
    }

    /// Runs sessions until `shutdown` fires and everything in flight is reported (or the grace
    /// period runs out).
    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let endpoints = self.settings.endpoints.clone();
        let mut next = 0usize;
        let mut failures = 0u32;
        loop {
            if self.finished() {
                break;
            }
            let endpoint = &endpoints[next % endpoints.len()];
            match self.session(endpoint, &shutdown).await {
                // Leases that came while the stream closed, or revokes answered only then, are
                // still to be handed back: the loop opens a stream without credit for them,
                // unless nothing is left or the grace is over.
                SessionEnd::Finished => {}
                SessionEnd::Reopen => failures = 0,
                SessionEnd::Drained => {
                    next = next.wrapping_add(1);
                    failures = 0;
                }
                SessionEnd::Failed { error, useful } => {
                    next = next.wrapping_add(1);
                    if useful {
                        failures = 0;
                    }
                    let delay = backoff::delay(failures);
                    failures = failures.saturating_add(1);
                    warn!(%endpoint, error = %error_chain(&error), retry_in = ?delay, "lease session ended");
                    self.wait(delay, &shutdown).await;
                }
            }
        }
        self.stats.set_connected(false);
        if !self.inflight.is_empty() || !self.outbox.is_empty() {
            warn!(
                in_flight = self.inflight.len(),
                unreported = self.outbox.len(),
                "shutdown grace period over; leaving the rest to lease expiry"
            );
        }
    }

    /// True once shutdown has started and there is nothing left to do (or no time left).
    fn finished(&self) -> bool {
        match self.shutdown_deadline {
            None => false,
            Some(deadline) => {
                (self.inflight.is_empty()
                    && self.outbox.is_empty()
                    && self.to_release.is_empty()
                    && self.stopped_early.is_empty())
                    || Instant::now() >= deadline
            }
        }
    }

    fn begin_shutdown(&mut self) {
        if self.shutdown_deadline.is_some() {
            return;
        }
        self.shutdown_deadline = Some(Instant::now() + self.settings.shutdown_grace);
        // Leases that have not started sending are handed back (Release) so they are due again
        // at once without a charged attempt; should that frame never get out, the scheduler
        // leases them again once their TTL runs out. Sends already under way finish and are
        // reported within the grace period.
        let stopped = self.inflight.stop_all_pending();
        info!(
            released = stopped.len(),
            sending = self.inflight.len() - stopped.len(),
            "shutting down: no more credit, finishing sends in flight"
        );
        self.to_release.extend(stopped);
    }

    fn deadline_sleep(&self) -> tokio::time::Sleep {
        // Far in the future when not shutting down.
        let at = self
            .shutdown_deadline
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(86_400 * 365));
        tokio::time::sleep_until(at)
    }

    /// Between sessions: wait `delay`, still collecting results and watching for shutdown.
    async fn wait(&mut self, delay: Duration, shutdown: &CancellationToken) {
        let until = Instant::now() + delay;
        loop {
            if self.finished() {
                return;
            }
            let deadline = self.deadline_sleep();
            tokio::select! {
                () = tokio::time::sleep_until(until) => return,
                () = deadline => return,
                () = shutdown.cancelled(), if self.shutdown_deadline.is_none() => self.begin_shutdown(),
                Some(done) = self.done_rx.recv() => self.on_done(done),
            }
        }
    }

    /// A worker ended: free its slot and queue its result.
    fn on_done(&mut self, done: Done) {
        if self.inflight.remove(&done.key) {
            self.freed = self.freed.saturating_add(1);
        }
        if let Some(result) = done.result {
            if self.outbox.insert(done.key.clone(), result).is_none() {
                self.unsent.push(done.key);
            }
        }
        self.update_stats();
    }

    fn update_stats(&self) {
        self.stats
            .in_flight
            .store(self.inflight.len(), Ordering::Relaxed);
        self.stats
            .unacked
            .store(self.outbox.len(), Ordering::Relaxed);
    }

    #[instrument(name = "lease_session", skip_all, fields(endpoint = %endpoint))]
    async fn session(&mut self, endpoint: &str, shutdown: &CancellationToken) -> SessionEnd {
        let shutting_down = self.shutdown_deadline.is_some();
        let initial_credit = if shutting_down {
            0
        } else {
            let held = u32::try_from(self.inflight.len()).unwrap_or(u32::MAX);
            self.settings.max_in_flight.saturating_sub(held)
        };
        let hello = pb::Hello {
            executor_id: self.settings.executor_id.clone(),
            protocol_version: herald_proto::LEASE_PROTOCOL_VERSION,
            queues: self.settings.queues.clone(),
            initial_credit,
            // The `[accounts.*]` tables of the config file, so the scheduler leases this
            // executor only tasks routed to accounts it can send for.
            credentials_refs: self.settings.credentials_refs.clone(),
        };
        let deadline = self.deadline_sleep();
        // Bounded as a whole: a partitioned endpoint can accept the TCP connection and then
        // never answer, and the next endpoint must get its turn.
        let open_limit = CONNECT_TIMEOUT + WELCOME_TIMEOUT;
        // A shutdown meanwhile does not cut the opening short: the Hello may already have
        // offered credit and the scheduler be granting on it, and a stream dropped now would
        // leave those leases to lapse. Once open, `serve` sees the shutdown at once and closes
        // the stream, handing back what came on it.
        let opened = tokio::select! {
            opened = tokio::time::timeout(open_limit, open(endpoint, &self.settings.connection, hello)) => {
                opened.unwrap_or(Err(SessionError::OpenTimeout(open_limit)))
            }
            () = deadline => return SessionEnd::Finished,
        };
        let (mut stream, mut inbound, welcome) = match opened {
            Ok(opened) => opened,
            Err(error) => {
                return SessionEnd::Failed {
                    error,
                    useful: false,
                }
            }
        };
        stream.granting = !shutting_down;
        let heartbeat = positive(welcome.heartbeat_interval).unwrap_or(DEFAULT_HEARTBEAT);
        let ttl = positive(welcome.lease_ttl).unwrap_or(DEFAULT_LEASE_TTL);
        info!(
            scheduler_id = %welcome.scheduler_id,
            protocol_version = welcome.protocol_version,
            heartbeat = ?heartbeat,
            lease_ttl = ?ttl,
            initial_credit,
            "lease session open"
        );
        self.freed = 0;
        self.progressed = false;
        let opened_at = Instant::now();
        self.stats.set_connected(true);
        let result = self
            .serve(&mut stream, &mut inbound, heartbeat, ttl, shutdown)
            .await;
        self.stats.set_connected(false);
        match result {
            Ok(end) => {
                self.close(stream, inbound).await;
                end
            }
            Err(error) => SessionEnd::Failed {
                error,
                // An idle stream that stayed up for a while was healthy too.
                useful: self.progressed || opened_at.elapsed() >= heartbeat * SILENCE_LIMIT,
            },
        }
    }

    /// The session loop after Welcome.
    async fn serve(
        &mut self,
        stream: &mut Stream,
        inbound: &mut tonic::Streaming<pb::SchedulerMessage>,
        heartbeat: Duration,
        ttl: Duration,
        shutdown: &CancellationToken,
    ) -> Result<SessionEnd, SessionError> {
        // Leases held across a reconnect were last extended on the old stream, up to a third
        // of the TTL before it ended, and reaching this one took time too (backoff, a dead
        // host's connect timeout): extended only at this stream's first tick, they could lapse
        // mid-send and be leased, and sent, again elsewhere. So they are extended first, ahead
        // of the results sent again below, which the scheduler applies before it reads on.
        let held = self
            .inflight
            .due_for_extension(Instant::now(), Duration::ZERO);
        for chunk in held.chunks(MAX_BATCH) {
            debug!(
                leases = chunk.len(),
                "extending leases held across a reconnect"
            );
            stream
                .send(Out::Extend(pb::Extend {
                    leases: chunk.to_vec(),
                }))
                .await?;
        }
        // Everything not acknowledged on an earlier stream goes out again on this one.
        self.unsent = self.outbox.keys().cloned().collect();
        self.flush(stream).await?;

        let extend_every = (ttl / 3).max(Duration::from_millis(100));
        let mut extend_tick = tokio::time::interval_at(Instant::now() + extend_every, extend_every);
        extend_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let beat_every = (heartbeat / 2).max(Duration::from_millis(50));
        let mut beat_tick = tokio::time::interval_at(Instant::now() + beat_every, beat_every);
        beat_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let silence = heartbeat * SILENCE_LIMIT;
        stream.send_timeout = silence;
        let mut last_received = Instant::now();

        loop {
            if self.finished() {
                return Ok(SessionEnd::Finished);
            }
            let deadline = self.deadline_sleep();
            tokio::select! {
                message = inbound.message() => {
                    last_received = Instant::now();
                    match message {
                        Ok(Some(message)) => {
                            if let Some(end) = self.on_message(stream, message).await? {
                                return Ok(end);
                            }
                        }
                        Ok(None) => return Err(SessionError::Closed),
                        Err(status) => return Err(SessionError::Stream(status)),
                    }
                }
                Some(done) = self.done_rx.recv() => {
                    // Take one, then whatever else is ready, and report it all in one go.
                    self.on_done(done);
                    for _ in 0..MAX_BATCH {
                        match self.done_rx.try_recv() {
                            Ok(done) => self.on_done(done),
                            Err(_) => break,
                        }
                    }
                    self.flush(stream).await?;
                }
                _ = extend_tick.tick() => {
                    let due = self.inflight.due_for_extension(Instant::now(), extend_every);
                    for chunk in due.chunks(MAX_BATCH) {
                        debug!(leases = chunk.len(), "extending leases");
                        stream.send(Out::Extend(pb::Extend { leases: chunk.to_vec() })).await?;
                    }
                }
                _ = beat_tick.tick() => {
                    let now = Instant::now();
                    if now.duration_since(last_received) >= silence {
                        return Err(SessionError::Silent(silence));
                    }
                    // Idle in either direction for an interval: a heartbeat (answered by
                    // the scheduler) keeps both sides sure the stream is alive.
                    if now.duration_since(stream.last_sent) >= heartbeat
                        || now.duration_since(last_received) >= heartbeat
                    {
                        stream.send(Out::Heartbeat(pb::Heartbeat { sent_at: Some(SystemTime::now().into()) })).await?;
                    }
                }
                () = shutdown.cancelled(), if self.shutdown_deadline.is_none() => {
                    self.begin_shutdown();
                    stream.granting = false;
                    // Hand back the leases that had not started, here and now.
                    self.flush(stream).await?;
                    if !self.finished() {
                        // Credit already granted on this stream cannot be taken back, so the
                        // scheduler could keep leasing on it. Close it and report what is in
                        // flight over a fresh stream that offers no credit. A lease already on
                        // its way on this stream is lost with it and leased again after its TTL.
                        return Ok(SessionEnd::Reopen);
                    }
                }
                () = deadline => return Ok(SessionEnd::Finished),
            }
        }
    }

    /// Sends every unsent result and release, then grants the freed slots as credit.
    async fn flush(&mut self, stream: &mut Stream) -> Result<(), SessionError> {
        if !self.to_release.is_empty() {
            for chunk in self.to_release.chunks(MAX_BATCH) {
                stream
                    .send(Out::Release(pb::Release {
                        leases: chunk.to_vec(),
                    }))
                    .await?;
            }
            self.to_release.clear();
        }
        for lease in std::mem::take(&mut self.stopped_early) {
            let mut ack = pb::RevokeAck {
                lease: Some(lease),
                result: 0,
            };
            ack.set_result(pb::RevokeResult::StoppedBeforeSend);
            stream.send(Out::RevokeAck(ack)).await?;
        }
        // Taken before sending: if a send fails the session ends, and the next one queues
        // every result still waiting for its ack again.
        let unsent = std::mem::take(&mut self.unsent);
        let results = unsent.iter().filter_map(|k| self.outbox.get(k));
        for batch in report_frames::report_batches(results, MAX_BATCH) {
            stream.send(Out::Report(batch)).await?;
        }
        if stream.granting && self.freed > 0 {
            let additional = std::mem::take(&mut self.freed);
            stream.send(Out::Credit(pb::Credit { additional })).await?;
        }
        Ok(())
    }

    /// Handles one frame; `Some` ends the session.
    async fn on_message(
        &mut self,
        stream: &mut Stream,
        message: pb::SchedulerMessage,
    ) -> Result<Option<SessionEnd>, SessionError> {
        match message.kind {
            Some(In::Leases(batch)) => {
                self.progressed = true;
                // One receipt instant for the batch: its leases then come due for extension
                // together, in one frame, however long starting each send took.
                let received = Instant::now();
                for lease in batch.leases {
                    self.on_lease(lease, received);
                }
                self.update_stats();
                // Duplicates free their slot at once; leases arriving during shutdown are
                // released.
                self.flush(stream).await?;
            }
            Some(In::ReportAcks(batch)) => {
                self.progressed = true;
                self.on_report_acks(batch);
            }
            Some(In::ExtendAck(ack)) => {
                self.progressed = true;
                self.on_extend_ack(&ack);
            }
            Some(In::Revoke(revoke)) => {
                let Some(lease) = revoke.lease else {
                    warn!("Revoke without a lease; ignored");
                    return Ok(None);
                };
                let result = self.on_revoke(&lease);
                let mut ack = pb::RevokeAck {
                    lease: Some(lease),
                    result: 0,
                };
                ack.set_result(result);
                stream.send(Out::RevokeAck(ack)).await?;
            }
            Some(In::Drain(drain)) => {
                info!(reason = %drain.reason, in_flight = self.inflight.len(), "scheduler draining; moving to the next endpoint");
                stream.granting = false;
                return Ok(Some(SessionEnd::Drained));
            }
            Some(In::Heartbeat(_)) => {}
            Some(In::Welcome(_)) => warn!("unexpected second Welcome; ignored"),
            None => warn!("empty scheduler frame; ignored"),
        }
        Ok(None)
    }

    /// Forgets the results the scheduler acknowledged.
    fn on_report_acks(&mut self, batch: pb::ReportAckBatch) {
        for ack in batch.acks {
            let key = LeaseKey {
                task_id: ack.task_id,
                attempt: ack.attempt,
            };
            if self.outbox.remove(&key).is_some() && !ack.accepted {
                // The scheduler says why (older ones did not): a lost lease is routine after a
                // cancel or a stall; a result it cannot read is a bug here.
                let reason = if ack.reason.is_empty() {
                    "lease was lost or already reported"
                } else {
                    ack.reason.as_str()
                };
                info!(task_id = %key.task_id, attempt = key.attempt, state = ack.state, reason, "result not accepted");
            }
        }
        self.update_stats();
    }

    /// Drops the leases not yet sending that an extension found lost.
    fn on_extend_ack(&mut self, ack: &pb::ExtendAck) {
        for lost in &ack.lost {
            let key = LeaseKey::from_ref(lost);
            if self.inflight.lose(&key) {
                info!(task_id = %key.task_id, attempt = key.attempt, "lease lost before sending; dropped");
            }
        }
    }

    /// Stops a revoked lease if it has not started sending; says how it stood.
    fn on_revoke(&mut self, lease: &pb::LeaseRef) -> pb::RevokeResult {
        let result = self.inflight.revoke(&LeaseKey::from_ref(lease));
        info!(task_id = %lease.task_id, attempt = lease.attempt, result = ?result, "lease revoked");
        result
    }

    /// Starts a worker for a new lease, received at `received`.
    fn on_lease(&mut self, lease: pb::Lease, received: Instant) {
        let key = LeaseKey {
            task_id: lease.task_id.clone(),
            attempt: lease.attempt,
        };
        if self.inflight.contains(&key) {
            warn!(task_id = %key.task_id, attempt = key.attempt, "duplicate lease; ignored");
            self.freed = self.freed.saturating_add(1);
            return;
        }
        if self.inflight.revoked_before_received(&key) {
            info!(task_id = %key.task_id, attempt = key.attempt, "lease revoked before it came; dropped unsent");
            self.stopped_early.push(key.to_ref());
            self.freed = self.freed.saturating_add(1);
            return;
        }
        if self.shutdown_deadline.is_some() {
            // Credit granted before shutdown can still bring leases: hand them back unsent.
            debug!(task_id = %key.task_id, attempt = key.attempt, "lease received while shutting down; releasing it");
            self.to_release.push(key.to_ref());
            return;
        }
        let queue = lease.queue.clone();
        let account = lease.account_id.clone();
        let traceparent = lease.traceparent.clone();
        let send_at = positive(lease.send_after).map(|d| tokio::time::Instant::now() + d);
        // A lease naming an account goes to that account's sender; the queue only decides
        // for leases without one.
        let sender = if lease.credentials_ref.is_empty() {
            self.routes.get(&queue).ok_or_else(|| {
                SendError::permanent(format!("no sender configured for queue {queue}"))
            })
        } else {
            // Not the task's fault: the scheduler moves it to another account uncharged.
            self.routes.account(&lease.credentials_ref).ok_or_else(|| {
                SendError::account_unavailable(format!(
                    "no credentials for account {} in this executor",
                    lease.credentials_ref
                ))
            })
        };
        let request = match sender {
            Err(error) => Err(error),
            Ok(sender) => match request_from_lease(lease) {
                Some(req) => Ok((sender, Box::new(req))),
                None => Err(SendError::permanent("lease carries no content")),
            },
        };
        let (phase, cancel) = self.inflight.insert(key.clone(), received);
        let metrics = self.send_metrics_of(&account);
        let job = Job {
            key,
            queue,
            request,
            phase,
            cancel,
            account,
            metrics,
            traceparent,
            send_at,
        };
        // Boxed before it is spawned: the send's future is large (the sender's request future
        // inside it), and spawning it unboxed copied it several times per lease on this loop,
        // the one that reads every lease (memcpy under `on_lease` in the S1 profile).
        tokio::spawn(Box::pin(worker::run(job, self.done_tx.clone())));
    }

    /// `account`'s send metrics (empty: queue-routed sends).
    fn send_metrics_of(&mut self, account: &str) -> Arc<SendMetrics> {
        if let Some(metrics) = self.send_metrics.get(account) {
            return metrics.clone();
        }
        let metrics = Arc::new(SendMetrics::new(account));
        self.send_metrics
            .insert(account.to_owned(), metrics.clone());
        metrics
    }
}

fn request_from_lease(lease: pb::Lease) -> Option<SendRequest> {
    let content = Content::from_proto(lease.content.map(|c| *c))?;
    let window_closed_fallback = lease.window_closed_fallback.and_then(|t| {
        Content::from_proto(Some(pb::Content {
            body: Some(pb::content::Body::Template(*t)),
            link_preview: false,
        }))
    });
    Some(SendRequest {
        task_id: lease.task_id,
        attempt: lease.attempt,
        queue: lease.queue,
        recipient: lease.recipient,
        content,
        idempotency_key: lease.idempotency_key,
        labels: lease.labels.into_iter().collect(),
        run_at: lease.run_at.and_then(|t| SystemTime::try_from(t).ok()),
        leased_at: lease.leased_at.and_then(|t| SystemTime::try_from(t).ok()),
        attempts_before: lease.attempts_before,
        max_attempts: lease.max_attempts,
        account_id: lease.account_id,
        credentials_ref: lease.credentials_ref,
        window_closed_fallback,
    })
}

/// An error and its sources, `: `-separated (tonic's top-level transport error says little).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}

/// A wire duration, if positive, capped at [`LONGEST_SCHEDULER_DURATION`].
fn positive(d: Option<prost_types::Duration>) -> Option<Duration> {
    d.and_then(|d| Duration::try_from(d).ok())
        .filter(|d| !d.is_zero())
        .map(|d| d.min(LONGEST_SCHEDULER_DURATION))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduler_durations_are_positive_and_capped() {
        let wire = |seconds| Some(prost_types::Duration { seconds, nanos: 0 });
        assert_eq!(positive(wire(0)), None);
        assert_eq!(positive(wire(-5)), None);
        assert_eq!(positive(wire(5)), Some(Duration::from_secs(5)));
        let longest = positive(wire(i64::MAX)).expect("a positive duration");
        assert_eq!(longest, LONGEST_SCHEDULER_DURATION);
        // The arithmetic the session does on them holds.
        let _ = tokio::time::Instant::now() + longest;
        let _ = longest * SILENCE_LIMIT;
    }

    #[test]
    fn ready_with_a_session_and_for_a_grace_after_it_never_before_the_first() {
        let grace = Duration::from_secs(30);
        let stats = Stats::default();
        assert!(!stats.ready(grace), "ready before any session");
        stats.set_connected(true);
        assert!(stats.ready(grace));
        stats.set_connected(false);
        assert!(
            stats.ready(grace),
            "a reconnect within the grace is no reason to go unready"
        );
        assert!(
            !stats.ready(Duration::ZERO),
            "ready past the grace without a session"
        );
    }
}
