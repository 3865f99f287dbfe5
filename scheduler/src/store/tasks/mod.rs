//! The task repository: inserting (with idempotency keys), reading, listing, cancelling and
//! re-driving tasks, and reading their attempts.

pub mod columns;

use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use uuid::Uuid;

use self::columns::{state, with_columns, InsertArrays};
use super::sql::{column, notify, statement, FromRow, Statement};
use super::{repository, Db, StoreError};
use crate::tasks::model::{AttemptRecord, NewTask, Outcome, TaskRecord, TaskState};

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
static LIST_TASKS: LazyLock<Statement> =
    LazyLock::new(|| Statement::built("list_tasks", with_columns(include_str!("list_tasks.sql"))));
/// The SQL of the send-window functions (`herald.window_defer_to`), applied by the migrator
/// whenever it changes.
pub const FUNCTIONS_SQL: &str = include_str!("functions.sql");

const RESERVE_KEYS: Statement = statement!("reserve_keys");
const FIND_KEYS: Statement = statement!("find_keys");
const CANCEL_TASK: Statement = statement!("cancel_task");
const RETRY_TASK: Statement = statement!("retry_task");
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

/// Filters for [`TaskRepo::list`].
#[derive(Debug, Clone, Default)]
pub struct TaskFilter {
    /// States to include; empty means all.
    pub states: Vec<TaskState>,
    /// Queue to include; None means all.
    pub queue: Option<String>,
    /// Created at or after.
    pub created_after: Option<DateTime<Utc>>,
    /// Created before.
    pub created_before: Option<DateTime<Utc>>,
    /// Due at or after.
    pub run_after: Option<DateTime<Utc>>,
    /// Due before.
    pub run_before: Option<DateTime<Utc>>,
    /// Exactly this recipient (the console's search).
    pub recipient: Option<String>,
    /// Exactly this task.
    pub id: Option<Uuid>,
    /// Tasks of this campaign.
    pub campaign_id: Option<Uuid>,
    /// Tasks fired by this schedule.
    pub schedule_id: Option<String>,
    /// Tasks pinned to or last leased by this account.
    pub account_id: Option<String>,
    /// Continue after this id (ids sort by creation; pages go newest first).
    pub before_id: Option<Uuid>,
    /// Page size.
    pub limit: i64,
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
            inserted = INSERT_TASKS
                .fetch(self.db, &fresh.params(&namespace))
                .await?;
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
        let mut found: HashMap<String, (Uuid, Vec<u8>)> = HashMap::new();
        for r in FIND_KEYS.query(self.db, &[&namespace, &lookup]).await? {
            found.insert(
                column(&r, "key")?,
                (column(&r, "task_id")?, column(&r, "request_hash")?),
            );
        }
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
        let states: Option<Vec<&str>> =
            (!filter.states.is_empty()).then(|| filter.states.iter().map(|s| s.as_str()).collect());
        LIST_TASKS
            .fetch(
                self.db,
                &[
                    &namespace,
                    &states,
                    &filter.queue,
                    &filter.created_after,
                    &filter.created_before,
                    &filter.run_after,
                    &filter.run_before,
                    &filter.before_id,
                    &filter.limit,
                    &filter.recipient,
                    &filter.id,
                    &filter.campaign_id,
                    &filter.schedule_id,
                    &filter.account_id,
                ],
            )
            .await
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
            return Ok(CancelResult::NotFound);
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

    /// Re-drives a FAILED task; returns false when it is not FAILED (or does not exist).
    pub async fn retry(
        &self,
        namespace: &str,
        id: Uuid,
        run_at: Option<DateTime<Utc>>,
    ) -> Result<bool, StoreError> {
        let changed = RETRY_TASK
            .query_opt(self.db, &[&id, &namespace, &run_at])
            .await?
            .is_some();
        if changed {
            announce_due(self.db, run_at.unwrap_or_else(Utc::now)).await?;
        }
        Ok(changed)
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
