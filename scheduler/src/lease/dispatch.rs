//! The dispatcher of one executor session: waits for credit, claims due tasks in batches, and
//! when nothing is due sleeps until the next due time by the database clock, waking early on a
//! cluster `Due` event. There is no polling period. Each walk of the due index starts where its
//! last claim ended ([`DueMarks`]); one claim of each session walks from the oldest entry now
//! and then, for the rows a walk passed while another transaction held them ([`Role`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::{broadcast, Semaphore};
use tokio_util::sync::CancellationToken;

use super::claim::{self, ClaimRequest, Claimed, NoAccountsCache};
use super::due_marks::{DueMarks, PublishedMarks};
use super::events::Event;
use super::LeaseSettings;
use crate::low_water::full_walk_spacing;
use crate::store::{Db, Store};
use crate::tasks::model::GrantedLease;
use crate::telemetry::metrics::CLAIMS;

/// What one of a session's claim loops does. All share the executor's credit, so together they
/// never lease more than it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Claims whenever there is credit, and sleeps until the next due time when nothing is due.
    /// One claim at a time: a second beside it during a routed backlog once overlapped the
    /// first's round trips, but on a busy database it only walked past the first's locked
    /// candidates and waited for the same account rows, and S5 drained 5.5 % faster at 11 % less
    /// database CPU without it, over 32 alternating pairs (docs/performance.md).
    Main,
    /// Every straggler period (`HERALD_STRAGGLER_PERIOD`, longer when its walks are slow), a
    /// small claim that walks the due index from its oldest entry: it leases the rows the other
    /// claims' walks passed while another transaction held them, which nothing announces
    /// (lease/due_marks.rs). Its own loop so that a slow walk (under a held snapshot it reads
    /// every entry the snapshot keeps) never holds up the claims that grant the rest. Only in
    /// namespaces without accounts, the only ones whose claims follow the marks.
    Stragglers,
}

/// The claim loops of every session, in the order they start.
pub const SESSION_ROLES: [Role; 2] = [Role::Main, Role::Stragglers];

impl Role {
    /// The `loop` label of [`CLAIMS`](crate::telemetry::metrics::CLAIMS).
    fn label(self) -> &'static str {
        match self {
            Role::Main => "main",
            Role::Stragglers => "stragglers",
        }
    }
}

/// How long the straggler claim waits before its next walk. A full batch of stragglers (every
/// lease below the main claim's marks) may have left more behind: it looks again at once. A
/// batch that reached the main claim's backlog found no more stragglers than it took: under a
/// steady backlog, looking again at once made it a second claim beside the main one, walking
/// from the oldest entry and past the main claim's locked rows for 32 tasks at a time (S6 in
/// docs/performance.md). Walks made slow by a held snapshot take at most a twentieth of one
/// database connection.
fn straggler_pause_after(period: Duration, full_of_stragglers: bool, took: Duration) -> Duration {
    if full_of_stragglers {
        Duration::ZERO
    } else {
        full_walk_spacing(period, took)
    }
}

/// The most leases one straggler walk takes: stragglers are few, and credit it holds during its
/// walk is credit the other claims cannot use.
const STRAGGLER_BATCH: u32 = 32;

/// How long after a claim began the next one waits when the first came back with only a handful
/// (at least [`LINGER_MIN`], short of its batch): under steady traffic each claim finds only what
/// came due while the last one ran (about 20 tasks a claim at 7,000 tasks/s in S6) and pays its
/// fixed cost, about half a millisecond of database time, for each such handful. Waiting a few
/// milliseconds lets a claim find several times as many, at a few milliseconds of lateness,
/// well within the 10 and 20 ms that S3 and S6 hold the grant to. A trickle (a claim of one or
/// two tasks) and a backlog (full batches) are claimed at once, as before.
pub const LINGER: Duration = Duration::from_millis(3);

/// The fewest leases a claim short of its batch must bring back for the next one to wait
/// [`LINGER`]: fewer means the traffic is a trickle, whose every task is claimed at once.
pub const LINGER_MIN: u32 = 8;

/// Whether the claim loop of `role` waits [`LINGER`] before its next claim, after one that
/// granted `granted` of the `want` it asked for: only the main loop, and only after a handful.
fn lingers_after(role: Role, granted: u32, want: u32) -> bool {
    role == Role::Main && granted >= LINGER_MIN && granted < want
}

/// Upper bound on an idle sleep. Wake-ups come from events; this only bounds the damage of a
/// notification lost while the LISTEN connection was down.
const MAX_IDLE: Duration = Duration::from_secs(60);

/// What the dispatcher needs from its session; a session runs one per [`SESSION_ROLES`] on one
/// credit.
pub struct Dispatcher {
    /// Database access.
    pub store: Store,
    /// Namespaces known to have no accounts.
    pub no_accounts: NoAccountsCache,
    /// Replica settings.
    pub settings: Arc<LeaseSettings>,
    /// The namespace whose tasks this executor leases (bound to its token).
    pub namespace: String,
    /// The executor's id.
    pub executor_id: String,
    /// Queues the executor serves; None for all.
    pub queues: Option<Vec<String>>,
    /// Accounts (credentials refs) the executor can send for; None for any.
    pub credentials: Option<Vec<String>>,
    /// The executor's unused credit.
    pub credit: Arc<Semaphore>,
    /// Cluster events.
    pub events: broadcast::Receiver<Event>,
    /// Stops the dispatcher (stream closed or draining).
    pub stop: CancellationToken,
    /// What this claim loop does.
    pub role: Role,
    /// The session's main claim marks (published by [`Role::Main`], read by
    /// [`Role::Stragglers`]).
    pub main_marks: PublishedMarks,
}

impl Dispatcher {
    /// Runs until stopped, handing each claimed batch to `deliver` with whether the main
    /// claim's walk of the due queue came back short of what it asked for (it found no more due
    /// tasks: the end of a burst); stops early if `deliver` returns false (the stream is gone).
    pub async fn run<F, Fut>(mut self, mut deliver: F)
    where
        F: FnMut(Vec<GrantedLease>, bool) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let mut error_backoff = Duration::from_millis(50);
        let mut marks = DueMarks::default();
        let period = self.settings.straggler_period;
        let mut straggler_pause = period;
        let mut linger_until: Option<Instant> = None;
        let batch = match self.role {
            Role::Stragglers => STRAGGLER_BATCH.min(self.settings.claim_batch),
            Role::Main => self.settings.claim_batch,
        };
        loop {
            let go = match self.role {
                Role::Main => true,
                Role::Stragglers => self.pause(straggler_pause).await,
            };
            if !go {
                return;
            }
            if let Some(until) = linger_until.take() {
                if !self
                    .pause(until.saturating_duration_since(Instant::now()))
                    .await
                {
                    return;
                }
            }
            // Marks steer only the queue walk: where claims are routed there are no stragglers
            // to find, and a routed claim here would only split the session's routing. Not
            // known either way (no claim for a while): the idle main loop's own walk covers it.
            if self.role == Role::Stragglers && !self.no_accounts.known_empty(&self.namespace) {
                continue;
            }
            // Wait for at least one unit of credit, then take what else is free up to a batch.
            let want = tokio::select! {
                _ = self.stop.cancelled() => return,
                permit = self.credit.acquire() => match permit {
                    Ok(p) => {
                        p.forget();
                        let extra = (self.credit.available_permits() as u32)
                            .min(batch.saturating_sub(1));
                        if extra > 0 {
                            if let Ok(p) = self.credit.try_acquire_many(extra) {
                                p.forget();
                            }
                        }
                        1 + extra
                    }
                    Err(_) => return,
                },
            };
            // Events that arrived while we had no credit are stale: the claim below sees them.
            self.drain_events(&mut marks);
            // Published before the claim as well as after it: events may have lowered the
            // marks, and until the claim returns the straggler loop must not count entries the
            // main claim is about to walk again as passed.
            if self.role == Role::Main {
                self.main_marks.publish(&marks);
            }
            // What the straggler walk finds below these was passed before it began.
            let passed_before = (self.role == Role::Stragglers).then(|| self.main_marks.current());
            let started = Instant::now();
            let claimed = match self.role {
                Role::Main => self.claim_until_some(want, &mut marks).await,
                // From the oldest entry: no marks.
                Role::Stragglers => self.claim(want, &mut DueMarks::default()).await.map(Some),
            };
            match claimed {
                Ok(Some(claimed)) => {
                    error_backoff = Duration::from_millis(50);
                    let leases = claimed.leases;
                    let granted = leases.len() as u32;
                    // A routed claim also comes back short when the accounts' limits bind, with
                    // more due behind it: only the main queue walk says a burst is over.
                    let walked_all_due =
                        self.role == Role::Main && claimed.by_queue_walk && granted < want;
                    if let Some(passed_before) = &passed_before {
                        straggler_pause = straggler_pause_after(
                            period,
                            granted >= want && passed_before.all_passed(&leases),
                            started.elapsed(),
                        );
                    } else if self.role == Role::Main {
                        self.main_marks.publish(&marks);
                    }
                    if granted == 0 {
                        self.credit.add_permits(want as usize);
                        continue;
                    }
                    if granted < want {
                        self.credit.add_permits((want - granted) as usize);
                        if lingers_after(self.role, granted, want) {
                            linger_until = Some(started + LINGER);
                        }
                    }
                    if !deliver(leases, walked_all_due).await {
                        return;
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    marks.reset();
                    self.credit.add_permits(want as usize);
                    tracing::warn!(error = %e, executor_id = %self.executor_id, "claim failed");
                    // A Due event ends the backoff early: the listener announces one when its
                    // connection comes back, so claims resume as soon as the database does.
                    if !self.wait(error_backoff, None, &mut marks).await {
                        return;
                    }
                    error_backoff = (error_backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// One claim of up to `want` leases, its walk steered by `marks` and moving them.
    async fn claim(
        &self,
        want: u32,
        marks: &mut DueMarks,
    ) -> Result<Claimed, crate::store::StoreError> {
        // Every claim, the idle main loop's empty ones too: a handle lookup, a few hundred a
        // second at most.
        metrics::counter!(CLAIMS, "loop" => self.role.label()).increment(1);
        let due_from = marks.due_from();
        let claimed = claim::claim(
            &self.store,
            &self.no_accounts,
            &self.request(want, &due_from),
        )
        .await?;
        if claimed.by_queue_walk {
            marks.record(&claimed.leases);
        } else {
            marks.reset();
        }
        Ok(claimed)
    }

    /// Claims up to `want` leases, sleeping until something is due; None when stopped.
    async fn claim_until_some(
        &mut self,
        want: u32,
        marks: &mut DueMarks,
    ) -> Result<Option<Claimed>, crate::store::StoreError> {
        let mut contended = Duration::from_millis(1);
        let idle_since = Instant::now();
        loop {
            let claimed = self.claim(want, marks).await?;
            if !claimed.leases.is_empty() {
                return Ok(Some(claimed));
            }
            // Idle, this loop holds the credit the straggler claim would need, so it walks from
            // the oldest entry itself once it has been idle for a straggler period.
            let period = self.settings.straggler_period;
            if marks.is_set() && idle_since.elapsed() >= period {
                marks.reset();
                continue;
            }
            // Only routes with room can be served; their next due time, or the moment an
            // account without room gets some back, is when to look again. The look starts at
            // the marks, as the claim did.
            let due_from = marks.due_from();
            let next = self
                .store
                .conn()
                .await?
                .leases()
                .next_due(&self.request(want, &due_from), &claimed.open_routes)
                .await?;
            let blocked_ms = claimed.recheck_in.map(|d| d.as_secs_f64() * 1000.0);
            let (sleep, target) = match next {
                // Due now but the claim found nothing: another session holds the rows' locks
                // for a moment. Back off briefly rather than spin.
                Some((wait_ms, _)) if wait_ms <= 0.0 => {
                    let s = contended;
                    contended = (contended * 2).min(Duration::from_millis(50));
                    (s, None)
                }
                Some((wait_ms, at)) => (
                    millis(wait_ms.min(blocked_ms.unwrap_or(f64::MAX))),
                    Some(at),
                ),
                None => (blocked_ms.map_or(MAX_IDLE, millis), None),
            };
            let sleep = if marks.is_set() {
                sleep.min(period.saturating_sub(idle_since.elapsed()))
            } else {
                sleep
            };
            if !self.wait(sleep, target, marks).await {
                return Ok(None);
            }
        }
    }

    /// Sleeps for `pause`, whatever is announced meanwhile; false when stopped first.
    async fn pause(&self, pause: Duration) -> bool {
        tokio::select! {
            _ = self.stop.cancelled() => false,
            _ = tokio::time::sleep(pause) => true,
        }
    }

    /// Sleeps for `sleep`, or until an event announces work due before `target`, telling
    /// `marks` of every due announcement. Returns false when stopped.
    async fn wait(
        &mut self,
        sleep: Duration,
        target: Option<DateTime<Utc>>,
        marks: &mut DueMarks,
    ) -> bool {
        let timer = tokio::time::sleep(sleep);
        tokio::pin!(timer);
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => return false,
                _ = &mut timer => return true,
                event = self.events.recv() => match event {
                    Ok(Event::Due(Some(at))) => {
                        marks.heard_due(Some(at));
                        if target.is_none_or(|t| at < t) {
                            return true;
                        }
                    }
                    Ok(Event::Due(None)) => {
                        marks.heard_due(None);
                        return true;
                    }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        marks.heard_due(None);
                        return true;
                    }
                    Err(broadcast::error::RecvError::Closed) => return false,
                },
            }
        }
    }

    /// This executor's claim of up to `want` leases, the queue walk starting at `due_from`.
    fn request<'a>(&'a self, want: u32, due_from: &'a [Option<DateTime<Utc>>]) -> ClaimRequest<'a> {
        ClaimRequest {
            namespace: &self.namespace,
            executor_id: &self.executor_id,
            queues: self.queues.as_deref(),
            credentials: self.credentials.as_deref(),
            limit: i64::from(want),
            lease_ttl: self.settings.lease_ttl,
            due_from,
        }
    }

    /// Drops the events that arrived while the dispatcher had no credit (the next claim sees
    /// what they announced), telling `marks` of tasks due earlier than where walks start.
    fn drain_events(&mut self, marks: &mut DueMarks) {
        loop {
            match self.events.try_recv() {
                Ok(Event::Due(at)) => marks.heard_due(at),
                Ok(_) => {}
                Err(broadcast::error::TryRecvError::Lagged(_)) => marks.heard_due(None),
                Err(_) => return,
            }
        }
    }
}

/// A non-negative number of milliseconds as a sleep, capped at [`MAX_IDLE`].
fn millis(ms: f64) -> Duration {
    Duration::from_micros((ms.max(0.0) * 1000.0).ceil() as u64).min(MAX_IDLE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_straggler_claim_walks_again_at_once_only_after_a_full_batch_of_stragglers() {
        let quick = Duration::from_millis(3);
        let period = Duration::from_secs(5);
        assert_eq!(straggler_pause_after(period, true, quick), Duration::ZERO);
        assert_eq!(
            straggler_pause_after(period, false, quick),
            period,
            "a batch that reached the main claim's backlog"
        );
        assert_eq!(
            straggler_pause_after(period, false, Duration::from_secs(1)),
            Duration::from_secs(20),
            "a slow walk spaces the next by twenty times its length"
        );
    }

    #[test]
    fn only_the_main_loop_lingers_and_only_after_a_handful() {
        // Steady traffic: a claim finds what came due while the last one ran.
        assert!(lingers_after(Role::Main, 20, 512));
        assert!(lingers_after(Role::Main, LINGER_MIN, 512));
        // A trickle is claimed at once: one task, or a few.
        assert!(!lingers_after(Role::Main, 1, 512));
        assert!(!lingers_after(Role::Main, LINGER_MIN - 1, 512));
        // A full batch means a backlog: the next claim goes at once.
        assert!(!lingers_after(Role::Main, 512, 512));
        assert!(!lingers_after(Role::Main, 40, 40));
        // The other loops keep their own pace.
        assert!(!lingers_after(Role::Stragglers, 20, 32));
    }
}
