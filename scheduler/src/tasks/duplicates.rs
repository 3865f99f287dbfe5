//! The duplicate content guard: a task to the same recipient with the same rendered content as
//! another one due within a window ends CANCELLED (end reason `duplicate_content`) unsent.
//! The window comes from the task (`TaskSpec.duplicate_window`), its campaign
//! (`CampaignSpec.duplicate_window`) or its queue (`HERALD_DUPLICATE_CONTENT_WINDOWS`), first
//! set wins.
//!
//! Decided at creation, not at claim. Why: the claim is the hot, carefully planned statement
//! every send goes through (accounts, pacing, windows); a check there would cost every send and
//! make a duplicate look like a claimable task until the moment it is skipped. At creation the
//! caller learns at once (the created task is CANCELLED with the reason), the check runs only for
//! guarded tasks, and "the same message within the window" compares due times, which are known
//! then. The cost of deciding early: a task that is later cancelled or fails still blocked the
//! duplicates created while it was live (a duplicate created after it ended is let through).
//!
//! Across replicas: the guard takes a transaction-scoped advisory lock per (namespace,
//! recipient, content) before looking, so two replicas creating the same message at once are
//! ordered, and the second sees the first's row.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use deadpool_postgres::GenericClient;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::model::NewTask;
use crate::store::{Db, StoreError};

/// The error a guarded duplicate ends with.
pub const DUPLICATE_CONTENT: &str = "duplicate content";

/// Longest duplicate window.
pub const MAX_WINDOW_MS: i64 = 7 * 86_400_000;

/// Per-queue duplicate windows from the scheduler's configuration, in milliseconds.
#[derive(Debug, Clone, Default)]
pub struct DuplicateWindows(Arc<HashMap<String, i64>>);

impl DuplicateWindows {
    /// Parses `queue=duration,queue=duration` (durations as `10m`, `30s`); empty for none.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut map = HashMap::new();
        for entry in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (queue, window) = entry
                .split_once('=')
                .ok_or_else(|| format!("{entry:?} is not queue=duration"))?;
            let d =
                humantime::parse_duration(window.trim()).map_err(|e| format!("{entry:?}: {e}"))?;
            let ms = i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
            if !(1_000..=MAX_WINDOW_MS).contains(&ms) {
                return Err(format!(
                    "{entry:?}: the window must be between 1 s and 7 days"
                ));
            }
            map.insert(queue.trim().to_string(), ms);
        }
        Ok(DuplicateWindows(Arc::new(map)))
    }

    /// Gives tasks without a window of their own their queue's.
    pub fn apply(&self, tasks: &mut [NewTask]) {
        if self.0.is_empty() {
            return;
        }
        for t in tasks {
            if t.duplicate_window_ms.is_none() {
                t.duplicate_window_ms = self.0.get(&t.queue).copied();
            }
        }
    }
}

/// The advisory lock key of a message: namespace, recipient and content hash.
fn lock_key(namespace: &str, recipient: &str, hash: &[u8]) -> i64 {
    let d = Sha256::new()
        .chain_update(namespace.as_bytes())
        .chain_update([0])
        .chain_update(recipient.as_bytes())
        .chain_update([0])
        .chain_update(hash)
        .finalize();
    let mut key = [0u8; 8];
    key.copy_from_slice(&d[..8]);
    i64::from_be_bytes(key)
}

/// Runs the guard on `tasks` (those of `inserted` that are new and guarded) in the inserting
/// transaction `db`; returns the ids it ended as duplicates.
pub async fn guard(
    db: &impl GenericClient,
    namespace: &str,
    tasks: &[&NewTask],
) -> Result<Vec<Uuid>, StoreError> {
    let guarded: Vec<(&NewTask, i64, Vec<u8>)> = tasks
        .iter()
        .filter_map(|t| {
            t.duplicate_window_ms.map(|w| {
                let hash = Sha256::digest(prost::Message::encode_to_vec(&t.content)).to_vec();
                (*t, w, hash)
            })
        })
        .collect();
    if guarded.is_empty() {
        return Ok(Vec::new());
    }
    // Sorted, so two transactions locking overlapping keys take them in the same order.
    let keys: BTreeSet<i64> = guarded
        .iter()
        .map(|(t, _, h)| lock_key(namespace, &t.recipient, h))
        .collect();
    let keys: Vec<i64> = keys.into_iter().collect();
    db.tasks().lock_keys(&keys).await?;
    let ids: Vec<Uuid> = guarded.iter().map(|(t, _, _)| t.id).collect();
    let windows: Vec<i64> = guarded.iter().map(|(_, w, _)| *w).collect();
    let hashes: Vec<Vec<u8>> = guarded.into_iter().map(|(_, _, h)| h).collect();
    db.tasks()
        .guard_duplicates(namespace, &ids, &windows, &hashes)
        .await
}
