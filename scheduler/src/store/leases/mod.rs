//! The lease repository: the statements of the lease lifecycle after a claim (reports,
//! extensions, releases, revokes) and the sweeps of leases and deadlines that ran out. Every
//! write after a claim is fenced by (task id, lease_count). Each method that ends leases also
//! frees their account slots, so run them in a transaction: the transition and the slot change
//! commit together or not at all.

pub mod claim;

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use uuid::Uuid;

use super::sql::{column, notify, statement, Statement};
use super::tasks::announce_due_now;
use super::tasks::columns::state;
use super::{repository, Db, StoreError};
use crate::lease::reports::AttemptReport;
use crate::tasks::model::TaskState;

repository!(
    /// The lease lifecycle of tasks.
    LeaseRepo
);

const COMPLETE_ATTEMPTS: Statement = statement!("complete_attempts");
const SETTLE_LATE_REPORTS: Statement = statement!("settle_late_reports");
const BLOCK_RECIPIENTS: Statement = statement!("block_recipients");
const TASK_STATES: Statement = statement!("task_states");
const EXTEND_LEASES: Statement = statement!("extend_leases");
const RELEASE_LEASES: Statement = statement!("release_leases");
const REVOKE_STOPPED: Statement = statement!("revoke_stopped");
const EXPIRE_LEASES: Statement = statement!("expire_leases");
const LOCK_LAPSED: Statement = statement!("lock_lapsed");
const EXPIRE_DEADLINES: Statement = statement!("expire_deadlines");
const NEXT_SWEEP: Statement = statement!("next_sweep");

/// One report the database applied.
#[derive(Debug, Clone)]
pub struct Applied {
    /// Task.
    pub task_id: Uuid,
    /// Fencing attempt.
    pub attempt: i32,
    /// The task's state afterwards.
    pub state: TaskState,
    /// Its due time afterwards (the retry time when rescheduled).
    pub run_at: DateTime<Utc>,
    /// The account the lease held a slot of.
    pub account_id: Option<String>,
    /// The task had been cancelled while leased (its slot was freed then).
    pub was_cancelled: bool,
    /// For a report that gives the account's daily count back (ACCOUNT_UNAVAILABLE): whether
    /// the lease was granted on the account's current local day; None when not asked.
    pub counted_today: Option<bool>,
}

/// What one lease sweep did.
#[derive(Debug, Default, Clone)]
pub struct ExpiredLeases {
    /// Leases that ran out.
    pub expired: u64,
    /// Of those, tasks that went back to SCHEDULED.
    pub rescheduled: u64,
    /// Of those, tasks the sweep ended, by their end state.
    pub ended: Vec<(TaskState, u64)>,
    /// Where the next sweep's walk can start: no lapsed lease it could take is left before it.
    pub swept_through: Option<DateTime<Utc>>,
    /// Tasks ended SUCCEEDED because a status named their message, when that status was a
    /// failure: (namespace, task), for `callbacks::settle_failures`.
    pub failed_after_sent: Vec<(String, Uuid)>,
}

/// A row of `complete_attempts.sql` or `settle_late_reports.sql`.
fn applied(r: &tokio_postgres::Row) -> Result<Applied, StoreError> {
    Ok(Applied {
        task_id: column(r, "id")?,
        attempt: column(r, "lease_count")?,
        state: state(r, "state")?,
        run_at: column(r, "run_at")?,
        account_id: column(r, "account_id")?,
        was_cancelled: column(r, "was_cancelled")?,
        counted_today: column(r, "counted_today")?,
    })
}

impl<C: GenericClient> LeaseRepo<'_, C> {
    /// Applies reports whose fencing token still names the task's current lease, in one
    /// statement: task transitions and attempt rows. Reports with a stale token match nothing
    /// and are not returned.
    pub async fn complete(
        &self,
        namespace: &str,
        reports: &[&AttemptReport],
    ) -> Result<Vec<Applied>, StoreError> {
        let n = reports.len();
        let mut ids = Vec::with_capacity(n);
        let mut attempts = Vec::with_capacity(n);
        let mut outcomes = Vec::with_capacity(n);
        let mut errors = Vec::with_capacity(n);
        let mut provider_ids = Vec::with_capacity(n);
        let mut retry_afters = Vec::with_capacity(n);
        let mut started = Vec::with_capacity(n);
        let mut codes = Vec::with_capacity(n);
        let mut fallbacks = Vec::with_capacity(n);
        for r in reports {
            ids.push(r.task_id);
            attempts.push(r.attempt);
            outcomes.push(r.outcome as i16);
            errors.push(r.error.as_deref());
            provider_ids.push(r.provider_message_id.as_deref());
            retry_afters.push(r.retry_after_ms);
            started.push(r.started_at);
            codes.push(r.error_code);
            fallbacks.push(r.window_closed_fallback);
        }
        COMPLETE_ATTEMPTS
            .query(
                self.db,
                &[
                    &ids,
                    &attempts,
                    &outcomes,
                    &errors,
                    &provider_ids,
                    &retry_afters,
                    &started,
                    &namespace,
                    &codes,
                    &fallbacks,
                ],
            )
            .await?
            .iter()
            .map(applied)
            .collect()
    }

    /// Settles OK reports on leases the sweeper already took back while no lease came after
    /// them (`settle_late_reports.sql`): the message went out, so the task ends SUCCEEDED
    /// instead of being sent again. Frees no account slot (the sweeper did). Returns those
    /// settled.
    pub async fn settle_late(
        &self,
        namespace: &str,
        reports: &[&AttemptReport],
    ) -> Result<Vec<Applied>, StoreError> {
        if reports.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Uuid> = reports.iter().map(|r| r.task_id).collect();
        let attempts: Vec<i32> = reports.iter().map(|r| r.attempt).collect();
        let provider_ids: Vec<Option<&str>> = reports
            .iter()
            .map(|r| r.provider_message_id.as_deref())
            .collect();
        let started: Vec<Option<DateTime<Utc>>> = reports.iter().map(|r| r.started_at).collect();
        let notes: Vec<Option<&str>> = reports.iter().map(|r| r.error.as_deref()).collect();
        let fallbacks: Vec<bool> = reports.iter().map(|r| r.window_closed_fallback).collect();
        SETTLE_LATE_REPORTS
            .query(
                self.db,
                &[
                    &namespace,
                    &ids,
                    &attempts,
                    &provider_ids,
                    &started,
                    &notes,
                    &fallbacks,
                ],
            )
            .await?
            .iter()
            .map(applied)
            .collect()
    }

    /// Leaves each task's recipient alone on its account for the given milliseconds.
    pub async fn block_recipients(&self, blocks: &[(Uuid, i64)]) -> Result<(), StoreError> {
        if blocks.is_empty() {
            return Ok(());
        }
        let ids: Vec<Uuid> = blocks.iter().map(|b| b.0).collect();
        let ms: Vec<i64> = blocks.iter().map(|b| b.1).collect();
        BLOCK_RECIPIENTS.execute(self.db, &[&ids, &ms]).await?;
        Ok(())
    }

    /// The current states of tasks of the namespace; tasks of other namespaces are absent, as
    /// tasks that do not exist are.
    pub async fn states(
        &self,
        namespace: &str,
        ids: &[Uuid],
    ) -> Result<HashMap<Uuid, TaskState>, StoreError> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        TASK_STATES
            .query(self.db, &[&ids, &namespace])
            .await?
            .iter()
            .map(|r| Ok((column(r, "id")?, state(r, "state")?)))
            .collect()
    }

    /// Extends the given leases by one TTL from now; those not returned were lost.
    pub async fn extend(
        &self,
        namespace: &str,
        leases: &[(Uuid, i32)],
        lease_ttl: Duration,
    ) -> Result<Vec<(Uuid, i32, DateTime<Utc>)>, StoreError> {
        let ids: Vec<Uuid> = leases.iter().map(|l| l.0).collect();
        let attempts: Vec<i32> = leases.iter().map(|l| l.1).collect();
        EXTEND_LEASES
            .query(
                self.db,
                &[&ids, &attempts, &duration_ms(lease_ttl), &namespace],
            )
            .await?
            .iter()
            .map(|r| {
                Ok((
                    column(r, "task_id")?,
                    column(r, "attempt")?,
                    column(r, "expires_at")?,
                ))
            })
            .collect()
    }

    /// Hands leases back without charging an attempt (they never reached an executor), frees
    /// their slots and daily counts, and wakes the dispatchers.
    pub async fn release(&self, namespace: &str, leases: &[(Uuid, i32)]) -> Result<(), StoreError> {
        let ids: Vec<Uuid> = leases.iter().map(|l| l.0).collect();
        let attempts: Vec<i32> = leases.iter().map(|l| l.1).collect();
        let mut counted_today = Vec::new();
        let mut counted_before = Vec::new();
        for row in RELEASE_LEASES
            .query(self.db, &[&ids, &attempts, &namespace])
            .await?
        {
            let Some(account) = column::<Option<String>>(&row, "account")? else {
                continue;
            };
            if column::<Option<bool>>(&row, "counted_today")?.unwrap_or(false) {
                counted_today.push(account);
            } else {
                counted_before.push(account);
            }
        }
        // Nothing was sent: the daily count gets back what it counted today.
        let accounts = self.db.accounts();
        accounts
            .release_qualified_slots(&counted_today, true)
            .await?;
        accounts
            .release_qualified_slots(&counted_before, false)
            .await?;
        announce_due_now(self.db).await
    }

    /// Records that an executor dropped a cancelled task's lease before sending; true when the
    /// cancellation was still waiting for that answer (CancelTask callers are then told).
    pub async fn revoked_before_send(
        &self,
        namespace: &str,
        task_id: Uuid,
        attempt: i32,
    ) -> Result<bool, StoreError> {
        let changed = REVOKE_STOPPED
            .execute(self.db, &[&task_id, &attempt, &namespace])
            .await?
            > 0;
        if changed {
            announce_cancel_resolved(self.db, task_id).await?;
        }
        Ok(changed)
    }

    /// Returns up to `batch` lapsed leases to their queue (or fails or expires their tasks),
    /// recording the lost attempts and freeing their slots; wakes dispatchers when tasks became
    /// leasable again.
    /// A WhatsApp task waits `grace_ms` for a status callback before it is due again. The walk
    /// starts at `from` (see [`LowWater`](crate::low_water::LowWater)).
    pub async fn expire_leases(
        &self,
        batch: i64,
        grace_ms: i64,
        from: Option<DateTime<Utc>>,
    ) -> Result<ExpiredLeases, StoreError> {
        let lapsed: Vec<Uuid> = column(
            &LOCK_LAPSED.query_one(self.db, &[&batch, &from]).await?,
            "ids",
        )?;
        let row = EXPIRE_LEASES
            .query_one(self.db, &[&batch, &grace_ms, &lapsed])
            .await?;
        let swept_through = column(&row, "swept_through")?;
        let expired = u64::try_from(column::<i64>(&row, "expired")?).unwrap_or(0);
        let rescheduled = u64::try_from(column::<i64>(&row, "rescheduled")?).unwrap_or(0);
        let mut ended = Vec::with_capacity(4);
        for (state, name) in [
            (TaskState::Succeeded, "ended_succeeded"),
            (TaskState::Failed, "ended_failed"),
            (TaskState::Expired, "ended_expired"),
            (TaskState::Cancelled, "ended_cancelled"),
        ] {
            let n = u64::try_from(column::<i64>(&row, name)?).unwrap_or(0);
            if n > 0 {
                ended.push((state, n));
            }
        }
        let freed: Vec<String> = column(&row, "freed_accounts")?;
        let failed_after_sent = column::<Vec<String>>(&row, "failed_after_sent")?
            .iter()
            .filter_map(|q| {
                let (namespace, id) = q.rsplit_once('/')?;
                Some((namespace.to_owned(), id.parse().ok()?))
            })
            .collect();
        self.db
            .accounts()
            .release_qualified_slots(&freed, false)
            .await?;
        if rescheduled > 0 {
            announce_due_now(self.db).await?;
        }
        Ok(ExpiredLeases {
            expired,
            rescheduled,
            ended,
            swept_through,
            failed_after_sent,
        })
    }

    /// Expires up to `batch` scheduled tasks past their deadline; returns how many.
    pub async fn expire_deadlines(&self, batch: i64) -> Result<u64, StoreError> {
        EXPIRE_DEADLINES.execute(self.db, &[&batch]).await
    }

    /// Milliseconds until the next lease expiry (looked for from `from`) or deadline within
    /// `within`, by the database clock; None when there is none that soon.
    pub async fn next_sweep_ms(
        &self,
        from: Option<DateTime<Utc>>,
        within: Duration,
    ) -> Result<Option<f64>, StoreError> {
        let within_ms = duration_ms(within);
        column(
            &NEXT_SWEEP.query_one(self.db, &[&from, &within_ms]).await?,
            "wait_ms",
        )
    }
}

/// Announces that a cancelled task learned its outcome, so CancelTask calls waiting on any
/// replica can answer (delivered at commit).
pub async fn announce_cancel_resolved(
    db: &impl GenericClient,
    task_id: Uuid,
) -> Result<(), StoreError> {
    notify(db, "herald_cancel", &task_id.to_string()).await
}

/// A duration in whole milliseconds, saturating.
pub fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::claim::{CLAIM_DUE_SQL, DEFER_TO_WINDOW, LEASE_ASSIGNED, NEXT_DUE};
    use super::*;
    use crate::store::scratch::{insert_tasks, rows_discarded, ScratchStore};
    use crate::store::sql::Params;

    /// How many times each statement runs: PostgreSQL decides between custom and generic plans
    /// after its first five executions.
    const EXECUTIONS: usize = 8;

    /// The generic plans `statement` got on `conn`'s session.
    async fn generic_plans(conn: &deadpool_postgres::Object, statement: &Statement) -> i64 {
        conn.query_one(
            "SELECT generic_plans FROM pg_prepared_statements WHERE statement = $1",
            &[&statement.text()],
        )
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", statement.text()))
        .get(0)
    }

    /// An idle dispatcher's wake-up (`next_due.sql`) and a report of one result run many
    /// times a second on a quiet system; each planned afresh cost more than running it
    /// (docs/performance.md, S3). With the tasks table holding a few thousand rows, as in S3,
    /// custom plans for one route or one result looked cheaper than the generic plan, and
    /// PostgreSQL never kept it.
    #[tokio::test]
    async fn the_idle_wait_and_a_small_report_settle_on_a_generic_plan() {
        let store = ScratchStore::migrated().await;
        let conn = store.conn().await.unwrap_or_else(|e| panic!("{e}"));
        conn.batch_execute(
            "INSERT INTO herald.tasks (id, queue, recipient, content, priority, run_at,
                 max_attempts, backoff_initial_ms, backoff_max_ms, backoff_multiplier,
                 backoff_jitter, route, state, lease_count, executor_id, leased_at,
                 lease_expires_at)
             SELECT gen_random_uuid(), 'q', 'r' || i, '\\x00', 5,
                    now() + i * interval '10 ms', 10, 1000, 60000, 2, 0.2, 'default/',
                    CASE WHEN i % 10 = 0 THEN 'leased' ELSE 'scheduled' END::herald.task_state,
                    1, 'x', now(), now() + interval '1 hour'
             FROM generate_series(1, 20000) AS i;
             ANALYZE herald.tasks",
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let routes = vec!["default/".to_owned()];
        let no_queues: Option<Vec<String>> = None;
        let marks: Vec<Option<DateTime<Utc>>> = Vec::new();
        for _ in 0..EXECUTIONS {
            NEXT_DUE
                .query_one(&conn, &[&routes, &no_queues, &marks])
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        for _ in 0..EXECUTIONS {
            // A result for a task that is not leased matches nothing; the plan is the point.
            COMPLETE_ATTEMPTS
                .query(
                    &conn,
                    &[
                        &vec![Uuid::new_v4()],
                        &vec![1i32],
                        &vec![1i16],
                        &vec![None::<&str>],
                        &vec![None::<&str>],
                        &vec![None::<i64>],
                        &vec![Some(Utc::now())],
                        &"default",
                        &vec![None::<i64>],
                        &vec![false],
                    ],
                )
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        assert!(generic_plans(&conn, &NEXT_DUE).await > 0, "next_due");
        assert!(
            generic_plans(&conn, &COMPLETE_ATTEMPTS).await > 0,
            "complete_attempts"
        );
    }

    /// Every statement that changes a batch of tasks by id probes the primary key for each id,
    /// whatever the statistics say. With statistics taken while the table held only finished
    /// tasks and then 15,000 live ones added (a campaign landing in a table of last week's
    /// sends), `t.state = 'scheduled'` or `'leased'` made walking a partial index on the state
    /// look cheaper than the probes, and each statement read every live task of that state.
    #[tokio::test]
    async fn batch_updates_by_id_probe_the_primary_key_under_misleading_statistics() {
        let store = ScratchStore::migrated().await;
        let mut conn = store.conn().await.unwrap_or_else(|e| panic!("{e}"));
        // Only the statements under test plan from the statistics taken here.
        conn.batch_execute("ALTER TABLE herald.tasks SET (autovacuum_enabled = false)")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        insert_tasks(&conn, 20_000, "succeeded").await;
        conn.batch_execute("ANALYZE herald.tasks")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        insert_tasks(&conn, 10_000, "scheduled").await;
        insert_tasks(&conn, 5_000, "leased").await;
        let ids = |state: &'static str| {
            let conn = &conn;
            async move {
                conn.query(
                    "SELECT id FROM herald.tasks WHERE state::text = $1 LIMIT 200",
                    &[&state],
                )
                .await
                .unwrap_or_else(|e| panic!("{e}"))
                .iter()
                .map(|r| r.get::<_, Uuid>(0))
                .collect::<Vec<Uuid>>()
            }
        };
        let scheduled = ids("scheduled").await;
        let leased = ids("leased").await;
        let attempts = vec![1i32; leased.len()];
        let nothing_at: Vec<Option<DateTime<Utc>>> = vec![None; 200];
        let nothing: Vec<Option<String>> = vec![None; 200];
        let no_queues: Option<Vec<String>> = None;
        let no_marks: Vec<Option<DateTime<Utc>>> = Vec::new();
        let cases: [(&str, &str, &Params<'_>); 8] = [
            (
                "claim_due",
                CLAIM_DUE_SQL.as_str(),
                &[&no_queues, &32i64, &"x", &30_000i64, &"default/", &no_marks],
            ),
            (
                "lease_assigned",
                LEASE_ASSIGNED.text(),
                &[
                    &scheduled,
                    &nothing,
                    &"x",
                    &30_000i64,
                    &nothing_at,
                    &nothing,
                ],
            ),
            ("defer_to_window", DEFER_TO_WINDOW.text(), &[&scheduled]),
            (
                "expire_leases",
                EXPIRE_LEASES.text(),
                &[&200i64, &120_000i64, &leased],
            ),
            (
                "extend_leases",
                EXTEND_LEASES.text(),
                &[&leased, &attempts, &30_000i64, &"default"],
            ),
            (
                "release_leases",
                RELEASE_LEASES.text(),
                &[&leased, &attempts, &"default"],
            ),
            (
                "reschedule_tasks",
                crate::store::tasks::RESCHEDULE_TASKS.text(),
                &[&scheduled, &"default", &None::<DateTime<Utc>>, &1_000i64],
            ),
            (
                "suppress_tasks",
                crate::store::suppressions::SUPPRESS_TASKS.text(),
                &[&scheduled],
            ),
        ];
        let mut walks = Vec::new();
        for (name, sql, params) in cases {
            let n = rows_discarded(&mut conn, sql, params).await;
            if n >= 1_000 {
                walks.push(format!("{name} read and discarded {n} rows"));
            }
        }
        assert!(walks.is_empty(), "{walks:#?}");
    }
}
