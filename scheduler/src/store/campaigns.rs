//! The campaign aggregate: campaigns, their recipients (as tasks linked by `campaign_id`),
//! progress, pause, resume and cancel.
//!
//! Pausing parks a campaign's live tasks by prefixing their route with `paused:`: the claim
//! only probes the routes of the namespace's queue, pools and accounts, so parked tasks are
//! never visited by it (no extra predicate, no index change) and a retry of a task that was
//! leased at pause time comes back parked too. Cancelling does the same with `cancelled:` for
//! leased tasks, so a send that fails after the cancel is never retried.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::tasks::{create_tasks_in, CreateError};
use super::{Store, StoreError};
use crate::model::NewTask;

/// A campaign as stored.
#[derive(Debug, Clone)]
pub struct CampaignRecord {
    /// Id.
    pub id: Uuid,
    /// 'active' | 'paused' | 'cancelled' | 'finished'.
    pub state: String,
    /// Encoded `herald.v1.CampaignSpec`.
    pub spec: Vec<u8>,
    /// Target pool.
    pub pool: Option<String>,
    /// Recipients accepted.
    pub recipient_count: i32,
    /// Created.
    pub created_at: DateTime<Utc>,
}

/// Task counts of a campaign by state, with what the finish estimate needs.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    /// SCHEDULED or LEASED.
    pub live: i64,
    /// SUCCEEDED.
    pub succeeded: i64,
    /// FAILED.
    pub failed: i64,
    /// CANCELLED.
    pub cancelled: i64,
    /// EXPIRED.
    pub expired: i64,
    /// The latest due time of a live task.
    pub last_due: Option<DateTime<Utc>>,
    /// Sum of the pool's active accounts' effective rates, per second.
    pub pool_rate: f64,
    /// The database's now.
    pub now: Option<DateTime<Utc>>,
}

/// What AddRecipients did.
#[derive(Debug, Clone, Copy)]
pub struct Added {
    /// New tasks.
    pub added: usize,
    /// Dropped as already present.
    pub duplicates: usize,
    /// Recipients now.
    pub total: i32,
}

/// Why recipients were not added.
#[derive(Debug, thiserror::Error)]
pub enum AddError {
    /// No such campaign.
    #[error("campaign not found")]
    NotFound,
    /// The campaign is cancelled or finished.
    #[error("campaign is {0}")]
    Ended(String),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

const COLUMNS: &str = "id, state::text, spec, pool, recipient_count, created_at";

fn from_row(r: &tokio_postgres::Row) -> CampaignRecord {
    CampaignRecord {
        id: r.get(0),
        state: r.get(1),
        spec: r.get(2),
        pool: r.get(3),
        recipient_count: r.get(4),
        created_at: r.get(5),
    }
}

/// What cancelling the rows did; the caller revokes `leased` through the task cancel path.
#[derive(Debug, Clone, Default)]
pub struct CancelledRows {
    /// Scheduled tasks cancelled.
    pub scheduled: u64,
    /// Leased tasks, to revoke.
    pub leased: Vec<Uuid>,
}

impl Store {
    /// Inserts a campaign.
    pub async fn create_campaign(
        &self,
        namespace: &str,
        id: Uuid,
        name: &str,
        spec: &[u8],
        pool: Option<&str>,
    ) -> Result<CampaignRecord, StoreError> {
        let conn = self.conn().await?;
        let row = conn
            .query_one(
                &format!(
                    "INSERT INTO herald.campaigns (namespace, id, name, spec, pool)
                     VALUES ($1, $2, $3, $4, $5) RETURNING {COLUMNS}"
                ),
                &[&namespace, &id, &name, &spec, &pool],
            )
            .await
            .map_err(StoreError::query("inserting a campaign"))?;
        Ok(from_row(&row))
    }

    /// Reads a campaign.
    pub async fn get_campaign(
        &self,
        namespace: &str,
        id: Uuid,
    ) -> Result<Option<CampaignRecord>, StoreError> {
        let conn = self.conn().await?;
        let row = conn
            .query_opt(
                &format!("SELECT {COLUMNS} FROM herald.campaigns WHERE namespace = $1 AND id = $2"),
                &[&namespace, &id],
            )
            .await
            .map_err(StoreError::query("reading a campaign"))?;
        Ok(row.as_ref().map(from_row))
    }

    /// Adds recipients in one transaction: drops those already in the campaign (and repeats
    /// within `recipients`), asks `build` for the tasks of the rest — given each one's index in
    /// `recipients` and its sequence number in the campaign — and inserts them linked to the
    /// campaign (parked if it is paused). The campaign row is locked throughout, so chunks,
    /// pause, resume and cancel of one campaign apply one at a time.
    pub async fn add_campaign_recipients(
        &self,
        namespace: &str,
        id: Uuid,
        recipients: &[&str],
        build: impl FnOnce(&[(usize, i32)]) -> Vec<NewTask>,
    ) -> Result<Added, AddError> {
        let mut conn = self.conn().await?;
        let tx = conn
            .transaction()
            .await
            .map_err(StoreError::query("starting to add recipients"))?;
        let Some(row) = tx
            .query_opt(
                "SELECT state::text, recipient_count FROM herald.campaigns
                 WHERE namespace = $1 AND id = $2 FOR UPDATE",
                &[&namespace, &id],
            )
            .await
            .map_err(StoreError::query("locking a campaign"))?
        else {
            return Err(AddError::NotFound);
        };
        let state: String = row.get(0);
        let count: i32 = row.get(1);
        if state == "cancelled" || state == "finished" {
            return Err(AddError::Ended(state));
        }
        let present: HashSet<String> = tx
            .query(
                "SELECT recipient FROM herald.tasks
                 WHERE campaign_id = $1 AND recipient = ANY($2)",
                &[&id, &recipients],
            )
            .await
            .map_err(StoreError::query("finding present recipients"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut seen: HashSet<&str> = HashSet::new();
        let mut fresh: Vec<(usize, i32)> = Vec::new();
        for (i, r) in recipients.iter().enumerate() {
            if !present.contains(*r) && seen.insert(r) {
                fresh.push((i, count + fresh.len() as i32));
            }
        }
        let duplicates = recipients.len() - fresh.len();
        if fresh.is_empty() {
            return Ok(Added {
                added: 0,
                duplicates,
                total: count,
            });
        }
        let tasks = build(&fresh);
        let ids: Vec<Uuid> = tasks.iter().map(|t| t.id).collect();
        create_tasks_in(&tx, namespace, &tasks)
            .await
            .map_err(|e| match e {
                CreateError::Store(e) => AddError::Store(e),
                // Campaign tasks carry no idempotency keys.
                CreateError::KeyConflict { .. } => AddError::Store(StoreError::Corrupt(
                    "campaign task with an idempotency key".into(),
                )),
            })?;
        tx.execute(
            "UPDATE herald.tasks
             SET campaign_id = $1,
                 route = CASE WHEN $3 THEN 'paused:' || route ELSE route END
             WHERE id = ANY($2)",
            &[&id, &ids, &(state == "paused")],
        )
        .await
        .map_err(StoreError::query("linking tasks to a campaign"))?;
        let total: i32 = tx
            .query_one(
                "UPDATE herald.campaigns
                 SET recipient_count = recipient_count + $3, updated_at = now()
                 WHERE namespace = $1 AND id = $2 RETURNING recipient_count",
                &[&namespace, &id, &(fresh.len() as i32)],
            )
            .await
            .map_err(StoreError::query("counting recipients"))?
            .get(0);
        tx.commit()
            .await
            .map_err(StoreError::query("committing recipients"))?;
        Ok(Added {
            added: fresh.len(),
            duplicates,
            total,
        })
    }

    /// Counts a campaign's tasks by state: one GROUP BY that reads only the
    /// (campaign_id, state, run_at) index.
    pub async fn campaign_progress(
        &self,
        namespace: &str,
        id: Uuid,
        pool: Option<&str>,
    ) -> Result<Progress, StoreError> {
        let conn = self.conn().await?;
        let rows = conn
            .query(
                "SELECT state::text, count(*), max(run_at), now() FROM herald.tasks
                 WHERE campaign_id = $1 GROUP BY state",
                &[&id],
            )
            .await
            .map_err(StoreError::query("counting a campaign's tasks"))?;
        let mut p = Progress::default();
        for r in &rows {
            let n: i64 = r.get(1);
            p.now = r.get(3);
            match r.get::<_, &str>(0) {
                "scheduled" | "leased" => {
                    p.live += n;
                    let due: Option<DateTime<Utc>> = r.get(2);
                    p.last_due = p.last_due.max(due);
                }
                "succeeded" => p.succeeded += n,
                "failed" => p.failed += n,
                "cancelled" => p.cancelled += n,
                _ => p.expired += n,
            }
        }
        if let Some(pool) = pool {
            p.pool_rate = conn
                .query_one(
                    "SELECT coalesce(sum(effective_rate), 0)::float8 FROM herald.accounts
                     WHERE namespace = $1 AND pool = $2 AND state = 'active'",
                    &[&namespace, &pool],
                )
                .await
                .map_err(StoreError::query("summing a pool's rates"))?
                .get(0);
        }
        Ok(p)
    }

    /// Pauses (parks live tasks) or resumes (unparks them and wakes dispatchers) a campaign.
    /// Returns the campaign afterwards; a cancelled or finished one is returned unchanged.
    pub async fn set_campaign_paused(
        &self,
        namespace: &str,
        id: Uuid,
        paused: bool,
    ) -> Result<Option<CampaignRecord>, StoreError> {
        let mut conn = self.conn().await?;
        let tx = conn
            .transaction()
            .await
            .map_err(StoreError::query("starting a campaign pause"))?;
        let Some(row) = tx
            .query_opt(
                "SELECT state::text FROM herald.campaigns
                 WHERE namespace = $1 AND id = $2 FOR UPDATE",
                &[&namespace, &id],
            )
            .await
            .map_err(StoreError::query("locking a campaign"))?
        else {
            return Ok(None);
        };
        let state: String = row.get(0);
        let from = if paused { "active" } else { "paused" };
        if state == from {
            if paused {
                // A claim that locked some of these rows first finishes leasing them (they are
                // then LEASED, and parked too, so a retry stays parked); later claims never see
                // the parked route.
                tx.execute(
                    "UPDATE herald.tasks SET route = 'paused:' || route, updated_at = now()
                     WHERE campaign_id = $1 AND state IN ('scheduled', 'leased')
                       AND route NOT LIKE 'paused:%'",
                    &[&id],
                )
                .await
                .map_err(StoreError::query("parking a campaign's tasks"))?;
            } else {
                tx.execute(
                    "UPDATE herald.tasks SET route = substr(route, 8), updated_at = now()
                     WHERE campaign_id = $1 AND state IN ('scheduled', 'leased')
                       AND route LIKE 'paused:%'",
                    &[&id],
                )
                .await
                .map_err(StoreError::query("unparking a campaign's tasks"))?;
                // Tasks whose slot passed while paused are due now: wake the dispatchers.
                tx.execute(
                    "SELECT pg_notify('herald_due',
                         (extract(epoch FROM now()) * 1000000)::bigint::text)",
                    &[],
                )
                .await
                .map_err(StoreError::query("announcing a resume"))?;
            }
            tx.execute(
                "UPDATE herald.campaigns
                 SET state = $3::text::herald.campaign_state, updated_at = now()
                 WHERE namespace = $1 AND id = $2",
                &[&namespace, &id, &(if paused { "paused" } else { "active" })],
            )
            .await
            .map_err(StoreError::query("pausing a campaign"))?;
        }
        tx.commit()
            .await
            .map_err(StoreError::query("committing a campaign pause"))?;
        self.get_campaign(namespace, id).await
    }

    /// Marks a campaign cancelled, cancels its scheduled tasks and parks its leased ones for
    /// good, in one transaction; returns None if there is no such campaign.
    pub async fn cancel_campaign_rows(
        &self,
        namespace: &str,
        id: Uuid,
    ) -> Result<Option<CancelledRows>, StoreError> {
        let mut conn = self.conn().await?;
        let tx = conn
            .transaction()
            .await
            .map_err(StoreError::query("starting a campaign cancel"))?;
        let found = tx
            .execute(
                "UPDATE herald.campaigns SET state = 'cancelled', updated_at = now()
                 WHERE namespace = $1 AND id = $2",
                &[&namespace, &id],
            )
            .await
            .map_err(StoreError::query("cancelling a campaign"))?;
        if found == 0 {
            return Ok(None);
        }
        let scheduled = tx
            .execute(
                "UPDATE herald.tasks
                 SET state = 'cancelled', cancel_outcome = 1, finished_at = now(),
                     updated_at = now()
                 WHERE campaign_id = $1 AND state = 'scheduled'",
                &[&id],
            )
            .await
            .map_err(StoreError::query("cancelling a campaign's tasks"))?;
        // Read after the update, so a task a concurrent claim leased meanwhile is seen here.
        let leased: Vec<Uuid> = tx
            .query(
                "UPDATE herald.tasks SET route = 'cancelled:' || route
                 WHERE campaign_id = $1 AND state = 'leased' AND route NOT LIKE 'cancelled:%'
                 RETURNING id",
                &[&id],
            )
            .await
            .map_err(StoreError::query("parking a campaign's leased tasks"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        tx.commit()
            .await
            .map_err(StoreError::query("committing a campaign cancel"))?;
        Ok(Some(CancelledRows { scheduled, leased }))
    }
}

impl Store {
    /// Marks campaigns whose every task has ended as finished and raises `campaign.finished`
    /// (see migration V8); returns how many.
    pub async fn finish_campaigns(&self) -> Result<i32, StoreError> {
        let conn = self.conn().await?;
        let row = conn
            .query_one("SELECT herald.finish_campaigns()", &[])
            .await
            .map_err(StoreError::query("finishing campaigns"))?;
        Ok(row.get(0))
    }
}
