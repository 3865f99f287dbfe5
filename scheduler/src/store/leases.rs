//! The lease lifecycle in the database: claiming due tasks, applying reports, extending, and
//! sweeping leases and deadlines that ran out. Every write after a claim is fenced by
//! (task id, lease_count).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::accounts::{apply_feedback, AccountFeedback};
use super::tasks::parse_state;
use super::{Store, StoreError};
use crate::model::{AttemptReport, Outcome, ReportVerdict, TaskState};

/// What a batch of reports did.
#[derive(Debug, Default)]
pub struct ReportOutcome {
    /// One verdict per report, in input order.
    pub verdicts: Vec<ReportVerdict>,
    /// The earliest retry time among rescheduled tasks, to wake dispatchers.
    pub earliest_retry: Option<DateTime<Utc>>,
    /// An account at its in-flight limit got room back: dispatchers should look again.
    pub capacity_freed: bool,
}

/// What one sweep did.
#[derive(Debug, Default, Clone, Copy)]
pub struct SweepOutcome {
    /// Leases that ran out.
    pub leases_expired: u64,
    /// Of those, tasks that went back to SCHEDULED.
    pub rescheduled: u64,
    /// Scheduled tasks that passed their deadline.
    pub deadlines_passed: u64,
}

/// Result of extending leases.
#[derive(Debug, Default)]
pub struct Extended {
    /// Leases still held, with their new expiry.
    pub extended: Vec<(Uuid, i32, DateTime<Utc>)>,
}

impl Store {
    /// Applies executor reports in one statement; reports with a stale fencing token are
    /// answered `accepted = false` and change nothing.
    pub async fn complete_attempts(
        &self,
        namespace: &str,
        reports: &[AttemptReport],
    ) -> Result<ReportOutcome, StoreError> {
        let conn = self.conn().await?;
        let n = reports.len();
        let mut ids = Vec::with_capacity(n);
        let mut attempts = Vec::with_capacity(n);
        let mut outcomes = Vec::with_capacity(n);
        let mut errors = Vec::with_capacity(n);
        let mut provider_ids = Vec::with_capacity(n);
        let mut retry_afters = Vec::with_capacity(n);
        let mut started = Vec::with_capacity(n);
        for r in reports {
            ids.push(r.task_id);
            attempts.push(r.attempt);
            outcomes.push(r.outcome as i16);
            errors.push(r.error.as_deref());
            provider_ids.push(r.provider_message_id.as_deref());
            retry_afters.push(r.retry_after_ms);
            started.push(r.started_at);
        }
        let stmt = conn
            .prepare_cached(include_str!("queries/complete_attempts.sql"))
            .await
            .map_err(StoreError::query("preparing report"))?;
        let rows = conn
            .query(
                &stmt,
                &[
                    &ids,
                    &attempts,
                    &outcomes,
                    &errors,
                    &provider_ids,
                    &retry_afters,
                    &started,
                    &namespace,
                ],
            )
            .await
            .map_err(StoreError::query("applying reports"))?;

        let mut applied: HashMap<(Uuid, i32), TaskState> = HashMap::with_capacity(rows.len());
        let mut earliest_retry: Option<DateTime<Utc>> = None;
        let by_token: HashMap<(Uuid, i32), &AttemptReport> = reports
            .iter()
            .map(|r| ((r.task_id, r.attempt), r))
            .collect();
        let mut feedback: BTreeMap<String, AccountFeedback> = BTreeMap::new();
        let mut recipient_blocks: Vec<(Uuid, i64)> = Vec::new();
        for row in &rows {
            let state = parse_state(row.get(2))?;
            if state == TaskState::Scheduled {
                let at: DateTime<Utc> = row.get(3);
                earliest_retry = Some(earliest_retry.map_or(at, |e| e.min(at)));
            }
            let token: (Uuid, i32) = (row.get(0), row.get(1));
            applied.insert(token, state);
            let account: Option<String> = row.get(4);
            let was_cancelled: bool = row.get(5);
            if let (Some(account), Some(report)) = (account, by_token.get(&token)) {
                let f = feedback.entry(account).or_default();
                if !was_cancelled {
                    f.released += 1;
                }
                match report.outcome {
                    Outcome::Ok => f.ok += 1,
                    Outcome::RateLimited if report.recipient_scoped => {
                        recipient_blocks.push((token.0, report.retry_after_ms.unwrap_or(6_000)));
                    }
                    Outcome::RateLimited => {
                        f.rate_limited += 1;
                        f.retry_after_ms = f.retry_after_ms.max(report.retry_after_ms.unwrap_or(0));
                    }
                    Outcome::AccountUnavailable => {
                        f.unavailable += 1;
                        f.refund += 1;
                        f.reason.clone_from(&report.error);
                    }
                    _ => {}
                }
            }
        }
        if !recipient_blocks.is_empty() {
            let ids: Vec<Uuid> = recipient_blocks.iter().map(|b| b.0).collect();
            let ms: Vec<i64> = recipient_blocks.iter().map(|b| b.1).collect();
            conn.execute(
                "INSERT INTO herald.recipient_sends AS s
                     (namespace, account_id, recipient, last_sent_at, blocked_until)
                 SELECT t.namespace, t.account_id, t.recipient, now(),
                        now() + b.ms * interval '1 millisecond'
                 FROM unnest($1::uuid[], $2::bigint[]) AS b(id, ms)
                 JOIN herald.tasks t ON t.id = b.id
                 WHERE t.account_id IS NOT NULL
                 ON CONFLICT (namespace, account_id, recipient) DO UPDATE
                 SET blocked_until = greatest(COALESCE(s.blocked_until, now()),
                                              EXCLUDED.blocked_until)",
                &[&ids, &ms],
            )
            .await
            .map_err(StoreError::query("blocking throttled recipients"))?;
        }
        let freed = apply_feedback(&conn, namespace, &feedback).await?;

        // Rejected reports are rare (lost leases); look up their tasks' current states.
        let rejected: Vec<Uuid> = reports
            .iter()
            .filter(|r| !applied.contains_key(&(r.task_id, r.attempt)))
            .map(|r| r.task_id)
            .collect();
        let mut current: HashMap<Uuid, TaskState> = HashMap::new();
        if !rejected.is_empty() {
            let rows = conn
                .query(
                    "SELECT id, state::text FROM herald.tasks WHERE id = ANY($1)",
                    &[&rejected],
                )
                .await
                .map_err(StoreError::query("reading states of rejected reports"))?;
            for row in &rows {
                current.insert(row.get(0), parse_state(row.get(1))?);
            }
        }

        let verdicts = reports
            .iter()
            .map(|r| match applied.get(&(r.task_id, r.attempt)) {
                Some(state) => ReportVerdict {
                    task_id: r.task_id,
                    attempt: r.attempt,
                    accepted: true,
                    state: Some(*state),
                },
                None => ReportVerdict {
                    task_id: r.task_id,
                    attempt: r.attempt,
                    accepted: false,
                    state: current.get(&r.task_id).copied(),
                },
            })
            .collect();
        Ok(ReportOutcome {
            verdicts,
            earliest_retry,
            capacity_freed: freed,
        })
    }

    /// Extends the given leases by one TTL from now; those not returned were lost.
    pub async fn extend_leases(
        &self,
        namespace: &str,
        leases: &[(Uuid, i32)],
        lease_ttl: Duration,
    ) -> Result<Extended, StoreError> {
        let conn = self.conn().await?;
        let ids: Vec<Uuid> = leases.iter().map(|l| l.0).collect();
        let attempts: Vec<i32> = leases.iter().map(|l| l.1).collect();
        let stmt = conn
            .prepare_cached(include_str!("queries/extend_leases.sql"))
            .await
            .map_err(StoreError::query("preparing extend"))?;
        let rows = conn
            .query(
                &stmt,
                &[&ids, &attempts, &duration_ms(lease_ttl), &namespace],
            )
            .await
            .map_err(StoreError::query("extending leases"))?;
        Ok(Extended {
            extended: rows
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect(),
        })
    }

    /// Records that an executor dropped a cancelled task's lease before sending; true when the
    /// cancellation was still waiting for that answer.
    pub async fn record_revoked_before_send(
        &self,
        namespace: &str,
        task_id: Uuid,
        attempt: i32,
    ) -> Result<bool, StoreError> {
        let mut conn = self.conn().await?;
        let tx = conn
            .transaction()
            .await
            .map_err(StoreError::query("starting a revoke record"))?;
        let changed = tx
            .execute(
                include_str!("queries/revoke_stopped.sql"),
                &[&task_id, &attempt, &namespace],
            )
            .await
            .map_err(StoreError::query("recording a revoke"))?
            > 0;
        if changed {
            announce_cancel_resolved(&tx, task_id).await?;
        }
        tx.commit()
            .await
            .map_err(StoreError::query("committing a revoke record"))?;
        Ok(changed)
    }

    /// Announces that cancelled tasks learned their outcome from a report, so CancelTask calls
    /// waiting on any replica can answer.
    pub async fn announce_cancels_resolved(&self, task_ids: &[Uuid]) -> Result<(), StoreError> {
        let conn = self.conn().await?;
        for id in task_ids {
            conn.execute("SELECT pg_notify('herald_cancel', $1)", &[&id.to_string()])
                .await
                .map_err(StoreError::query("announcing a cancel outcome"))?;
        }
        Ok(())
    }

    /// Returns lapsed leases and passed deadlines, up to `batch` of each per call.
    pub async fn sweep(&self, batch: i64) -> Result<SweepOutcome, StoreError> {
        let conn = self.conn().await?;
        let leases = conn
            .prepare_cached(include_str!("queries/expire_leases.sql"))
            .await
            .map_err(StoreError::query("preparing lease sweep"))?;
        let row = conn
            .query_one(&leases, &[&batch])
            .await
            .map_err(StoreError::query("sweeping expired leases"))?;
        let leases_expired = u64::try_from(row.get::<_, i64>(0)).unwrap_or(0);
        let rescheduled = u64::try_from(row.get::<_, i64>(1)).unwrap_or(0);
        let freed_accounts: Vec<String> = row.get(2);
        release_qualified_slots(&conn, &freed_accounts, false).await?;
        let deadlines = conn
            .prepare_cached(include_str!("queries/expire_deadlines.sql"))
            .await
            .map_err(StoreError::query("preparing deadline sweep"))?;
        let deadlines_passed = conn
            .execute(&deadlines, &[&batch])
            .await
            .map_err(StoreError::query("expiring overdue tasks"))?;
        if rescheduled > 0 {
            conn.execute("SELECT pg_notify('herald_due', $1)", &[&"0"])
                .await
                .map_err(StoreError::query("announcing re-leasable tasks"))?;
        }
        Ok(SweepOutcome {
            leases_expired,
            rescheduled,
            deadlines_passed,
        })
    }

    /// Milliseconds until the next lease expiry or deadline, by the database clock.
    pub async fn next_sweep_ms(&self) -> Result<Option<f64>, StoreError> {
        let conn = self.conn().await?;
        let stmt = conn
            .prepare_cached(include_str!("queries/next_sweep.sql"))
            .await
            .map_err(StoreError::query("preparing next-sweep"))?;
        let row = conn
            .query_one(&stmt, &[])
            .await
            .map_err(StoreError::query("finding the next sweep"))?;
        Ok(row.get(0))
    }

    /// Wakes dispatchers on every replica for tasks due at `at`.
    pub async fn announce_due(&self, at: DateTime<Utc>) -> Result<(), StoreError> {
        let conn = self.conn().await?;
        conn.execute(
            "SELECT pg_notify('herald_due', $1)",
            &[&at.timestamp_micros().to_string()],
        )
        .await
        .map_err(StoreError::query("announcing due tasks"))?;
        Ok(())
    }
}

async fn announce_cancel_resolved(
    tx: &deadpool_postgres::Transaction<'_>,
    task_id: Uuid,
) -> Result<(), StoreError> {
    tx.execute(
        "SELECT pg_notify('herald_cancel', $1)",
        &[&task_id.to_string()],
    )
    .await
    .map_err(StoreError::query("announcing a cancel outcome"))?;
    Ok(())
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Store {
    /// Hands leases back without charging an attempt: they never reached an executor.
    pub async fn release_leases(
        &self,
        namespace: &str,
        leases: &[(Uuid, i32)],
    ) -> Result<(), StoreError> {
        let conn = self.conn().await?;
        let ids: Vec<Uuid> = leases.iter().map(|l| l.0).collect();
        let attempts: Vec<i32> = leases.iter().map(|l| l.1).collect();
        let accounts: Vec<String> = conn
            .query(
                "UPDATE herald.tasks t
                 SET state = 'scheduled', lease_expires_at = NULL, updated_at = now()
                 FROM unnest($1::uuid[], $2::integer[]) AS l(id, attempt)
                 WHERE t.id = l.id AND t.lease_count = l.attempt AND t.state = 'leased'
                   AND t.namespace = $3
                 RETURNING t.namespace || '/' || t.account_id",
                &[&ids, &attempts, &namespace],
            )
            .await
            .map_err(StoreError::query("releasing undelivered leases"))?
            .iter()
            .filter_map(|r| r.get::<_, Option<String>>(0))
            .collect();
        // Nothing was sent: the daily count gets these back too.
        release_qualified_slots(&conn, &accounts, true).await?;
        conn.execute("SELECT pg_notify('herald_due', '0')", &[])
            .await
            .map_err(StoreError::query("announcing released leases"))?;
        Ok(())
    }
}

/// Frees one in-flight slot per entry of `accounts` (an account may repeat) of `namespace`;
/// `refund` also returns the sends to the daily count.
pub(crate) async fn release_slots(
    client: &impl deadpool_postgres::GenericClient,
    namespace: &str,
    accounts: &[String],
    refund: bool,
) -> Result<bool, StoreError> {
    let mut feedback: BTreeMap<String, AccountFeedback> = BTreeMap::new();
    for a in accounts {
        let f = feedback.entry(a.clone()).or_default();
        f.released += 1;
        if refund {
            f.refund += 1;
        }
    }
    apply_feedback(client, namespace, &feedback).await
}

/// [`release_slots`] for accounts of any namespace, each given as `<namespace>/<account>`
/// (namespaces never contain `/`), as the cross-namespace sweeps return them.
pub(crate) async fn release_qualified_slots(
    client: &impl deadpool_postgres::GenericClient,
    qualified: &[String],
    refund: bool,
) -> Result<bool, StoreError> {
    let mut by_namespace: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for q in qualified {
        if let Some((namespace, account)) = q.split_once('/') {
            by_namespace
                .entry(namespace)
                .or_default()
                .push(account.to_owned());
        }
    }
    let mut freed = false;
    for (namespace, accounts) in by_namespace {
        freed |= release_slots(client, namespace, &accounts, refund).await?;
    }
    Ok(freed)
}
