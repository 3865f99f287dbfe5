//! Claiming due tasks: granting leases within the executor's credit and every sending account's
//! limits, in one transaction.
//!
//! Without accounts in the namespace a claim is a single statement (`claim_due.sql`). With
//! accounts it is a short transaction of named steps:
//! 1. [`read_budgets`]: what each account may send now (`herald.account_room`, the one
//!    definition of the limits);
//! 2. [`lock_candidates`]: lock due candidates of the routes that have room;
//! 3. read what the accounts know of the candidates' recipients (spacing, provider blocks,
//!    open conversations, last account), and assign pooled tasks to an account of their pool
//!    ([`routing::assign`], pure and unit-tested: health, stickiness, tiers);
//! 4. [`reserve`] and [`mark_recipients`]: reserve account capacity atomically
//!    (`herald.reserve_capacity`) and record recipient sends; whatever a concurrent claim took
//!    first is dropped here;
//! 5. move candidates whose send window is closed to its next opening, and lease what is left
//!    (`lease_assigned.sql`).
//!
//! The reservation in step 4 is what keeps the limits across replicas: it locks each account row
//! and grants no more than its room at that instant.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use deadpool_postgres::Transaction;

use crate::accounts::routing::{self, AccountRoom, Assignment, Candidate};
use crate::store::leases::claim::{AccountBudget, ClaimParams};
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

impl ClaimRequest<'_> {
    fn params(&self) -> ClaimParams<'_> {
        ClaimParams {
            executor_id: self.executor_id,
            queues: self.queues,
            limit: self.limit,
            ttl_ms: i64::try_from(self.lease_ttl.as_millis()).unwrap_or(i64::MAX),
        }
    }

    /// The route of tasks sent by queue alone.
    fn unrouted(&self) -> String {
        format!("{}/", self.namespace)
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
        let leases = conn
            .leases()
            .claim_due(&req.params(), &req.unrouted())
            .await?;
        return Ok(Claimed {
            leases,
            open_routes: vec![req.unrouted()],
            recheck_in: Some(remaining),
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
        let leases = tx
            .leases()
            .claim_due(&req.params(), &req.unrouted())
            .await?;
        let claimed = Claimed {
            leases,
            open_routes: vec![req.unrouted()],
            recheck_in: None,
        };
        return Ok((claimed, false));
    }
    let (accounts, recheck_in) = read_budgets(req, budgets);
    let (candidates, open_routes) = lock_candidates(tx, req, &accounts).await?;
    if candidates.is_empty() {
        let claimed = Claimed {
            leases: Vec::new(),
            open_routes,
            recheck_in,
        };
        return Ok((claimed, true));
    }
    // Recipients put on the suppression list after their task was queued: the task ends
    // SUPPRESSED here instead of being leased (one statement, only when there are any).
    let listed: Vec<Uuid> = candidates
        .iter()
        .filter(|c| c.suppressed)
        .map(|c| c.id)
        .collect();
    let candidates: Vec<Candidate> = if listed.is_empty() {
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
            .filter(|c| !ended.contains(&c.id))
            .collect()
    };
    let recipients: Vec<&str> = candidates
        .iter()
        .filter(|c| c.route != req.unrouted())
        .map(|c| c.recipient.as_str())
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
        .map(|c| c.id)
        .collect();
    let deferred = tx.leases().defer_closed_windows(&windowed).await?;
    let candidates: Vec<Candidate> = candidates
        .into_iter()
        .filter(|c| !deferred.contains(&c.id))
        .collect();
    let limit = usize::try_from(req.limit).unwrap_or(usize::MAX);
    let assigned = routing::assign(req.namespace, &candidates, &accounts, &facts, limit);
    let (assigned, granted_at) = reserve(tx, req, assigned).await?;
    let assigned = mark_recipients(tx, req, &accounts, assigned, &granted_at).await?;
    // A routed lease is granted at its reserved instant; the rest at the lease's.
    let leasing: Vec<_> = assigned
        .iter()
        .map(|a| (a.id, a.account.as_deref(), granted_at.get(&a.id).copied()))
        .collect();
    let leases = tx.leases().lease_assigned(&req.params(), &leasing).await?;
    let claimed = Claimed {
        leases,
        open_routes,
        recheck_in,
    };
    Ok((claimed, true))
}

/// The accounts this executor can send for, with their room; and how long until an account
/// without room gets some back by time alone.
fn read_budgets(
    req: &ClaimRequest<'_>,
    budgets: Vec<AccountBudget>,
) -> (Vec<AccountRoom>, Option<Duration>) {
    let mut accounts = Vec::new();
    let mut recheck_ms: Option<f64> = None;
    for b in budgets {
        if req
            .credentials
            .is_some_and(|held| !held.contains(&b.credentials_ref))
        {
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
    (accounts, recheck_in)
}

/// Locks due candidates of every route with room: by queue, each pool with room (up to its
/// room) and each pinned account with room. Returns them with the routes that were open.
async fn lock_candidates(
    tx: &Transaction<'_>,
    req: &ClaimRequest<'_>,
    accounts: &[AccountRoom],
) -> Result<(Vec<Candidate>, Vec<String>), StoreError> {
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
    let candidates = tx
        .leases()
        .candidates(req.namespace, &wide, &pinned, req.queues)
        .await?;
    Ok((candidates, open_routes))
}

/// Reserves capacity for the assigned tasks; accounts grant at most their room (and their
/// tier's room for new conversations) at this instant. Keeps the assignments that got a slot,
/// gives back the slots of those dropped for want of tier room, and returns the instant each
/// kept routed task is granted at: its account's reservation instant, or for an account with
/// human-like gaps the next of its paced instants, in the order the tasks were assigned.
async fn reserve(
    tx: &Transaction<'_>,
    req: &ClaimRequest<'_>,
    mut assigned: Vec<Assignment>,
) -> Result<(Vec<Assignment>, HashMap<Uuid, DateTime<Utc>>), StoreError> {
    let mut wanted: BTreeMap<&str, (i32, i32, i32)> = BTreeMap::new();
    for a in &assigned {
        if let Some(acc) = a.account.as_deref() {
            let w = wanted.entry(acc).or_default();
            if a.high {
                w.0 += 1;
            } else {
                w.1 += 1;
            }
            if a.opens {
                w.2 += 1;
            }
        }
    }
    let reservations = tx.leases().reserve(req.namespace, &wanted).await?;
    let mut instants: HashMap<String, Instants> = HashMap::new();
    let mut granted: HashMap<String, (i32, i32, i32)> = HashMap::new();
    for r in reservations {
        instants.insert(r.account.clone(), Instants::new(r.at, r.times));
        granted.insert(r.account, (r.high, r.low, r.new));
    }
    let mut unused: Vec<String> = Vec::new();
    assigned.retain(|a| match a.account.as_deref() {
        None => true,
        Some(acc) => granted.get_mut(acc).is_some_and(|g| {
            let slot = if a.high { &mut g.0 } else { &mut g.1 };
            if *slot == 0 {
                return false;
            }
            *slot -= 1;
            if a.opens {
                if g.2 == 0 {
                    unused.push(acc.to_owned());
                    return false;
                }
                g.2 -= 1;
            }
            true
        }),
    });
    if !unused.is_empty() {
        tx.accounts()
            .release_slots(req.namespace, &unused, true)
            .await?;
    }
    let granted_at = assigned
        .iter()
        .filter_map(|a| {
            let at = instants.get_mut(a.account.as_deref()?)?.next();
            Some((a.id, at))
        })
        .collect();
    Ok((assigned, granted_at))
}

/// The instants an account's reservation grants its sends at, handed out in order.
struct Instants {
    at: DateTime<Utc>,
    paced: std::vec::IntoIter<DateTime<Utc>>,
}

impl Instants {
    fn new(at: DateTime<Utc>, paced: Option<Vec<DateTime<Utc>>>) -> Self {
        Instants {
            at,
            paced: paced.unwrap_or_default().into_iter(),
        }
    }

    /// The next send's instant: a paced account has one per granted send (a task dropped
    /// after the reservation leaves its instant unused), any other its reservation's instant.
    fn next(&mut self) -> DateTime<Utc> {
        if let Some(t) = self.paced.next() {
            self.at = t;
        }
        self.at
    }
}

/// Records recipient sends where the account tracks them (spacing, tier, sticky pool), at each
/// task's granted instant
/// (reservations on one account are serialised by its row lock, so these times are in order); a
/// pair another claim just took comes back refused, its task is dropped and its account slot
/// given back.
async fn mark_recipients(
    tx: &Transaction<'_>,
    req: &ClaimRequest<'_>,
    accounts: &[AccountRoom],
    mut assigned: Vec<Assignment>,
    granted_at: &HashMap<Uuid, DateTime<Utc>>,
) -> Result<Vec<Assignment>, StoreError> {
    let spaced: HashSet<&str> = accounts
        .iter()
        .filter(|a| a.tracks_recipients())
        .map(|a| a.id.as_str())
        .collect();
    // One mark per pair: a pair can repeat in a claim where the account does not space sends.
    let mut seen: HashSet<(&str, &str)> = HashSet::new();
    let marks: Vec<(&str, &str, DateTime<Utc>, bool)> = assigned
        .iter()
        .filter_map(|a| {
            let acc = a.account.as_deref()?;
            let at = granted_at.get(&a.id)?;
            (spaced.contains(acc) && seen.insert((acc, a.recipient.as_str()))).then_some((
                acc,
                a.recipient.as_str(),
                *at,
                a.opens,
            ))
        })
        .collect();
    if marks.is_empty() {
        return Ok(assigned);
    }
    let accepted = tx.leases().mark_recipients(req.namespace, &marks).await?;
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
    tx.accounts()
        .release_slots(req.namespace, &refused, true)
        .await?;
    Ok(assigned)
}
