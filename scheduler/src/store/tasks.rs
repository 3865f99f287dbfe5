//! The task aggregate: creating (with idempotency), reading, listing, cancelling, re-driving.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use tokio_postgres::Row;
use uuid::Uuid;

use super::{Store, StoreError};
use crate::model::{
    AttemptRecord, CancelOutcome, DueAt, NewTask, Outcome, RetryPolicy, Target, TaskRecord,
    TaskState,
};

/// Columns every task read selects, in the order [`task_from_row`] expects.
const TASK_COLUMNS: &str = "id, queue, recipient, content, labels, state::text, priority, run_at, \
     expire_at, idempotency_key, lease_count, attempts, max_attempts, retry_delays_ms, \
     backoff_initial_ms, backoff_max_ms, backoff_multiplier, backoff_jitter, executor_id, \
     leased_at, lease_expires_at, cancel_outcome, last_error, created_at, updated_at, finished_at, \
     pool, account_id";

/// The result of creating one task.
#[derive(Debug, Clone)]
pub enum Created {
    /// A new task was inserted.
    New(Uuid),
    /// The idempotency key named an existing task created by the same request.
    Existing(Uuid),
}

impl Created {
    /// The task's id either way.
    pub fn id(&self) -> Uuid {
        match self {
            Created::New(id) | Created::Existing(id) => *id,
        }
    }
}

/// Why a batch was not created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
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

/// Filters for [`Store::list_tasks`].
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
    /// Continue after this id (ids sort by creation; pages go newest first).
    pub before_id: Option<Uuid>,
    /// Page size.
    pub limit: i64,
}

/// What CancelTask found and did.
#[derive(Debug, Clone)]
pub enum CancelResult {
    /// No such task.
    NotFound,
    /// The task had already ended in this state.
    AlreadyEnded(TaskState),
    /// Cancelled before any executor held it.
    CancelledScheduled,
    /// Cancelled while an executor held this lease; it must be told to drop it.
    CancelledLeased {
        /// Fencing attempt of the lease.
        attempt: i32,
        /// The executor holding it.
        executor_id: String,
    },
}

impl Store {
    /// Inserts a batch atomically, resolving idempotency keys: a key seen before with the same
    /// request hash yields the existing task, with a different hash fails the whole batch.
    pub async fn create_tasks(
        &self,
        namespace: &str,
        tasks: &[NewTask],
    ) -> Result<Vec<Created>, CreateError> {
        let mut conn = self.conn().await?;
        let tx = conn
            .transaction()
            .await
            .map_err(StoreError::query("starting a create"))?;
        let created = create_tasks_in(&tx, namespace, tasks).await?;
        tx.commit()
            .await
            .map_err(StoreError::query("committing a create"))?;
        Ok(created)
    }

    /// Reads tasks by id (in no particular order); missing ids are skipped.
    pub async fn get_tasks(
        &self,
        namespace: &str,
        ids: &[Uuid],
    ) -> Result<Vec<TaskRecord>, StoreError> {
        let conn = self.conn().await?;
        let stmt = conn
            .prepare_cached(&format!(
                "SELECT {TASK_COLUMNS} FROM herald.tasks WHERE id = ANY($1) AND namespace = $2"
            ))
            .await
            .map_err(StoreError::query("preparing task read"))?;
        let rows = conn
            .query(&stmt, &[&ids, &namespace])
            .await
            .map_err(StoreError::query("reading tasks"))?;
        rows.iter().map(task_from_row).collect()
    }

    /// Reads one task.
    pub async fn get_task(
        &self,
        namespace: &str,
        id: Uuid,
    ) -> Result<Option<TaskRecord>, StoreError> {
        Ok(self.get_tasks(namespace, &[id]).await?.into_iter().next())
    }

    /// Lists one page of tasks, newest first.
    pub async fn list_tasks(
        &self,
        namespace: &str,
        filter: &TaskFilter,
    ) -> Result<Vec<TaskRecord>, StoreError> {
        let conn = self.conn().await?;
        let states: Option<Vec<&str>> =
            (!filter.states.is_empty()).then(|| filter.states.iter().map(|s| s.as_str()).collect());
        // Every filter is a parameter that may be NULL, so one prepared statement serves all.
        let stmt = conn
            .prepare_cached(&format!(
                "SELECT {TASK_COLUMNS} FROM herald.tasks
                 WHERE namespace = $1
                   AND ($2::text[] IS NULL OR state::text = ANY($2))
                   AND ($3::text IS NULL OR queue = $3)
                   AND ($4::timestamptz IS NULL OR created_at >= $4)
                   AND ($5::timestamptz IS NULL OR created_at < $5)
                   AND ($6::timestamptz IS NULL OR run_at >= $6)
                   AND ($7::timestamptz IS NULL OR run_at < $7)
                   AND ($8::uuid IS NULL OR id < $8)
                 ORDER BY id DESC
                 LIMIT $9"
            ))
            .await
            .map_err(StoreError::query("preparing task list"))?;
        let rows = conn
            .query(
                &stmt,
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
                ],
            )
            .await
            .map_err(StoreError::query("listing tasks"))?;
        rows.iter().map(task_from_row).collect()
    }

    /// Cancels a task; for a leased one, also announces the revoke to every replica (the one
    /// holding the executor's stream forwards it).
    pub async fn cancel_task(&self, namespace: &str, id: Uuid) -> Result<CancelResult, StoreError> {
        let mut conn = self.conn().await?;
        let tx = conn
            .transaction()
            .await
            .map_err(StoreError::query("starting a cancel"))?;
        let stmt = tx
            .prepare_cached(include_str!("queries/cancel_task.sql"))
            .await
            .map_err(StoreError::query("preparing cancel"))?;
        let Some(row) = tx
            .query_opt(&stmt, &[&id, &namespace])
            .await
            .map_err(StoreError::query("cancelling a task"))?
        else {
            return Ok(CancelResult::NotFound);
        };
        let state = parse_state(row.get(0))?;
        let attempt: i32 = row.get(1);
        let executor_id: Option<String> = row.get(2);
        let changed: bool = row.get(3);
        let account: Option<String> = row.get(4);
        if changed && state == TaskState::Leased {
            // The slot is given back now; the late report of this lease will not free it again.
            if let Some(account) = account {
                super::leases::release_slots(&tx, namespace, &[account], false).await?;
            }
        }
        let result = match (changed, state) {
            (false, state) => CancelResult::AlreadyEnded(state),
            (true, TaskState::Leased) => {
                let executor_id = executor_id.unwrap_or_default();
                // Sessions register as `<namespace>/<executor id>`: executor ids are chosen by
                // executors and need only be unique within their namespace.
                tx.execute(
                    "SELECT pg_notify('herald_revoke', $1)",
                    &[&format!("{id}:{attempt}:{namespace}/{executor_id}")],
                )
                .await
                .map_err(StoreError::query("announcing a revoke"))?;
                CancelResult::CancelledLeased {
                    attempt,
                    executor_id,
                }
            }
            (true, _) => CancelResult::CancelledScheduled,
        };
        tx.commit()
            .await
            .map_err(StoreError::query("committing a cancel"))?;
        Ok(result)
    }

    /// Re-drives a FAILED task; returns false when it is not FAILED (or does not exist).
    pub async fn retry_task(
        &self,
        namespace: &str,
        id: Uuid,
        run_at: Option<DateTime<Utc>>,
    ) -> Result<bool, StoreError> {
        let mut conn = self.conn().await?;
        let tx = conn
            .transaction()
            .await
            .map_err(StoreError::query("starting a retry"))?;
        let stmt = tx
            .prepare_cached(include_str!("queries/retry_task.sql"))
            .await
            .map_err(StoreError::query("preparing retry"))?;
        let changed = tx
            .query_opt(&stmt, &[&id, &namespace, &run_at])
            .await
            .map_err(StoreError::query("re-driving a task"))?
            .is_some();
        if changed {
            let at = run_at.unwrap_or_else(Utc::now);
            tx.execute(
                "SELECT pg_notify('herald_due', $1)",
                &[&at.timestamp_micros().to_string()],
            )
            .await
            .map_err(StoreError::query("announcing a retry"))?;
        }
        tx.commit()
            .await
            .map_err(StoreError::query("committing a retry"))?;
        Ok(changed)
    }

    /// Every attempt of a task, oldest first.
    pub async fn list_attempts(&self, task_id: Uuid) -> Result<Vec<AttemptRecord>, StoreError> {
        let conn = self.conn().await?;
        let stmt = conn
            .prepare_cached(
                "SELECT task_id, attempt, executor_id, account, outcome, error,
                        provider_message_id, retry_after_ms, leased_at, finished_at
                 FROM herald.attempts WHERE task_id = $1 ORDER BY attempt",
            )
            .await
            .map_err(StoreError::query("preparing attempt list"))?;
        let rows = conn
            .query(&stmt, &[&task_id])
            .await
            .map_err(StoreError::query("listing attempts"))?;
        rows.iter()
            .map(|r| {
                let code: i16 = r.get(4);
                Ok(AttemptRecord {
                    task_id: r.get(0),
                    attempt: r.get(1),
                    executor_id: r.get(2),
                    account: r.get(3),
                    outcome: Outcome::from_code(code)
                        .ok_or_else(|| StoreError::Corrupt(format!("outcome code {code}")))?,
                    error: r.get(5),
                    provider_message_id: r.get(6),
                    retry_after_ms: r.get(7),
                    leased_at: r.get(8),
                    finished_at: r.get(9),
                })
            })
            .collect()
    }
}

/// [`Store::create_tasks`] inside the caller's transaction, so a schedule run or a campaign
/// chunk and its tasks commit together.
pub(crate) async fn create_tasks_in(
    tx: &deadpool_postgres::Transaction<'_>,
    namespace: &str,
    tasks: &[NewTask],
) -> Result<Vec<Created>, CreateError> {
    let keyed: Vec<(usize, &str, &[u8])> = tasks
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            t.idempotency
                .as_ref()
                .map(|(k, h)| (i, k.as_str(), h.as_slice()))
        })
        .collect();

    // Index of each task whose key was already bound, with the task it resolves to.
    let mut existing: HashMap<usize, Uuid> = HashMap::new();
    if !keyed.is_empty() {
        let keys: Vec<&str> = keyed.iter().map(|(_, k, _)| *k).collect();
        let ids: Vec<Uuid> = keyed.iter().map(|(i, _, _)| tasks[*i].id).collect();
        let hashes: Vec<&[u8]> = keyed.iter().map(|(_, _, h)| *h).collect();
        let stmt = tx
            .prepare_cached(include_str!("queries/reserve_keys.sql"))
            .await
            .map_err(StoreError::query("preparing key reservation"))?;
        let reserved: HashSet<String> = tx
            .query(&stmt, &[&namespace, &keys, &ids, &hashes])
            .await
            .map_err(StoreError::query("reserving idempotency keys"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        // A key reserved by this batch may still appear twice in it: only its first use
        // inserts, later ones resolve like any existing key.
        let mut first_use: HashSet<&str> = HashSet::new();
        let unresolved: Vec<&(usize, &str, &[u8])> = keyed
            .iter()
            .filter(|(_, k, _)| !(reserved.contains(*k) && first_use.insert(*k)))
            .collect();
        if !unresolved.is_empty() {
            let lookup: Vec<&str> = unresolved.iter().map(|(_, k, _)| *k).collect();
            let stmt = tx
                .prepare_cached(include_str!("queries/find_keys.sql"))
                .await
                .map_err(StoreError::query("preparing key lookup"))?;
            let found: HashMap<String, (Uuid, Vec<u8>)> = tx
                .query(&stmt, &[&namespace, &lookup])
                .await
                .map_err(StoreError::query("looking up idempotency keys"))?
                .iter()
                .map(|r| (r.get(0), (r.get(1), r.get(2))))
                .collect();
            for (index, key, hash) in unresolved {
                match found.get(*key) {
                    Some((task_id, stored)) if stored.as_slice() == *hash => {
                        existing.insert(*index, *task_id);
                    }
                    _ => return Err(CreateError::KeyConflict { index: *index }),
                }
            }
        }
    }

    let fresh: Vec<&NewTask> = tasks
        .iter()
        .enumerate()
        .filter(|(i, _)| !existing.contains_key(i))
        .map(|(_, t)| t)
        .collect();
    if !fresh.is_empty() {
        let earliest = insert_rows(tx, namespace, &fresh).await?;
        if let Some(earliest) = earliest {
            // Delivered at commit; dispatchers sleeping past this time wake up.
            tx.execute(
                "SELECT pg_notify('herald_due', $1)",
                &[&earliest.timestamp_micros().to_string()],
            )
            .await
            .map_err(StoreError::query("announcing new tasks"))?;
        }
    }
    Ok(tasks
        .iter()
        .enumerate()
        .map(|(i, t)| match existing.get(&i) {
            Some(id) => Created::Existing(*id),
            None => Created::New(t.id),
        })
        .collect())
}

/// Inserts tasks with one statement and returns the earliest due time among them.
async fn insert_rows(
    tx: &deadpool_postgres::Transaction<'_>,
    namespace: &str,
    tasks: &[&NewTask],
) -> Result<Option<DateTime<Utc>>, StoreError> {
    let n = tasks.len();
    let mut ids = Vec::with_capacity(n);
    let mut queues = Vec::with_capacity(n);
    let mut recipients = Vec::with_capacity(n);
    let mut contents = Vec::with_capacity(n);
    let mut template_ids = Vec::with_capacity(n);
    let mut labels = Vec::with_capacity(n);
    let mut priorities = Vec::with_capacity(n);
    let mut run_ats = Vec::with_capacity(n);
    let mut delays = Vec::with_capacity(n);
    let mut expire_ats = Vec::with_capacity(n);
    let mut keys = Vec::with_capacity(n);
    let mut max_attempts = Vec::with_capacity(n);
    let mut retry_delays = Vec::with_capacity(n);
    let mut initials = Vec::with_capacity(n);
    let mut maxes = Vec::with_capacity(n);
    let mut multipliers = Vec::with_capacity(n);
    let mut jitters = Vec::with_capacity(n);
    let mut pools: Vec<Option<&str>> = Vec::with_capacity(n);
    let mut accounts: Vec<Option<&str>> = Vec::with_capacity(n);
    let trace_parents: Vec<Option<&str>> =
        tasks.iter().map(|t| t.trace_parent.as_deref()).collect();
    for t in tasks {
        match &t.target {
            Target::Queue => {
                pools.push(None);
                accounts.push(None);
            }
            Target::Pool(p) => {
                pools.push(Some(p));
                accounts.push(None);
            }
            Target::Account(a) => {
                pools.push(None);
                accounts.push(Some(a));
            }
        }
        ids.push(t.id);
        queues.push(t.queue.as_str());
        recipients.push(t.recipient.as_str());
        contents.push(t.content.as_slice());
        template_ids.push(t.template_id.as_deref());
        labels.push(serde_json::to_value(&t.labels).unwrap_or_default());
        priorities.push(t.priority);
        match t.due {
            DueAt::At(at) => {
                run_ats.push(Some(at));
                delays.push(0i64);
            }
            DueAt::After(ms) => {
                run_ats.push(None);
                delays.push(ms);
            }
        }
        expire_ats.push(t.expire_at);
        keys.push(t.idempotency.as_ref().map(|(k, _)| k.as_str()));
        max_attempts.push(t.max_attempts);
        match &t.retry {
            RetryPolicy::Exponential {
                initial_ms,
                max_ms,
                multiplier,
                jitter,
            } => {
                retry_delays.push(String::new());
                initials.push(*initial_ms);
                maxes.push(*max_ms);
                multipliers.push(*multiplier);
                jitters.push(*jitter);
            }
            RetryPolicy::Delays(list) => {
                retry_delays.push(
                    list.iter()
                        .map(|d| d.to_string())
                        .collect::<Vec<_>>()
                        .join(","),
                );
                initials.push(RetryPolicy::DEFAULT_INITIAL_MS);
                maxes.push(RetryPolicy::DEFAULT_MAX_MS);
                multipliers.push(RetryPolicy::DEFAULT_MULTIPLIER);
                jitters.push(0.0);
            }
        }
    }
    let stmt = tx
        .prepare_cached(include_str!("queries/insert_tasks.sql"))
        .await
        .map_err(StoreError::query("preparing task insert"))?;
    let rows = tx
        .query(
            &stmt,
            &[
                &namespace,
                &ids,
                &queues,
                &recipients,
                &contents,
                &template_ids,
                &labels,
                &priorities,
                &run_ats,
                &delays,
                &expire_ats,
                &keys,
                &max_attempts,
                &retry_delays,
                &initials,
                &maxes,
                &multipliers,
                &jitters,
                &pools,
                &accounts,
                &trace_parents,
            ],
        )
        .await
        .map_err(StoreError::query("inserting tasks"))?;
    Ok(rows.iter().map(|r| r.get::<_, DateTime<Utc>>(0)).min())
}

pub(crate) fn parse_state(s: &str) -> Result<TaskState, StoreError> {
    TaskState::parse(s).ok_or_else(|| StoreError::Corrupt(format!("task state {s:?}")))
}

fn task_from_row(r: &Row) -> Result<TaskRecord, StoreError> {
    let delays: Vec<i64> = r.get(13);
    let retry = if delays.is_empty() {
        RetryPolicy::Exponential {
            initial_ms: r.get(14),
            max_ms: r.get(15),
            multiplier: r.get(16),
            jitter: r.get(17),
        }
    } else {
        RetryPolicy::Delays(delays)
    };
    let cancel: Option<i16> = r.get(21);
    Ok(TaskRecord {
        id: r.get(0),
        queue: r.get(1),
        recipient: r.get(2),
        content: r.get(3),
        labels: labels_from_json(r.get(4)),
        state: parse_state(r.get(5))?,
        priority: r.get(6),
        run_at: r.get(7),
        expire_at: r.get(8),
        idempotency_key: r.get(9),
        lease_count: r.get(10),
        attempts: r.get(11),
        max_attempts: r.get(12),
        retry,
        executor_id: r.get(18),
        leased_at: r.get(19),
        lease_expires_at: r.get(20),
        cancel_outcome: cancel.and_then(CancelOutcome::from_code),
        last_error: r.get(22),
        created_at: r.get(23),
        updated_at: r.get(24),
        finished_at: r.get(25),
        pool: r.get(26),
        account_id: r.get(27),
    })
}

/// Labels are written as a JSON object of strings; anything else reads as no labels.
pub(crate) fn labels_from_json(value: serde_json::Value) -> BTreeMap<String, String> {
    serde_json::from_value(value).unwrap_or_default()
}
