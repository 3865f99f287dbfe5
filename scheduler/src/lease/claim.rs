//! Claiming due tasks: granting leases within the executor's credit and every sending account's
//! limits, in one transaction.
//!
//! Without accounts in the namespace a claim is a single statement (`claim_due.sql`). With
//! accounts it is a short transaction of named steps:
//! 1. [`read_budgets`]: what each account may send now (`herald.account_room`, the one
//!    definition of the limits);
//! 2. [`lock_candidates`]: lock due candidates of the routes that have room;
//! 3. end the tasks of suppressed recipients, move those whose send window is closed to its
//!    next opening, read what the accounts know of the recipients (spacing, provider blocks,
//!    open conversations, last account), and assign pooled tasks to an account of their pool
//!    ([`routing::assign`], pure and unit-tested: health, stickiness, tiers); when a sticky
//!    pool's recipient was last sent to through an account this executor does not hold, which
//!    other live executors hold it is read from their presence (`held_elsewhere`);
//! 4. lease the assignments, then grant them (`herald.grant_claim`): reserve account capacity
//!    atomically (`herald.reserve_capacity`), record recipient sends, give back what a
//!    concurrent claim took first; then settle: paced sends are leased from their drawn
//!    instants and what the grant refused is scheduled again as it was
//!    ([`LeaseRepo::grant`](crate::store::leases::LeaseRepo::grant)).
//!
//! The reservation in step 4 is what keeps the limits across replicas: it locks each account row
//! and grants no more than its room at that instant. Report batches need the same rows to free
//! slots, so the rows are locked as late as possible: after the lease update, for one
//! statement and the commit (docs/performance.md, S5).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_postgres::Transaction;

use super::presence;
use crate::accounts::routing::{self, AccountRoom, HeldElsewhere, PairFacts, Serves};
pub use crate::store::leases::claim::ClaimRequest;
use crate::store::leases::claim::{AccountBudget, CandidateRow, GrantAccounts};
use crate::store::transaction;
use crate::store::{Db, Store, StoreError};
use crate::tasks::model::GrantedLease;
use uuid::Uuid;

/// How long a namespace seen without accounts keeps the one-statement claim path before the
/// accounts table is read again, by default. Creating an account ends it at once on every
/// replica (`herald_accounts`); the expiry is the backstop for a notification lost while a
/// replica's listener was reconnecting (it forgets every namespace when it reconnects, too).
pub const NO_ACCOUNTS_TTL: Duration = Duration::from_secs(1);

/// Namespaces known to have no accounts, until when.
#[derive(Debug, Clone)]
pub struct NoAccountsCache {
    until: Arc<Mutex<HashMap<String, Instant>>>,
    ttl: Duration,
}

impl Default for NoAccountsCache {
    fn default() -> Self {
        Self::with_ttl(NO_ACCOUNTS_TTL)
    }
}

impl NoAccountsCache {
    /// A cache that keeps a namespace for `ttl`.
    pub fn with_ttl(ttl: Duration) -> Self {
        NoAccountsCache {
            until: Arc::default(),
            ttl,
        }
    }

    /// How long `namespace` is still known to have no accounts.
    fn remaining(&self, namespace: &str) -> Option<Duration> {
        let now = Instant::now();
        let until = self.until.lock().ok()?.get(namespace).copied()?;
        (until > now).then(|| until - now)
    }

    /// Whether `namespace` is known, now, to have no accounts: its claims are the queue walk.
    pub fn known_empty(&self, namespace: &str) -> bool {
        self.remaining(namespace).is_some()
    }

    fn remember(&self, namespace: &str) {
        if let Ok(mut map) = self.until.lock() {
            map.insert(namespace.to_owned(), Instant::now() + self.ttl);
        }
    }

    /// Forgets what is known of `namespace`: it gained an account.
    pub fn forget(&self, namespace: &str) {
        if let Ok(mut map) = self.until.lock() {
            map.remove(namespace);
        }
    }

    /// Forgets every namespace (after missing notifications).
    pub fn forget_all(&self) {
        if let Ok(mut map) = self.until.lock() {
            map.clear();
        }
    }
}

/// What a claim granted, and what the dispatcher needs to know to wait well when it granted
/// nothing.
#[derive(Debug, Default)]
pub struct Claimed {
    /// The leases granted.
    pub leases: Vec<GrantedLease>,
    /// Routes that could be served now; the next due time is looked up among these only.
    pub open_routes: Vec<String>,
    /// How long until an account without room gets room again by time alone.
    pub recheck_in: Option<Duration>,
    /// Whether the leases came from the queue claim's walk, the one the due marks steer.
    pub by_queue_walk: bool,
}

/// Claims due tasks, as one statement while the namespace has no accounts.
pub async fn claim(
    store: &Store,
    no_accounts: &NoAccountsCache,
    req: &ClaimRequest<'_>,
) -> Result<Claimed, StoreError> {
    if let Some(remaining) = no_accounts.remaining(req.namespace) {
        // One autocommitted statement: a single round trip per claim on the drain path.
        let conn = store.conn().await?;
        let leases = conn.leases().claim_due(req).await?;
        return Ok(Claimed {
            leases,
            open_routes: vec![req.unrouted()],
            recheck_in: Some(remaining),
            by_queue_walk: true,
        });
    }
    // Idempotent: a claim whose commit happened unheard leased tasks that are never sent; they
    // come back when their lease runs out, as any lease whose grant was lost. A second run
    // claims other tasks.
    let (claimed, had_accounts) =
        transaction!(store, StoreError, idempotent = true, |tx| claim_in(tx, req)
            .await)?;
    if !had_accounts {
        no_accounts.remember(req.namespace);
    }
    Ok(claimed)
}

/// One claim in `tx`; also says whether the namespace has accounts.
async fn claim_in(
    tx: &Transaction<'_>,
    req: &ClaimRequest<'_>,
) -> Result<(Claimed, bool), StoreError> {
    let budgets = tx.leases().account_budgets(req.namespace).await?;
    if budgets.is_empty() {
        // No accounts: every task is sent by queue; one statement.
        let leases = tx.leases().claim_due(req).await?;
        let claimed = Claimed {
            leases,
            open_routes: vec![req.unrouted()],
            recheck_in: None,
            by_queue_walk: true,
        };
        return Ok((claimed, false));
    }
    let credentials: HashMap<String, String> = budgets
        .iter()
        .map(|b| (b.room.id.clone(), b.credentials_ref.clone()))
        .collect();
    let (accounts, not_held, recheck_in) = read_budgets(req, budgets);
    let (candidates, open_routes) = lock_candidates(tx, req, &accounts).await?;
    if candidates.is_empty() {
        let claimed = Claimed {
            leases: Vec::new(),
            open_routes,
            recheck_in,
            by_queue_walk: false,
        };
        return Ok((claimed, true));
    }
    // Recipients put on the suppression list after their task was queued: the task ends
    // SUPPRESSED here instead of being leased (one statement, only when there are any).
    let listed: Vec<Uuid> = candidates
        .iter()
        .filter(|c| c.suppressed)
        .map(|c| c.task.id)
        .collect();
    let candidates: Vec<CandidateRow> = if listed.is_empty() {
        candidates
    } else {
        let ended: HashSet<Uuid> = tx
            .suppressions()
            .suppress_tasks(&listed)
            .await?
            .into_iter()
            .collect();
        candidates
            .into_iter()
            .filter(|c| !ended.contains(&c.task.id))
            .collect()
    };
    let recipients: Vec<&str> = candidates
        .iter()
        .filter(|c| c.task.route != req.unrouted())
        .map(|c| c.task.recipient.as_str())
        .collect::<HashSet<&str>>()
        .into_iter()
        .collect();
    let facts = tx
        .leases()
        .recipient_facts(req.namespace, &recipients)
        .await?;
    // Only candidates with a send window are looked at (one statement, and none at all when
    // no candidate has one).
    let windowed: Vec<Uuid> = candidates
        .iter()
        .filter(|c| c.windowed)
        .map(|c| c.task.id)
        .collect();
    let deferred = tx.leases().defer_closed_windows(&windowed).await?;
    let candidates: Vec<CandidateRow> = candidates
        .into_iter()
        .filter(|c| !deferred.contains(&c.task.id))
        .collect();
    let elsewhere = held_elsewhere(tx, req, not_held, &facts).await?;
    let limit = usize::try_from(req.limit).unwrap_or(usize::MAX);
    let assigned = routing::assign(
        req.namespace,
        &candidates,
        &accounts,
        &facts,
        &elsewhere,
        limit,
    );
    let tracked: Vec<&str> = accounts
        .iter()
        .filter(|a| a.tracks_recipients())
        .map(|a| a.id.as_str())
        .collect();
    let grant_accounts = GrantAccounts {
        tracked: &tracked,
        credentials: &credentials,
    };
    let leases = tx.leases().grant(req, &assigned, &grant_accounts).await?;
    let claimed = Claimed {
        leases,
        open_routes,
        recheck_in,
        by_queue_walk: false,
    };
    Ok((claimed, true))
}

/// The accounts this executor can send for, with their room; those of sticky pools it cannot
/// send for; and how long until an account it can without room gets some back by time alone.
fn read_budgets(
    req: &ClaimRequest<'_>,
    budgets: Vec<AccountBudget>,
) -> (Vec<AccountRoom>, Vec<AccountBudget>, Option<Duration>) {
    let mut accounts = Vec::new();
    let mut not_held = Vec::new();
    let mut recheck_ms: Option<f64> = None;
    for b in budgets {
        if req
            .credentials
            .is_some_and(|held| !held.contains(&b.credentials_ref))
        {
            if b.room.sticky {
                not_held.push(b);
            }
            continue;
        }
        if b.room.room == 0 {
            if let Some(ms) = b.available_in_ms {
                recheck_ms = Some(recheck_ms.map_or(ms, |r| r.min(ms)));
            }
        }
        accounts.push(b.room);
    }
    let recheck_in = recheck_ms.map(|ms| Duration::from_micros((ms.max(0.0) * 1000.0) as u64));
    (accounts, not_held, recheck_in)
}

/// Which of `not_held` (sticky-pool accounts this executor cannot send for) other live
/// executors hold, and for which queues. Presence is read only when a candidate's recipient was
/// sent to through one of them: otherwise none can keep a recipient waiting.
async fn held_elsewhere(
    tx: &Transaction<'_>,
    req: &ClaimRequest<'_>,
    not_held: Vec<AccountBudget>,
    facts: &PairFacts,
) -> Result<HeldElsewhere, StoreError> {
    let mut elsewhere = HeldElsewhere::default();
    if not_held.is_empty() {
        return Ok(elsewhere);
    }
    let sent_through: HashSet<&str> = facts
        .last_sent
        .values()
        .flatten()
        .map(|(account, _)| account.as_str())
        .collect();
    let not_held: Vec<AccountBudget> = not_held
        .into_iter()
        .filter(|b| sent_through.contains(b.room.id.as_str()))
        .collect();
    if not_held.is_empty() {
        return Ok(elsewhere);
    }
    let holders = tx
        .executors()
        .live_elsewhere(req.namespace, req.executor_id, presence::FRESH)
        .await?;
    for b in not_held {
        for h in &holders {
            if h.credentials.is_empty() || h.credentials.contains(&b.credentials_ref) {
                let serves = if h.queues.is_empty() {
                    Serves::Every
                } else {
                    Serves::Queues(h.queues.iter().cloned().collect())
                };
                elsewhere.add(b.room.clone(), serves);
            }
        }
    }
    Ok(elsewhere)
}

/// Locks due candidates of every route with room: by queue, each pool with room (up to its
/// room) and each pinned account with room. Returns them with the routes that were open.
async fn lock_candidates(
    tx: &Transaction<'_>,
    req: &ClaimRequest<'_>,
    accounts: &[AccountRoom],
) -> Result<(Vec<CandidateRow>, Vec<String>), StoreError> {
    let limit = i32::try_from(req.limit).unwrap_or(i32::MAX);
    let mut pool_room: BTreeMap<&str, i32> = BTreeMap::new();
    for a in accounts.iter().filter(|a| a.room > 0) {
        *pool_room.entry(a.pool.as_str()).or_default() += a.room;
    }
    let mut wide = vec![(req.unrouted(), limit)];
    for (pool, room) in &pool_room {
        wide.push((format!("{}/p:{pool}", req.namespace), (*room).min(limit)));
    }
    let pinned: Vec<(String, i32)> = accounts
        .iter()
        .filter(|a| a.room > 0)
        .map(|a| (format!("{}/a:{}", req.namespace, a.id), a.room.min(limit)))
        .collect();
    let open_routes = wide
        .iter()
        .chain(pinned.iter())
        .map(|(route, _)| route.clone())
        .collect();
    let candidates = tx.leases().candidates(req, &wide, &pinned).await?;
    Ok((candidates, open_routes))
}
