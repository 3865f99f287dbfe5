//! The suppression repository: the namespace-wide list of recipients herald must not message
//! (`herald.suppressions`, migration V15), the claim's check against it, and the replies
//! recipients sent (`herald.inbound_messages`).

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use uuid::Uuid;

use super::sql::{column, statement, FromRow, Statement};
use super::{repository, StoreError};
use crate::suppressions::{Suppression, SuppressionReason};

repository!(
    /// The suppression list and inbound replies.
    SuppressionRepo
);

/// How herald compares recipients (`herald.recipient_key`), applied by the migrator whenever it
/// changes.
pub const FUNCTIONS_SQL: &str = include_str!("functions.sql");

const ADD_SUPPRESSIONS: Statement = statement!("add_suppressions");
const REMOVE_SUPPRESSION: Statement = statement!("remove_suppression");
const GET_SUPPRESSIONS: Statement = statement!("get_suppressions");
const LIST_SUPPRESSIONS: Statement = statement!("list_suppressions");
/// Ends suppressed tasks among locked ones (`suppress_tasks.sql`); seen by the plan tests in
/// `store/leases`.
pub(crate) const SUPPRESS_TASKS: Statement = statement!("suppress_tasks");
const RECORD_INBOUND_MESSAGE: Statement = statement!("record_inbound_message");
const LEASED_TO: Statement = statement!("leased_to");
const LIST_UNDELIVERABLE: Statement = statement!("list_undeliverable");
const LEARN_ALIASES: Statement = statement!("learn_aliases");
const COVER_ALIASES: Statement = statement!("cover_aliases");

impl FromRow for Suppression {
    fn from_row(r: &Row) -> Result<Self, StoreError> {
        let reason: &str = column(r, "reason")?;
        Ok(Suppression {
            recipient: column(r, "recipient")?,
            reason: SuppressionReason::parse(reason)
                .ok_or_else(|| StoreError::Corrupt(format!("suppression reason {reason:?}")))?,
            note: column(r, "note")?,
            created_at: column(r, "created_at")?,
        })
    }
}

fn entries(rows: &[Row]) -> Result<Vec<Suppression>, StoreError> {
    rows.iter().map(Suppression::from_row).collect()
}

/// One reply a recipient sent to an account.
#[derive(Debug, Clone)]
pub struct InboundMessage<'a> {
    /// The account written to, by its credentials_ref.
    pub credentials_ref: &'a str,
    /// Who wrote.
    pub sender: &'a str,
    /// The provider's message type.
    pub kind: &'a str,
    /// Its text, when it had one.
    pub body: Option<&'a str>,
    /// When (None: now).
    pub received_at: Option<DateTime<Utc>>,
    /// The provider's id of the message, when known.
    pub provider_message_id: Option<&'a str>,
}

impl<C: GenericClient> SuppressionRepo<'_, C> {
    /// Lists `recipients` with `reason` and `note`; entries that exist are kept as they are.
    /// Returns every entry, with whether this call added it.
    pub async fn add(
        &self,
        namespace: &str,
        recipients: &[&str],
        reason: SuppressionReason,
        note: &str,
    ) -> Result<Vec<(Suppression, bool)>, StoreError> {
        let entries = ADD_SUPPRESSIONS
            .query(self.db, &[&namespace, &recipients, &reason.as_str(), &note])
            .await?
            .iter()
            .map(|r| Ok((Suppression::from_row(r)?, column(r, "added")?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        self.cover_aliases(namespace, recipients).await?;
        Ok(entries)
    }

    /// Lists the other names a provider knows the listed ones among `recipients` by (migration
    /// 36), with the same reason. Returns the names newly listed.
    pub async fn cover_aliases(
        &self,
        namespace: &str,
        recipients: &[&str],
    ) -> Result<Vec<String>, StoreError> {
        if recipients.is_empty() {
            return Ok(Vec::new());
        }
        COVER_ALIASES
            .query(self.db, &[&namespace, &recipients])
            .await?
            .iter()
            .map(|r| column(r, "recipient"))
            .collect()
    }

    /// Records the names status callbacks gave their tasks' recipients, as (task, name) pairs,
    /// where they differ from the task's; a new name of a listed recipient is listed too.
    /// Returns the names newly listed.
    pub async fn learn_aliases(
        &self,
        namespace: &str,
        named: &[(Uuid, &str)],
    ) -> Result<Vec<String>, StoreError> {
        if named.is_empty() {
            return Ok(Vec::new());
        }
        let tasks: Vec<Uuid> = named.iter().map(|n| n.0).collect();
        let names: Vec<&str> = named.iter().map(|n| n.1).collect();
        let learned: Vec<String> = LEARN_ALIASES
            .query(self.db, &[&namespace, &tasks, &names])
            .await?
            .iter()
            .flat_map(|r| [column(r, "recipient"), column(r, "alias")])
            .collect::<Result<_, StoreError>>()?;
        let learned: Vec<&str> = learned.iter().map(String::as_str).collect();
        self.cover_aliases(namespace, &learned).await
    }

    /// Lists with reason INVALID_RECIPIENT the recipients of those of `tasks` that ended because
    /// the provider cannot deliver to them at all (end reason INVALID_RECIPIENT), or of all of
    /// them when `all` (the caller read it from a late failure's code); returns those newly
    /// listed.
    pub async fn list_undeliverable(
        &self,
        namespace: &str,
        tasks: &[Uuid],
        all: bool,
    ) -> Result<Vec<String>, StoreError> {
        if tasks.is_empty() {
            return Ok(Vec::new());
        }
        LIST_UNDELIVERABLE
            .query(self.db, &[&namespace, &tasks, &all])
            .await?
            .iter()
            .map(|r| column(r, "recipient"))
            .collect()
    }

    /// The namespace's LEASED tasks to `recipients` (compared as the list does), waiting for
    /// claims in progress on their tasks, and holding their SCHEDULED tasks for the rest of
    /// the transaction (see `leased_to.sql`).
    pub async fn leased_to(
        &self,
        namespace: &str,
        recipients: &[&str],
    ) -> Result<Vec<Uuid>, StoreError> {
        if recipients.is_empty() {
            return Ok(Vec::new());
        }
        let mut leased = Vec::new();
        for r in LEASED_TO.query(self.db, &[&namespace, &recipients]).await? {
            if column::<&str>(&r, "state")? == "leased" {
                leased.push(column(&r, "id")?);
            }
        }
        Ok(leased)
    }

    /// Removes `recipient`'s entry; None when it was not listed.
    pub async fn remove(
        &self,
        namespace: &str,
        recipient: &str,
    ) -> Result<Option<Suppression>, StoreError> {
        let rows = REMOVE_SUPPRESSION
            .query(self.db, &[&namespace, &recipient])
            .await?;
        Ok(entries(&rows)?.into_iter().next())
    }

    /// The entries of those of `recipients` that are listed.
    pub async fn get(
        &self,
        namespace: &str,
        recipients: &[&str],
    ) -> Result<Vec<Suppression>, StoreError> {
        entries(
            &GET_SUPPRESSIONS
                .query(self.db, &[&namespace, &recipients])
                .await?,
        )
    }

    /// Up to `limit` entries after recipient `after`, in recipient order, optionally of one
    /// reason.
    pub async fn list(
        &self,
        namespace: &str,
        after: Option<&str>,
        reason: Option<SuppressionReason>,
        limit: i64,
    ) -> Result<Vec<Suppression>, StoreError> {
        let reason = reason.map(SuppressionReason::as_str);
        entries(
            &LIST_SUPPRESSIONS
                .query(self.db, &[&namespace, &after, &reason, &limit])
                .await?,
        )
    }

    /// Ends the scheduled tasks among `ids` whose recipient is listed (SUPPRESSED); returns
    /// them. The caller holds their row locks (a claim).
    pub async fn suppress_tasks(&self, ids: &[Uuid]) -> Result<Vec<Uuid>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        SUPPRESS_TASKS
            .query(self.db, &[&ids])
            .await?
            .iter()
            .map(|r| column(r, "id"))
            .collect()
    }

    /// Stores one reply; false when the provider's message id was stored before (a webhook
    /// delivered again).
    pub async fn record_inbound(
        &self,
        namespace: &str,
        m: &InboundMessage<'_>,
    ) -> Result<bool, StoreError> {
        let stored = RECORD_INBOUND_MESSAGE
            .execute(
                self.db,
                &[
                    &namespace,
                    &m.credentials_ref,
                    &m.sender,
                    &m.kind,
                    &m.body,
                    &m.received_at,
                    &m.provider_message_id,
                ],
            )
            .await?;
        Ok(stored > 0)
    }
}
