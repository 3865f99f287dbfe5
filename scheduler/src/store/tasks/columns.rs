//! The task row: which columns a new task is inserted with, which a read selects and which a
//! lease returns, each list beside the code that decodes it by name. A task field is added here
//! (and in a migration), and every statement that inserts, reads or leases tasks follows.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, NaiveTime, SubsecRound, Utc};
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::store::arrays::{Sparse, Uniform};
use crate::store::sql::{column, Columns, FromRow};
use crate::store::StoreError;
use crate::tasks::model::{
    CancelOutcome, DueAt, EndReason, GrantedLease, NewTask, Origin, RetryPolicy, SendWindow,
    Target, TaskRecord, TaskState,
};

/// What a task read selects (`t` is `herald.tasks`); decoded by [`TaskRecord::from_row`].
pub const TASK_COLUMNS: &str = "t.id, t.queue, t.recipient, t.content, t.labels, \
     t.state::text AS state, t.priority, t.run_at, t.expire_at, t.idempotency_key, t.lease_count, \
     t.attempts, t.max_attempts, t.retry_delays_ms, t.backoff_initial_ms, t.backoff_max_ms, \
     t.backoff_multiplier, t.backoff_jitter, t.executor_id, t.leased_at, t.lease_expires_at, \
     t.cancel_outcome, t.last_error, t.created_at, t.updated_at, t.finished_at, t.pool, \
     t.account_id, t.window_start, t.window_end, t.window_zone, t.window_spread_ms, \
     t.end_reason::text AS end_reason, t.end_code, t.trace_parent, t.campaign_id, t.schedule_id, \
     t.audience_id, t.route, t.window_closed_fallback, t.window_closed_fallback_at, \
     t.fallback_replaces";

/// What the insert computes of a new task and returns (`t` is `herald.tasks`): the rest of its
/// record is what the create path sent ([`InsertArrays::into_records`]).
pub const CREATED_COLUMNS: &str = "t.id, t.state::text AS state, t.run_at, t.cancel_outcome, \
     t.last_error, t.created_at, t.updated_at, t.finished_at, t.end_reason::text AS end_reason";

/// What a lease returns of its task (`t` is `herald.tasks`); the statements add `account_id`
/// and `credentials_ref`. Decoded by [`GrantedLease::from_row`]. `send_after_ms` is how far in
/// the future the grant instant lies (a paced send; 0 for the rest). Once the window-closed
/// fallback has taken the place of the content, every lease sends the fallback and carries
/// none: it is used once.
pub const LEASE_COLUMNS: &str = "t.id AS task_id, t.lease_count AS attempt, t.queue, \
     t.recipient, \
     CASE WHEN t.window_closed_fallback_at IS NULL THEN t.content \
          ELSE t.window_closed_fallback END AS content, \
     CASE WHEN t.window_closed_fallback_at IS NULL THEN t.window_closed_fallback END \
     AS window_closed_fallback, \
     COALESCE(t.idempotency_key, t.id::text) AS idempotency_key, \
     t.run_at, t.priority, t.leased_at, t.lease_expires_at AS expires_at, t.attempts AS attempts_before, \
     t.max_attempts, t.labels, t.trace_parent, \
     greatest(ceil(extract(epoch FROM t.leased_at - herald.clock()) * 1000), 0)::bigint \
     AS send_after_ms";

/// How an input column of the insert travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// One element a task; one NULL when it is NULL for every task ([`Sparse`]).
    PerTask,
    /// Never NULL and mostly the same for a whole batch (one queue, one policy, often one
    /// content): one element when it is ([`Uniform`]). The statement reads a missing element as
    /// the first.
    Uniform,
}

/// Columns a new task is inserted with, as `unnest` inputs: (name, SQL type, how it is sent).
/// Parameters `$2`… follow this order (`$1` is the namespace); `insert_tasks.sql` computes the
/// rest.
pub const INSERT_INPUTS: &[(&str, &str, Sent)] = &[
    ("id", "uuid", Sent::PerTask),
    ("queue", "text", Sent::Uniform),
    ("recipient", "text", Sent::PerTask),
    ("content", "bytea", Sent::Uniform),
    ("template_id", "text", Sent::PerTask),
    ("labels", "jsonb", Sent::Uniform),
    ("priority", "smallint", Sent::Uniform),
    ("expire_at", "timestamptz", Sent::PerTask),
    ("idempotency_key", "text", Sent::PerTask),
    ("max_attempts", "integer", Sent::Uniform),
    ("backoff_initial_ms", "bigint", Sent::Uniform),
    ("backoff_max_ms", "bigint", Sent::Uniform),
    ("backoff_multiplier", "float8", Sent::Uniform),
    ("backoff_jitter", "float8", Sent::Uniform),
    ("pool", "text", Sent::PerTask),
    ("account_id", "text", Sent::PerTask),
    ("trace_parent", "text", Sent::PerTask),
    ("schedule_id", "text", Sent::PerTask),
    ("fire_time", "timestamptz", Sent::PerTask),
    ("campaign_id", "uuid", Sent::PerTask),
    ("audience_id", "text", Sent::PerTask),
    ("window_start", "time", Sent::PerTask),
    ("window_end", "time", Sent::PerTask),
    ("window_zone", "text", Sent::PerTask),
    ("window_spread_ms", "bigint", Sent::PerTask),
    ("window_closed_fallback", "bytea", Sent::PerTask),
    // Inputs of computed columns (see insert_tasks.sql).
    ("given_run_at", "timestamptz", Sent::PerTask),
    ("delay_ms", "bigint", Sent::Uniform),
    ("retry_delays", "text", Sent::Uniform),
    ("parked", "boolean", Sent::Uniform),
];

/// How many inputs of [`INSERT_INPUTS`] are computed rather than stored as they are.
const COMPUTED_INPUTS: usize = 4;

/// `insert_tasks.sql` with its column lists filled in from [`INSERT_INPUTS`].
pub fn insert_statement(template: &str) -> String {
    let stored = &INSERT_INPUTS[..INSERT_INPUTS.len() - COMPUTED_INPUTS];
    // One `unnest` per array in the select list, not one multi-array `unnest` in FROM: the
    // select list steps through the arrays together, while FROM materialises each array's
    // elements into a tuple store of its own first (30 of them per batch), which cost about
    // three times as much per row (docs/performance.md, S2). The arrays are always equally
    // long, so stepping together pairs the elements of each task.
    // A uniform input is sent as one element when the whole batch shares it: the `unnest`
    // runs out after the first task, and the outer select reads its padding as that element
    // (COALESCE takes no set-returning argument, hence the two levels).
    let unnests: Vec<String> = INSERT_INPUTS
        .iter()
        .enumerate()
        .map(|(i, (name, ty, _))| format!("unnest(${}::{ty}[]) AS {name}", i + 2))
        .collect();
    let reads: Vec<String> = INSERT_INPUTS
        .iter()
        .enumerate()
        .map(|(i, (name, ty, sent))| match sent {
            Sent::PerTask => format!("u.{name}"),
            Sent::Uniform => format!("COALESCE(u.{name}, (${}::{ty}[])[1]) AS {name}", i + 2),
        })
        .collect();
    let inputs = format!(
        "{} FROM (SELECT {}) AS u",
        reads.join(", "),
        unnests.join(", ")
    );
    template
        .replace(
            "{stored_columns}",
            &stored
                .iter()
                .map(|(n, _, _)| *n)
                .collect::<Vec<_>>()
                .join(", "),
        )
        .replace(
            "{stored_values}",
            &stored
                .iter()
                .map(|(n, _, _)| format!("i.{n}"))
                .collect::<Vec<_>>()
                .join(", "),
        )
        .replace("{inputs}", &inputs)
}

/// A retry policy as the task row stores it: the backoff columns, and the explicit delays as
/// text (`insert_tasks.sql` and `update_task.sql` turn it into the `retry_delays_ms` array;
/// empty for backoff).
pub struct RetryColumns {
    /// `backoff_initial_ms`.
    pub initial: i64,
    /// `backoff_max_ms`.
    pub max: i64,
    /// `backoff_multiplier`.
    pub multiplier: f64,
    /// `backoff_jitter`.
    pub jitter: f64,
    /// The delays, comma-separated milliseconds.
    pub delays: String,
}

impl RetryColumns {
    /// The columns of a policy.
    pub fn of(retry: &RetryPolicy) -> Self {
        match retry {
            RetryPolicy::Exponential {
                initial_ms,
                max_ms,
                multiplier,
                jitter,
            } => RetryColumns {
                initial: *initial_ms,
                max: *max_ms,
                multiplier: *multiplier,
                jitter: *jitter,
                delays: String::new(),
            },
            RetryPolicy::Delays(list) => RetryColumns {
                initial: RetryPolicy::DEFAULT_INITIAL_MS,
                max: RetryPolicy::DEFAULT_MAX_MS,
                multiplier: RetryPolicy::DEFAULT_MULTIPLIER,
                jitter: 0.0,
                delays: list
                    .iter()
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            },
        }
    }
}

/// The policy a row's retry columns stand for: its explicit delays, or else its backoff. One
/// rule for a read and for a create's answer, so both say what GetTask says.
fn stored_retry(
    delays: Vec<i64>,
    initial_ms: i64,
    max_ms: i64,
    multiplier: f64,
    jitter: f64,
) -> RetryPolicy {
    if delays.is_empty() {
        RetryPolicy::Exponential {
            initial_ms,
            max_ms,
            multiplier,
            jitter,
        }
    } else {
        RetryPolicy::Delays(delays)
    }
}

/// A batch of new tasks as one array per input column.
#[derive(Default)]
pub struct InsertArrays<'a> {
    tasks: Vec<&'a NewTask>,
    id: Vec<Uuid>,
    queue: Uniform<&'a str>,
    recipient: Vec<&'a str>,
    content: Uniform<Vec<u8>>,
    template_id: Sparse<&'a str>,
    labels: Uniform<serde_json::Value>,
    priority: Uniform<i16>,
    expire_at: Sparse<DateTime<Utc>>,
    idempotency_key: Sparse<&'a str>,
    max_attempts: Uniform<i32>,
    backoff_initial_ms: Uniform<i64>,
    backoff_max_ms: Uniform<i64>,
    backoff_multiplier: Uniform<f64>,
    backoff_jitter: Uniform<f64>,
    pool: Sparse<&'a str>,
    account_id: Sparse<&'a str>,
    trace_parent: Sparse<&'a str>,
    schedule_id: Sparse<&'a str>,
    fire_time: Sparse<DateTime<Utc>>,
    campaign_id: Sparse<Uuid>,
    audience_id: Sparse<&'a str>,
    window_start: Sparse<NaiveTime>,
    window_end: Sparse<NaiveTime>,
    window_zone: Sparse<&'a str>,
    window_spread_ms: Sparse<i64>,
    window_closed_fallback: Sparse<Vec<u8>>,
    given_run_at: Sparse<DateTime<Utc>>,
    delay_ms: Uniform<i64>,
    retry_delays: Uniform<String>,
    parked: Uniform<bool>,
}

impl<'a> InsertArrays<'a> {
    /// Adds one task.
    pub fn push(&mut self, t: &'a NewTask) {
        let (pool, account) = match &t.target {
            Target::Queue => (None, None),
            Target::Pool(p) => (Some(p.as_str()), None),
            Target::Account(a) => (None, Some(a.as_str())),
        };
        let (given_run_at, delay_ms) = match t.due {
            DueAt::At(at) => (Some(at), 0),
            DueAt::After(ms) => (None, ms),
        };
        let RetryColumns {
            initial,
            max,
            multiplier,
            jitter,
            delays,
        } = RetryColumns::of(&t.retry);
        let (schedule_id, fire_time, campaign_id, audience_id, parked) = match &t.origin {
            Origin::Request => (None, None, None, None, false),
            Origin::ScheduleRun {
                schedule_id,
                fire_time,
                audience_id,
            } => (
                Some(schedule_id.as_str()),
                Some(*fire_time),
                None,
                audience_id.as_deref(),
                false,
            ),
            Origin::Campaign {
                campaign_id,
                paused,
                audience_id,
            } => (
                None,
                None,
                Some(*campaign_id),
                audience_id.as_deref(),
                *paused,
            ),
        };
        self.tasks.push(t);
        self.id.push(t.id);
        self.queue.0.push(&t.queue);
        self.recipient.push(&t.recipient);
        self.content
            .0
            .push(prost::Message::encode_to_vec(&t.content));
        self.template_id.0.push(t.template_id.as_deref());
        self.labels
            .0
            .push(serde_json::to_value(&t.labels).unwrap_or_default());
        self.priority.0.push(t.priority);
        self.expire_at.0.push(t.expire_at);
        self.idempotency_key
            .0
            .push(t.idempotency.as_ref().map(|(k, _)| k.as_str()));
        self.max_attempts.0.push(t.max_attempts);
        self.backoff_initial_ms.0.push(initial);
        self.backoff_max_ms.0.push(max);
        self.backoff_multiplier.0.push(multiplier);
        self.backoff_jitter.0.push(jitter);
        self.pool.0.push(pool);
        self.account_id.0.push(account);
        self.trace_parent.0.push(t.trace_parent.as_deref());
        self.schedule_id.0.push(schedule_id);
        self.fire_time.0.push(fire_time);
        self.campaign_id.0.push(campaign_id);
        self.audience_id.0.push(audience_id);
        let w = t.send_window.as_ref();
        self.window_start.0.push(w.map(|w| w.start));
        self.window_end.0.push(w.map(|w| w.end));
        self.window_zone.0.push(w.map(|w| w.zone.as_str()));
        self.window_spread_ms.0.push(w.map(|w| w.spread_ms));
        self.window_closed_fallback.0.push(
            t.window_closed_fallback
                .as_ref()
                .map(|f| prost::Message::encode_to_vec(&crate::tasks::model::fallback_content(f))),
        );
        self.given_run_at.0.push(given_run_at);
        self.delay_ms.0.push(delay_ms);
        self.retry_delays.0.push(delays);
        self.parked.0.push(parked);
    }

    /// The records of the inserted tasks, from the rows the insert returned
    /// ([`CREATED_COLUMNS`]) and what was sent: the answer to a create is built without
    /// reading back or decoding what the create path already holds (docs/performance.md, S2).
    /// Reads back as [`TaskRecord::from_row`] would (`tasks_api`'s round trip checks it).
    pub fn into_records(mut self, rows: &[Row]) -> Result<Vec<TaskRecord>, StoreError> {
        let at: HashMap<Uuid, usize> = self.id.iter().enumerate().map(|(i, id)| (*id, i)).collect();
        rows.iter()
            .map(|r| {
                let mut c = Columns::new(r);
                let id: Uuid = c.get("id")?;
                let i = *at.get(&id).ok_or_else(|| {
                    StoreError::Corrupt(format!(
                        "the insert returned task {id}, not one it was given"
                    ))
                })?;
                let t = self.tasks[i];
                let state = parse_state(c.get("state")?)?;
                let run_at = c.get("run_at")?;
                let cancel: Option<i16> = c.get("cancel_outcome")?;
                let last_error = c.get("last_error")?;
                let created_at = c.get("created_at")?;
                let updated_at = c.get("updated_at")?;
                let finished_at = c.get("finished_at")?;
                let end_reason = parse_end_reason(c.get("end_reason")?)?;
                let delays = match &t.retry {
                    RetryPolicy::Delays(delays) => delays.clone(),
                    RetryPolicy::Exponential { .. } => Vec::new(),
                };
                let retry = stored_retry(
                    delays,
                    self.backoff_initial_ms.0[i],
                    self.backoff_max_ms.0[i],
                    self.backoff_multiplier.0[i],
                    self.backoff_jitter.0[i],
                );
                Ok(TaskRecord {
                    id,
                    queue: t.queue.clone(),
                    recipient: t.recipient.clone(),
                    content: std::mem::take(&mut self.content.0[i]),
                    labels: t.labels.clone(),
                    state,
                    priority: t.priority,
                    run_at,
                    // The column keeps microseconds.
                    expire_at: t.expire_at.map(|at| at.trunc_subsecs(6)),
                    idempotency_key: t.idempotency.as_ref().map(|(key, _)| key.clone()),
                    lease_count: 0,
                    attempts: 0,
                    max_attempts: t.max_attempts,
                    retry,
                    executor_id: None,
                    leased_at: None,
                    lease_expires_at: None,
                    cancel_outcome: cancel.and_then(CancelOutcome::from_code),
                    last_error,
                    created_at,
                    updated_at,
                    finished_at,
                    pool: self.pool.0[i].map(str::to_owned),
                    account_id: self.account_id.0[i].map(str::to_owned),
                    send_window: SendWindow::from_columns(
                        self.window_start.0[i].map(|at| at.trunc_subsecs(6)),
                        self.window_end.0[i].map(|at| at.trunc_subsecs(6)),
                        self.window_zone.0[i].map(str::to_owned),
                        self.window_spread_ms.0[i],
                    ),
                    end_reason,
                    end_code: None,
                    trace_parent: t.trace_parent.clone(),
                    campaign_id: self.campaign_id.0[i],
                    schedule_id: self.schedule_id.0[i].map(str::to_owned),
                    audience_id: self.audience_id.0[i].map(str::to_owned),
                    parked: self.parked.0[i],
                    window_closed_fallback: self.window_closed_fallback.0[i].take(),
                    window_closed_fallback_at: None,
                    fallback_replaces: None,
                })
            })
            .collect()
    }

    /// The statement's parameters after the namespace, in [`INSERT_INPUTS`] order.
    pub fn params<'p>(&'p self, namespace: &'p &str) -> Vec<&'p (dyn ToSql + Sync)> {
        let params: [&'p (dyn ToSql + Sync); 31] = [
            namespace,
            &self.id,
            &self.queue,
            &self.recipient,
            &self.content,
            &self.template_id,
            &self.labels,
            &self.priority,
            &self.expire_at,
            &self.idempotency_key,
            &self.max_attempts,
            &self.backoff_initial_ms,
            &self.backoff_max_ms,
            &self.backoff_multiplier,
            &self.backoff_jitter,
            &self.pool,
            &self.account_id,
            &self.trace_parent,
            &self.schedule_id,
            &self.fire_time,
            &self.campaign_id,
            &self.audience_id,
            &self.window_start,
            &self.window_end,
            &self.window_zone,
            &self.window_spread_ms,
            &self.window_closed_fallback,
            &self.given_run_at,
            &self.delay_ms,
            &self.retry_delays,
            &self.parked,
        ];
        params.to_vec()
    }
}

/// Checks at compile time that [`InsertArrays::params`] covers every input plus the namespace.
const _: () = assert!(INSERT_INPUTS.len() + 1 == 31);

/// Reads a task state column written as text.
pub fn state(row: &Row, name: &str) -> Result<TaskState, StoreError> {
    parse_state(column(row, name)?)
}

fn parse_state(s: &str) -> Result<TaskState, StoreError> {
    TaskState::parse(s).ok_or_else(|| StoreError::Corrupt(format!("task state {s:?}")))
}

/// Reads a task's end reason column written as text (NULL while the task has not ended).
pub fn end_reason(row: &Row, name: &str) -> Result<Option<EndReason>, StoreError> {
    parse_end_reason(column(row, name)?)
}

fn parse_end_reason(s: Option<&str>) -> Result<Option<EndReason>, StoreError> {
    s.map(|s| EndReason::parse(s).ok_or_else(|| StoreError::Corrupt(format!("end reason {s:?}"))))
        .transpose()
}

/// Labels are written as a JSON object of strings; anything else reads as no labels.
pub fn labels(row: &Row, name: &str) -> Result<BTreeMap<String, String>, StoreError> {
    Ok(parse_labels(column(row, name)?))
}

fn parse_labels(value: serde_json::Value) -> BTreeMap<String, String> {
    serde_json::from_value(value).unwrap_or_default()
}

impl FromRow for TaskRecord {
    /// Reads in TASK_COLUMNS order (see [`Columns`]).
    fn from_row(r: &Row) -> Result<Self, StoreError> {
        let mut c = Columns::new(r);
        let id = c.get("id")?;
        let queue = c.get("queue")?;
        let recipient = c.get("recipient")?;
        let content = c.get("content")?;
        let labels = parse_labels(c.get("labels")?);
        let state = parse_state(c.get("state")?)?;
        let priority = c.get("priority")?;
        let run_at = c.get("run_at")?;
        let expire_at = c.get("expire_at")?;
        let idempotency_key = c.get("idempotency_key")?;
        let lease_count = c.get("lease_count")?;
        let attempts = c.get("attempts")?;
        let max_attempts = c.get("max_attempts")?;
        let retry = stored_retry(
            c.get("retry_delays_ms")?,
            c.get("backoff_initial_ms")?,
            c.get("backoff_max_ms")?,
            c.get("backoff_multiplier")?,
            c.get("backoff_jitter")?,
        );
        let executor_id = c.get("executor_id")?;
        let leased_at = c.get("leased_at")?;
        let lease_expires_at = c.get("lease_expires_at")?;
        let cancel: Option<i16> = c.get("cancel_outcome")?;
        Ok(TaskRecord {
            id,
            queue,
            recipient,
            content,
            labels,
            state,
            priority,
            run_at,
            expire_at,
            idempotency_key,
            lease_count,
            attempts,
            max_attempts,
            retry,
            executor_id,
            leased_at,
            lease_expires_at,
            cancel_outcome: cancel.and_then(CancelOutcome::from_code),
            last_error: c.get("last_error")?,
            created_at: c.get("created_at")?,
            updated_at: c.get("updated_at")?,
            finished_at: c.get("finished_at")?,
            pool: c.get("pool")?,
            account_id: c.get("account_id")?,
            send_window: SendWindow::from_columns(
                c.get("window_start")?,
                c.get("window_end")?,
                c.get("window_zone")?,
                c.get("window_spread_ms")?,
            ),
            end_reason: parse_end_reason(c.get("end_reason")?)?,
            end_code: c.get("end_code")?,
            trace_parent: c.get("trace_parent")?,
            campaign_id: c.get("campaign_id")?,
            schedule_id: c.get("schedule_id")?,
            audience_id: c.get("audience_id")?,
            parked: c.get::<&str>("route")?.starts_with("paused:"),
            window_closed_fallback: c.get("window_closed_fallback")?,
            window_closed_fallback_at: c.get("window_closed_fallback_at")?,
            fallback_replaces: c.get("fallback_replaces")?,
        })
    }
}

impl FromRow for GrantedLease {
    /// Reads in LEASE_COLUMNS order, then the statements' account_id and credentials_ref (see
    /// [`Columns`]).
    fn from_row(r: &Row) -> Result<Self, StoreError> {
        let mut c = Columns::new(r);
        let task_id = c.get("task_id")?;
        let attempt = c.get("attempt")?;
        let queue = c.get("queue")?;
        let recipient = c.get("recipient")?;
        let content = c.get("content")?;
        let window_closed_fallback = c.get("window_closed_fallback")?;
        let idempotency_key = c.get("idempotency_key")?;
        let run_at = c.get("run_at")?;
        let priority = c.get("priority")?;
        let leased_at = c.get("leased_at")?;
        let expires_at = c.get("expires_at")?;
        let attempts_before = c.get("attempts_before")?;
        let max_attempts = c.get("max_attempts")?;
        let labels = parse_labels(c.get("labels")?);
        let trace_parent = c.get("trace_parent")?;
        let send_after = std::time::Duration::from_millis(
            u64::try_from(c.get::<i64>("send_after_ms")?).unwrap_or(0),
        );
        Ok(GrantedLease {
            task_id,
            attempt,
            queue,
            recipient,
            content,
            idempotency_key,
            run_at,
            priority,
            leased_at,
            expires_at,
            attempts_before,
            max_attempts,
            labels,
            account_id: c.get("account_id")?,
            credentials_ref: c.get("credentials_ref")?,
            trace_parent,
            send_after,
            window_closed_fallback,
        })
    }
}

/// `sql` with its `{task_columns}`, `{created_columns}` and `{lease_columns}` placeholders
/// filled in.
pub fn with_columns(sql: &str) -> String {
    sql.replace("{task_columns}", TASK_COLUMNS)
        .replace("{created_columns}", CREATED_COLUMNS)
        .replace("{lease_columns}", LEASE_COLUMNS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How `INSERT_INPUTS` says an input travels and the type `InsertArrays` sends it as must
    /// agree: a uniform input sent per task would be read as NULL after the first task, and a
    /// per-task input sent once would give every task the first task's value.
    #[test]
    fn every_input_is_sent_the_way_the_statement_reads_it() {
        let arrays = InsertArrays::default();
        let params = arrays.params(&"default");
        assert_eq!(params.len(), INSERT_INPUTS.len() + 1);
        for ((name, _, sent), param) in INSERT_INPUTS.iter().zip(&params[1..]) {
            let sent_once = format!("{param:?}").starts_with("Uniform(");
            assert_eq!(
                sent_once,
                *sent == Sent::Uniform,
                "{name}: declared {sent:?}, sent as {param:?}"
            );
        }
    }
}
