//! The executors connected to this replica, by id, so a revoke announced by any replica reaches
//! the stream of the executor holding the lease.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use uuid::Uuid;

use super::{LeaseRef, ToExecutor};

/// Outbound frames of one session.
pub type Outbound = mpsc::Sender<ToExecutor>;

/// Connected executors of this replica.
#[derive(Clone, Default)]
pub struct Registry {
    sessions: Arc<Mutex<HashMap<String, (u64, Outbound)>>>,
}

impl Registry {
    /// Registers a session; a newer stream of the same executor replaces an older one. Returns
    /// a generation number for [`Registry::remove`].
    pub fn insert(&self, executor_id: &str, outbound: Outbound) -> u64 {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let generation = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Ok(mut map) = self.sessions.lock() {
            map.insert(executor_id.to_string(), (generation, outbound));
        }
        generation
    }

    /// Unregisters a session unless a newer one of the same executor took its place.
    pub fn remove(&self, executor_id: &str, generation: u64) {
        if let Ok(mut map) = self.sessions.lock() {
            if map.get(executor_id).is_some_and(|(g, _)| *g == generation) {
                map.remove(executor_id);
            }
        }
    }

    /// Forwards a revoke to the executor's stream if it is connected here.
    pub fn revoke(&self, executor_id: &str, task_id: Uuid, attempt: i32) {
        let outbound = self
            .sessions
            .lock()
            .ok()
            .and_then(|map| map.get(executor_id).map(|(_, o)| o.clone()));
        if let Some(outbound) = outbound {
            let frame = ToExecutor::Revoke(LeaseRef {
                task_ref: task_id.to_string(),
                attempt,
            });
            // A stream busy with lease batches still gets the revoke, after them: dropped, the
            // lease it named was sent although the executor could have stopped it. A closed
            // stream loses it; the cancel is still final in the database, CancelTask answers
            // UNCONFIRMED, and the executor's next extension finds the lease lost.
            match outbound.try_send(frame) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(frame)) => {
                    let executor_id = executor_id.to_owned();
                    tokio::spawn(async move {
                        if outbound.send(frame).await.is_err() {
                            tracing::warn!(%task_id, attempt, executor_id, "revoke not delivered");
                        }
                    });
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    tracing::warn!(%task_id, attempt, executor_id, "revoke not delivered");
                }
            }
        }
    }

    /// Every connected session's outbound channel, for draining on shutdown.
    pub fn all(&self) -> Vec<Outbound> {
        self.sessions
            .lock()
            .map(|map| map.values().map(|(_, o)| o.clone()).collect())
            .unwrap_or_default()
    }

    /// How many executors are connected here.
    pub fn len(&self) -> usize {
        self.sessions.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// True when no executor is connected here.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_revoke_to_a_full_stream_follows_what_fills_it() {
        let registry = Registry::default();
        let (tx, mut rx) = mpsc::channel(1);
        let generation = registry.insert("e", tx.clone());
        assert!(tx
            .try_send(ToExecutor::Heartbeat(chrono::Utc::now()))
            .is_ok());
        let task = Uuid::new_v4();
        registry.revoke("e", task, 3);
        // Every sender gone but the revoke's own: a dropped revoke ends the stream instead.
        registry.remove("e", generation);
        drop(tx);
        assert!(matches!(rx.recv().await, Some(ToExecutor::Heartbeat(_))));
        match rx.recv().await {
            Some(ToExecutor::Revoke(lease)) => {
                assert_eq!((lease.task_ref, lease.attempt), (task.to_string(), 3));
            }
            other => panic!("the revoke was dropped: {}", other.is_some()),
        }
    }
}
