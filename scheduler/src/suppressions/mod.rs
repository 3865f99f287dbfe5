//! The suppression list: recipients a namespace must not message (opt-outs, invalid numbers,
//! manual entries). A task to a listed recipient is created already ended (CANCELLED, end
//! reason SUPPRESSED), and a claim that finds one due ends it the same way instead of leasing
//! it, so a recipient listed after a campaign was queued is not messaged either
//! (docs/api.md#suppression-list).

use chrono::{DateTime, Utc};

use crate::store::tasks::CancelResult;
use crate::store::{Db, StoreError};

/// Stops what listing `recipients` must still stop: their LEASED tasks, which the claim checked
/// before the listing. Each is cancelled and revoked from its executor as CancelTask does, so
/// one not sent yet never is (one sent meanwhile ends with the executor's answer); SCHEDULED
/// tasks are ended by the claim when due. Returns how many were revoked.
pub async fn revoke_leased(
    db: &impl Db,
    namespace: &str,
    recipients: &[&str],
) -> Result<usize, StoreError> {
    let mut revoked = 0;
    for id in db.suppressions().leased_to(namespace, recipients).await? {
        if matches!(
            db.tasks().cancel(namespace, id).await?,
            CancelResult::CancelledLeased { .. }
        ) {
            tracing::info!(task_id = %id, "revoking a leased task: its recipient was suppressed");
            revoked += 1;
        }
    }
    Ok(revoked)
}

/// The opt-out keywords used when the configuration names none.
pub const DEFAULT_OPT_OUT_KEYWORDS: &[&str] = &["STOP", "UNSUBSCRIBE", "退订"];

/// Why a recipient is listed; the names match the `herald.suppression_reason` enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SuppressionReason {
    /// The recipient replied with an opt-out keyword.
    OptOut,
    /// The recipient cannot receive messages.
    InvalidRecipient,
    /// Added through the API.
    Manual,
}

impl SuppressionReason {
    /// Every reason.
    pub const ALL: [SuppressionReason; 3] = [
        SuppressionReason::OptOut,
        SuppressionReason::InvalidRecipient,
        SuppressionReason::Manual,
    ];

    /// The database's name for the reason.
    pub fn as_str(self) -> &'static str {
        match self {
            SuppressionReason::OptOut => "opt_out",
            SuppressionReason::InvalidRecipient => "invalid_recipient",
            SuppressionReason::Manual => "manual",
        }
    }

    /// Parses the database's name for a reason.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// One entry of the list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suppression {
    /// The recipient, without a leading `+`.
    pub recipient: String,
    /// Why it is listed.
    pub reason: SuppressionReason,
    /// Who listed it and why, or the opt-out message.
    pub note: String,
    /// When it was listed.
    pub created_at: DateTime<Utc>,
}

/// Whether a reply's text is an opt-out: the whole message, trimmed and compared without
/// regard to case, is one of `keywords` ("stop" and " STOP " are; "please stop" is not, so a
/// sentence that merely contains the word does not unsubscribe anyone).
pub fn is_opt_out(text: &str, keywords: &[String]) -> bool {
    let said = text.trim().to_uppercase();
    !said.is_empty() && keywords.iter().any(|k| k.trim().to_uppercase() == said)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Vec<String> {
        DEFAULT_OPT_OUT_KEYWORDS
            .iter()
            .map(|k| k.to_string())
            .collect()
    }

    #[test]
    fn opt_out_is_the_whole_message_in_any_case() {
        let keywords = defaults();
        for said in ["STOP", "stop", " Stop\n", "unsubscribe", "退订"] {
            assert!(is_opt_out(said, &keywords), "{said:?}");
        }
        for said in ["please stop", "STOPPED", "", "  ", "退订了吗"] {
            assert!(!is_opt_out(said, &keywords), "{said:?}");
        }
    }

    #[test]
    fn reasons_round_trip() {
        for r in SuppressionReason::ALL {
            assert_eq!(SuppressionReason::parse(r.as_str()), Some(r));
        }
        assert_eq!(SuppressionReason::parse("other"), None);
    }
}
