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
            // A full or closed stream loses the revoke; the cancel is still final in the database
            // and CancelTask answers UNCONFIRMED.
            if outbound.try_send(frame).is_err() {
                tracing::warn!(%task_id, attempt, executor_id, "revoke not delivered");
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
