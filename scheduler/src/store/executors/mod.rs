//! Executor presence: which executors are connected (to any replica), the queues they serve
//! and the credentials they hold (migration V24). Written by the lease sessions, read by the
//! console's "why is it waiting".

use std::collections::HashSet;
use std::time::Duration;

use deadpool_postgres::GenericClient;
use uuid::Uuid;

use super::sql::{column, statement, Statement};
use super::{repository, StoreError};

repository!(
    /// Connected executors.
    ExecutorRepo
);

const UPSERT_SESSION: Statement = statement!("upsert_session");
const REMOVE_SESSION: Statement = statement!("remove_session");
const SERVING: Statement = statement!("serving");
const LIVE_ELSEWHERE: Statement = statement!("live_elsewhere");

/// What one other live executor serves: its queues and the credentials refs it holds, each
/// empty for every one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Its queues; empty for every queue.
    pub queues: Vec<String>,
    /// Its credentials refs; empty for every account's.
    pub credentials: Vec<String>,
}

/// One live session as its replica records it.
#[derive(Debug, Clone)]
pub struct Session<'a> {
    /// The namespace.
    pub namespace: &'a str,
    /// The executor.
    pub executor_id: &'a str,
    /// This session.
    pub session_id: Uuid,
    /// The replica holding it.
    pub scheduler_id: &'a str,
    /// Its queues; empty for every queue.
    pub queues: &'a [String],
    /// The credentials refs it holds; empty for every account's.
    pub credentials: &'a [String],
}

/// Who serves a queue now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Serving {
    /// No live executor serves the queue.
    Nobody,
    /// Some executor serves it and sends for every account.
    AnyAccount,
    /// The executors serving it hold only these credentials refs.
    Accounts(HashSet<String>),
}

impl<C: GenericClient> ExecutorRepo<'_, C> {
    /// Records or refreshes a live session.
    pub async fn upsert(&self, s: &Session<'_>) -> Result<(), StoreError> {
        UPSERT_SESSION
            .execute(
                self.db,
                &[
                    &s.namespace,
                    &s.executor_id,
                    &s.session_id,
                    &s.scheduler_id,
                    &s.queues,
                    &s.credentials,
                ],
            )
            .await?;
        Ok(())
    }

    /// Forgets a session that ended (unless a newer one replaced it).
    pub async fn remove(
        &self,
        namespace: &str,
        executor_id: &str,
        session_id: Uuid,
    ) -> Result<(), StoreError> {
        REMOVE_SESSION
            .execute(self.db, &[&namespace, &executor_id, &session_id])
            .await?;
        Ok(())
    }

    /// Who serves `queue` among the executors seen within `fresh`.
    pub async fn serving(
        &self,
        namespace: &str,
        queue: &str,
        fresh: Duration,
    ) -> Result<Serving, StoreError> {
        let rows = SERVING
            .query(self.db, &[&namespace, &queue, &(fresh.as_millis() as f64)])
            .await?;
        if rows.is_empty() {
            return Ok(Serving::Nobody);
        }
        let mut held = HashSet::new();
        for r in rows {
            let credentials: Vec<String> = column(&r, "credentials")?;
            if credentials.is_empty() {
                return Ok(Serving::AnyAccount);
            }
            held.extend(credentials);
        }
        Ok(Serving::Accounts(held))
    }

    /// The executors of `namespace` other than `executor_id` seen within `fresh`.
    pub async fn live_elsewhere(
        &self,
        namespace: &str,
        executor_id: &str,
        fresh: Duration,
    ) -> Result<Vec<Holder>, StoreError> {
        LIVE_ELSEWHERE
            .query(
                self.db,
                &[&namespace, &executor_id, &(fresh.as_millis() as f64)],
            )
            .await?
            .iter()
            .map(|r| {
                Ok(Holder {
                    queues: column(r, "queues")?,
                    credentials: column(r, "credentials")?,
                })
            })
            .collect()
    }
}
