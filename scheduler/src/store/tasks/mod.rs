//! The task repository: inserting (with idempotency keys), reading, listing, cancelling and
//! re-driving tasks, and reading their attempts.

pub mod columns;

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use uuid::Uuid;

use self::columns::{state, with_columns, InsertArrays, RetryColumns};
use super::sql::{column, notify, statement, FromRow, Statement};
use super::{repository, Db, StoreError};
use crate::tasks::model::{AttemptRecord, DueAt, NewTask, Outcome, TaskRecord, TaskState};
use crate::tasks::selection::Selection;

repository!(
    /// Tasks, their attempts and idempotency keys.
    TaskRepo
);

static INSERT_TASKS: LazyLock<Statement> = LazyLock::new(|| {
    Statement::built(
        "insert_tasks",
        with_columns(&columns::insert_statement(include_str!("insert_tasks.sql"))),
    )
});
static GET_TASKS: LazyLock<Statement> =
    LazyLock::new(|| Statement::built("get_tasks", with_columns(include_str!("get_tasks.sql"))));
static UPDATE_TASK: LazyLock<Statement> = LazyLock::new(|| {
    Statement::built("update_task", with_columns(include_str!("update_task.sql")))
});
static LIST_TASKS: LazyLock<Statement> =
    LazyLock::new(|| Statement::built("list_tasks", with_filter(include_str!("list_tasks.sql"))));
/// The SQL of the send-window functions (`herald.window_defer_to`), applied by the migrator
/// whenever it changes.
pub const FUNCTIONS_SQL: &str = include_str!("functions.sql");

const RESERVE_KEYS: Statement = statement!("reserve_keys");
const FIND_KEYS: Statement = statement!("find_keys");
const CANCEL_TASK: Statement = statement!("cancel_task");
const RETRY_TASK: Statement = statement!("retry_task");
const HOLD_CAMPAIGNS: Statement = statement!("hold_campaigns");
/// A bulk reschedule's batch (`reschedule_tasks.sql`); seen by the plan tests in `store/leases`.
pub(crate) const RESCHEDULE_TASKS: Statement = statement!("reschedule_tasks");
const LOCK_KEYS: Statement = statement!("lock_keys");
const GUARD_DUPLICATES: Statement = statement!("guard_duplicates");
const LIST_ATTEMPTS: Statement = statement!("list_attempts");
const PENDING_GROUPS: Statement = statement!("pending_groups");
const NOT_DUE_COUNT: Statement = statement!("not_due_count");

/// Due, unclaimed tasks that share what decides whether they can go.
#[derive(Debug, Clone)]
pub struct PendingGroup {
    /// Queue.
    pub queue: String,
    /// Targeted pool.
    pub pool: Option<String>,
    /// Pinned account.
    pub account_id: Option<String>,
    /// Parked by a paused campaign.
    pub parked: bool,
    /// Tasks in the group.
    pub tasks: i64,
    /// The oldest due time among them.
    pub oldest: DateTime<Utc>,
}

/// The result of creating one task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    /// A new task was inserted.
    New(Uuid),
    /// The idempotency key named an existing task created by the same request.
    Existing(Uuid),
}

/// What a batch insert did: one [`Created`] per task in order, and the stored record of each
/// task it inserted (as the insert returned it; tasks an idempotency key resolved to are not
/// read).
#[derive(Debug, Default)]
pub struct Inserted {
    /// One per task of the batch, in order.
    pub created: Vec<Created>,
    /// The tasks inserted, as stored.
    pub inserted: Vec<TaskRecord>,
}

impl Created {
    /// The task's id either way.
    pub fn id(&self) -> Uuid {
        match self {
            Created::New(id) | Created::Existing(id) => *id,
        }
    }
}

/// Why a batch was not inserted.
#[derive(Debug, thiserror::Error)]
pub enum InsertError {
    /// An idempotency key is already bound to a different request.
    #[error("idempotency key of task {index} was used before with a different request")]
    KeyConflict {
        /// Position of the offending task in the batch.
        index: usize,
    },
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One page of [`TaskRepo::list`]: the tasks selected, continuing after a page token.
#[derive(Debug, Clone, Default)]
pub struct TaskFilter {
    /// Which tasks.
    pub selection: Selection,
    /// Continue after this id (ids sort by creation; pages go newest first).
    pub before_id: Option<Uuid>,
    /// Page size.
    pub limit: i64,
}

/// The predicate every statement that selects tasks by a [`Selection`] shares, filled into
/// their `{task_filter}` placeholder: parameters `$1` (the namespace) to `$14`, in
/// [`SelectionParams::params`] order. Every filter may be NULL, so one prepared statement
/// serves all. A statement's own parameters after these are written `{$+1}`, `{$+2}`, …, so a
/// filter added here renumbers nothing else. The account and the recipient are each matched in
/// two arms, one per partial index that holds their live tasks: `tasks_account` and
/// `tasks_recipient` leave leased tasks out (migrations 33 and 32), and the planner reaches
/// those through `tasks_lease_expiry` only for an arm that says `state = 'leased'`. A
/// recipient matches in either spelling (`+1650…` and `1650…`, `herald.recipient_key`), as
/// the suppression list compares them: three index probes, one per spelling.
pub const TASK_FILTER: &str = "t.namespace = $1
  AND ($2::text[] IS NULL OR t.state::text = ANY($2))
  AND ($3::text IS NULL OR t.queue = $3)
  AND ($4::timestamptz IS NULL OR t.created_at >= $4)
  AND ($5::timestamptz IS NULL OR t.created_at < $5)
  AND ($6::timestamptz IS NULL OR t.run_at >= $6)
  AND ($7::timestamptz IS NULL OR t.run_at < $7)
  AND ($8::uuid IS NULL OR t.campaign_id = $8)
  AND ($9::text IS NULL OR t.schedule_id = $9)
  AND ($10::text IS NULL OR (t.account_id = $10 AND t.state <> 'leased')
       OR (t.account_id = $10 AND t.state = 'leased'))
  AND ($11::text[] IS NULL OR t.end_reason::text = ANY($11))
  AND ($12::text IS NULL
       OR (t.recipient IN ($12, herald.recipient_key($12), '+' || herald.recipient_key($12))
           AND t.state <> 'leased')
       OR (t.recipient IN ($12, herald.recipient_key($12), '+' || herald.recipient_key($12))
           AND t.state = 'leased'))
  AND ($13::uuid IS NULL OR t.id = $13)
  AND ($14::text IS NULL OR t.audience_id = $14)";

/// How many parameters [`TASK_FILTER`] takes, the namespace included.
pub const TASK_FILTER_PARAMS: usize = 14;

/// A selection's values as `$1`…`$14` of [`TASK_FILTER`].
pub struct SelectionParams<'a> {
    states: Option<Vec<&'static str>>,
    end_reasons: Option<Vec<&'static str>>,
    s: &'a Selection,
}

impl<'a> SelectionParams<'a> {
    /// The values of `s`.
    pub fn of(s: &'a Selection) -> Self {
        SelectionParams {
            states: s.state_names(),
            end_reasons: s.end_reason_names(),
            s,
        }
    }

    /// `$1` (the namespace) to `$14`.
    pub fn params<'p>(
        &'p self,
        namespace: &'p &str,
    ) -> Vec<&'p (dyn tokio_postgres::types::ToSql + Sync)> {
        let params: [&'p (dyn tokio_postgres::types::ToSql + Sync); TASK_FILTER_PARAMS] = [
            namespace,
            &self.states,
            &self.s.queue,
            &self.s.created_after,
            &self.s.created_before,
            &self.s.run_after,
            &self.s.run_before,
            &self.s.campaign_id,
            &self.s.schedule_id,
            &self.s.account_id,
            &self.end_reasons,
            &self.s.recipient,
            &self.s.id,
            &self.s.audience_id,
        ];
        params.to_vec()
    }
}

/// `sql` with its `{task_filter}` placeholder filled in, and its own parameters `{$+1}`,
/// `{$+2}`, … numbered after the filter's.
pub fn with_filter(sql: &str) -> String {
    let mut sql = with_columns(sql).replace("{task_filter}", TASK_FILTER);
    for k in 1..=4 {
        sql = sql.replace(
            &format!("{{$+{k}}}"),
            &format!("${}", TASK_FILTER_PARAMS + k),
        );
    }
    sql
}

/// What cancelling found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelResult {
    /// No such task.
    NotFound,
    /// The task had already ended in this state.
    AlreadyEnded(TaskState),
    /// Cancelled before any executor held it.
    CancelledScheduled,
    /// Cancelled while an executor held this lease; it has been told to drop it.
    CancelledLeased {
        /// Fencing attempt of the lease.
        attempt: i32,
        /// The executor holding it.
        executor_id: String,
    },
}

impl FromRow for AttemptRecord {
    fn from_row(r: &tokio_postgres::Row) -> Result<Self, StoreError> {
        let code: i16 = column(r, "outcome")?;
        Ok(AttemptRecord {
            task_id: column(r, "task_id")?,
            attempt: column(r, "attempt")?,
            executor_id: column(r, "executor_id")?,
            account: column(r, "account")?,
            outcome: Outcome::from_code(code)
                .ok_or_else(|| StoreError::Corrupt(format!("outcome code {code}")))?,
            error: column(r, "error")?,
            provider_message_id: column(r, "provider_message_id")?,
            retry_after_ms: column(r, "retry_after_ms")?,
            leased_at: column(r, "leased_at")?,
            finished_at: column(r, "finished_at")?,
            window_closed_fallback: column(r, "window_closed_fallback")?,
        })
    }
}

/// Wakes dispatchers on every replica for tasks due at `at` (delivered at commit).
pub async fn announce_due(db: &impl GenericClient, at: DateTime<Utc>) -> Result<(), StoreError> {
    notify(db, "herald_due", &at.timestamp_micros().to_string()).await
}

/// Wakes dispatchers on every replica to look again now (delivered at commit).
pub async fn announce_due_now(db: &impl GenericClient) -> Result<(), StoreError> {
    notify(db, "herald_due", "0").await
}

impl<C: GenericClient> TaskRepo<'_, C> {
    /// Inserts a batch, resolving idempotency keys: a key seen before with the same request hash
    /// yields the existing task, with a different hash fails the whole batch. Announces the
    /// earliest due time to every replica's dispatchers at commit. Run it in a transaction: the
    /// keys are reserved before the tasks are inserted.
    pub async fn insert(
        &self,
        namespace: &str,
        tasks: &[NewTask],
    ) -> Result<Inserted, InsertError> {
        let existing = self.resolve_keys(namespace, tasks).await?;
        let mut fresh = InsertArrays::default();
        let mut any = false;
        for (i, t) in tasks.iter().enumerate() {
            if !existing.contains_key(&i) {
                fresh.push(t);
                any = true;
            }
        }
        let mut inserted: Vec<TaskRecord> = Vec::new();
        if any {
            let rows = INSERT_TASKS
                .query(self.db, &fresh.params(&namespace))
                .await?;
            inserted = fresh.into_records(&rows)?;
            if let Some(at) = inserted.iter().map(|t| t.run_at).min() {
                announce_due(self.db, at).await?;
            }
        }
        let created = tasks
            .iter()
            .enumerate()
            .map(|(i, t)| match existing.get(&i) {
                Some(id) => Created::Existing(*id),
                None => Created::New(t.id),
            })
            .collect();
        Ok(Inserted { created, inserted })
    }

    /// The index of each task whose key was already bound, with the task it resolves to.
    async fn resolve_keys(
        &self,
        namespace: &str,
        tasks: &[NewTask],
    ) -> Result<HashMap<usize, Uuid>, InsertError> {
        let keyed: Vec<(usize, &str, &[u8])> = tasks
            .iter()
            .enumerate()
            .filter_map(|(i, t)| {
                t.idempotency
                    .as_ref()
                    .map(|(k, h)| (i, k.as_str(), h.as_slice()))
            })
            .collect();
        let mut existing = HashMap::new();
        if keyed.is_empty() {
            return Ok(existing);
        }
        let keys: Vec<&str> = keyed.iter().map(|(_, k, _)| *k).collect();
        let ids: Vec<Uuid> = keyed.iter().map(|(i, _, _)| tasks[*i].id).collect();
        let hashes: Vec<&[u8]> = keyed.iter().map(|(_, _, h)| *h).collect();
        let reserved: HashSet<String> = RESERVE_KEYS
            .query(self.db, &[&namespace, &keys, &ids, &hashes])
            .await?
            .iter()
            .map(|r| column(r, "key"))
            .collect::<Result<_, _>>()?;
        // A key reserved by this batch may still appear twice in it: only its first use
        // inserts, later ones resolve like any existing key.
        let mut first_use: HashSet<&str> = HashSet::new();
        let unresolved: Vec<&(usize, &str, &[u8])> = keyed
            .iter()
            .filter(|(_, k, _)| !(reserved.contains(*k) && first_use.insert(*k)))
            .collect();
        if unresolved.is_empty() {
            return Ok(existing);
        }
        let lookup: Vec<&str> = unresolved.iter().map(|(_, k, _)| *k).collect();
        let found = self.bound_keys(namespace, &lookup).await?;
        for (index, key, hash) in unresolved {
            match found.get(*key) {
                Some((task_id, stored)) if stored.as_slice() == *hash => {
                    existing.insert(*index, *task_id);
                }
                _ => return Err(InsertError::KeyConflict { index: *index }),
            }
        }
        Ok(existing)
    }

    /// The tasks `keys` of the namespace are bound to, with the request digest each was bound
    /// with; keys not bound are left out.
    pub async fn bound_keys(
        &self,
        namespace: &str,
        keys: &[&str],
    ) -> Result<HashMap<String, (Uuid, Vec<u8>)>, StoreError> {
        let mut found = HashMap::with_capacity(keys.len());
        for r in FIND_KEYS.query(self.db, &[&namespace, &keys]).await? {
            found.insert(
                column(&r, "key")?,
                (column(&r, "task_id")?, column(&r, "request_hash")?),
            );
        }
        Ok(found)
    }

    /// Reads tasks of the namespace by id (in no particular order); missing ids are skipped.
    pub async fn get_many(
        &self,
        namespace: &str,
        ids: &[Uuid],
    ) -> Result<Vec<TaskRecord>, StoreError> {
        GET_TASKS.fetch(self.db, &[&ids, &namespace]).await
    }

    /// Reads one task.
    pub async fn get(&self, namespace: &str, id: Uuid) -> Result<Option<TaskRecord>, StoreError> {
        Ok(self.get_many(namespace, &[id]).await?.into_iter().next())
    }

    /// Lists one page of tasks, newest first.
    pub async fn list(
        &self,
        namespace: &str,
        filter: &TaskFilter,
    ) -> Result<Vec<TaskRecord>, StoreError> {
        let selection = SelectionParams::of(&filter.selection);
        let mut params = selection.params(&namespace);
        params.push(&filter.before_id);
        params.push(&filter.limit);
        LIST_TASKS.fetch(self.db, &params).await
    }

    /// The namespace's due, unclaimed tasks grouped by queue, pool, account and parking, looking
    /// at the `limit` oldest due.
    pub async fn pending_groups(
        &self,
        namespace: &str,
        limit: i64,
    ) -> Result<Vec<PendingGroup>, StoreError> {
        PENDING_GROUPS
            .query(self.db, &[&namespace, &limit])
            .await?
            .iter()
            .map(|r| {
                Ok(PendingGroup {
                    queue: column(r, "queue")?,
                    pool: column(r, "pool")?,
                    account_id: column(r, "account_id")?,
                    parked: column(r, "parked")?,
                    tasks: column(r, "tasks")?,
                    oldest: column(r, "oldest")?,
                })
            })
            .collect()
    }

    /// How many scheduled tasks are not due yet, counting at most `limit`.
    pub async fn not_due_count(&self, namespace: &str, limit: i64) -> Result<i64, StoreError> {
        column(
            &NOT_DUE_COUNT
                .query_one(self.db, &[&namespace, &limit])
                .await?,
            "tasks",
        )
    }

    /// Cancels a task; for a leased one, also gives its account slot back and announces the
    /// revoke to every replica (the one holding the executor's stream forwards it). Run it in a
    /// transaction: the transition, the slot and the announcement commit together.
    pub async fn cancel(&self, namespace: &str, id: Uuid) -> Result<CancelResult, StoreError> {
        let Some(row) = CANCEL_TASK.query_opt(self.db, &[&id, &namespace]).await? else {
            // Not in the hot table: ended and moved into the history, or not there at all.
            return Ok(
                match self.db.leases().states(namespace, &[id]).await?.remove(&id) {
                    Some(state) => CancelResult::AlreadyEnded(state),
                    None => CancelResult::NotFound,
                },
            );
        };
        let state = state(&row, "state")?;
        let attempt: i32 = column(&row, "attempt")?;
        let executor_id: Option<String> = column(&row, "executor_id")?;
        let changed: bool = column(&row, "changed")?;
        let account: Option<String> = column(&row, "account_id")?;
        Ok(match (changed, state) {
            (false, state) => CancelResult::AlreadyEnded(state),
            (true, TaskState::Leased) => {
                // The slot is given back now; the late report of this lease will not free it.
                if let Some(account) = account {
                    self.db
                        .accounts()
                        .release_slots(namespace, &[account], false)
                        .await?;
                }
                let executor_id = executor_id.unwrap_or_default();
                // Sessions register as `<namespace>/<executor id>`: executor ids are chosen by
                // executors and need only be unique within their namespace.
                notify(
                    self.db,
                    "herald_revoke",
                    &format!("{id}:{attempt}:{namespace}/{executor_id}"),
                )
                .await?;
                CancelResult::CancelledLeased {
                    attempt,
                    executor_id,
                }
            }
            (true, _) => CancelResult::CancelledScheduled,
        })
    }

    /// Writes an edit of a SCHEDULED task (`task` is the edited task, checked and rendered;
    /// its due time and content are written only when `when` and `content` say they changed)
    /// and wakes the dispatchers for its due time; None when the task is not SCHEDULED (any
    /// more), does not exist, or changed since the version last updated at `read_at` that the
    /// edit was merged onto. See `update_task.sql` for why a concurrent claim cannot also win.
    pub async fn update(
        &self,
        namespace: &str,
        id: Uuid,
        task: &NewTask,
        when: bool,
        content: bool,
        read_at: DateTime<Utc>,
    ) -> Result<Option<TaskRecord>, StoreError> {
        let (run_at, delay_ms) = match (when, task.due) {
            (false, _) => (None, None),
            (true, DueAt::At(at)) => (Some(at), None),
            (true, DueAt::After(ms)) => (None, Some(ms)),
        };
        let encoded = prost::Message::encode_to_vec(&task.content);
        let labels = serde_json::to_value(&task.labels).unwrap_or_default();
        let retry = RetryColumns::of(&task.retry);
        let updated: Option<TaskRecord> = UPDATE_TASK
            .fetch_opt(
                self.db,
                &[
                    &id,
                    &namespace,
                    &run_at,
                    &delay_ms,
                    &content,
                    &encoded,
                    &task.template_id,
                    &task.priority,
                    &task.expire_at,
                    &labels,
                    &task.max_attempts,
                    &retry.initial,
                    &retry.max,
                    &retry.multiplier,
                    &retry.jitter,
                    &retry.delays,
                    &read_at,
                ],
            )
            .await?;
        if let Some(t) = &updated {
            announce_due(self.db, t.run_at).await?;
        }
        Ok(updated)
    }

    /// Re-drives a FAILED task (brought back from the history first, so the caller's
    /// transaction is where it moves); returns false when it is not FAILED (or does not exist).
    pub async fn retry(
        &self,
        namespace: &str,
        id: Uuid,
        run_at: Option<DateTime<Utc>>,
    ) -> Result<bool, StoreError> {
        self.db.history().restore(&[id]).await?;
        self.hold_campaigns(&[id]).await?;
        let changed = RETRY_TASK
            .query_opt(self.db, &[&id, &namespace, &run_at])
            .await?
            .is_some();
        if changed {
            announce_due(self.db, run_at.unwrap_or_else(Utc::now)).await?;
        }
        Ok(changed)
    }

    /// Locks the campaigns of `tasks` for the rest of the transaction (see
    /// `hold_campaigns.sql`): a retry and a pause or cancel of the campaign apply one after the
    /// other, never both from the state before the other.
    pub async fn hold_campaigns(&self, tasks: &[Uuid]) -> Result<(), StoreError> {
        HOLD_CAMPAIGNS.query(self.db, &[&tasks]).await?;
        Ok(())
    }

    /// Takes the duplicate content guard's advisory locks `keys` (sorted) for the rest of the
    /// transaction.
    pub async fn lock_keys(&self, keys: &[i64]) -> Result<(), StoreError> {
        LOCK_KEYS.query_one(self.db, &[&keys]).await?;
        Ok(())
    }

    /// The duplicate content guard over the just-inserted tasks `ids` (their windows and
    /// content hashes alongside; see `guard_duplicates.sql`); returns the tasks it ended.
    pub async fn guard_duplicates(
        &self,
        namespace: &str,
        ids: &[Uuid],
        windows_ms: &[i64],
        hashes: &[Vec<u8>],
    ) -> Result<Vec<Uuid>, StoreError> {
        GUARD_DUPLICATES
            .query(self.db, &[&namespace, &ids, &windows_ms, &hashes])
            .await?
            .iter()
            .map(|r| column(r, "id"))
            .collect()
    }

    /// Moves the SCHEDULED tasks among `ids` to `run_at`, or by `shift_ms`, and wakes the
    /// dispatchers for the earliest; returns how many moved.
    pub async fn reschedule(
        &self,
        namespace: &str,
        ids: &[Uuid],
        run_at: Option<DateTime<Utc>>,
        shift_ms: Option<i64>,
    ) -> Result<u64, StoreError> {
        let rows = RESCHEDULE_TASKS
            .query(self.db, &[&ids, &namespace, &run_at, &shift_ms])
            .await?;
        let mut earliest: Option<DateTime<Utc>> = None;
        for r in &rows {
            let at: DateTime<Utc> = column(r, "run_at")?;
            earliest = Some(earliest.map_or(at, |e| e.min(at)));
        }
        if let Some(at) = earliest {
            announce_due(self.db, at).await?;
        }
        Ok(rows.len() as u64)
    }

    /// Every attempt of a task of the namespace, oldest first.
    pub async fn attempts(
        &self,
        namespace: &str,
        task_id: Uuid,
    ) -> Result<Vec<AttemptRecord>, StoreError> {
        LIST_ATTEMPTS.fetch(self.db, &[&task_id, &namespace]).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::scratch::{insert_tasks, rows_discarded, ScratchStore};

    /// An edit is written only onto the version it was merged onto: a second edit merged onto
    /// the same read, after the first was written, changes nothing (UpdateTask merges it again;
    /// written, it would put back the first edit's field as read before it).
    #[tokio::test]
    async fn an_edit_merged_onto_an_older_version_is_not_written() {
        let store = ScratchStore::migrated().await;
        let conn = store.conn().await.unwrap_or_else(|e| panic!("{e}"));
        insert_tasks(&conn, 1, "scheduled").await;
        let id: Uuid = conn
            .query_one("SELECT id FROM herald.tasks", &[])
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .get("id");
        let read = conn
            .tasks()
            .get("default", id)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("task {id} not found"));
        let edited = |priority: i32| {
            let spec = crate::tasks::model::TaskSpec {
                queue: read.queue.clone(),
                recipient: read.recipient.clone(),
                content: Some(herald_proto::v1::Content {
                    body: Some(herald_proto::v1::content::Body::Text("edited".into())),
                    ..Default::default()
                }),
                priority: Some(priority),
                ..Default::default()
            };
            let mut v = crate::error::Violations::default();
            spec.validate("task", Utc::now(), &mut v)
                .unwrap_or_else(|| panic!("{v:?}"))
        };
        let first = conn
            .tasks()
            .update("default", id, &edited(7), false, false, read.updated_at)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(first.map(|t| t.priority), Some(7));
        let stale = conn
            .tasks()
            .update("default", id, &edited(2), false, false, read.updated_at)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(stale.is_none(), "an edit of a stale read was written");
        let now = conn
            .tasks()
            .get("default", id)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .map(|t| t.priority);
        assert_eq!(now, Some(7));
    }

    /// A table of 20,000 succeeded, 5,000 scheduled and 1,000 leased tasks, to recipients `r1`,
    /// `r2`, … in each state, each also sent through account `acct-` + its number modulo 50
    /// when `accounts`, with fresh statistics.
    async fn tasks_in_every_state(conn: &deadpool_postgres::Object, accounts: bool) {
        insert_tasks(conn, 20_000, "succeeded").await;
        insert_tasks(conn, 5_000, "scheduled").await;
        insert_tasks(conn, 1_000, "leased").await;
        if accounts {
            conn.batch_execute(
                "UPDATE herald.tasks
                 SET account_id = 'acct-' || substr(recipient, 2)::integer % 50",
            )
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        }
        conn.batch_execute("ANALYZE herald.tasks")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// The first page of up to `limit` tasks `selection` finds, and how many rows the page's
    /// plan read and threw away.
    async fn search(
        conn: &mut deadpool_postgres::Object,
        selection: Selection,
        limit: i64,
    ) -> (Vec<TaskRecord>, i64) {
        let namespace = "default";
        let page = TaskFilter {
            selection,
            before_id: None,
            limit,
        };
        let found = conn
            .tasks()
            .list(namespace, &page)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let filter = SelectionParams::of(&page.selection);
        let mut params = filter.params(&namespace);
        params.push(&page.before_id);
        params.push(&page.limit);
        let discarded = rows_discarded(conn, LIST_TASKS.text(), &params).await;
        (found, discarded)
    }

    /// A search by recipient reads the recipient's own tasks and, since `tasks_recipient` leaves
    /// leased tasks out (migration 32), the leased ones through `tasks_lease_expiry`: never the
    /// table's finished or scheduled tasks, of which there are many more.
    #[tokio::test]
    async fn a_search_by_recipient_reads_only_its_tasks_and_the_leased_ones() {
        let store = ScratchStore::migrated().await;
        let mut conn = store.conn().await.unwrap_or_else(|e| panic!("{e}"));
        tasks_in_every_state(&conn, false).await;
        let selection = Selection {
            recipient: Some("r7".into()),
            ..Selection::default()
        };
        let (found, discarded) = search(&mut conn, selection, 100).await;
        let mut states: Vec<TaskState> = found.iter().map(|t| t.state).collect();
        states.sort_by_key(|s| format!("{s:?}"));
        assert_eq!(
            states,
            vec![
                TaskState::Leased,
                TaskState::Scheduled,
                TaskState::Succeeded
            ]
        );
        assert!(
            discarded <= 1_000,
            "the search read {discarded} rows it threw away: more than the leased tasks"
        );
    }

    /// A search by account reads the account's own tasks and, since `tasks_account` leaves
    /// leased tasks out (migration 33), the leased ones through `tasks_lease_expiry`: never the
    /// other accounts' finished or scheduled tasks, of which there are many more.
    #[tokio::test]
    async fn a_search_by_account_reads_only_its_tasks_and_the_leased_ones() {
        let store = ScratchStore::migrated().await;
        let mut conn = store.conn().await.unwrap_or_else(|e| panic!("{e}"));
        tasks_in_every_state(&conn, true).await;
        let selection = Selection {
            account_id: Some("acct-7".into()),
            ..Selection::default()
        };
        let (found, discarded) = search(&mut conn, selection, 1_000).await;
        let count = |state: TaskState| found.iter().filter(|t| t.state == state).count();
        assert_eq!(
            (
                count(TaskState::Succeeded),
                count(TaskState::Scheduled),
                count(TaskState::Leased)
            ),
            (400, 100, 20)
        );
        assert!(
            discarded <= 1_000,
            "the search read {discarded} rows it threw away: more than the leased tasks"
        );
    }
}
