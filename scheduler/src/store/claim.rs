//! Claiming due tasks: granting leases within the executor's credit and every sending account's
//! limits, in one transaction.
//!
//! Without accounts in the namespace a claim is a single statement (`claim_due.sql`). With
//! accounts it is a short transaction:
//! 1. read what each account may send now (`herald.account_room`, the one definition of the
//!    limits);
//! 2. lock due candidates of the routes that have room (`claim_candidates.sql`);
//! 3. assign pooled tasks to the account with the most room left, honouring per-recipient
//!    intervals and provider blocks ([`assign`], pure and unit-tested);
//! 4. record recipient sends and reserve account capacity atomically (`mark_recipients.sql`,
//!    `herald.reserve_capacity`); whatever a concurrent claim took first is dropped here;
//! 5. lease what is left (`lease_assigned.sql`).
//!
//! The reservation in step 4 is what keeps the limits across replicas: it locks each account row
//! and grants no more than its room at that instant.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio_postgres::Row;
use uuid::Uuid;

use super::tasks::labels_from_json;
use super::{Store, StoreError};
use crate::model::GrantedLease;

/// How long a namespace seen without accounts keeps the one-statement claim path before the
/// accounts table is read again. A task routed to an account created meanwhile waits at most
/// this long: the fast path leases only the queue-routed route `<ns>/`, never a pool's or an
/// account's, and tells the dispatcher to look again when the entry expires.
pub const NO_ACCOUNTS_TTL: Duration = Duration::from_secs(1);

/// Namespaces known to have no accounts, until when.
#[derive(Debug, Clone, Default)]
pub struct NoAccountsCache {
    until: Arc<Mutex<HashMap<String, Instant>>>,
}

impl NoAccountsCache {
    /// How long `namespace` is still known to have no accounts.
    fn remaining(&self, namespace: &str) -> Option<Duration> {
        let now = Instant::now();
        let until = self.until.lock().ok()?.get(namespace).copied()?;
        (until > now).then(|| until - now)
    }

    fn remember(&self, namespace: &str) {
        if let Ok(mut map) = self.until.lock() {
            map.insert(namespace.to_owned(), Instant::now() + NO_ACCOUNTS_TTL);
        }
    }
}

/// Priority levels, highest first: the order claims visit them in.
pub const PRIORITIES_DESC: [i16; 10] = [9, 8, 7, 6, 5, 4, 3, 2, 1, 0];

/// `statement` with its `{at_each_priority}` placeholder replaced by `branch` once per priority
/// level, highest first, joined with UNION ALL.
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
    statement.replace("{at_each_priority}", &branches.join("\nUNION ALL\n"))
}

/// The one-statement claim (`claim_due.sql`, expanded): public so the benchmark times exactly
/// the statement the scheduler runs. Parameters: queues (`text[]` or NULL), limit, executor id,
/// lease TTL in milliseconds, route (`<namespace>/`).
pub static CLAIM_DUE_SQL: LazyLock<String> = LazyLock::new(|| {
    at_each_priority(
        include_str!("queries/claim_due.sql"),
        include_str!("queries/claim_due.at_priority.sql"),
    )
});

static CLAIM_CANDIDATES_SQL: LazyLock<String> = LazyLock::new(|| {
    at_each_priority(
        include_str!("queries/claim_candidates.sql"),
        include_str!("queries/claim_candidates.at_priority.sql"),
    )
});

static NEXT_DUE_SQL: LazyLock<String> = LazyLock::new(|| {
    at_each_priority(
        include_str!("queries/next_due.sql"),
        include_str!("queries/next_due.at_priority.sql"),
    )
});

/// What an executor asks for.
#[derive(Debug, Clone)]
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
}

/// What a claim granted, and what the dispatcher needs to know to wait well when it granted
/// nothing.
#[derive(Debug, Default)]
pub struct Claimed {
    /// The leases granted.
    pub leases: Vec<GrantedLease>,
    /// Routes that could be served now; the next due time is looked up among these only.
    pub open_routes: Vec<String>,
    /// The earliest time an account without room gets room again by time alone.
    pub blocked_until: Option<DateTime<Utc>>,
}

/// One account's room for this claim.
#[derive(Debug, Clone)]
pub struct AccountRoom {
    /// Account id.
    pub id: String,
    /// Its pool.
    pub pool: String,
    /// Sends any task may take now.
    pub room: i32,
    /// Sends a task below `high_priority_min` may take now.
    pub room_low: i32,
    /// The lowest priority that may use the high-priority reserve.
    pub high_priority_min: i16,
    /// Whether sends to one recipient must be spaced.
    pub has_recipient_interval: bool,
}

/// A locked due task that may be leased.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// Task id.
    pub id: Uuid,
    /// Its route: '<ns>/', '<ns>/p:<pool>' or '<ns>/a:<account>'.
    pub route: String,
    /// Recipient.
    pub recipient: String,
    /// Priority.
    pub priority: i16,
}

/// A candidate with the account it goes out through (None: sent by queue).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// Task id.
    pub id: Uuid,
    /// The account, if routed.
    pub account: Option<String>,
    /// Whether it counts against the high-priority share.
    pub high: bool,
    /// Recipient.
    pub recipient: String,
}

/// Assigns candidates (in claim order) to accounts: pooled tasks to the pool's account with the
/// most room left that may still send to the recipient, pinned tasks to their account. Takes at
/// most `limit`. `blocked` holds (account, recipient) pairs that may not be sent to now.
pub fn assign(
    namespace: &str,
    candidates: &[Candidate],
    accounts: &[AccountRoom],
    blocked: &HashSet<(String, String)>,
    limit: usize,
) -> Vec<Assignment> {
    let unrouted = format!("{namespace}/");
    let pool_prefix = format!("{namespace}/p:");
    let account_prefix = format!("{namespace}/a:");
    let mut left: HashMap<&str, (i32, i32)> = accounts
        .iter()
        .map(|a| (a.id.as_str(), (a.room, a.room_low)))
        .collect();
    let by_pool: BTreeMap<&str, Vec<&AccountRoom>> =
        accounts.iter().fold(BTreeMap::new(), |mut m, a| {
            m.entry(a.pool.as_str()).or_insert_with(Vec::new).push(a);
            m
        });
    let mut used_pairs: HashSet<(String, String)> = HashSet::new();
    let mut out = Vec::new();

    for c in candidates {
        if out.len() >= limit {
            break;
        }
        if c.route == unrouted {
            out.push(Assignment {
                id: c.id,
                account: None,
                high: false,
                recipient: c.recipient.clone(),
            });
            continue;
        }
        let choices: Vec<&AccountRoom> = if let Some(pool) = c.route.strip_prefix(&pool_prefix) {
            by_pool.get(pool).cloned().unwrap_or_default()
        } else if let Some(id) = c.route.strip_prefix(&account_prefix) {
            accounts.iter().filter(|a| a.id == id).collect()
        } else {
            Vec::new()
        };
        let pick = choices
            .iter()
            .filter(|a| {
                let (room, room_low) = left.get(a.id.as_str()).copied().unwrap_or((0, 0));
                let fits = if c.priority >= a.high_priority_min {
                    room > 0
                } else {
                    room_low > 0
                };
                let pair = (a.id.clone(), c.recipient.clone());
                fits && !blocked.contains(&pair)
                    && !(a.has_recipient_interval && used_pairs.contains(&pair))
            })
            // Most headroom first; ties go to the lower id, so the choice is stable.
            .max_by(|x, y| {
                let rx = left.get(x.id.as_str()).map_or(0, |l| l.0);
                let ry = left.get(y.id.as_str()).map_or(0, |l| l.0);
                rx.cmp(&ry).then_with(|| y.id.cmp(&x.id))
            });
        let Some(account) = pick else { continue };
        let high = c.priority >= account.high_priority_min;
        if let Some(l) = left.get_mut(account.id.as_str()) {
            l.0 -= 1;
            // A low-priority send uses a slot of the shared part; a high one may dip into the
            // reserve, and the shared part can never exceed the total.
            if !high {
                l.1 -= 1;
            }
            l.1 = l.1.min(l.0);
        }
        used_pairs.insert((account.id.clone(), c.recipient.clone()));
        out.push(Assignment {
            id: c.id,
            account: Some(account.id.clone()),
            high,
            recipient: c.recipient.clone(),
        });
    }
    out
}

/// Leases due queue-routed tasks (route `<ns>/`) with `claim_due.sql`.
async fn claim_due(
    client: &impl deadpool_postgres::GenericClient,
    req: &ClaimRequest<'_>,
    ttl_ms: i64,
    unrouted: &str,
) -> Result<Vec<GrantedLease>, StoreError> {
    let stmt = client
        .prepare_cached(&CLAIM_DUE_SQL)
        .await
        .map_err(StoreError::query("preparing claim"))?;
    let rows = client
        .query(
            &stmt,
            &[
                &req.queues,
                &req.limit,
                &req.executor_id,
                &ttl_ms,
                &unrouted,
            ],
        )
        .await
        .map_err(StoreError::query("claiming due tasks"))?;
    Ok(rows.iter().map(lease_from_row).collect())
}

impl Store {
    /// Leases due tasks within the executor's credit and every account's limits.
    pub async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Claimed, StoreError> {
        let mut conn = self.conn().await?;
        let unrouted = format!("{}/", req.namespace);
        let ttl_ms = i64::try_from(req.lease_ttl.as_millis()).unwrap_or(i64::MAX);
        if let Some(remaining) = self.no_accounts.remaining(req.namespace) {
            // One autocommitted statement: a single round trip per claim on the drain path.
            let leases = claim_due(&conn, req, ttl_ms, &unrouted).await?;
            let recheck = chrono::Duration::from_std(remaining).unwrap_or(chrono::Duration::MAX);
            return Ok(Claimed {
                leases,
                open_routes: vec![unrouted],
                blocked_until: Utc::now().checked_add_signed(recheck),
            });
        }
        let tx = conn
            .transaction()
            .await
            .map_err(StoreError::query("starting a claim"))?;

        let stmt = tx
            .prepare_cached(include_str!("queries/account_budgets.sql"))
            .await
            .map_err(StoreError::query("preparing account budgets"))?;
        let account_rows = tx
            .query(&stmt, &[&req.namespace])
            .await
            .map_err(StoreError::query("reading account budgets"))?;

        if account_rows.is_empty() {
            // No accounts: every task is sent by queue; one statement.
            let leases = claim_due(&tx, req, ttl_ms, &unrouted).await?;
            tx.commit()
                .await
                .map_err(StoreError::query("committing a claim"))?;
            self.no_accounts.remember(req.namespace);
            return Ok(Claimed {
                leases,
                open_routes: vec![unrouted],
                blocked_until: None,
            });
        }

        let mut accounts = Vec::new();
        let mut blocked_until: Option<DateTime<Utc>> = None;
        for r in &account_rows {
            let credentials_ref: String = r.get(2);
            if req
                .credentials
                .is_some_and(|held| !held.contains(&credentials_ref))
            {
                continue;
            }
            let room: i32 = r.get(5);
            let available_at: Option<DateTime<Utc>> = r.get(7);
            if room == 0 {
                if let Some(at) = available_at {
                    blocked_until = Some(blocked_until.map_or(at, |b| b.min(at)));
                }
            }
            accounts.push(AccountRoom {
                id: r.get(0),
                pool: r.get(1),
                has_recipient_interval: r.get::<_, Option<i64>>(3).is_some_and(|ms| ms > 0),
                high_priority_min: r.get(4),
                room,
                room_low: r.get(6),
            });
        }

        let limit = i32::try_from(req.limit).unwrap_or(i32::MAX);
        let mut pool_room: BTreeMap<&str, i32> = BTreeMap::new();
        for a in accounts.iter().filter(|a| a.room > 0) {
            *pool_room.entry(a.pool.as_str()).or_default() += a.room;
        }
        let mut wide_routes = vec![unrouted.clone()];
        let mut wide_limits = vec![limit];
        for (pool, room) in &pool_room {
            wide_routes.push(format!("{}/p:{pool}", req.namespace));
            wide_limits.push((*room).min(limit));
        }
        let (pinned_routes, pinned_limits): (Vec<String>, Vec<i32>) = accounts
            .iter()
            .filter(|a| a.room > 0)
            .map(|a| (format!("{}/a:{}", req.namespace, a.id), a.room.min(limit)))
            .unzip();
        let open_routes: Vec<String> = wide_routes
            .iter()
            .chain(pinned_routes.iter())
            .cloned()
            .collect();

        let stmt = tx
            .prepare_cached(&CLAIM_CANDIDATES_SQL)
            .await
            .map_err(StoreError::query("preparing claim candidates"))?;
        let candidates: Vec<Candidate> = tx
            .query(
                &stmt,
                &[
                    &wide_routes,
                    &wide_limits,
                    &pinned_routes,
                    &pinned_limits,
                    &req.queues,
                ],
            )
            .await
            .map_err(StoreError::query("finding claim candidates"))?
            .iter()
            .map(|r| Candidate {
                id: r.get(0),
                route: r.get(1),
                recipient: r.get(2),
                priority: r.get(3),
            })
            .collect();
        if candidates.is_empty() {
            tx.commit()
                .await
                .map_err(StoreError::query("committing a claim"))?;
            return Ok(Claimed {
                leases: Vec::new(),
                open_routes,
                blocked_until,
            });
        }

        // Pairs the provider told us to leave alone, or sent to too recently.
        let recipients: Vec<&str> = candidates
            .iter()
            .filter(|c| c.route != unrouted)
            .map(|c| c.recipient.as_str())
            .collect::<HashSet<&str>>()
            .into_iter()
            .collect();
        let blocked: HashSet<(String, String)> = if recipients.is_empty() {
            HashSet::new()
        } else {
            // One probe of recipient_sends_recipient per recipient, forced by LATERAL: left to
            // itself the planner walked every account's pairs through the primary key.
            tx.query(
                "SELECT s.account_id, s.recipient
                 FROM unnest($2::text[]) AS r(recipient)
                 CROSS JOIN LATERAL (
                     SELECT * FROM herald.recipient_sends s
                     WHERE s.namespace = $1 AND s.recipient = r.recipient
                     -- Keeps the subquery from being flattened into the join.
                     OFFSET 0
                 ) s
                 JOIN herald.accounts a ON a.namespace = s.namespace AND a.id = s.account_id
                 WHERE (s.blocked_until > now()
                        OR s.last_sent_at > now() - COALESCE(a.recipient_interval_ms, 0)
                                                    * interval '1 millisecond')",
                &[&req.namespace, &recipients],
            )
            .await
            .map_err(StoreError::query("reading recipient sends"))?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
        };

        let mut assigned = assign(
            req.namespace,
            &candidates,
            &accounts,
            &blocked,
            usize::try_from(req.limit).unwrap_or(usize::MAX),
        );

        // Reserve capacity; accounts grant at most their room at this instant.
        let mut reserved_at: HashMap<String, DateTime<Utc>> = HashMap::new();
        let mut wanted: BTreeMap<&str, (i32, i32)> = BTreeMap::new();
        for a in &assigned {
            if let Some(acc) = a.account.as_deref() {
                let w = wanted.entry(acc).or_default();
                if a.high {
                    w.0 += 1;
                } else {
                    w.1 += 1;
                }
            }
        }
        if !wanted.is_empty() {
            let ids: Vec<&str> = wanted.keys().copied().collect();
            let highs: Vec<i32> = wanted.values().map(|w| w.0).collect();
            let lows: Vec<i32> = wanted.values().map(|w| w.1).collect();
            let rows = tx
                .query(
                    "SELECT out_account, out_high, out_low, out_at
                     FROM herald.reserve_capacity($1, $2, $3, $4)",
                    &[&req.namespace, &ids, &highs, &lows],
                )
                .await
                .map_err(StoreError::query("reserving account capacity"))?;
            let mut granted: HashMap<String, (i32, i32)> = HashMap::new();
            for r in &rows {
                granted.insert(r.get(0), (r.get(1), r.get(2)));
                reserved_at.insert(r.get(0), r.get(3));
            }
            assigned.retain(|a| match a.account.as_deref() {
                None => true,
                Some(acc) => match granted.get_mut(acc) {
                    Some(g) => {
                        let slot = if a.high { &mut g.0 } else { &mut g.1 };
                        if *slot > 0 {
                            *slot -= 1;
                            true
                        } else {
                            false
                        }
                    }
                    None => false,
                },
            });
        }

        // Record recipient sends where the account spaces them, at the reservation's instant
        // (reservations on one account are serialised by its row lock, so these times are in
        // order); a pair another claim just took comes back refused, its task is dropped and
        // its account slot given back.
        let spaced: HashSet<&str> = accounts
            .iter()
            .filter(|a| a.has_recipient_interval)
            .map(|a| a.id.as_str())
            .collect();
        let marks: Vec<(&str, &str, DateTime<Utc>)> = assigned
            .iter()
            .filter_map(|a| {
                let acc = a.account.as_deref()?;
                let at = reserved_at.get(acc)?;
                spaced
                    .contains(acc)
                    .then_some((acc, a.recipient.as_str(), *at))
            })
            .collect();
        if !marks.is_empty() {
            let ids: Vec<&str> = marks.iter().map(|m| m.0).collect();
            let recips: Vec<&str> = marks.iter().map(|m| m.1).collect();
            let times: Vec<DateTime<Utc>> = marks.iter().map(|m| m.2).collect();
            let stmt = tx
                .prepare_cached(include_str!("queries/mark_recipients.sql"))
                .await
                .map_err(StoreError::query("preparing recipient marks"))?;
            let accepted: HashSet<(String, String)> = tx
                .query(&stmt, &[&req.namespace, &ids, &recips, &times])
                .await
                .map_err(StoreError::query("recording recipient sends"))?
                .iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            let mut refused: Vec<String> = Vec::new();
            assigned.retain(|a| match a.account.as_deref() {
                Some(acc) if spaced.contains(acc) => {
                    let keep = accepted.contains(&(acc.to_string(), a.recipient.clone()));
                    if !keep {
                        refused.push(acc.to_string());
                    }
                    keep
                }
                _ => true,
            });
            super::leases::release_slots(&tx, req.namespace, &refused, true).await?;
        }

        let ids: Vec<Uuid> = assigned.iter().map(|a| a.id).collect();
        let account_ids: Vec<Option<&str>> =
            assigned.iter().map(|a| a.account.as_deref()).collect();
        // A routed lease is granted at its reservation's instant; the rest at the lease's.
        let granted_at: Vec<Option<DateTime<Utc>>> = assigned
            .iter()
            .map(|a| {
                a.account
                    .as_ref()
                    .and_then(|acc| reserved_at.get(acc).copied())
            })
            .collect();
        let stmt = tx
            .prepare_cached(include_str!("queries/lease_assigned.sql"))
            .await
            .map_err(StoreError::query("preparing lease"))?;
        let rows = tx
            .query(
                &stmt,
                &[&ids, &account_ids, &req.executor_id, &ttl_ms, &granted_at],
            )
            .await
            .map_err(StoreError::query("leasing assigned tasks"))?;
        tx.commit()
            .await
            .map_err(StoreError::query("committing a claim"))?;
        Ok(Claimed {
            leases: rows.iter().map(lease_from_row).collect(),
            open_routes,
            blocked_until,
        })
    }

    /// Time until the earliest scheduled task of `routes` is due, by the database clock, and
    /// its due time; None when none is scheduled. Zero or negative means one is due now.
    pub async fn next_due(
        &self,
        routes: &[String],
        queues: Option<&[String]>,
    ) -> Result<Option<(f64, DateTime<Utc>)>, StoreError> {
        let conn = self.conn().await?;
        let stmt = conn
            .prepare_cached(&NEXT_DUE_SQL)
            .await
            .map_err(StoreError::query("preparing next-due"))?;
        let row = conn
            .query_one(&stmt, &[&routes, &queues])
            .await
            .map_err(StoreError::query("finding the next due task"))?;
        let wait_ms: Option<f64> = row.get(0);
        let at: Option<DateTime<Utc>> = row.get(1);
        Ok(wait_ms.zip(at))
    }
}

fn lease_from_row(r: &Row) -> GrantedLease {
    GrantedLease {
        task_id: r.get(0),
        attempt: r.get(1),
        queue: r.get(2),
        recipient: r.get(3),
        content: r.get(4),
        idempotency_key: r.get(5),
        run_at: r.get(6),
        leased_at: r.get(7),
        expires_at: r.get(8),
        attempts_before: r.get(9),
        max_attempts: r.get(10),
        labels: labels_from_json(r.get(11)),
        account_id: r.get(12),
        credentials_ref: r.get(13),
        trace_parent: r.get(14),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_claim_statement_probes_every_level_highest_first() {
        for sql in [&*CLAIM_DUE_SQL, &*CLAIM_CANDIDATES_SQL, &*NEXT_DUE_SQL] {
            assert!(!sql.contains("{at_each_priority}") && !sql.contains("{priority}"));
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

    fn account(id: &str, pool: &str, room: i32, room_low: i32) -> AccountRoom {
        AccountRoom {
            id: id.into(),
            pool: pool.into(),
            room,
            room_low,
            high_priority_min: 7,
            has_recipient_interval: true,
        }
    }

    fn candidate(route: &str, recipient: &str, priority: i16) -> Candidate {
        Candidate {
            id: Uuid::now_v7(),
            route: route.into(),
            recipient: recipient.into(),
            priority,
        }
    }

    fn accounts_of(out: &[Assignment]) -> Vec<Option<&str>> {
        out.iter().map(|a| a.account.as_deref()).collect()
    }

    #[test]
    fn pooled_tasks_go_to_the_account_with_most_room() {
        let accounts = [account("a", "p", 1, 1), account("b", "p", 3, 3)];
        let candidates: Vec<_> = (0..4)
            .map(|i| candidate("ns/p:p", &format!("+{i}"), 5))
            .collect();
        let out = assign("ns", &candidates, &accounts, &HashSet::new(), 10);
        assert_eq!(
            accounts_of(&out),
            vec![Some("b"), Some("b"), Some("a"), Some("b")]
        );
    }

    #[test]
    fn never_more_than_an_accounts_room_nor_the_limit() {
        let accounts = [account("a", "p", 2, 2)];
        let candidates: Vec<_> = (0..5)
            .map(|i| candidate("ns/p:p", &format!("+{i}"), 5))
            .collect();
        assert_eq!(
            assign("ns", &candidates, &accounts, &HashSet::new(), 10).len(),
            2
        );
        let unrouted: Vec<_> = (0..5)
            .map(|i| candidate("ns/", &format!("+{i}"), 5))
            .collect();
        assert_eq!(
            assign("ns", &unrouted, &accounts, &HashSet::new(), 3).len(),
            3
        );
    }

    #[test]
    fn the_reserve_is_for_high_priority_only() {
        // 4 slots, 2 of them reserved.
        let accounts = [account("a", "p", 4, 2)];
        let low: Vec<_> = (0..4)
            .map(|i| candidate("ns/p:p", &format!("+l{i}"), 3))
            .collect();
        assert_eq!(assign("ns", &low, &accounts, &HashSet::new(), 10).len(), 2);
        let mut mixed = low.clone();
        mixed.insert(0, candidate("ns/p:p", "+h1", 9));
        mixed.insert(1, candidate("ns/p:p", "+h2", 8));
        let out = assign("ns", &mixed, &accounts, &HashSet::new(), 10);
        assert_eq!(out.len(), 4);
        assert_eq!(out.iter().filter(|a| a.high).count(), 2);
    }

    #[test]
    fn a_recipient_is_not_sent_twice_through_one_spaced_account_in_a_claim() {
        let accounts = [account("a", "p", 5, 5), account("b", "p", 1, 1)];
        let candidates = vec![
            candidate("ns/p:p", "+1", 5),
            candidate("ns/p:p", "+1", 5),
            candidate("ns/p:p", "+1", 5),
        ];
        let out = assign("ns", &candidates, &accounts, &HashSet::new(), 10);
        assert_eq!(accounts_of(&out), vec![Some("a"), Some("b")]);
    }

    #[test]
    fn blocked_pairs_and_pinned_accounts_are_respected() {
        let accounts = [account("a", "p", 5, 5), account("b", "p", 5, 5)];
        let blocked = HashSet::from([("a".to_string(), "+1".to_string())]);
        let candidates = vec![
            candidate("ns/p:p", "+1", 5),
            candidate("ns/a:a", "+1", 5),
            candidate("ns/a:a", "+2", 5),
            candidate("ns/a:zzz", "+3", 5),
        ];
        let out = assign("ns", &candidates, &accounts, &blocked, 10);
        assert_eq!(accounts_of(&out), vec![Some("b"), Some("a")]);
        assert_eq!(out[1].recipient, "+2");
    }
}
