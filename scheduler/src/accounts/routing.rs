//! Routing: which account of a pool sends each due task. Pure and unit-tested; the claim
//! (`lease/claim.rs`) feeds it each account's room and the due candidates with what is known of
//! their recipients, and reserves what it assigns.
//!
//! A pooled task goes to the healthiest account of its pool that has room and may send to the
//! recipient now (health in steps of a tenth, then the most headroom), unless its pool is
//! sticky and the recipient's last account is still active and healthy: then it waits for that
//! account, also when another live executor holds it and this one does not ([`HeldElsewhere`]).
//! An account with a messaging tier takes a send that opens a new conversation only
//! while the tier has room; sends inside an open conversation or customer-service window are
//! free.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// The least health at which a sticky pool keeps a recipient on its account.
pub const STICKY_MIN_HEALTH: f64 = 0.5;

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
    /// New conversations its messaging tier still allows (i32::MAX without a tier).
    pub tier_room: i32,
    /// Whether it has a messaging tier.
    pub has_tier: bool,
    /// Whether it may send at all (not paused, not offline).
    pub active: bool,
    /// Health score, 0 to 1.
    pub health: f64,
    /// Whether its pool is sticky.
    pub sticky: bool,
}

impl AccountRoom {
    /// Whether its sends are recorded per recipient (spacing, the tier, a sticky pool).
    pub fn tracks_recipients(&self) -> bool {
        self.has_recipient_interval || self.has_tier || self.sticky
    }
}

/// What routing weighs of a due task: the claim's candidate row carries more (see
/// `store/leases/claim.rs`), and hands routing this part of it.
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
    /// Its queue (whether an executor holding its recipient's sticky account serves it).
    pub queue: String,
}

impl AsRef<Candidate> for Candidate {
    fn as_ref(&self) -> &Candidate {
        self
    }
}

/// What the accounts know of the candidates' recipients, by (account, recipient).
#[derive(Debug, Clone, Default)]
pub struct PairFacts {
    /// Pairs that may not be sent to now (recipient interval, provider block).
    pub blocked: HashSet<(String, String)>,
    /// Pairs a send to is free of the messaging tier (open conversation or service window).
    pub tier_free: HashSet<(String, String)>,
    /// Each recipient's accounts with the last send through each.
    pub last_sent: HashMap<String, Vec<(String, DateTime<Utc>)>>,
}

impl PairFacts {
    /// Records that `pair` was last sent to at `at`.
    pub fn record_send(&mut self, pair: (String, String), at: DateTime<Utc>) {
        let (account, recipient) = pair;
        self.last_sent
            .entry(recipient)
            .or_default()
            .push((account, at));
    }

    /// The account of `pool_accounts` that last sent to `recipient`, and when, if any did.
    fn last_account<'a, A: std::borrow::Borrow<AccountRoom> + 'a>(
        &self,
        recipient: &str,
        pool_accounts: impl IntoIterator<Item = &'a A>,
    ) -> Option<(&'a AccountRoom, DateTime<Utc>)> {
        let sends = self.last_sent.get(recipient)?;
        pool_accounts
            .into_iter()
            .map(std::borrow::Borrow::borrow)
            .filter_map(|a: &AccountRoom| {
                sends
                    .iter()
                    .find(|(id, at)| *id == a.id && *at > DateTime::<Utc>::MIN_UTC)
                    .map(|(_, at)| (a, *at))
            })
            .max_by_key(|(_, at)| *at)
    }
}

/// Which queues a live executor holding an account sends it for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Serves {
    /// Every queue.
    Every,
    /// These queues only.
    Queues(HashSet<String>),
}

impl Serves {
    fn includes(&self, queue: &str) -> bool {
        match self {
            Serves::Every => true,
            Serves::Queues(queues) => queues.contains(queue),
        }
    }
}

/// Accounts of sticky pools that the claiming executor cannot send for and another live
/// executor can, with the queues it serves them for. A recipient whose last account is one of
/// them waits for that executor instead of moving to a number held here; one whose last account
/// no live executor holds moves (the account is as good as offline).
#[derive(Debug, Clone, Default)]
pub struct HeldElsewhere {
    accounts: Vec<(AccountRoom, Serves)>,
}

impl HeldElsewhere {
    /// `account` is held by another live executor serving `serves`; a second holder widens it.
    pub fn add(&mut self, account: AccountRoom, serves: Serves) {
        match self.accounts.iter_mut().find(|(a, _)| a.id == account.id) {
            Some((_, held)) => match (held, serves) {
                (Serves::Every, _) => {}
                (held, Serves::Every) => *held = Serves::Every,
                (Serves::Queues(mine), Serves::Queues(more)) => mine.extend(more),
            },
            None => self.accounts.push((account, serves)),
        }
    }

    /// Whether `c`, of sticky pool `pool`, waits for an account held elsewhere: the account of
    /// the pool that last sent to its recipient is held elsewhere (for its queue), still active
    /// and healthy, and sent later than `here_since` (the last send through an account held
    /// here).
    fn waits_for_one(
        &self,
        c: &Candidate,
        pool: &str,
        facts: &PairFacts,
        here_since: Option<DateTime<Utc>>,
    ) -> bool {
        if self.accounts.is_empty() {
            return false;
        }
        let in_pool = self
            .accounts
            .iter()
            .filter(|(a, serves)| a.pool == pool && serves.includes(&c.queue))
            .map(|(a, _)| a);
        facts
            .last_account(&c.recipient, in_pool)
            .is_some_and(|(a, at)| {
                here_since.is_none_or(|here| at > here) && a.active && a.health >= STICKY_MIN_HEALTH
            })
    }
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
    /// Whether it opens a new conversation on its account's messaging tier.
    pub opens: bool,
    /// Recipient.
    pub recipient: String,
}

/// What is left of one account during an assignment.
#[derive(Debug, Clone, Copy)]
struct Left {
    room: i32,
    room_low: i32,
    tier: i32,
}

/// Assigns candidates (in claim order) to accounts: pooled tasks to an account of the pool (see
/// the module's rules), pinned tasks to their account. Takes at most `limit`. The claim has
/// already taken out candidates whose send window is closed.
///
/// `accounts` are those the claiming executor can send for; `elsewhere` the sticky ones that
/// only other live executors can.
pub fn assign<C: AsRef<Candidate>>(
    namespace: &str,
    candidates: &[C],
    accounts: &[AccountRoom],
    facts: &PairFacts,
    elsewhere: &HeldElsewhere,
    limit: usize,
) -> Vec<Assignment> {
    // Accounts are referred to by their index in `accounts`, and what is known of each
    // recipient is looked up once per candidate: a claim weighs every candidate against every
    // account of its pool (500 × 100 in the routed benchmark), and hashing and cloning
    // (account, recipient) strings for each of those pairs took a quarter of the claim's time.
    let unrouted = format!("{namespace}/");
    let pool_prefix = format!("{namespace}/p:");
    let account_prefix = format!("{namespace}/a:");
    let mut left: Vec<Left> = accounts
        .iter()
        .map(|a| Left {
            room: a.room,
            room_low: a.room_low,
            tier: a.tier_room,
        })
        .collect();
    let health_tenths: Vec<i64> = accounts
        .iter()
        .map(|a| (a.health * 10.0).floor() as i64)
        .collect();
    let index_of: HashMap<&str, usize> = accounts
        .iter()
        .enumerate()
        .map(|(i, a)| (a.id.as_str(), i))
        .collect();
    // Each account's place in id order: ties in health and room, the usual case when a pool's
    // accounts are alike, compare these integers instead of the ids' strings.
    let id_rank: Vec<usize> = {
        let mut by_id: Vec<usize> = (0..accounts.len()).collect();
        by_id.sort_by(|&x, &y| accounts[x].id.cmp(&accounts[y].id));
        let mut rank = vec![0; accounts.len()];
        for (r, i) in by_id.into_iter().enumerate() {
            rank[i] = r;
        }
        rank
    };
    let by_pool: BTreeMap<&str, Vec<usize>> =
        accounts
            .iter()
            .enumerate()
            .fold(BTreeMap::new(), |mut m, (i, a)| {
                m.entry(a.pool.as_str()).or_insert_with(Vec::new).push(i);
                m
            });
    let blocked = by_recipient(&facts.blocked, &index_of);
    let tier_free = by_recipient(&facts.tier_free, &index_of);
    // Accounts this claim already gave each recipient, by `rules::recipient_key`: a number
    // spelled with and without its `+` is one person for spacing and conversations, as the
    // grant's marks key it (two spellings in one claim were both granted on a spaced account).
    let mut used: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut out = Vec::new();

    for c in candidates.iter().map(AsRef::as_ref) {
        if out.len() >= limit {
            break;
        }
        if c.route == unrouted {
            out.push(Assignment {
                id: c.id,
                account: None,
                high: false,
                opens: false,
                recipient: c.recipient.clone(),
            });
            continue;
        }
        // Borrowed from the pool, not copied: one account alone (a pinned route, or the sticky
        // one) is held in `single`.
        let mut single = [0usize; 1];
        let mut choices: &[usize] = if let Some(pool) = c.route.strip_prefix(&pool_prefix) {
            by_pool.get(pool).map_or(&[], Vec::as_slice)
        } else if let Some(&i) = c
            .route
            .strip_prefix(&account_prefix)
            .and_then(|id| index_of.get(id))
        {
            single[0] = i;
            &single
        } else {
            &[]
        };
        if c.route.starts_with(&pool_prefix) && choices.first().is_some_and(|&i| accounts[i].sticky)
        {
            let pool: Vec<&AccountRoom> = choices.iter().map(|&i| &accounts[i]).collect();
            let last = facts.last_account(&c.recipient, pool.iter().copied());
            let pool_name = &c.route[pool_prefix.len()..];
            if elsewhere.waits_for_one(c, pool_name, facts, last.map(|(_, at)| at)) {
                continue;
            }
            if let Some((last, _)) = last {
                if last.active && last.health >= STICKY_MIN_HEALTH {
                    choices = match index_of.get(last.id.as_str()) {
                        Some(&i) => {
                            single[0] = i;
                            &single
                        }
                        None => &[],
                    };
                }
            }
        }
        let recipient = c.recipient.as_str();
        let none: &[usize] = &[];
        let blocked_here = blocked.get(recipient).map_or(none, Vec::as_slice);
        let free_here = tier_free.get(recipient).map_or(none, Vec::as_slice);
        let person = crate::rules::recipient_key(recipient);
        let used_here = used.get(person).map_or(none, Vec::as_slice);
        let opens_on =
            |i: usize| accounts[i].has_tier && !free_here.contains(&i) && !used_here.contains(&i);
        let pick = choices
            .iter()
            .copied()
            .filter(|&i| {
                let a = &accounts[i];
                let l = left[i];
                let fits = if c.priority >= a.high_priority_min {
                    l.room > 0
                } else {
                    l.room_low > 0
                };
                fits && !blocked_here.contains(&i)
                    && !(a.has_recipient_interval && used_here.contains(&i))
                    && (!opens_on(i) || l.tier > 0)
            })
            // Healthiest first (in tenths), then most headroom; ties go to the lower id, so
            // the choice is stable.
            .max_by(|&x, &y| {
                health_tenths[x]
                    .cmp(&health_tenths[y])
                    .then(left[x].room.cmp(&left[y].room))
                    .then(id_rank[y].cmp(&id_rank[x]))
            });
        let Some(i) = pick else { continue };
        let account = &accounts[i];
        let high = c.priority >= account.high_priority_min;
        let opens = opens_on(i);
        let l = &mut left[i];
        l.room -= 1;
        // A low-priority send uses a slot of the shared part; a high one may dip into the
        // reserve, and the shared part can never exceed the total.
        if !high {
            l.room_low -= 1;
        }
        l.room_low = l.room_low.min(l.room);
        if opens {
            l.tier -= 1;
        }
        used.entry(person).or_default().push(i);
        out.push(Assignment {
            id: c.id,
            account: Some(account.id.clone()),
            high,
            opens,
            recipient: c.recipient.clone(),
        });
    }
    out
}

/// (account, recipient) pairs as each recipient's account indexes.
fn by_recipient<'a>(
    pairs: &'a HashSet<(String, String)>,
    index_of: &HashMap<&str, usize>,
) -> HashMap<&'a str, Vec<usize>> {
    let mut m: HashMap<&str, Vec<usize>> = HashMap::new();
    for (account, recipient) in pairs {
        if let Some(&i) = index_of.get(account.as_str()) {
            m.entry(recipient.as_str()).or_default().push(i);
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(id: &str, pool: &str, room: i32, room_low: i32) -> AccountRoom {
        AccountRoom {
            id: id.into(),
            pool: pool.into(),
            room,
            room_low,
            high_priority_min: 7,
            has_recipient_interval: true,
            tier_room: i32::MAX,
            has_tier: false,
            active: true,
            health: 1.0,
            sticky: false,
        }
    }

    fn candidate(route: &str, recipient: &str, priority: i16) -> Candidate {
        Candidate {
            id: Uuid::now_v7(),
            route: route.into(),
            recipient: recipient.into(),
            priority,
            queue: "q".into(),
        }
    }

    /// Routes for an executor that holds `accounts`, none held elsewhere.
    fn assign_here(
        candidates: &[Candidate],
        accounts: &[AccountRoom],
        facts: &PairFacts,
        limit: usize,
    ) -> Vec<Assignment> {
        assign(
            "ns",
            candidates,
            accounts,
            facts,
            &HeldElsewhere::default(),
            limit,
        )
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
        let out = assign_here(&candidates, &accounts, &PairFacts::default(), 10);
        assert_eq!(
            accounts_of(&out),
            vec![Some("b"), Some("b"), Some("a"), Some("b")]
        );
    }

    #[test]
    fn equally_healthy_accounts_with_equal_room_go_in_id_order_whatever_their_order() {
        // Given out of id order; every tie goes to the lowest id that still has the most room.
        let accounts = vec![
            account("c", "p", 2, 2),
            account("a", "p", 2, 2),
            account("b", "p", 2, 2),
            account("a2", "p", 1, 1),
        ];
        let candidates: Vec<Candidate> = (0..6)
            .map(|n| candidate("ns/p:p", &format!("r{n}"), 0))
            .collect();
        let out = assign_here(&candidates, &accounts, &PairFacts::default(), 10);
        assert_eq!(
            accounts_of(&out),
            vec![
                Some("a"),
                Some("b"),
                Some("c"),
                Some("a"),
                Some("a2"),
                Some("b")
            ]
        );
    }

    #[test]
    fn never_more_than_an_accounts_room_nor_the_limit() {
        let accounts = [account("a", "p", 2, 2)];
        let candidates: Vec<_> = (0..5)
            .map(|i| candidate("ns/p:p", &format!("+{i}"), 5))
            .collect();
        assert_eq!(
            assign_here(&candidates, &accounts, &PairFacts::default(), 10).len(),
            2
        );
        let unrouted: Vec<_> = (0..5)
            .map(|i| candidate("ns/", &format!("+{i}"), 5))
            .collect();
        assert_eq!(
            assign_here(&unrouted, &accounts, &PairFacts::default(), 3).len(),
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
        assert_eq!(
            assign_here(&low, &accounts, &PairFacts::default(), 10).len(),
            2
        );
        let mut mixed = low.clone();
        mixed.insert(0, candidate("ns/p:p", "+h1", 9));
        mixed.insert(1, candidate("ns/p:p", "+h2", 8));
        let out = assign_here(&mixed, &accounts, &PairFacts::default(), 10);
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
        let out = assign_here(&candidates, &accounts, &PairFacts::default(), 10);
        assert_eq!(accounts_of(&out), vec![Some("a"), Some("b")]);
    }

    #[test]
    fn blocked_pairs_and_pinned_accounts_are_respected() {
        let accounts = [account("a", "p", 5, 5), account("b", "p", 5, 5)];
        let blocked = PairFacts {
            blocked: HashSet::from([("a".to_string(), "+1".to_string())]),
            ..Default::default()
        };
        let candidates = vec![
            candidate("ns/p:p", "+1", 5),
            candidate("ns/a:a", "+1", 5),
            candidate("ns/a:a", "+2", 5),
            candidate("ns/a:zzz", "+3", 5),
        ];
        let out = assign_here(&candidates, &accounts, &blocked, 10);
        assert_eq!(accounts_of(&out), vec![Some("b"), Some("a")]);
        assert_eq!(out[1].recipient, "+2");
    }

    #[test]
    fn one_number_spelled_two_ways_is_one_recipient_on_a_spaced_account() {
        let accounts = [account("a", "p", 10, 10)];
        let candidates = vec![
            candidate("ns/a:a", "+15550001111", 5),
            candidate("ns/a:a", "15550001111", 5),
            candidate("ns/a:a", "+15550002222", 5),
        ];
        let out = assign_here(&candidates, &accounts, &PairFacts::default(), 10);
        let got: Vec<&str> = out.iter().map(|a| a.recipient.as_str()).collect();
        assert_eq!(got, vec!["+15550001111", "+15550002222"]);
    }

    #[test]
    fn the_tier_caps_new_conversations_but_not_open_ones() {
        let mut a = account("a", "p", 10, 10);
        a.has_tier = true;
        a.tier_room = 1;
        a.has_recipient_interval = false;
        let facts = PairFacts {
            tier_free: HashSet::from([("a".to_string(), "+replied".to_string())]),
            ..Default::default()
        };
        let candidates = vec![
            candidate("ns/p:p", "+new1", 5),
            candidate("ns/p:p", "+new2", 5),
            candidate("ns/p:p", "+replied", 5),
            candidate("ns/p:p", "+new1", 5),
        ];
        let out = assign_here(&candidates, &[a], &facts, 10);
        let got: Vec<(&str, bool)> = out
            .iter()
            .map(|a| (a.recipient.as_str(), a.opens))
            .collect();
        assert_eq!(
            got,
            vec![("+new1", true), ("+replied", false), ("+new1", false)]
        );
    }

    #[test]
    fn sticky_pools_keep_a_recipient_on_its_healthy_account() {
        let mut a = account("a", "p", 1, 1);
        let mut b = account("b", "p", 9, 9);
        a.sticky = true;
        b.sticky = true;
        let mut facts = PairFacts::default();
        facts.record_send(("a".into(), "+1".into()), Utc::now());
        let candidates = vec![candidate("ns/p:p", "+1", 5), candidate("ns/p:p", "+1", 5)];
        let out = assign_here(&candidates, &[a.clone(), b.clone()], &facts, 10);
        // The second waits for its account rather than move to b.
        assert_eq!(accounts_of(&out), vec![Some("a")]);
        a.health = 0.2;
        let out = assign_here(&candidates[..1], &[a, b], &facts, 10);
        assert_eq!(accounts_of(&out), vec![Some("b")]);
    }

    #[test]
    fn healthier_accounts_are_preferred_over_more_headroom() {
        let mut sick = account("a", "p", 9, 9);
        sick.health = 0.4;
        let well = account("b", "p", 1, 1);
        let candidates = vec![candidate("ns/p:p", "+1", 5), candidate("ns/p:p", "+2", 5)];
        let out = assign_here(&candidates, &[sick, well], &PairFacts::default(), 10);
        assert_eq!(accounts_of(&out), vec![Some("b"), Some("a")]);
    }

    #[test]
    fn sticky_recipients_wait_for_an_account_another_live_executor_holds_for_their_queue() {
        let mut here = account("here", "p", 9, 9);
        let mut away = account("away", "p", 9, 9);
        here.sticky = true;
        away.sticky = true;
        let mut facts = PairFacts::default();
        let earlier = Utc::now() - chrono::Duration::minutes(5);
        facts.record_send(("away".into(), "+known".into()), Utc::now());
        facts.record_send(("here".into(), "+back".into()), Utc::now());
        facts.record_send(("away".into(), "+back".into()), earlier);
        let candidates = vec![
            candidate("ns/p:p", "+known", 5),
            candidate("ns/p:p", "+new", 5),
            candidate("ns/p:p", "+back", 5),
        ];
        let routed = |elsewhere: &HeldElsewhere| {
            let out = assign("ns", &candidates, &[here.clone()], &facts, elsewhere, 10);
            out.into_iter()
                .map(|a| a.recipient)
                .collect::<Vec<String>>()
        };
        // Held elsewhere for the task's queue: the known recipient waits; the new one, and
        // the one this executor's account messaged last, go here.
        let mut elsewhere = HeldElsewhere::default();
        elsewhere.add(away.clone(), Serves::Queues(HashSet::from(["q".into()])));
        assert_eq!(routed(&elsewhere), vec!["+new", "+back"]);
        // An executor that holds it for every queue, as another adds: still waits.
        let mut every = HeldElsewhere::default();
        every.add(
            away.clone(),
            Serves::Queues(HashSet::from(["other".into()])),
        );
        every.add(away.clone(), Serves::Every);
        assert_eq!(routed(&every), vec!["+new", "+back"]);
        // Held only for another queue, or by nobody live, or paused: the recipient moves.
        let mut other_queue = HeldElsewhere::default();
        other_queue.add(
            away.clone(),
            Serves::Queues(HashSet::from(["other".into()])),
        );
        assert_eq!(routed(&other_queue), vec!["+known", "+new", "+back"]);
        assert_eq!(
            routed(&HeldElsewhere::default()),
            vec!["+known", "+new", "+back"]
        );
        away.active = false;
        let mut paused = HeldElsewhere::default();
        paused.add(away, Serves::Every);
        assert_eq!(routed(&paused), vec!["+known", "+new", "+back"]);
    }
}
