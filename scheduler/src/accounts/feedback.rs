//! Feedback: what a batch of lease endings tells each account — slots to free, sends to refund,
//! successes and throttling for the adaptive rate, unavailability for the offline cool-down,
//! failures for the account's health. It
//! is gathered per account here and applied once per batch, in the transaction that ends the
//! leases (`herald.account_feedback`, in `store/accounts/functions.sql`).

use std::collections::BTreeMap;

/// Accumulated feedback for one account.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct AccountFeedback {
    /// Leases that ended (freeing in-flight slots).
    pub released: i32,
    /// Leases that sent nothing (refunded from the daily count).
    pub refund: i32,
    /// Successful sends.
    pub ok: i32,
    /// Account-scoped RATE_LIMITED outcomes.
    pub rate_limited: i32,
    /// The longest retry-after among them, in milliseconds.
    pub retry_after_ms: i64,
    /// ACCOUNT_UNAVAILABLE outcomes.
    pub unavailable: i32,
    /// Failed sends (TRANSIENT or PERMANENT), for the account's health.
    pub failed: i32,
    /// The last error that made the account unavailable.
    pub reason: Option<String>,
}

/// Feedback for the accounts of one namespace, by account id (sorted, so account rows are
/// always locked in one order).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Feedback(BTreeMap<String, AccountFeedback>);

impl Feedback {
    /// The entry of `account`, created empty.
    pub fn account(&mut self, account: &str) -> &mut AccountFeedback {
        self.0.entry(account.to_owned()).or_default()
    }

    /// One slot freed per entry of `accounts` (an account may repeat); `refund` also returns
    /// the sends to the daily count (nothing was sent).
    pub fn released(accounts: &[String], refund: bool) -> Self {
        let mut f = Feedback::default();
        for a in accounts {
            let e = f.account(a);
            e.released += 1;
            if refund {
                e.refund += 1;
            }
        }
        f
    }

    /// True when there is nothing to apply.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every account's feedback, by id.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &AccountFeedback)> {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_count_per_account() {
        let f = Feedback::released(&["b".into(), "a".into(), "b".into()], true);
        let got: Vec<(&str, i32, i32)> = f
            .iter()
            .map(|(id, e)| (id.as_str(), e.released, e.refund))
            .collect();
        assert_eq!(got, vec![("a", 1, 1), ("b", 2, 2)]);
    }
}
