//! The account repository: accounts and pools, the feedback lease endings give, and the
//! reconciliation of in-flight counts. The limits are written and read as one JSON record keyed
//! by column name (see `insert_account.sql`), so the column lists here follow
//! [`AccountLimits`]'s fields.

use std::collections::HashMap;
use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use super::sql::{column, notify, statement, FromRow, Statement};
use super::{repository, StoreError, WriteError};
use crate::accounts::feedback::Feedback;
use crate::accounts::model::{AccountLimits, AccountRecord, AccountSpec, AccountState, PoolRecord};

repository!(
    /// Sending accounts and pools.
    AccountRepo
);

/// Existing task targets and the sender kinds (as stored) each may send through.
#[derive(Debug, Default)]
pub struct Targets {
    /// Pool name → the kinds of its accounts.
    pub pools: HashMap<String, Vec<String>>,
    /// Account id → its kind.
    pub accounts: HashMap<String, Vec<String>>,
}

/// What an account read selects (`a` is `herald.accounts`); decoded by
/// [`AccountRecord::from_row`].
const ACCOUNT_COLUMNS: &str = "a.id, a.sender_kind, a.pool, a.time_zone, a.credentials_ref, \
     a.state::text AS state, to_jsonb(a) AS limits, a.effective_rate, a.rate_reason, \
     a.rate_changed_at, \
     CASE WHEN a.day = (herald.now() AT TIME ZONE a.time_zone)::date THEN a.day_count ELSE 0 END \
         AS today_count, \
     herald.account_in_flight(a) AS in_flight, a.offline_until, a.state_reason, \
     a.throttled_until, a.created_at, a.updated_at, \
     (herald.account_day_cap(a, (herald.now() AT TIME ZONE a.time_zone)::date)).cap AS today_cap, \
     (herald.account_day_cap(a, (herald.now() AT TIME ZONE a.time_zone)::date)).ramp_day, \
     herald.tier_used(a, herald.now()) AS tier_used, \
     herald.account_health(a) AS health, a.quality, a.next_send_at";

/// The limit columns: [`AccountLimits`]'s field names.
static LIMIT_COLUMNS: LazyLock<Vec<String>> =
    LazyLock::new(
        || match serde_json::to_value(AccountLimits::with_rate(1.0)) {
            Ok(serde_json::Value::Object(fields)) => fields.keys().cloned().collect(),
            _ => Vec::new(),
        },
    );

/// `sql` with its column-list placeholders filled in.
fn expand(name: &'static str, sql: &str) -> Statement {
    let columns = LIMIT_COLUMNS.join(", ");
    let values = LIMIT_COLUMNS
        .iter()
        .map(|c| format!("l.{c}"))
        .collect::<Vec<_>>()
        .join(", ");
    Statement::built(
        name,
        sql.replace("{limit_columns}", &columns)
            .replace("{limit_values}", &values)
            .replace("{account_columns}", ACCOUNT_COLUMNS),
    )
}

static INSERT_ACCOUNT: LazyLock<Statement> =
    LazyLock::new(|| expand("insert_account", include_str!("insert_account.sql")));
static UPDATE_ACCOUNT: LazyLock<Statement> =
    LazyLock::new(|| expand("update_account", include_str!("update_account.sql")));
static GET_ACCOUNT: LazyLock<Statement> =
    LazyLock::new(|| expand("get_account", include_str!("get_account.sql")));
static LIST_ACCOUNTS: LazyLock<Statement> =
    LazyLock::new(|| expand("list_accounts", include_str!("list_accounts.sql")));
const ENSURE_POOL: Statement = statement!("ensure_pool");
const RECORD_INBOUND: Statement = statement!("record_inbound");
const ACCOUNT_GAUGES: Statement = statement!("account_gauges");
const RECORD_STANDING: Statement = statement!("record_standing");
const ACCOUNTS_BY_REF: Statement = statement!("accounts_by_ref");
const LOCK_ACCOUNTS_BY_REFS: Statement = statement!("lock_accounts_by_refs");
const PROVIDER_PAUSE: Statement = statement!("provider_pause");
const PROVIDER_RESUME: Statement = statement!("provider_resume");
const DELETE_ACCOUNT: Statement = statement!("delete_account");
const INSERT_POOL: Statement = statement!("insert_pool");
const UPDATE_POOL: Statement = statement!("update_pool");
const LIST_POOLS: Statement = statement!("list_pools");
const DELETE_POOL: Statement = statement!("delete_pool");
const EXISTING_POOLS: Statement = statement!("existing_pools");
const EXISTING_ACCOUNTS: Statement = statement!("existing_accounts");
const APPLY_FEEDBACK: Statement = statement!("apply_feedback");
const DRIFTED_ACCOUNTS: Statement = statement!("drifted_accounts");
const LOCK_ACCOUNT: Statement = statement!("lock_account");
const RECONCILE_IN_FLIGHT: Statement = statement!("reconcile_in_flight");
const WAITING_DELTAS: Statement = statement!("waiting_deltas");
const FOLD_DELTAS: Statement = statement!("fold_deltas");

/// The SQL of the limit functions (`account_room`, `reserve_capacity`, `account_feedback`),
/// applied by the migrator whenever it changes.
pub const FUNCTIONS_SQL: &str = include_str!("functions.sql");

/// One account's pacing figures, for the account gauges.
#[derive(Debug, Clone)]
pub struct AccountGauges {
    /// Namespace.
    pub namespace: String,
    /// Account id.
    pub id: String,
    /// Business-initiated conversations opened in the last 24 hours.
    pub tier_used: i32,
    /// The tier's limit, if any.
    pub tier_limit: Option<i32>,
    /// Health, 0 to 1.
    pub health: f64,
    /// Sends counted today.
    pub today_count: i32,
    /// Today's cap, warm-up included.
    pub today_cap: Option<i32>,
}

/// An account whose in-flight count was corrected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconciled {
    /// Its namespace.
    pub namespace: String,
    /// Its id.
    pub account: String,
    /// The count it had.
    pub before: i32,
    /// The leases it holds.
    pub after: i32,
}

impl FromRow for AccountRecord {
    fn from_row(r: &Row) -> Result<Self, StoreError> {
        let state: &str = column(r, "state")?;
        let limits: serde_json::Value = column(r, "limits")?;
        let limits: AccountLimits = serde_json::from_value(limits)
            .map_err(|e| StoreError::Corrupt(format!("account limits: {e}")))?;
        Ok(AccountRecord {
            spec: AccountSpec {
                id: column(r, "id")?,
                sender_kind: column(r, "sender_kind")?,
                pool: column(r, "pool")?,
                time_zone: column(r, "time_zone")?,
                credentials_ref: column(r, "credentials_ref")?,
                state: AccountState::parse(state)
                    .ok_or_else(|| StoreError::Corrupt(format!("account state {state:?}")))?,
                limits,
            },
            effective_rate: column(r, "effective_rate")?,
            rate_reason: column(r, "rate_reason")?,
            rate_changed_at: column(r, "rate_changed_at")?,
            today_count: column(r, "today_count")?,
            in_flight: column(r, "in_flight")?,
            offline_until: column(r, "offline_until")?,
            state_reason: column(r, "state_reason")?,
            throttled_until: column(r, "throttled_until")?,
            today_cap: column(r, "today_cap")?,
            ramp_day: column(r, "ramp_day")?,
            tier_used: column(r, "tier_used")?,
            health: column(r, "health")?,
            quality: column(r, "quality")?,
            next_send_at: column(r, "next_send_at")?,
            created_at: column(r, "created_at")?,
            updated_at: column(r, "updated_at")?,
        })
    }
}

impl FromRow for PoolRecord {
    fn from_row(r: &Row) -> Result<Self, StoreError> {
        Ok(PoolRecord {
            name: column(r, "name")?,
            description: column(r, "description")?,
            created_at: column(r, "created_at")?,
            account_ids: column(r, "account_ids")?,
            effective_rate: column(r, "effective_rate")?,
            scheduled_tasks: column(r, "scheduled_tasks")?,
            sticky: column(r, "sticky")?,
        })
    }
}

/// The parameters insert_account.sql and update_account.sql share.
fn definition<'p>(
    namespace: &'p &str,
    spec: &'p AccountSpec,
    state: &'p &'static str,
    limits: &'p serde_json::Value,
) -> [&'p (dyn tokio_postgres::types::ToSql + Sync); 8] {
    [
        namespace,
        &spec.id,
        &spec.sender_kind,
        &spec.pool,
        &spec.time_zone,
        &spec.credentials_ref,
        state,
        limits,
    ]
}

fn limits_json(limits: &AccountLimits) -> Result<serde_json::Value, StoreError> {
    serde_json::to_value(limits).map_err(|e| StoreError::Corrupt(format!("account limits: {e}")))
}

impl<C: GenericClient> AccountRepo<'_, C> {
    /// Creates an account, and its pool if missing. Run it in a transaction.
    pub async fn create(
        &self,
        namespace: &str,
        spec: &AccountSpec,
    ) -> Result<AccountRecord, WriteError> {
        self.write(&INSERT_ACCOUNT, namespace, spec)
            .await
            .map_err(|e| WriteError::from_insert(e, || format!("account {}", spec.id)))?;
        // Claims on every replica stop assuming the namespace has no accounts, and look again.
        notify(self.db, "herald_accounts", namespace).await?;
        super::tasks::announce_due_now(self.db).await?;
        self.existing(namespace, &spec.id).await
    }

    /// Replaces an account's definition (the caller merged the update mask) and wakes the
    /// dispatchers, whose limits may have opened. Run it in a transaction.
    pub async fn update(
        &self,
        namespace: &str,
        spec: &AccountSpec,
    ) -> Result<AccountRecord, WriteError> {
        if self.write(&UPDATE_ACCOUNT, namespace, spec).await? == 0 {
            return Err(WriteError::NotFound(format!("account {}", spec.id)));
        }
        super::tasks::announce_due_now(self.db).await?;
        self.existing(namespace, &spec.id).await
    }

    /// Runs insert_account.sql or update_account.sql (they take the same parameters) after
    /// making sure the account's pool exists; the rows written.
    async fn write(
        &self,
        statement: &Statement,
        namespace: &str,
        spec: &AccountSpec,
    ) -> Result<u64, StoreError> {
        ENSURE_POOL
            .execute(self.db, &[&namespace, &spec.pool])
            .await?;
        let limits = limits_json(&spec.limits)?;
        let state = spec.state.as_str();
        statement
            .execute(self.db, &definition(&namespace, spec, &state, &limits))
            .await
    }

    async fn existing(&self, namespace: &str, id: &str) -> Result<AccountRecord, WriteError> {
        self.get(namespace, id)
            .await?
            .ok_or_else(|| WriteError::NotFound(format!("account {id}")))
    }

    /// Reads one account.
    pub async fn get(
        &self,
        namespace: &str,
        id: &str,
    ) -> Result<Option<AccountRecord>, StoreError> {
        GET_ACCOUNT.fetch_opt(self.db, &[&namespace, &id]).await
    }

    /// Lists accounts ordered by id, after `after`, optionally of one pool.
    pub async fn list(
        &self,
        namespace: &str,
        pool: Option<&str>,
        after: Option<&str>,
        limit: i64,
    ) -> Result<Vec<AccountRecord>, StoreError> {
        LIST_ACCOUNTS
            .fetch(self.db, &[&namespace, &pool, &after, &limit])
            .await
    }

    /// Every account of `pool`, in id order, read a page at a time.
    pub async fn pool_members(
        &self,
        namespace: &str,
        pool: &str,
    ) -> Result<Vec<AccountRecord>, StoreError> {
        const PAGE: i64 = 500;
        let mut all: Vec<AccountRecord> = Vec::new();
        loop {
            let after = all.last().map(|a| a.spec.id.clone());
            let page = self
                .list(namespace, Some(pool), after.as_deref(), PAGE)
                .await?;
            let done = (page.len() as i64) < PAGE;
            all.extend(page);
            if done {
                return Ok(all);
            }
        }
    }

    /// Deletes an account no live task needs.
    pub async fn delete(&self, namespace: &str, id: &str) -> Result<(), WriteError> {
        let row = DELETE_ACCOUNT
            .query_one(self.db, &[&namespace, &id])
            .await?;
        let live: i64 = column(&row, "live")?;
        let gone: i64 = column(&row, "gone")?;
        let present: bool = column(&row, "present")?;
        if gone > 0 {
            return Ok(());
        }
        if !present {
            return Err(WriteError::NotFound(format!("account {id}")));
        }
        Err(WriteError::InUse(format!(
            "account {id} still has {live} scheduled or leased tasks"
        )))
    }

    /// Records that `recipient` wrote to the account at `at` (None: now); returns until when
    /// the customer-service window is open, None when the account does not exist.
    pub async fn record_inbound(
        &self,
        namespace: &str,
        account: &str,
        recipient: &str,
        at: Option<DateTime<Utc>>,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        RECORD_INBOUND
            .query_opt(self.db, &[&namespace, &account, &recipient, &at])
            .await?
            .map(|r| column(&r, "window_until"))
            .transpose()
    }

    /// Every account's pacing figures.
    pub async fn gauges(&self) -> Result<Vec<AccountGauges>, StoreError> {
        ACCOUNT_GAUGES
            .query(self.db, &[])
            .await?
            .iter()
            .map(|r| {
                Ok(AccountGauges {
                    namespace: column(r, "namespace")?,
                    id: column(r, "id")?,
                    tier_used: column(r, "tier_used")?,
                    tier_limit: column(r, "tier_limit")?,
                    health: column(r, "health")?,
                    today_count: column(r, "today_count")?,
                    today_cap: column(r, "today_cap")?,
                })
            })
            .collect()
    }

    /// Records the provider's quality rating (None keeps it) and tier (None keeps it;
    /// Some(None) removes the limit); false when the account does not exist.
    pub async fn record_standing(
        &self,
        namespace: &str,
        account: &str,
        quality: Option<&str>,
        tier_limit: Option<Option<i32>>,
    ) -> Result<bool, StoreError> {
        let set_tier = tier_limit.is_some();
        let tier = tier_limit.flatten();
        let changed = RECORD_STANDING
            .execute(self.db, &[&namespace, &account, &quality, &set_tier, &tier])
            .await?;
        Ok(changed > 0)
    }

    /// Locks, in id order, the rows of the accounts whose credentials executors hold under any
    /// of `credentials_refs`, for the rest of the transaction; returns their ids by
    /// credentials_ref (a ref no account holds is absent).
    pub async fn lock_by_credentials_refs(
        &self,
        namespace: &str,
        credentials_refs: &[&str],
    ) -> Result<HashMap<String, Vec<String>>, StoreError> {
        let mut ids_by_ref: HashMap<String, Vec<String>> = HashMap::new();
        if credentials_refs.is_empty() {
            return Ok(ids_by_ref);
        }
        for row in LOCK_ACCOUNTS_BY_REFS
            .query(self.db, &[&namespace, &credentials_refs])
            .await?
        {
            ids_by_ref
                .entry(column(&row, "credentials_ref")?)
                .or_default()
                .push(column(&row, "id")?);
        }
        Ok(ids_by_ref)
    }

    /// The ids of the accounts whose credentials executors hold under `credentials_ref`.
    pub async fn ids_by_credentials_ref(
        &self,
        namespace: &str,
        credentials_ref: &str,
    ) -> Result<Vec<String>, StoreError> {
        ACCOUNTS_BY_REF
            .query(self.db, &[&namespace, &credentials_ref])
            .await?
            .iter()
            .map(|r| column(r, "id"))
            .collect()
    }

    /// Pauses the account because its provider took it out of service, raising
    /// `account.paused`; false when it was already paused (or does not exist).
    pub async fn provider_pause(
        &self,
        namespace: &str,
        account: &str,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let rows = PROVIDER_PAUSE
            .query(self.db, &[&namespace, &account, &reason])
            .await?;
        Ok(!rows.is_empty())
    }

    /// Makes the account active again when a provider's pause, whose reason starts with
    /// `pause_prefix`, is what holds it; false otherwise.
    pub async fn provider_resume(
        &self,
        namespace: &str,
        account: &str,
        reason: &str,
        pause_prefix: &str,
    ) -> Result<bool, StoreError> {
        let changed = PROVIDER_RESUME
            .execute(self.db, &[&namespace, &account, &reason, &pause_prefix])
            .await?;
        Ok(changed > 0)
    }

    /// Creates a pool.
    pub async fn create_pool(
        &self,
        namespace: &str,
        name: &str,
        description: &str,
        sticky: bool,
    ) -> Result<PoolRecord, WriteError> {
        INSERT_POOL
            .execute(self.db, &[&namespace, &name, &description, &sticky])
            .await
            .map_err(|e| WriteError::from_insert(e, || format!("pool {name}")))?;
        self.existing_pool(namespace, name).await
    }

    /// Changes a pool's description and stickiness.
    pub async fn update_pool(
        &self,
        namespace: &str,
        name: &str,
        description: &str,
        sticky: bool,
    ) -> Result<PoolRecord, WriteError> {
        let changed = UPDATE_POOL
            .execute(self.db, &[&namespace, &name, &description, &sticky])
            .await?;
        if changed == 0 {
            return Err(WriteError::NotFound(format!("pool {name}")));
        }
        self.existing_pool(namespace, name).await
    }

    async fn existing_pool(&self, namespace: &str, name: &str) -> Result<PoolRecord, WriteError> {
        self.get_pool(namespace, name)
            .await?
            .ok_or_else(|| WriteError::NotFound(format!("pool {name}")))
    }

    /// Reads pools (all, or the one named) with their members and combined status.
    pub async fn list_pools(
        &self,
        namespace: &str,
        name: Option<&str>,
    ) -> Result<Vec<PoolRecord>, StoreError> {
        LIST_POOLS.fetch(self.db, &[&namespace, &name]).await
    }

    /// Reads one pool.
    pub async fn get_pool(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<PoolRecord>, StoreError> {
        Ok(self
            .list_pools(namespace, Some(name))
            .await?
            .into_iter()
            .next())
    }

    /// Deletes a pool with no accounts and no waiting tasks.
    pub async fn delete_pool(&self, namespace: &str, name: &str) -> Result<(), WriteError> {
        let Some(pool) = self.get_pool(namespace, name).await? else {
            return Err(WriteError::NotFound(format!("pool {name}")));
        };
        if !pool.account_ids.is_empty() || pool.scheduled_tasks > 0 {
            return Err(WriteError::InUse(format!(
                "pool {name} still has {} accounts and {} scheduled tasks",
                pool.account_ids.len(),
                pool.scheduled_tasks
            )));
        }
        DELETE_POOL.execute(self.db, &[&namespace, &name]).await?;
        Ok(())
    }

    /// Which of `pools` and `accounts` exist, with the sender kinds each may send through
    /// (a pool's: those of its accounts), for validating task targets and their content.
    pub async fn existing_targets(
        &self,
        namespace: &str,
        pools: &[&str],
        accounts: &[&str],
    ) -> Result<Targets, StoreError> {
        let mut found = Targets::default();
        for r in EXISTING_POOLS.query(self.db, &[&namespace, &pools]).await? {
            found
                .pools
                .insert(column(&r, "name")?, column(&r, "kinds")?);
        }
        for r in EXISTING_ACCOUNTS
            .query(self.db, &[&namespace, &accounts])
            .await?
        {
            let kind: String = column(&r, "sender_kind")?;
            found.accounts.insert(column(&r, "id")?, vec![kind]);
        }
        Ok(found)
    }

    /// Applies a batch's feedback in one statement; true when an account that was at its
    /// in-flight limit got room back. Run it in the transaction that ended the leases.
    pub async fn apply_feedback(
        &self,
        namespace: &str,
        feedback: &Feedback,
    ) -> Result<bool, StoreError> {
        if feedback.is_empty() {
            return Ok(false);
        }
        let (ids, f): (Vec<&str>, Vec<_>) = feedback.iter().map(|(id, f)| (id.as_str(), f)).unzip();
        let released: Vec<i32> = f.iter().map(|x| x.released).collect();
        let refund: Vec<i32> = f.iter().map(|x| x.refund).collect();
        let ok: Vec<i32> = f.iter().map(|x| x.ok).collect();
        let rate_limited: Vec<i32> = f.iter().map(|x| x.rate_limited).collect();
        let retry_after: Vec<i64> = f.iter().map(|x| x.retry_after_ms).collect();
        let unavailable: Vec<i32> = f.iter().map(|x| x.unavailable).collect();
        let failed: Vec<i32> = f.iter().map(|x| x.failed).collect();
        let reasons: Vec<Option<&str>> = f.iter().map(|x| x.reason.as_deref()).collect();
        let row = APPLY_FEEDBACK
            .query_one(
                self.db,
                &[
                    &namespace,
                    &ids,
                    &released,
                    &refund,
                    &ok,
                    &rate_limited,
                    &retry_after,
                    &unavailable,
                    &failed,
                    &reasons,
                ],
            )
            .await?;
        Ok(column::<Option<bool>>(&row, "freed")?.unwrap_or(false))
    }

    /// Frees one in-flight slot per entry of `accounts` of `namespace` (an account may repeat);
    /// `refund` also returns the sends to the daily count.
    pub async fn release_slots(
        &self,
        namespace: &str,
        accounts: &[String],
        refund: bool,
    ) -> Result<bool, StoreError> {
        self.apply_feedback(namespace, &Feedback::released(accounts, refund))
            .await
    }

    /// [`Self::release_slots`] for accounts of any namespace, each given as
    /// `<namespace>/<account>` (namespaces never contain `/`), as the cross-namespace sweeps
    /// return them.
    pub async fn release_qualified_slots(
        &self,
        qualified: &[String],
        refund: bool,
    ) -> Result<bool, StoreError> {
        let mut by_namespace: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
        for q in qualified {
            if let Some((namespace, account)) = q.split_once('/') {
                by_namespace
                    .entry(namespace)
                    .or_default()
                    .push(account.to_owned());
            }
        }
        let mut freed = false;
        for (namespace, accounts) in by_namespace {
            freed |= self.release_slots(namespace, &accounts, refund).await?;
        }
        Ok(freed)
    }

    /// Accounts whose in-flight count may differ from the leases they hold, as
    /// (namespace, id); [`Self::reconcile`] decides under the account's lock.
    pub async fn drifted(&self) -> Result<Vec<(String, String)>, StoreError> {
        DRIFTED_ACCOUNTS
            .query(self.db, &[])
            .await?
            .iter()
            .map(|r| Ok((column(r, "namespace")?, column(r, "id")?)))
            .collect()
    }

    /// The accounts with released slots or successes waiting to be folded into their rows,
    /// as (namespace, ids); see [`Self::fold_deltas`].
    pub async fn waiting_deltas(&self) -> Result<Vec<(String, Vec<String>)>, StoreError> {
        WAITING_DELTAS
            .query(self.db, &[])
            .await?
            .iter()
            .map(|r| Ok((column(r, "namespace")?, column(r, "ids")?)))
            .collect()
    }

    /// Folds the released slots and successes reports left waiting for accounts `ids` of
    /// `namespace` into their rows, under their locks. Run it in a transaction of its own: it
    /// holds the rows until commit.
    pub async fn fold_deltas(&self, namespace: &str, ids: &[String]) -> Result<(), StoreError> {
        FOLD_DELTAS.execute(self.db, &[&namespace, &ids]).await?;
        Ok(())
    }

    /// Locks one account's row until the transaction ends; false when there is no such account.
    /// An edit reads the row under it, so a pause or an offline spell a report or a webhook
    /// writes meanwhile is read, not overwritten with what was read before it.
    pub async fn lock(&self, namespace: &str, id: &str) -> Result<bool, StoreError> {
        Ok(LOCK_ACCOUNT
            .query_opt(self.db, &[&namespace, &id])
            .await?
            .is_some())
    }

    /// Sets one account's in-flight count to the leases it holds, under its lock; returns the
    /// correction when there was one. Run it in a transaction of its own.
    pub async fn reconcile(
        &self,
        namespace: &str,
        id: &str,
    ) -> Result<Option<Reconciled>, StoreError> {
        if !self.lock(namespace, id).await? {
            return Ok(None);
        }
        let Some(row) = RECONCILE_IN_FLIGHT
            .query_opt(self.db, &[&namespace, &id])
            .await?
        else {
            return Ok(None);
        };
        Ok(Some(Reconciled {
            namespace: namespace.to_owned(),
            account: id.to_owned(),
            before: column(&row, "before")?,
            after: column(&row, "after")?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use crate::store::scratch::ScratchStore;
    use crate::store::Db as _;

    /// A migrated database whose collation sorts `acct-a` before `Acct-b` (ICU en-US), where
    /// byte by byte, as Rust sorts the ids report batches lock, `Acct-b` comes first.
    async fn linguistic_store() -> ScratchStore {
        let store = ScratchStore::with_icu_collation("en-US")
            .await
            .with_migrations()
            .await;
        let conn = store.conn().await.unwrap_or_else(|e| panic!("{e}"));
        let linguistic: bool = conn
            .query_one("SELECT 'acct-a' < 'Acct-b' AS before", &[])
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .get("before");
        assert!(linguistic, "the database should sort linguistically");
        store
    }

    /// Folds lock account rows in the order `waiting_deltas` lists them, so the list is in the
    /// order claims and report batches take them, byte by byte, whatever the database's
    /// collation. Fails if it sorts by the collation (`acct-a` first).
    #[tokio::test]
    async fn waiting_deltas_lists_accounts_byte_by_byte_under_a_linguistic_collation() {
        let store = linguistic_store().await;
        let conn = store.conn().await.unwrap_or_else(|e| panic!("{e}"));
        conn.batch_execute(
            "INSERT INTO herald.account_deltas (namespace, account_id, released, ok)
             VALUES ('default', 'acct-a', 1, 0), ('default', 'Acct-b', 1, 0)",
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        let waiting = conn
            .accounts()
            .waiting_deltas()
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            waiting,
            vec![(
                "default".to_owned(),
                vec!["Acct-b".to_owned(), "acct-a".to_owned()]
            )]
        );
    }

    /// A webhook batch locks its accounts in the same byte order. Fails if it sorts by the
    /// collation.
    #[tokio::test]
    async fn webhook_batches_lock_accounts_byte_by_byte_under_a_linguistic_collation() {
        let store = linguistic_store().await;
        let mut conn = store.conn().await.unwrap_or_else(|e| panic!("{e}"));
        conn.batch_execute(
            "INSERT INTO herald.pools (namespace, name) VALUES ('default', 'p');
             INSERT INTO herald.accounts (namespace, id, sender_kind, pool, credentials_ref,
                                          rate_per_sec, burst, effective_rate, tokens,
                                          max_in_flight, high_priority_reserve)
             SELECT 'default', id, 'webhook', 'p', 'shared', 10, 10, 10, 10, 10, 0
             FROM unnest(ARRAY['acct-a', 'Acct-b']) AS id",
        )
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
        let tx = conn.transaction().await.unwrap_or_else(|e| panic!("{e}"));
        let locked = tx
            .accounts()
            .lock_by_credentials_refs("default", &["shared"])
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            locked.get("shared"),
            Some(&vec!["Acct-b".to_owned(), "acct-a".to_owned()])
        );
    }
}
