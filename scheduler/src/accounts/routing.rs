//! Routing: which account of a pool sends each due task. Pure and unit-tested; the claim
//! (`lease/claim.rs`) feeds it each account's room and the due candidates, and reserves what it
//! assigns.

use std::collections::{BTreeMap, HashMap, HashSet};

use uuid::Uuid;

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
