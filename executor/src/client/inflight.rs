//! The leases this executor holds, each with its phase and cancellation token.
//!
//! A lease is `Pending` from receipt until its sender is ready (for example until the route's
//! concurrency limit lets it through), then `Sending` until the sender answers. Only a `Pending`
//! lease can still be stopped (Revoke, lost on extension, shutdown): it becomes `Cancelled` and
//! its worker drops it without a report. The phase sits behind a mutex so that "stop it" and
//! "start sending it" cannot both win.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use herald_proto::v1 as pb;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The fencing token of a lease.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct LeaseKey {
    pub(crate) task_id: String,
    pub(crate) attempt: i32,
}

impl LeaseKey {
    pub(crate) fn from_ref(r: &pb::LeaseRef) -> Self {
        LeaseKey {
            task_id: r.task_id.clone(),
            attempt: r.attempt,
        }
    }

    pub(crate) fn to_ref(&self) -> pb::LeaseRef {
        pb::LeaseRef {
            task_id: self.task_id.clone(),
            attempt: self.attempt,
        }
    }
}

/// Where a held lease is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Waiting for the sender to be ready; can still be stopped.
    Pending,
    /// Handed to the sender; its outcome will be reported.
    Sending,
    /// Stopped before sending; its worker drops it without a report.
    Cancelled,
}

/// The phase shared between the session loop and the lease's worker.
#[derive(Clone, Debug)]
pub(crate) struct SharedPhase(Arc<Mutex<Phase>>);

impl SharedPhase {
    fn new() -> Self {
        SharedPhase(Arc::new(Mutex::new(Phase::Pending)))
    }

    fn lock(&self) -> MutexGuard<'_, Phase> {
        // A worker panicking while holding the lock leaves a valid enum behind: keep going.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Moves Pending → Sending; false when the lease was cancelled first.
    pub(crate) fn start_sending(&self) -> bool {
        let mut phase = self.lock();
        match *phase {
            Phase::Cancelled => false,
            Phase::Pending | Phase::Sending => {
                *phase = Phase::Sending;
                true
            }
        }
    }

    pub(crate) fn get(&self) -> Phase {
        *self.lock()
    }
}

struct Held {
    phase: SharedPhase,
    cancel: CancellationToken,
    received: Instant,
}

/// How long a revoke for a lease not (yet) held is remembered: longer than any lease lives.
const UNHELD_REVOKE_MEMORY: Duration = Duration::from_secs(15 * 60);

/// The leases held by this process, across streams.
#[derive(Default)]
pub(crate) struct InFlight {
    held: HashMap<LeaseKey, Held>,
    /// Revokes answered NotHeld, by when: a revoke can overtake its lease (the scheduler
    /// writes revokes and lease batches from different tasks), and the lease that follows must
    /// then be dropped, not sent.
    revoked_unheld: HashMap<LeaseKey, Instant>,
}

impl InFlight {
    pub(crate) fn len(&self) -> usize {
        self.held.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    pub(crate) fn contains(&self, key: &LeaseKey) -> bool {
        self.held.contains_key(key)
    }

    /// Registers a new lease; returns what its worker needs.
    pub(crate) fn insert(
        &mut self,
        key: LeaseKey,
        now: Instant,
    ) -> (SharedPhase, CancellationToken) {
        let phase = SharedPhase::new();
        let cancel = CancellationToken::new();
        self.held.insert(
            key,
            Held {
                phase: phase.clone(),
                cancel: cancel.clone(),
                received: now,
            },
        );
        (phase, cancel)
    }

    /// Stops a Pending lease; true if it was Pending.
    fn stop(held: &Held) -> bool {
        let mut phase = held.phase.lock();
        if *phase == Phase::Pending {
            *phase = Phase::Cancelled;
            held.cancel.cancel();
            true
        } else {
            false
        }
    }

    /// Answers a Revoke.
    pub(crate) fn revoke(&mut self, key: &LeaseKey) -> pb::RevokeResult {
        let Some(held) = self.held.get(key) else {
            let now = Instant::now();
            self.revoked_unheld
                .retain(|_, at| now.duration_since(*at) < UNHELD_REVOKE_MEMORY);
            self.revoked_unheld.insert(key.clone(), now);
            return pb::RevokeResult::NotHeld;
        };
        if Self::stop(held) {
            return pb::RevokeResult::StoppedBeforeSend;
        }
        match held.phase.get() {
            Phase::Sending => pb::RevokeResult::SendInProgress,
            Phase::Pending | Phase::Cancelled => pb::RevokeResult::NotHeld,
        }
    }

    /// Whether a revoke came for this lease before the lease did (forgotten once asked).
    pub(crate) fn revoked_before_received(&mut self, key: &LeaseKey) -> bool {
        self.revoked_unheld.remove(key).is_some()
    }

    /// The lease was lost: stop it if it has not started (a send in progress finishes and its
    /// report is answered `accepted = false`).
    pub(crate) fn lose(&mut self, key: &LeaseKey) -> bool {
        self.held.get(key).is_some_and(Self::stop)
    }

    /// Stops every Pending lease (shutdown); returns them.
    pub(crate) fn stop_all_pending(&mut self) -> Vec<pb::LeaseRef> {
        self.held
            .iter()
            .filter(|(_, h)| Self::stop(h))
            .map(|(k, _)| k.to_ref())
            .collect()
    }

    /// The leases still worth extending that were received at least `age` ago.
    pub(crate) fn due_for_extension(&self, now: Instant, age: Duration) -> Vec<pb::LeaseRef> {
        self.held
            .iter()
            .filter(|(_, h)| {
                h.phase.get() != Phase::Cancelled && now.duration_since(h.received) >= age
            })
            .map(|(k, _)| k.to_ref())
            .collect()
    }

    /// Forgets a lease whose worker ended.
    pub(crate) fn remove(&mut self, key: &LeaseKey) -> bool {
        self.held.remove(key).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> LeaseKey {
        LeaseKey {
            task_id: id.into(),
            attempt: 1,
        }
    }

    #[test]
    fn revoke_depends_on_phase() {
        let mut inflight = InFlight::default();
        let now = Instant::now();
        let (_, cancel_a) = inflight.insert(key("a"), now);
        let (phase_b, _) = inflight.insert(key("b"), now);
        assert!(phase_b.start_sending());

        assert_eq!(
            inflight.revoke(&key("a")),
            pb::RevokeResult::StoppedBeforeSend
        );
        assert!(cancel_a.is_cancelled());
        assert_eq!(inflight.revoke(&key("a")), pb::RevokeResult::NotHeld);
        assert_eq!(inflight.revoke(&key("b")), pb::RevokeResult::SendInProgress);
        assert_eq!(inflight.revoke(&key("zz")), pb::RevokeResult::NotHeld);
    }

    #[test]
    fn cancelled_lease_cannot_start() {
        let mut inflight = InFlight::default();
        let (phase, _) = inflight.insert(key("a"), Instant::now());
        assert!(inflight.lose(&key("a")));
        assert!(!phase.start_sending());
        assert!(inflight.stop_all_pending().is_empty());
        let (_, cancel) = inflight.insert(key("b"), Instant::now());
        assert_eq!(inflight.stop_all_pending(), vec![key("b").to_ref()]);
        assert!(cancel.is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn extension_picks_old_leases() {
        let mut inflight = InFlight::default();
        inflight.insert(key("old"), Instant::now());
        tokio::time::advance(Duration::from_secs(10)).await;
        inflight.insert(key("new"), Instant::now());
        let due = inflight.due_for_extension(Instant::now(), Duration::from_secs(5));
        assert_eq!(due, vec![key("old").to_ref()]);
    }
}
