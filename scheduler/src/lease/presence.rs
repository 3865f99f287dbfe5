//! Executor presence: while a lease session lasts, its replica records it in the database
//! (queues served, credentials held) and refreshes it, so any replica's console can tell "no
//! executor connected for this queue" from "connected, the task goes at the next claim". A
//! failed write is logged and tried again at the next refresh: presence is advisory and never
//! holds up leasing.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::store::executors::Session;
use crate::store::{Db, Store};

/// How often a live session's record is refreshed.
pub const REFRESH: Duration = Duration::from_secs(10);
/// How long a record counts as live without a refresh: a replica that died stops refreshing
/// its sessions, and they stop counting after this.
pub const FRESH: Duration = Duration::from_secs(35);

/// A session's presence, refreshed until [`Presence::end`].
pub struct Presence {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// Who is present: the session's facts.
#[derive(Debug, Clone)]
pub struct Present {
    /// The namespace.
    pub namespace: String,
    /// The executor.
    pub executor_id: String,
    /// The replica holding the session.
    pub scheduler_id: String,
    /// Its queues (empty: every queue).
    pub queues: Vec<String>,
    /// Its credentials refs (empty: every account's).
    pub credentials: Vec<String>,
}

impl Presence {
    /// Records the session now and every [`REFRESH`] after.
    pub fn start(store: Store, present: Present) -> Self {
        let stop = CancellationToken::new();
        let session_id = Uuid::now_v7();
        let until = stop.clone();
        let task = tokio::spawn(async move {
            loop {
                if let Err(e) = record(&store, &present, session_id).await {
                    tracing::warn!(executor_id = %present.executor_id, error = %e,
                        "recording executor presence failed; trying again at the next refresh");
                }
                tokio::select! {
                    _ = until.cancelled() => break,
                    _ = tokio::time::sleep(REFRESH) => {}
                }
            }
            let removed = async {
                store
                    .conn()
                    .await?
                    .executors()
                    .remove(&present.namespace, &present.executor_id, session_id)
                    .await
            };
            if let Err(e) = removed.await {
                tracing::warn!(executor_id = %present.executor_id, error = %e,
                    "forgetting executor presence failed; it goes stale instead");
            }
        });
        Presence { stop, task }
    }

    /// Ends the session's presence: its record is deleted.
    pub async fn end(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

async fn record(
    store: &Store,
    p: &Present,
    session_id: Uuid,
) -> Result<(), crate::store::StoreError> {
    store
        .conn()
        .await?
        .executors()
        .upsert(&Session {
            namespace: &p.namespace,
            executor_id: &p.executor_id,
            session_id,
            scheduler_id: &p.scheduler_id,
            queues: &p.queues,
            credentials: &p.credentials,
        })
        .await
}
