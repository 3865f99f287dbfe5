//! The claim's statements, one method per step: the one-statement claim by queue, and the steps
//! of a routed claim (read each account's room, lock due candidates, read what is known of
//! their recipients, move tasks whose send window is closed, then grant the assignments
//! (reserve capacity, record recipient sends) and lease what was granted, each from its grant
//! instant).
//! `lease/claim.rs` runs them in one transaction and decides between them.

use std::collections::{HashMap, HashSet};

use std::sync::LazyLock;
use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use uuid::Uuid;

use super::LeaseRepo;
use crate::accounts::routing::{AccountRoom, Assignment, Candidate, PairFacts};
use crate::store::sql::{column, statement, Statement};
use crate::store::tasks::columns::with_columns;
use crate::store::StoreError;
use crate::tasks::model::GrantedLease;

/// A locked due task a routed claim may lease: what routing weighs ([`Candidate`]) and what
/// the claim's other steps need of the row.
#[derive(Debug, Clone)]
pub struct CandidateRow {
    /// What routing weighs.
    pub task: Candidate,
    /// Whether it has a send window (the claim moves it if the window is closed).
    pub windowed: bool,
    /// Whether its recipient is on the suppression list (the claim ends it instead).
    pub suppressed: bool,
}

impl AsRef<Candidate> for CandidateRow {
    fn as_ref(&self) -> &Candidate {
        &self.task
    }
}

/// Priority levels, highest first: the order claims visit them in.
pub const PRIORITIES_DESC: [i16; 10] = [9, 8, 7, 6, 5, 4, 3, 2, 1, 0];

/// `statement` with its `{at_each_priority}` placeholder replaced by `branch` once per priority
/// level, highest first, joined with UNION ALL, and its lease columns filled in.
///
/// The level is a literal in each branch rather than a row of `unnest($1)`: PostgreSQL then
/// estimates each level from the column's statistics and probes `tasks_due` for a level that
/// holds nothing. Given the level from `unnest` it assumed any level matches every due task,
/// preferred the plain run_at index, and walked every due task of the other levels to find none
/// of its own: four whole walks per claim while all tasks had the default priority 5.
fn at_each_priority(statement: &str, branch: &str) -> String {
    let branches: Vec<String> = PRIORITIES_DESC
        .iter()
        .map(|p| {
            let body = branch.replace("{priority}", &p.to_string());
            format!("SELECT * FROM (\n{body}\n) AS at_priority_{p}")
        })
        .collect();
    with_columns(&statement.replace("{at_each_priority}", &branches.join("\nUNION ALL\n")))
}

/// The one-statement claim (`claim_due.sql`, expanded): public so the benchmark times exactly
/// the statement the scheduler runs. Parameters: queues (`text[]` or NULL), limit, executor id,
/// lease TTL in milliseconds, route (`<namespace>/`), and where each priority level's walk
/// starts (`timestamptz[]`, element `priority + 1`; NULL or missing: the oldest entry).
pub static CLAIM_DUE_SQL: LazyLock<String> = LazyLock::new(|| {
    at_each_priority(
        include_str!("claim_due.sql"),
        include_str!("claim_due.at_priority.sql"),
    )
});

static CLAIM_DUE: LazyLock<Statement> =
    LazyLock::new(|| Statement::built("claim_due", CLAIM_DUE_SQL.clone()));
static CLAIM_CANDIDATES: LazyLock<Statement> = LazyLock::new(|| {
    Statement::built(
        "claim_candidates",
        at_each_priority(
            include_str!("claim_candidates.sql"),
            include_str!("claim_candidates.at_priority.sql"),
        ),
    )
});
pub(super) static NEXT_DUE: LazyLock<Statement> = LazyLock::new(|| {
    Statement::built(
        "next_due",
        at_each_priority(
            include_str!("next_due.sql"),
            include_str!("next_due.at_priority.sql"),
        ),
    )
});
/// The routed lease (`lease_assigned.sql`); seen by the plan tests in `store/leases`.
pub(super) static LEASE_ASSIGNED: LazyLock<Statement> = LazyLock::new(|| {
    Statement::built(
        "lease_assigned",
        with_columns(include_str!("lease_assigned.sql")),
    )
});
const GRANT_ASSIGNED: Statement = statement!("grant_assigned");
const ACCOUNT_BUDGETS: Statement = statement!("account_budgets");
const RECIPIENT_FACTS: Statement = statement!("recipient_facts");
/// Moves closed-window candidates (`defer_to_window.sql`); seen by the plan tests.
pub(super) const DEFER_TO_WINDOW: Statement = statement!("defer_to_window");

/// What an executor's claim asks for: the one declaration of the claim's inputs, built by the
/// dispatcher (`lease/dispatch.rs`), read by the claim's steps (`lease/claim.rs`) and bound
/// to the statements here. A new input is a field here, its binding below and its SQL.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// The namespace whose tasks are claimed.
    pub namespace: &'a str,
    /// Who holds the leases.
    pub executor_id: &'a str,
    /// Queues the executor serves; None for all.
    pub queues: Option<&'a [String]>,
    /// Accounts (credentials refs) the executor can send for; None for any.
    pub credentials: Option<&'a [String]>,
    /// At most this many leases.
    pub limit: i64,
    /// Lease duration.
    pub lease_ttl: Duration,
    /// Where the queue claim's walk starts at each priority level, indexed by priority (None:
    /// the oldest due entry; the dispatcher's [`DueMarks`](crate::lease::due_marks::DueMarks));
    /// the routed claim does not use them.
    pub due_from: &'a [Option<DateTime<Utc>>],
}

impl ClaimRequest<'_> {
    /// The lease duration in milliseconds, as the statements take it.
    pub fn ttl_ms(&self) -> i64 {
        super::duration_ms(self.lease_ttl)
    }

    /// The route of tasks sent by queue alone (`<namespace>/`).
    pub fn unrouted(&self) -> String {
        format!("{}/", self.namespace)
    }
}

/// What a routed claim's grant needs to know of the namespace's accounts besides their room.
pub struct GrantAccounts<'a> {
    /// Accounts that record sends per recipient (spacing, provider blocks, the tier).
    pub tracked: &'a [&'a str],
    /// Each account's credentials ref, by account id.
    pub credentials: &'a HashMap<String, String>,
}

/// One account as a claim sees it now (`herald.account_room`): what routing weighs, where
/// executors hold its credentials, and when time alone gives it room again.
#[derive(Debug, Clone)]
pub struct AccountBudget {
    /// Room, health and the rest of what routing weighs.
    pub room: AccountRoom,
    /// Where executors hold its credentials.
    pub credentials_ref: String,
    /// How long until time alone gives room again, in milliseconds (None: only an event
    /// will).
    pub available_in_ms: Option<f64>,
}

impl<C: GenericClient> LeaseRepo<'_, C> {
    /// Leases due tasks of the request's queue-routed route in one statement.
    pub async fn claim_due(&self, req: &ClaimRequest<'_>) -> Result<Vec<GrantedLease>, StoreError> {
        CLAIM_DUE
            .fetch(
                self.db,
                &[
                    &req.queues,
                    &req.limit,
                    &req.executor_id,
                    &req.ttl_ms(),
                    &req.unrouted(),
                    &req.due_from,
                ],
            )
            .await
    }

    /// Every account of the namespace with what it may send now.
    pub async fn account_budgets(&self, namespace: &str) -> Result<Vec<AccountBudget>, StoreError> {
        ACCOUNT_BUDGETS
            .query(self.db, &[&namespace])
            .await?
            .iter()
            .map(|r| {
                Ok(AccountBudget {
                    room: AccountRoom {
                        id: column(r, "id")?,
                        pool: column(r, "pool")?,
                        has_recipient_interval: column::<Option<i64>>(r, "recipient_interval_ms")?
                            .is_some_and(|ms| ms > 0),
                        high_priority_min: column(r, "high_priority_min")?,
                        room: column(r, "room")?,
                        room_low: column(r, "room_low")?,
                        tier_room: column(r, "tier_room")?,
                        has_tier: column(r, "has_tier")?,
                        active: column(r, "active")?,
                        health: column(r, "health")?,
                        sticky: column(r, "sticky")?,
                    },
                    credentials_ref: column(r, "credentials_ref")?,
                    available_in_ms: column(r, "available_in_ms")?,
                })
            })
            .collect()
    }

    /// Locks due candidates: up to a limit per wide route (by queue, per pool) and per pinned
    /// account route.
    pub async fn candidates(
        &self,
        req: &ClaimRequest<'_>,
        wide: &[(String, i32)],
        pinned: &[(String, i32)],
    ) -> Result<Vec<CandidateRow>, StoreError> {
        let (wide_routes, wide_limits): (Vec<&str>, Vec<i32>) =
            wide.iter().map(|(r, l)| (r.as_str(), *l)).unzip();
        let (pinned_routes, pinned_limits): (Vec<&str>, Vec<i32>) =
            pinned.iter().map(|(r, l)| (r.as_str(), *l)).unzip();
        CLAIM_CANDIDATES
            .query(
                self.db,
                &[
                    &wide_routes,
                    &wide_limits,
                    &pinned_routes,
                    &pinned_limits,
                    &req.queues,
                    &req.namespace,
                ],
            )
            .await?
            .iter()
            .map(|r| {
                Ok(CandidateRow {
                    task: Candidate {
                        id: column(r, "id")?,
                        route: column(r, "route")?,
                        recipient: column(r, "recipient")?,
                        priority: column(r, "priority")?,
                        queue: column(r, "queue")?,
                    },
                    windowed: column(r, "windowed")?,
                    suppressed: column(r, "suppressed")?,
                })
            })
            .collect()
    }

    /// What the namespace's accounts know of `recipients`: pairs that may not be sent to now,
    /// pairs a send to is free of the messaging tier, and when each pair was last sent to.
    pub async fn recipient_facts(
        &self,
        namespace: &str,
        recipients: &[&str],
    ) -> Result<PairFacts, StoreError> {
        let mut facts = PairFacts::default();
        if recipients.is_empty() {
            return Ok(facts);
        }
        for r in RECIPIENT_FACTS
            .query(self.db, &[&namespace, &recipients])
            .await?
        {
            let pair: (String, String) = (column(&r, "account_id")?, column(&r, "recipient")?);
            if column::<Option<bool>>(&r, "blocked")?.unwrap_or(false) {
                facts.blocked.insert(pair.clone());
            }
            if column::<Option<bool>>(&r, "tier_free")?.unwrap_or(false) {
                facts.tier_free.insert(pair.clone());
            }
            if let Some(last) = column::<Option<DateTime<Utc>>>(&r, "last_sent_at")? {
                facts.record_send(pair, last);
            }
        }
        Ok(facts)
    }

    /// Moves those of `windowed` whose send window is closed now to its next opening; returns
    /// their ids.
    pub async fn defer_closed_windows(
        &self,
        windowed: &[Uuid],
    ) -> Result<HashSet<Uuid>, StoreError> {
        if windowed.is_empty() {
            return Ok(HashSet::new());
        }
        DEFER_TO_WINDOW
            .query(self.db, &[&windowed])
            .await?
            .iter()
            .map(|r| column(r, "id"))
            .collect()
    }

    /// Grants routed assignments (in routing's order) and leases what was granted: each
    /// account grants at most its room, sends on `tracked` accounts are recorded per recipient
    /// (a pair a concurrent claim just took is refused), and unused slots are given back.
    /// Assignments without an account are leased as they are.
    ///
    /// The grant (`grant_assigned.sql`, `herald.grant_claim`) runs first and returns each kept
    /// assignment with its instant: its account's reservation instant, or for an account with
    /// human-like gaps the instant it drew. The lease (`lease_assigned.sql`) then
    /// writes each kept task once, leased from that instant, so a routed lease's `leased_at` is
    /// the moment its account's capacity was taken and an assignment the grant refuses is
    /// never leased. The lease runs while the grant's account locks are held; other claims,
    /// folds and the reports that free slots at once wait that much longer for those rows
    /// (docs/performance.md, S5).
    ///
    /// `credentials` maps each account id to its credentials ref, which every lease carries.
    pub async fn grant(
        &self,
        req: &ClaimRequest<'_>,
        assigned: &[Assignment],
        accounts: &GrantAccounts<'_>,
    ) -> Result<Vec<GrantedLease>, StoreError> {
        let GrantAccounts {
            tracked,
            credentials,
        } = accounts;
        let ids: Vec<Uuid> = assigned.iter().map(|a| a.id).collect();
        let accounts: Vec<Option<&str>> = assigned.iter().map(|a| a.account.as_deref()).collect();
        let high: Vec<bool> = assigned.iter().map(|a| a.high).collect();
        let opens: Vec<bool> = assigned.iter().map(|a| a.opens).collect();
        let recipients: Vec<&str> = assigned.iter().map(|a| a.recipient.as_str()).collect();
        let granted = GRANT_ASSIGNED
            .query(
                self.db,
                &[
                    &req.namespace,
                    &ids,
                    &accounts,
                    &high,
                    &opens,
                    &recipients,
                    &tracked,
                ],
            )
            .await?;
        let by_id: HashMap<Uuid, &Assignment> = assigned.iter().map(|a| (a.id, a)).collect();
        let mut kept: Vec<&Assignment> = Vec::with_capacity(granted.len());
        let mut instants: Vec<Option<DateTime<Utc>>> = Vec::with_capacity(granted.len());
        for row in &granted {
            let id: Uuid = column(row, "id")?;
            let assignment = by_id.get(&id).ok_or_else(|| {
                StoreError::Inconsistent(format!("the grant kept {id}, which was not assigned"))
            })?;
            kept.push(assignment);
            instants.push(column(row, "granted_at")?);
        }
        let mut leased = self.lease(req, &kept, &instants, credentials).await?;
        // Every assignment is locked since `candidates` and still scheduled, so each one kept
        // leases; one that did not would hold a slot reserved for a task left behind, so the
        // claim fails and its transaction rolls back.
        if leased.len() != kept.len() {
            return Err(StoreError::Inconsistent(format!(
                "{} of {} granted routed assignments could not be leased",
                kept.len() - leased.len(),
                kept.len()
            )));
        }
        // In the grant's order, which is routing's.
        Ok(kept.iter().filter_map(|a| leased.remove(&a.id)).collect())
    }

    /// Leases `assigned` to their accounts, each from its instant in `at` (its grant instant)
    /// or, where there is none (sent by queue), now; by task id.
    async fn lease(
        &self,
        req: &ClaimRequest<'_>,
        assigned: &[&Assignment],
        at: &[Option<DateTime<Utc>>],
        credentials: &HashMap<String, String>,
    ) -> Result<HashMap<Uuid, GrantedLease>, StoreError> {
        if assigned.is_empty() {
            return Ok(HashMap::new());
        }
        let ids: Vec<Uuid> = assigned.iter().map(|a| a.id).collect();
        let accounts: Vec<Option<&str>> = assigned.iter().map(|a| a.account.as_deref()).collect();
        let credentials: Vec<Option<&str>> = accounts
            .iter()
            .map(|a| a.and_then(|id| credentials.get(id)).map(String::as_str))
            .collect();
        Ok(LEASE_ASSIGNED
            .fetch::<GrantedLease>(
                self.db,
                &[
                    &ids,
                    &accounts,
                    &req.executor_id,
                    &req.ttl_ms(),
                    &at,
                    &credentials,
                ],
            )
            .await?
            .into_iter()
            .map(|l| (l.task_id, l))
            .collect())
    }

    /// Time until the earliest scheduled task of `routes` is due, by the database clock, and
    /// its due time; None when none is scheduled. Zero or negative means one is due now. Each
    /// priority level's look starts at its mark (see [`ClaimRequest::due_from`]), among the
    /// request's queues.
    pub async fn next_due(
        &self,
        req: &ClaimRequest<'_>,
        routes: &[String],
    ) -> Result<Option<(f64, DateTime<Utc>)>, StoreError> {
        let row = NEXT_DUE
            .query_one(self.db, &[&routes, &req.queues, &req.due_from])
            .await?;
        let wait_ms: Option<f64> = column(&row, "wait_ms")?;
        let at: Option<DateTime<Utc>> = column(&row, "run_at")?;
        Ok(wait_ms.zip(at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_claim_statement_probes_every_level_highest_first() {
        for sql in [CLAIM_DUE.text(), CLAIM_CANDIDATES.text(), NEXT_DUE.text()] {
            assert!(!sql.contains("{at_each_priority}") && !sql.contains("{priority}"));
            assert!(!sql.contains("{lease_columns}"));
            // A placeholder inside a comment would swallow its first branch.
            assert!(sql
                .lines()
                .all(|l| !l.trim_start().starts_with("--") || !l.contains("SELECT")));
            let positions: Vec<Option<usize>> = PRIORITIES_DESC
                .iter()
                .map(|p| sql.find(&format!("t.priority = {p}\n")))
                .collect();
            assert!(
                positions.iter().all(Option::is_some),
                "a level is missing: {sql}"
            );
            assert!(positions.windows(2).all(|w| w[0] < w[1]), "{sql}");
        }
    }
}
