//! "Why is it waiting": what holds a pending task, from what herald knows of it and of the
//! accounts it may be sent through. A pure function of those facts, so every rule is
//! unit-tested; the console reads the facts with the repositories' queries.
//!
//! A task pinned to an account waits while that account cannot send. A pooled task waits only
//! while every account of its pool is held, so each held account is named with its reason.

use chrono::{DateTime, NaiveTime, Utc};

use crate::accounts::model::{AccountRecord, AccountState};
use crate::store::executors::Serving;

/// The kinds of hold, as the page and the tests name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldKind {
    /// Due later.
    NotDue,
    /// Its campaign is paused.
    CampaignPaused,
    /// An operator paused the account.
    AccountPaused,
    /// The account is offline (a provider error, or no executor holds its credentials).
    AccountOffline,
    /// The account sent its cap for today (ramp included).
    DailyCap,
    /// The account's provider tier is used up.
    Tier,
    /// The account is in its quiet hours.
    QuietHours,
    /// The provider asked the account to slow down.
    Throttled,
    /// The account's pacing (rate, gaps) puts its next send later.
    Paced,
    /// The task's pool has no account that could send it.
    NoAccount,
    /// The account sent to this recipient within its recipient interval, or the provider asked
    /// to leave the recipient alone for a while.
    RecipientSpacing,
    /// The executors serving its queue hold none of its accounts' credentials.
    NoCredentials,
    /// No executor serving its queue is connected.
    NoExecutor,
    /// Nothing holds it: an executor serving its queue is connected and takes it at its next
    /// claim.
    AwaitingExecutor,
}

impl HoldKind {
    /// A short, stable name (for the page's labels and the tests).
    pub fn name(self) -> &'static str {
        match self {
            HoldKind::NotDue => "not due yet",
            HoldKind::CampaignPaused => "campaign paused",
            HoldKind::AccountPaused => "account paused",
            HoldKind::AccountOffline => "account offline",
            HoldKind::DailyCap => "daily cap reached",
            HoldKind::Tier => "tier reached",
            HoldKind::QuietHours => "quiet hours",
            HoldKind::Throttled => "provider throttling",
            HoldKind::Paced => "account pacing",
            HoldKind::NoAccount => "no account",
            HoldKind::RecipientSpacing => "recipient spacing",
            HoldKind::NoCredentials => "no executor holds its credentials",
            HoldKind::NoExecutor => "no executor for its queue",
            HoldKind::AwaitingExecutor => "next claim",
        }
    }
}

/// What holds a task, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// The kind.
    pub kind: HoldKind,
    /// The sentence an operator reads.
    pub detail: String,
}

impl Hold {
    fn new(kind: HoldKind, detail: impl Into<String>) -> Self {
        Hold {
            kind,
            detail: detail.into(),
        }
    }
}

/// The facts about one pending task (or a group of them that share these).
#[derive(Debug, Clone)]
pub struct Pending<'a> {
    /// When it is due.
    pub run_at: DateTime<Utc>,
    /// Parked by a paused campaign.
    pub parked: bool,
    /// Its queue.
    pub queue: &'a str,
    /// The pool it targets, if any.
    pub pool: Option<&'a str>,
    /// The account it is pinned to, if any (a pooled task's account is chosen at the claim).
    pub account: Option<&'a str>,
    /// Who serves its queue now.
    pub serving: &'a Serving,
    /// The accounts that may not send to its recipient now (spacing, or the provider's
    /// request); empty when unknown (a group of tasks).
    pub recipient_blocked: &'a [String],
}

fn fmt(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// Whether `local` is within the quiet window `start..end` (which may wrap past midnight).
fn in_window(local: NaiveTime, start: NaiveTime, end: NaiveTime) -> bool {
    if start <= end {
        local >= start && local < end
    } else {
        local >= start || local < end
    }
}

/// Why `account` cannot send now, if it cannot.
pub fn account_hold(account: &AccountRecord, now: DateTime<Utc>) -> Option<Hold> {
    let id = &account.spec.id;
    match account.spec.state {
        AccountState::Paused => {
            return Some(Hold::new(
                HoldKind::AccountPaused,
                format!("account {id} is paused by an operator"),
            ))
        }
        // Still 'offline' in its row until the next claim looks at it, but its cool-down is
        // over: it holds nothing (saying "offline until" a past time misled the operator).
        AccountState::Offline if account.offline_until.is_some_and(|t| t <= now) => {}
        AccountState::Offline => {
            let until = account
                .offline_until
                .map(|t| format!(" until {}", fmt(t)))
                .unwrap_or_default();
            let reason = if account.state_reason.is_empty() {
                "no reason recorded".to_owned()
            } else {
                account.state_reason.clone()
            };
            return Some(Hold::new(
                HoldKind::AccountOffline,
                format!("account {id} is offline{until}: {reason}"),
            ));
        }
        AccountState::Active => {}
    }
    if let Some(cap) = account.today_cap {
        if account.today_count >= cap {
            let ramp = account
                .ramp_day
                .map(|d| format!(" (warm-up day {d})"))
                .unwrap_or_default();
            return Some(Hold::new(
                HoldKind::DailyCap,
                format!(
                    "account {id} sent {} of its {cap} for today{ramp}",
                    account.today_count
                ),
            ));
        }
    }
    if let Some(limit) = account.spec.limits.tier_limit {
        if account.tier_used >= limit {
            return Some(Hold::new(
                HoldKind::Tier,
                format!(
                    "account {id} reached its messaging tier ({} of {limit} recipients in 24 h)",
                    account.tier_used
                ),
            ));
        }
    }
    if let Some((start, end)) = account.spec.limits.quiet_hours() {
        if let Ok(zone) = account.spec.time_zone.parse::<chrono_tz::Tz>() {
            let local = now.with_timezone(&zone).time();
            if in_window(local, start, end) {
                return Some(Hold::new(
                    HoldKind::QuietHours,
                    format!(
                        "account {id} is in its quiet hours ({}–{} {})",
                        start.format("%H:%M"),
                        end.format("%H:%M"),
                        account.spec.time_zone
                    ),
                ));
            }
        }
    }
    if let Some(until) = account.throttled_until.filter(|t| *t > now) {
        return Some(Hold::new(
            HoldKind::Throttled,
            format!(
                "the provider asked account {id} to slow down until {}",
                fmt(until)
            ),
        ));
    }
    if let Some(next) = account.next_send_at.filter(|t| *t > now) {
        return Some(Hold::new(
            HoldKind::Paced,
            format!("account {id} paces its sends: the next at {}", fmt(next)),
        ));
    }
    None
}

/// What holds a pending task. `accounts` are the accounts it may go through: its pinned account,
/// or every account of its pool (empty for a task sent by queue alone).
pub fn holds(task: &Pending<'_>, accounts: &[AccountRecord], now: DateTime<Utc>) -> Vec<Hold> {
    if task.run_at > now {
        return vec![Hold::new(
            HoldKind::NotDue,
            format!("due at {}", fmt(task.run_at)),
        )];
    }
    if task.parked {
        return vec![Hold::new(
            HoldKind::CampaignPaused,
            "its campaign is paused; resuming it releases the task",
        )];
    }
    let targeted = task.account.is_some() || task.pool.is_some();
    if targeted {
        if accounts.is_empty() {
            let what = match (task.account, task.pool) {
                (Some(a), _) => format!("account {a} does not exist"),
                (None, Some(p)) => format!("pool {p} has no accounts"),
                (None, None) => String::new(),
            };
            return vec![Hold::new(HoldKind::NoAccount, what)];
        }
        // A pooled task goes through any free account: it is held only when every one is.
        let held: Vec<Hold> = accounts
            .iter()
            .map(|a| {
                account_hold(a, now)
                    .or_else(|| recipient_hold(a, task.recipient_blocked))
                    .or_else(|| credentials_hold(a, task.queue, task.serving))
            })
            .collect::<Option<Vec<Hold>>>()
            .unwrap_or_default();
        if !held.is_empty() {
            return held;
        }
    }
    if *task.serving == Serving::Nobody {
        return vec![Hold::new(
            HoldKind::NoExecutor,
            format!(
                "due, but no executor serving queue {} is connected to any scheduler",
                task.queue
            ),
        )];
    }
    vec![Hold::new(
        HoldKind::AwaitingExecutor,
        format!(
            "due, and nothing holds it: an executor serving queue {} is connected and takes it \
             at its next claim, as its credit allows",
            task.queue
        ),
    )]
}

/// Why `account` may not send to the task's recipient now, if it may not.
fn recipient_hold(account: &AccountRecord, blocked: &[String]) -> Option<Hold> {
    let id = &account.spec.id;
    blocked.contains(id).then(|| {
        let interval = account
            .spec
            .limits
            .recipient_interval_ms
            .filter(|ms| *ms > 0)
            .map(|ms| format!(" (its recipient interval is {} s)", ms / 1000))
            .unwrap_or_default();
        Hold::new(
            HoldKind::RecipientSpacing,
            format!(
                "account {id} sent to this recipient too recently{interval}, or the provider \
                 asked it to leave the recipient alone for a while"
            ),
        )
    })
}

/// Why no connected executor can send for `account`, if none can: executors serve the queue
/// but none holds the account's credentials.
fn credentials_hold(account: &AccountRecord, queue: &str, serving: &Serving) -> Option<Hold> {
    match serving {
        Serving::Accounts(held) if !held.contains(&account.spec.credentials_ref) => {
            Some(Hold::new(
                HoldKind::NoCredentials,
                format!(
                    "no connected executor serving queue {queue} holds the credentials of \
                     account {} ({})",
                    account.spec.id, account.spec.credentials_ref
                ),
            ))
        }
        _ => None,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use chrono::TimeZone;

    use super::*;
    use crate::accounts::model::{AccountLimits, AccountSpec};

    /// A fixed instant the test accounts are made at.
    pub(in crate::http::console) fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 3, 2, 12, 0, 0)
            .single()
            .unwrap_or_default()
    }

    /// An active account of pool p, rate 1/s, nothing used.
    pub(in crate::http::console) fn account(id: &str) -> AccountRecord {
        AccountRecord {
            spec: AccountSpec {
                id: id.into(),
                sender_kind: "webhook".into(),
                pool: "p".into(),
                time_zone: "UTC".into(),
                credentials_ref: String::new(),
                state: AccountState::Active,
                limits: AccountLimits::with_rate(1.0),
            },
            effective_rate: 1.0,
            rate_reason: String::new(),
            rate_changed_at: now(),
            today_count: 0,
            in_flight: 0,
            offline_until: None,
            state_reason: String::new(),
            throttled_until: None,
            today_cap: None,
            ramp_day: None,
            tier_used: 0,
            health: 1.0,
            quality: String::new(),
            next_send_at: None,
            created_at: now(),
            updated_at: now(),
        }
    }

    const ANY: &Serving = &Serving::AnyAccount;

    fn pooled(run_at: DateTime<Utc>) -> Pending<'static> {
        Pending {
            run_at,
            parked: false,
            queue: "q",
            pool: Some("p"),
            account: None,
            serving: ANY,
            recipient_blocked: &[],
        }
    }

    fn kinds(h: &[Hold]) -> Vec<HoldKind> {
        h.iter().map(|h| h.kind).collect()
    }

    #[test]
    fn a_future_task_is_not_due() {
        let later = now() + chrono::Duration::minutes(5);
        assert_eq!(
            kinds(&holds(&pooled(later), &[], now())),
            [HoldKind::NotDue]
        );
    }

    #[test]
    fn a_parked_task_waits_for_its_campaign() {
        let mut t = pooled(now());
        t.parked = true;
        assert_eq!(
            kinds(&holds(&t, &[account("a")], now())),
            [HoldKind::CampaignPaused]
        );
    }

    #[test]
    fn an_offline_account_is_named_with_its_reason() {
        let mut a = account("a");
        a.spec.state = AccountState::Offline;
        a.state_reason = "no executor holds its credentials".into();
        let h = holds(&pooled(now()), &[a], now());
        assert_eq!(kinds(&h), [HoldKind::AccountOffline]);
        assert!(
            h[0].detail.contains("no executor holds its credentials"),
            "{h:?}"
        );
    }

    /// Offline until a time already past: the next claim reopens it, so it holds nothing.
    #[test]
    fn an_offline_account_whose_cool_down_is_over_holds_nothing() {
        let mut a = account("a");
        a.spec.state = AccountState::Offline;
        a.offline_until = Some(now() - chrono::Duration::seconds(30));
        let over = kinds(&holds(&pooled(now()), &[a.clone()], now()));
        assert!(!over.contains(&HoldKind::AccountOffline), "{over:?}");
        a.offline_until = Some(now() + chrono::Duration::seconds(30));
        assert_eq!(
            kinds(&holds(&pooled(now()), &[a], now())),
            [HoldKind::AccountOffline]
        );
    }

    #[test]
    fn a_pool_holds_only_when_every_account_is_held() {
        let mut capped = account("a");
        capped.today_cap = Some(10);
        capped.today_count = 10;
        let free = account("b");
        let h = holds(&pooled(now()), &[capped.clone(), free], now());
        assert_eq!(kinds(&h), [HoldKind::AwaitingExecutor]);
        let mut paused = account("b");
        paused.spec.state = AccountState::Paused;
        let h = holds(&pooled(now()), &[capped, paused], now());
        assert_eq!(kinds(&h), [HoldKind::DailyCap, HoldKind::AccountPaused]);
    }

    #[test]
    fn tier_quiet_hours_throttling_and_pacing() {
        let mut tier = account("a");
        tier.spec.limits.tier_limit = Some(250);
        tier.tier_used = 250;
        assert_eq!(
            account_hold(&tier, now()).map(|h| h.kind),
            Some(HoldKind::Tier)
        );

        let mut quiet = account("a");
        quiet.spec.limits.quiet_start = NaiveTime::from_hms_opt(22, 0, 0);
        quiet.spec.limits.quiet_end = NaiveTime::from_hms_opt(13, 0, 0);
        assert_eq!(
            account_hold(&quiet, now()).map(|h| h.kind),
            Some(HoldKind::QuietHours)
        );
        quiet.spec.limits.quiet_end = NaiveTime::from_hms_opt(7, 0, 0);
        assert_eq!(account_hold(&quiet, now()), None);

        let mut throttled = account("a");
        throttled.throttled_until = Some(now() + chrono::Duration::seconds(30));
        assert_eq!(
            account_hold(&throttled, now()).map(|h| h.kind),
            Some(HoldKind::Throttled)
        );

        let mut paced = account("a");
        paced.next_send_at = Some(now() + chrono::Duration::seconds(3));
        assert_eq!(
            account_hold(&paced, now()).map(|h| h.kind),
            Some(HoldKind::Paced)
        );
    }

    #[test]
    fn a_pinned_task_to_a_missing_account_says_so() {
        let t = Pending {
            run_at: now(),
            parked: false,
            queue: "q",
            pool: None,
            account: Some("gone"),
            serving: ANY,
            recipient_blocked: &[],
        };
        let h = holds(&t, &[], now());
        assert_eq!(kinds(&h), [HoldKind::NoAccount]);
        assert!(h[0].detail.contains("gone"));
    }

    #[test]
    fn a_queue_task_waits_for_the_next_claim_or_for_an_executor_to_connect() {
        let mut t = Pending {
            run_at: now(),
            parked: false,
            queue: "q",
            pool: None,
            account: None,
            serving: ANY,
            recipient_blocked: &[],
        };
        assert_eq!(kinds(&holds(&t, &[], now())), [HoldKind::AwaitingExecutor]);
        t.serving = &Serving::Nobody;
        let h = holds(&t, &[], now());
        assert_eq!(kinds(&h), [HoldKind::NoExecutor]);
        assert!(h[0].detail.contains("queue q"), "{h:?}");
    }

    #[test]
    fn recipient_spacing_holds_only_the_accounts_that_sent_to_the_recipient() {
        let mut spaced = account("a");
        spaced.spec.limits.recipient_interval_ms = Some(60_000);
        let blocked = vec!["a".to_owned()];
        let mut t = pooled(now());
        t.recipient_blocked = &blocked;
        let h = holds(&t, &[spaced.clone()], now());
        assert_eq!(kinds(&h), [HoldKind::RecipientSpacing]);
        assert!(h[0].detail.contains("60 s"), "{h:?}");
        // Another account of the pool may send to the recipient: not held.
        let h = holds(&t, &[spaced, account("b")], now());
        assert_eq!(kinds(&h), [HoldKind::AwaitingExecutor]);
    }

    #[test]
    fn an_account_whose_credentials_no_connected_executor_holds_is_named() {
        let mut a = account("a");
        a.spec.credentials_ref = "wa-main".into();
        let elsewhere = Serving::Accounts(["wa-other".to_owned()].into());
        let mut t = pooled(now());
        t.serving = &elsewhere;
        let h = holds(&t, &[a.clone()], now());
        assert_eq!(kinds(&h), [HoldKind::NoCredentials]);
        assert!(h[0].detail.contains("wa-main"), "{h:?}");
        let here = Serving::Accounts(["wa-main".to_owned()].into());
        t.serving = &here;
        assert_eq!(kinds(&holds(&t, &[a], now())), [HoldKind::AwaitingExecutor]);
    }
}
