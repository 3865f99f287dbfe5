//! The campaign repository: campaigns, their recipients (tasks linked by `campaign_id`),
//! progress, pause, resume and cancel.
//!
//! Pausing parks a campaign's live tasks by prefixing their route with `paused:`: the claim
//! only probes the routes of the namespace's queue, pools and accounts, so parked tasks are
//! never visited by it (no extra predicate, no index change) and a retry of a task that was
//! leased at pause time comes back parked too. Cancelling does the same with `cancelled:` for
//! leased tasks, so a send that fails after the cancel is never retried.

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use uuid::Uuid;

use super::sql::{column, statement, FromRow, Statement};
use super::stats::delivery_counts;
use super::tasks::announce_due_now;
use super::tasks::columns::end_reason;
use super::{repository, StoreError};
use crate::campaigns::model::{
    AudienceProgress, CampaignRecord, CancelledRows, FailureReason, Progress,
};

repository!(
    /// Campaigns.
    CampaignRepo
);

/// What a campaign read selects; decoded by [`CampaignRecord::from_row`].
const CAMPAIGN_COLUMNS: &str = "id, state::text AS state, spec, pool, recipient_count, \
     created_at, audience_pending, audience_after, audience_at, audience_error";

fn expand(name: &'static str, sql: &str) -> Statement {
    Statement::built(name, sql.replace("{campaign_columns}", CAMPAIGN_COLUMNS))
}

static INSERT_CAMPAIGN: LazyLock<Statement> =
    LazyLock::new(|| expand("insert_campaign", include_str!("insert_campaign.sql")));
static CAMPAIGN_BY_KEY: LazyLock<Statement> =
    LazyLock::new(|| expand("campaign_by_key", include_str!("campaign_by_key.sql")));
static GET_CAMPAIGN: LazyLock<Statement> =
    LazyLock::new(|| expand("get_campaign", include_str!("get_campaign.sql")));
static LIST_CAMPAIGNS: LazyLock<Statement> =
    LazyLock::new(|| expand("list_campaigns", include_str!("list_campaigns.sql")));
const FAILURE_REASONS: Statement = statement!("failure_reasons");
const SENDS_PER_INTERVAL: Statement = statement!("sends_per_interval");
const LOCK_CAMPAIGN: Statement = statement!("lock_campaign");
const PRESENT_RECIPIENTS: Statement = statement!("present_recipients");
const COUNT_RECIPIENTS: Statement = statement!("count_recipients");
const PROGRESS: Statement = statement!("progress");
const POOL_RATE: Statement = statement!("pool_rate");
const DELIVERY: Statement = statement!("delivery");
const PARK_TASKS: Statement = statement!("park_tasks");
const UNPARK_TASKS: Statement = statement!("unpark_tasks");
const SET_STATE: Statement = statement!("set_state");
const CANCEL_SCHEDULED: Statement = statement!("cancel_scheduled");
const PARK_LEASED_FOR_GOOD: Statement = statement!("park_leased_for_good");
const FINISH_CAMPAIGNS: Statement = statement!("finish_campaigns");
const PENDING_AUDIENCES: Statement = statement!("pending_audiences");
const ADVANCE_AUDIENCE: Statement = statement!("advance_audience");

/// The SQL of `herald.finish_campaigns`, applied by the migrator whenever it changes.
pub const FUNCTIONS_SQL: &str = include_str!("functions.sql");

impl FromRow for CampaignRecord {
    fn from_row(r: &Row) -> Result<Self, StoreError> {
        Ok(CampaignRecord {
            id: column(r, "id")?,
            state: column(r, "state")?,
            spec: column(r, "spec")?,
            pool: column(r, "pool")?,
            recipient_count: column(r, "recipient_count")?,
            created_at: column(r, "created_at")?,
            audience: AudienceProgress {
                pending: column(r, "audience_pending")?,
                after: column(r, "audience_after")?,
                at: column(r, "audience_at")?,
                error: column(r, "audience_error")?,
            },
        })
    }
}

impl<C: GenericClient> CampaignRepo<'_, C> {
    /// Inserts a campaign; None when `idempotency_key` is taken in the namespace (read the
    /// campaign holding it with [`Self::by_key`]).
    #[allow(clippy::too_many_arguments)]
    pub async fn create(
        &self,
        namespace: &str,
        id: Uuid,
        name: &str,
        spec: &[u8],
        pool: Option<&str>,
        audience_at: Option<DateTime<Utc>>,
        idempotency_key: Option<&str>,
    ) -> Result<Option<CampaignRecord>, StoreError> {
        let pending = audience_at.is_some();
        INSERT_CAMPAIGN
            .query_opt(
                self.db,
                &[
                    &namespace,
                    &id,
                    &name,
                    &spec,
                    &pool,
                    &pending,
                    &audience_at,
                    &idempotency_key,
                ],
            )
            .await?
            .as_ref()
            .map(CampaignRecord::from_row)
            .transpose()
    }

    /// The campaign created with `idempotency_key` in the namespace, if any.
    pub async fn by_key(
        &self,
        namespace: &str,
        idempotency_key: &str,
    ) -> Result<Option<CampaignRecord>, StoreError> {
        CAMPAIGN_BY_KEY
            .fetch_opt(self.db, &[&namespace, &idempotency_key])
            .await
    }

    /// Reads a campaign.
    pub async fn get(
        &self,
        namespace: &str,
        id: Uuid,
    ) -> Result<Option<CampaignRecord>, StoreError> {
        GET_CAMPAIGN.fetch_opt(self.db, &[&namespace, &id]).await
    }

    /// One page of the namespace's campaigns, newest first: those with an id before
    /// `before` (ids are UUIDv7, so they sort by creation), in one of `states` (None: any).
    pub async fn list(
        &self,
        namespace: &str,
        states: Option<&[&str]>,
        before: Option<Uuid>,
        limit: i64,
    ) -> Result<Vec<CampaignRecord>, StoreError> {
        LIST_CAMPAIGNS
            .fetch(self.db, &[&namespace, &states, &before, &limit])
            .await
    }

    /// A campaign's failed tasks grouped by how their last attempt failed, largest first; at
    /// most `limit` groups.
    pub async fn failure_reasons(
        &self,
        id: Uuid,
        limit: i64,
    ) -> Result<Vec<FailureReason>, StoreError> {
        FAILURE_REASONS
            .query(self.db, &[&id, &limit])
            .await?
            .iter()
            .map(|r| {
                Ok(FailureReason {
                    end_reason: end_reason(r, "end_reason")?,
                    end_code: column(r, "end_code")?,
                    example: column(r, "example")?,
                    tasks: column(r, "tasks")?,
                })
            })
            .collect()
    }

    /// Sends per interval of `interval_ms` over the last `intervals` of them, per campaign of
    /// `ids` (index 0 the latest interval).
    pub async fn sends_per_interval(
        &self,
        ids: &[Uuid],
        intervals: i32,
        interval_ms: i64,
    ) -> Result<HashMap<Uuid, Vec<i64>>, StoreError> {
        let mut out: HashMap<Uuid, Vec<i64>> = HashMap::new();
        let rows = SENDS_PER_INTERVAL
            .query(
                self.db,
                &[&ids, &f64::from(intervals), &(interval_ms as f64)],
            )
            .await?;
        for r in rows {
            let bucket: i32 = column(&r, "bucket")?;
            let Ok(i) = usize::try_from(bucket) else {
                continue;
            };
            let counts = out
                .entry(column(&r, "campaign_id")?)
                .or_insert_with(|| vec![0; intervals.max(0) as usize]);
            if let Some(slot) = counts.get_mut(i) {
                *slot += column::<i64>(&r, "sent")?;
            }
        }
        Ok(out)
    }

    /// Locks a campaign for the rest of the transaction; its state and recipient count, or
    /// None when there is no such campaign.
    pub async fn lock(
        &self,
        namespace: &str,
        id: Uuid,
    ) -> Result<Option<(String, i32)>, StoreError> {
        let Some(row) = LOCK_CAMPAIGN.query_opt(self.db, &[&namespace, &id]).await? else {
            return Ok(None);
        };
        Ok(Some((
            column(&row, "state")?,
            column(&row, "recipient_count")?,
        )))
    }

    /// Which of `recipients` the campaign already has.
    pub async fn present(
        &self,
        id: Uuid,
        recipients: &[&str],
    ) -> Result<HashSet<String>, StoreError> {
        PRESENT_RECIPIENTS
            .query(self.db, &[&id, &recipients])
            .await?
            .iter()
            .map(|r| column(r, "recipient"))
            .collect()
    }

    /// Adds `added` to the recipient count; returns the new total.
    pub async fn count_recipients(
        &self,
        namespace: &str,
        id: Uuid,
        added: i32,
    ) -> Result<i32, StoreError> {
        column(
            &COUNT_RECIPIENTS
                .query_one(self.db, &[&namespace, &id, &added])
                .await?,
            "recipient_count",
        )
    }

    /// Counts a campaign's tasks by state, with the pool's rate when it targets one.
    pub async fn progress(
        &self,
        namespace: &str,
        id: Uuid,
        pool: Option<&str>,
    ) -> Result<Progress, StoreError> {
        let mut p = Progress::default();
        for r in PROGRESS.query(self.db, &[&id]).await? {
            let n: i64 = column(&r, "tasks")?;
            p.now = column(&r, "db_now")?;
            match column::<&str>(&r, "state")? {
                "scheduled" | "leased" => {
                    p.live += n;
                    let due: Option<DateTime<Utc>> = column(&r, "last_due")?;
                    p.last_due = p.last_due.max(due);
                }
                "succeeded" => p.succeeded += n,
                "failed" => p.failed += n,
                "cancelled" => p.cancelled += n,
                _ => p.expired += n,
            }
        }
        p.delivery = delivery_counts(&DELIVERY.query_one(self.db, &[&id]).await?)?;
        if let Some(pool) = pool {
            p.pool_rate = column(
                &POOL_RATE.query_one(self.db, &[&namespace, &pool]).await?,
                "rate",
            )?;
        }
        Ok(p)
    }

    /// Pauses (parks live tasks) or resumes (unparks them and wakes dispatchers) a campaign in
    /// the given state; a campaign in any other state is left as it is. Run it in a transaction
    /// after [`Self::lock`].
    pub async fn set_paused(
        &self,
        namespace: &str,
        id: Uuid,
        paused: bool,
    ) -> Result<(), StoreError> {
        if paused {
            PARK_TASKS.execute(self.db, &[&id]).await?;
        } else {
            UNPARK_TASKS.execute(self.db, &[&id]).await?;
            // Tasks whose slot passed while paused are due now: wake the dispatchers.
            announce_due_now(self.db).await?;
        }
        let state = if paused { "paused" } else { "active" };
        SET_STATE
            .execute(self.db, &[&namespace, &id, &state])
            .await?;
        Ok(())
    }

    /// Marks a campaign cancelled, cancels its scheduled tasks and parks its leased ones for
    /// good; None if there is no such campaign. Run it in a transaction.
    pub async fn cancel(
        &self,
        namespace: &str,
        id: Uuid,
    ) -> Result<Option<CancelledRows>, StoreError> {
        let state = "cancelled";
        if SET_STATE
            .execute(self.db, &[&namespace, &id, &state])
            .await?
            == 0
        {
            return Ok(None);
        }
        // A report or an expired lease can move a leased task back to SCHEDULED while the
        // parking waits for its row, and a claim can lease a scheduled one meanwhile: each
        // statement sees what committed before it, so both are repeated until a pass finds
        // nothing more (the campaign's row lock keeps retries and new recipients out).
        let mut scheduled = 0;
        let mut leased: Vec<Uuid> = Vec::new();
        loop {
            let cancelled = CANCEL_SCHEDULED.execute(self.db, &[&id]).await?;
            let parked = PARK_LEASED_FOR_GOOD
                .query(self.db, &[&id])
                .await?
                .iter()
                .map(|r| column(r, "id"))
                .collect::<Result<Vec<Uuid>, _>>()?;
            scheduled += cancelled;
            let done = cancelled == 0 && parked.is_empty();
            leased.extend(parked);
            if done {
                break;
            }
        }
        Ok(Some(CancelledRows { scheduled, leased }))
    }

    /// Up to `limit` campaigns (namespace, id) with audience contacts still to add.
    pub async fn pending_audiences(&self, limit: i64) -> Result<Vec<(String, Uuid)>, StoreError> {
        PENDING_AUDIENCES
            .query(self.db, &[&limit])
            .await?
            .iter()
            .map(|r| Ok((column(r, "namespace")?, column(r, "id")?)))
            .collect()
    }

    /// Moves a campaign's audience cursor from `from` to `to` after a page was added; `more`
    /// pages follow unless it `stopped` early (with why). False when another replica moved it
    /// first.
    pub async fn advance_audience(
        &self,
        namespace: &str,
        id: Uuid,
        from: &str,
        to: &str,
        more: bool,
        stopped: Option<&str>,
    ) -> Result<bool, StoreError> {
        let pending = more && stopped.is_none();
        let moved = ADVANCE_AUDIENCE
            .execute(self.db, &[&namespace, &id, &from, &to, &pending, &stopped])
            .await?;
        Ok(moved == 1)
    }

    /// Finishes campaigns whose every task has ended; returns how many.
    pub async fn finish(&self) -> Result<i32, StoreError> {
        column(&FINISH_CAMPAIGNS.query_one(self.db, &[]).await?, "finished")
    }
}
