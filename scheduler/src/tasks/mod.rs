//! The task domain: every task is created here (validate → render → check targets → insert,
//! in one transaction that also wakes the dispatchers), whether it comes from CreateTask(s), a
//! test send, a campaign or a schedule run; and cancelled here (with the wait for the executor
//! holding a lease to say whether it had sent), whether one task or a campaign's.

pub mod bulk;
pub mod duplicates;
pub mod edit;
pub mod model;
pub mod retry_policy;
pub mod selection;
pub mod send_window;
pub mod spec_checks;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use herald_proto::v1 as pb;
use herald_proto::SenderKind;
use tokio::sync::broadcast;
use uuid::Uuid;

use self::model::{
    AttemptRecord, CancelOutcome, NewTask, Origin, Target, TaskRecord, TaskSpec, TaskState,
};
use crate::clock::Clock;
use crate::error::{Error, Violations};
use crate::lease::events::Event;
use crate::store::tasks::{CancelResult, Created, InsertError, Inserted, TaskFilter};
use crate::store::transaction;
use crate::store::{Db, Store};
use crate::templates::Renderer;

/// Names the field path of the i-th spec of a request (`task`, `tasks[3]`).
pub type PathOf<'a> = &'a (dyn Fn(usize) -> String + Sync);

/// One created task: whether it is new, and the task as stored (None when an idempotency key
/// named a task that was pruned since; the caller answers from its request).
#[derive(Debug, Clone)]
pub struct CreatedTask {
    /// New or existing.
    pub created: Created,
    /// The task as stored.
    pub record: Option<TaskRecord>,
    /// The task as requested (checked and rendered); None for a retried request answered
    /// from its stored task without checking it again.
    pub requested: Option<NewTask>,
}

/// The task operations of a replica.
#[derive(Clone)]
pub struct Tasks {
    store: Store,
    events: broadcast::Sender<Event>,
    cancel_wait: Duration,
    clock: Clock,
    /// Wakes this replica's bulk worker when an operation starts here.
    bulk_wake: std::sync::Arc<tokio::sync::Notify>,
    /// The queues' duplicate content windows (HERALD_DUPLICATE_CONTENT_WINDOWS).
    duplicate_windows: duplicates::DuplicateWindows,
}

impl Tasks {
    /// `cancel_wait` bounds how long a cancel waits for the executor holding a lease to say
    /// whether it stopped before sending.
    pub fn new(
        store: Store,
        events: broadcast::Sender<Event>,
        cancel_wait: Duration,
        clock: Clock,
    ) -> Self {
        Tasks {
            store,
            events,
            cancel_wait,
            clock,
            bulk_wake: std::sync::Arc::default(),
            duplicate_windows: duplicates::DuplicateWindows::default(),
        }
    }

    /// These tasks with the queues' duplicate content windows `windows`.
    pub fn with_duplicate_windows(mut self, windows: duplicates::DuplicateWindows) -> Self {
        self.duplicate_windows = windows;
        self
    }

    /// The queues' duplicate content windows, which every creating path applies.
    pub fn duplicate_windows(&self) -> &duplicates::DuplicateWindows {
        &self.duplicate_windows
    }

    /// Herald's clock.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The database these tasks live in.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Creates a batch atomically: every spec is checked and rendered first, and either all
    /// are stored or none. `trace_parent` is the caller's span, carried to the lease.
    pub async fn create(
        &self,
        namespace: &str,
        specs: Vec<TaskSpec>,
        path: PathOf<'_>,
        trace_parent: Option<String>,
    ) -> Result<Vec<CreatedTask>, Error> {
        let now = self.clock.now();
        // Each key with its request's digest, for a refused request that was made before.
        let keys: Vec<(String, Vec<u8>)> = if specs.iter().all(|t| !t.idempotency_key.is_empty()) {
            specs
                .iter()
                .map(|t| (t.idempotency_key.clone(), t.request_hash.clone()))
                .collect()
        } else {
            Vec::new()
        };
        let mut specs = Some(specs);
        // Checked and rendered once: a retried transaction inserts the same tasks again.
        let mut prepared: Option<Vec<NewTask>> = None;
        // Idempotent when every task is keyed: a second run after a commit that did happen
        // finds each key bound to the same request and returns the stored task. Without keys
        // it would create the batch twice, so an unknown outcome goes back to the client.
        let keyed = specs
            .as_ref()
            .is_some_and(|s| s.iter().all(|t| !t.idempotency_key.is_empty()));
        let created = transaction!(self.store, Error, idempotent = keyed, |tx| {
            let tasks = match (prepared.take(), specs.take()) {
                (Some(tasks), _) => tasks,
                (None, Some(specs)) => {
                    let mut tasks = prepare(tx, namespace, specs, path, now).await?;
                    self.duplicate_windows.apply(&mut tasks);
                    for t in &mut tasks {
                        t.trace_parent.clone_from(&trace_parent);
                    }
                    tasks
                }
                (None, None) => {
                    return Err(Error::Unavailable(
                        "the create was interrupted; retry it".into(),
                    ))
                }
            };
            let created = insert(tx, namespace, &tasks, path).await;
            prepared = Some(tasks);
            created
        });
        let created = match created {
            Ok(created) => created,
            // Looked up only when the request is refused, so a create pays nothing for it.
            Err(refused) => {
                return match self.created_before(namespace, &keys).await {
                    Ok(Some(answered)) => Ok(answered),
                    _ => Err(refused),
                }
            }
        };
        let tasks = prepared.unwrap_or_default();
        let Inserted { created, inserted } = created;
        // The insert returned what it stored; only tasks a key resolved to are read.
        let existing: Vec<Uuid> = created
            .iter()
            .filter(|c| matches!(c, Created::Existing(_)))
            .map(Created::id)
            .collect();
        // Records stay where the insert put them and are found by index: moving them through a
        // map keyed by id copied every record (a few hundred bytes) at each of the map's growths,
        // which showed in the create path's profile.
        let mut records: Vec<Option<TaskRecord>> = inserted.into_iter().map(Some).collect();
        if !existing.is_empty() {
            let read = self
                .store
                .conn()
                .await?
                .tasks()
                .get_many(namespace, &existing)
                .await?;
            records.extend(read.into_iter().map(Some));
        }
        let at: HashMap<Uuid, usize> = records
            .iter()
            .enumerate()
            .filter_map(|(i, r)| Some((r.as_ref()?.id, i)))
            .collect();
        // A batch may name one task twice (the same key twice): the last answer takes the
        // record, earlier ones get a copy.
        let mut left: HashMap<Uuid, usize> = HashMap::with_capacity(created.len());
        for c in &created {
            *left.entry(c.id()).or_default() += 1;
        }
        Ok(created
            .into_iter()
            .zip(tasks)
            .map(|(created, task)| {
                let id = created.id();
                let remaining = left.entry(id).or_default();
                *remaining -= 1;
                let slot = at.get(&id).and_then(|&i| records.get_mut(i));
                let record = match slot {
                    Some(slot) if *remaining == 0 => slot.take(),
                    Some(slot) => slot.clone(),
                    None => None,
                };
                CreatedTask {
                    created,
                    record,
                    requested: Some(task),
                }
            })
            .collect())
    }

    /// The stored tasks of a refused request sent before, when every spec's key (`keys`, each
    /// with its request's digest; empty when a spec has none) is bound to that same spec and
    /// every task is still kept: the answer instead of the refusal. A retry must find what the first request created even when its specs
    /// would no longer pass (its due time is now more than a day past, its template changed,
    /// its account went): refused, the caller could not tell whether its task exists.
    async fn created_before(
        &self,
        namespace: &str,
        keys: &[(String, Vec<u8>)],
    ) -> Result<Option<Vec<CreatedTask>>, Error> {
        if keys.is_empty() {
            return Ok(None);
        }
        let conn = self.store.conn().await?;
        let names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
        let bound = conn.tasks().bound_keys(namespace, &names).await?;
        let mut ids = Vec::with_capacity(keys.len());
        for (key, request_hash) in keys {
            match bound.get(key) {
                Some((id, hash)) if hash == request_hash => ids.push(*id),
                // A key new or bound to another request: the usual path decides.
                _ => return Ok(None),
            }
        }
        let records: HashMap<Uuid, TaskRecord> = conn
            .tasks()
            .get_many(namespace, &ids)
            .await?
            .into_iter()
            .map(|r| (r.id, r))
            .collect();
        let mut answered = Vec::with_capacity(ids.len());
        for id in ids {
            let Some(record) = records.get(&id) else {
                return Ok(None);
            };
            answered.push(CreatedTask {
                created: Created::Existing(id),
                record: Some(record.clone()),
                requested: None,
            });
        }
        Ok(Some(answered))
    }

    /// Reads one task of the namespace.
    pub async fn get(&self, namespace: &str, id: Uuid) -> Result<TaskRecord, Error> {
        self.store
            .conn()
            .await?
            .tasks()
            .get(namespace, id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("task {id}")))
    }

    /// Reads tasks of the namespace by id; missing ids are skipped.
    pub async fn get_many(&self, namespace: &str, ids: &[Uuid]) -> Result<Vec<TaskRecord>, Error> {
        Ok(self
            .store
            .conn()
            .await?
            .tasks()
            .get_many(namespace, ids)
            .await?)
    }

    /// One page of tasks, newest first.
    pub async fn list(
        &self,
        namespace: &str,
        filter: &TaskFilter,
    ) -> Result<Vec<TaskRecord>, Error> {
        Ok(self
            .store
            .conn()
            .await?
            .tasks()
            .list(namespace, filter)
            .await?)
    }

    /// The deliveries of the tasks among `ids` that have one (docs/api.md, "Delivery").
    pub async fn deliveries(
        &self,
        namespace: &str,
        ids: &[Uuid],
    ) -> Result<HashMap<Uuid, crate::callbacks::Delivery>, Error> {
        Ok(self
            .store
            .conn()
            .await?
            .deliveries()
            .of_tasks(namespace, ids)
            .await?)
    }

    /// The deliveries of the messages that window-closed fallbacks replaced, for the tasks
    /// among `ids` that have one (docs/api.md, "The window-closed fallback").
    pub async fn replaced_deliveries(
        &self,
        namespace: &str,
        ids: &[Uuid],
    ) -> Result<HashMap<Uuid, crate::callbacks::Delivery>, Error> {
        Ok(self
            .store
            .conn()
            .await?
            .deliveries()
            .replaced_of_tasks(namespace, ids)
            .await?)
    }

    /// Every attempt of a task, oldest first.
    pub async fn attempts(&self, namespace: &str, id: Uuid) -> Result<Vec<AttemptRecord>, Error> {
        let conn = self.store.conn().await?;
        if conn.tasks().get(namespace, id).await?.is_none() {
            return Err(Error::NotFound(format!("task {id}")));
        }
        Ok(conn.tasks().attempts(namespace, id).await?)
    }

    /// Cancels a task. A leased one is revoked from its executor, and the answer says whether
    /// it stopped before sending, once the executor said so or `cancel_wait` passed.
    pub async fn cancel(
        &self,
        namespace: &str,
        id: Uuid,
    ) -> Result<(TaskRecord, CancelOutcome), Error> {
        // Subscribe before cancelling, so the executor's answer cannot slip past us.
        let events = self.events.subscribe();
        let result = transaction!(self.store, Error, |tx| tx
            .tasks()
            .cancel(namespace, id)
            .await)?;
        match result {
            CancelResult::NotFound => return Err(Error::NotFound(format!("task {id}"))),
            CancelResult::AlreadyEnded(state) if state != TaskState::Cancelled => {
                return Err(Error::FailedPrecondition(format!(
                    "task {id} already ended as {}",
                    state.as_str()
                )))
            }
            CancelResult::CancelledLeased { attempt, .. } => {
                tracing::info!(task_id = %id, attempt, "cancelling a leased task");
                self.wait_for_revokes(events, HashSet::from([id])).await;
            }
            CancelResult::CancelledScheduled | CancelResult::AlreadyEnded(_) => {}
        }
        let record = self.get(namespace, id).await?;
        let outcome = record.cancel_outcome.unwrap_or(CancelOutcome::Unconfirmed);
        Ok((record, outcome))
    }

    /// Cancels tasks a campaign cancel left leased, revoking each from its executor, and waits
    /// (at most `cancel_wait`) for the executors' answers. Returns how many were revoked and
    /// how many turned out to be scheduled by then.
    pub async fn cancel_leased(
        &self,
        namespace: &str,
        ids: &[Uuid],
    ) -> Result<(usize, usize), Error> {
        let events = self.events.subscribe();
        let mut waiting = HashSet::new();
        let mut scheduled = 0;
        for id in ids {
            let result = transaction!(self.store, Error, |tx| tx
                .tasks()
                .cancel(namespace, *id)
                .await)?;
            match result {
                CancelResult::CancelledLeased { .. } => {
                    waiting.insert(*id);
                }
                CancelResult::CancelledScheduled => scheduled += 1,
                _ => {}
            }
        }
        let revoked = waiting.len();
        self.wait_for_revokes(events, waiting).await;
        Ok((revoked, scheduled))
    }

    /// Waits until every task of `waiting` learned its cancel outcome (on any replica), or
    /// `cancel_wait` passed.
    async fn wait_for_revokes(
        &self,
        mut events: broadcast::Receiver<Event>,
        mut waiting: HashSet<Uuid>,
    ) {
        let deadline = tokio::time::sleep(self.cancel_wait);
        tokio::pin!(deadline);
        while !waiting.is_empty() {
            tokio::select! {
                _ = &mut deadline => break,
                event = events.recv() => match event {
                    Ok(Event::CancelResolved(task)) => { waiting.remove(&task); }
                    Ok(_) => {}
                    // Missed events: the caller re-reads the rows either way.
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => break,
                },
            }
        }
    }

    /// Re-drives a FAILED task with a fresh attempt budget, due at `run_at` (None: now).
    pub async fn retry(
        &self,
        namespace: &str,
        id: Uuid,
        run_at: Option<DateTime<Utc>>,
    ) -> Result<TaskRecord, Error> {
        // The bounds of a create's and a bulk reschedule's due time: a due time in 1970 also
        // counted decades of lateness into herald_trigger_lag_seconds.
        let now = self.clock().now();
        if run_at.is_some_and(|at| at < now - model::MAX_PAST || at > now + model::MAX_AHEAD) {
            return Err(Error::invalid(
                "run_at",
                "must be within 24 hours in the past and 366 days ahead",
            ));
        }
        transaction!(self.store, Error, |tx| {
            if tx.tasks().retry(namespace, id, run_at).await? {
                return Ok(());
            }
            // Refused: the error rolls the transaction back, so a finished task the retry
            // brought back from the history (to find it where the update looks) goes back
            // there untouched, and another namespace's task is not moved at all.
            let task = tx
                .tasks()
                .get(namespace, id)
                .await?
                .ok_or_else(|| Error::NotFound(format!("task {id}")))?;
            if task.state == TaskState::Failed {
                // Failed, yet not retried: its campaign was cancelled (retry_task.sql).
                return Err(Error::FailedPrecondition(format!(
                    "task {id} belongs to campaign {} which was cancelled; nothing of it is sent any more",
                    task.campaign_id.map(|c| c.to_string()).unwrap_or_default()
                )));
            }
            Err(Error::FailedPrecondition(format!(
                "task {id} is {}; only FAILED tasks can be retried",
                task.state.as_str()
            )))
        })?;
        self.get(namespace, id).await
    }
}

/// Checks every spec, renders stored templates into each one's content (so the task holds
/// exactly what will be sent) and checks that targeted pools and accounts exist: a task for a
/// pool that does not exist would wait forever. Violations name every bad field; nothing is
/// written. Runs on `db`, so a caller's transaction sees its own templates and accounts.
pub async fn prepare(
    db: &impl GenericClient,
    namespace: &str,
    specs: Vec<TaskSpec>,
    path: PathOf<'_>,
    now: DateTime<Utc>,
) -> Result<Vec<NewTask>, Error> {
    let mut v = Violations::default();
    let tasks: Vec<NewTask> = specs
        .into_iter()
        .enumerate()
        .filter_map(|(i, s)| v.under(|| path(i), |v| s.into_task(now, v)))
        .collect();
    let tasks = v.into_result(tasks)?;
    let mut tasks = render(db, namespace, tasks, path).await?;
    check_targets(db, namespace, &mut tasks, path, now).await?;
    Ok(tasks)
}

/// [`prepare`] for the tasks of a run or a page of contacts, where one recipient's task that
/// no longer checks or renders (a template that now needs a variable the recipient lacks) must
/// not hold up the others: the tasks that prepare, and what is wrong with each one left out.
pub async fn prepare_leaving_out(
    db: &impl GenericClient,
    namespace: &str,
    specs: Vec<TaskSpec>,
    path: PathOf<'_>,
    now: DateTime<Utc>,
) -> Result<(Vec<NewTask>, Vec<String>), Error> {
    match prepare(db, namespace, specs.clone(), path, now).await {
        Ok(tasks) => return Ok((tasks, Vec::new())),
        Err(Error::InvalidArgument(_)) => {}
        Err(e) => return Err(e),
    }
    let mut kept = Vec::with_capacity(specs.len());
    let mut left_out = Vec::new();
    for (i, spec) in specs.into_iter().enumerate() {
        let this = move |_: usize| path(i);
        match prepare(db, namespace, vec![spec], &this, now).await {
            Ok(mut task) => kept.append(&mut task),
            Err(Error::InvalidArgument(problems)) => {
                left_out.push(crate::error::describe(&problems));
            }
            Err(e) => return Err(e),
        }
    }
    Ok((kept, left_out))
}

/// Inserts prepared tasks (with their origin) on `db`; an idempotency key bound to a different
/// request is ALREADY_EXISTS naming the field.
pub async fn insert(
    db: &impl GenericClient,
    namespace: &str,
    tasks: &[NewTask],
    path: PathOf<'_>,
) -> Result<Inserted, Error> {
    let mut inserted = db
        .tasks()
        .insert(namespace, tasks)
        .await
        .map_err(|e| match e {
            InsertError::KeyConflict { index } => Error::AlreadyExists(format!(
                "{}.idempotency_key: already used for a different request",
                path(index)
            )),
            InsertError::Store(e) => Error::Store(e),
        })?;
    // The duplicate content guard, for the new guarded tasks, in the same transaction.
    let fresh: Vec<&NewTask> = tasks
        .iter()
        .zip(&inserted.created)
        .filter(|(t, c)| matches!(c, Created::New(_)) && t.duplicate_window_ms.is_some())
        .map(|(t, _)| t)
        .collect();
    let ended = duplicates::guard(db, namespace, &fresh).await?;
    if !ended.is_empty() {
        // Answer with what is stored: the duplicates are CANCELLED.
        let now = db.tasks().get_many(namespace, &ended).await?;
        for record in now {
            if let Some(slot) = inserted.inserted.iter_mut().find(|r| r.id == record.id) {
                *slot = record;
            }
        }
    }
    Ok(inserted)
}

/// Marks tasks as made by `origin`, in the trace [`origin_trace`] starts for it.
pub fn with_origin(mut tasks: Vec<NewTask>, origin: &Origin) -> Vec<NewTask> {
    let trace_parent = origin_trace(origin);
    for t in &mut tasks {
        t.origin = origin.clone();
        if t.trace_parent.is_none() {
            t.trace_parent.clone_from(&trace_parent);
        }
    }
    tasks
}

/// The `traceparent` of a span standing for the schedule run or campaign page that makes tasks
/// no request made (a request's tasks carry their request's): their leases and sends join its
/// trace, one trace per run or page. None while spans are not exported.
pub fn origin_trace(origin: &Origin) -> Option<String> {
    let span = match origin {
        Origin::Request => return None,
        Origin::ScheduleRun {
            schedule_id,
            fire_time,
            audience_id,
        } => tracing::info_span!(
            "schedule.run",
            schedule_id = %schedule_id,
            fire_time = %fire_time,
            audience_id = audience_id.as_deref().unwrap_or(""),
        ),
        Origin::Campaign {
            campaign_id,
            audience_id,
            ..
        } => tracing::info_span!(
            "campaign.recipients",
            campaign_id = %campaign_id,
            audience_id = audience_id.as_deref().unwrap_or(""),
        ),
    };
    crate::telemetry::traceparent(&span)
}

/// Renders stored templates into the tasks' content; a task without a window-closed fallback
/// of its own takes its stored template's.
async fn render(
    db: &impl GenericClient,
    namespace: &str,
    mut tasks: Vec<NewTask>,
    path: PathOf<'_>,
) -> Result<Vec<NewTask>, Error> {
    let ids = Renderer::template_ids(tasks.iter().map(|t| &t.content));
    if ids.is_empty() {
        return Ok(tasks);
    }
    let renderer = Renderer::load(db, namespace, ids).await?;
    let mut v = Violations::default();
    for (i, task) in tasks.iter_mut().enumerate() {
        if task.window_closed_fallback.is_none() {
            task.window_closed_fallback = renderer.window_closed_fallback(&task.content);
            task.fallback_inherited = task.window_closed_fallback.is_some();
        }
        let rendered: Option<pb::Content> =
            v.under(|| path(i), |v| renderer.render(&task.content, "content", v));
        if let Some(rendered) = rendered {
            task.content = rendered;
        }
    }
    v.into_result(tasks)
}

/// Checks that targeted pools and accounts exist and that their channels can send each task's
/// content and window-closed fallback. A fallback inherited from a stored template is dropped,
/// not refused, where the target cannot send it: the caller did not ask for it.
async fn check_targets(
    db: &impl GenericClient,
    namespace: &str,
    tasks: &mut [NewTask],
    path: PathOf<'_>,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    // Owned: the checks below may drop an inherited fallback from a task.
    let pools: Vec<String> = tasks
        .iter()
        .filter_map(|t| match &t.target {
            Target::Pool(p) => Some(p.clone()),
            _ => None,
        })
        .collect();
    let accounts: Vec<String> = tasks
        .iter()
        .filter_map(|t| match &t.target {
            Target::Account(a) => Some(a.clone()),
            _ => None,
        })
        .collect();
    let pools: Vec<&str> = pools.iter().map(String::as_str).collect();
    let accounts: Vec<&str> = accounts.iter().map(String::as_str).collect();
    let mut v = Violations::default();
    // A task sent by queue goes through whatever sender the executor's config names for the
    // queue, which the scheduler cannot see: a fallback that only WhatsApp can send needs
    // accounts whose kind is known.
    for (i, t) in tasks.iter_mut().enumerate() {
        if t.window_closed_fallback.is_some() && t.target == Target::Queue {
            if t.fallback_inherited {
                t.window_closed_fallback = None;
                continue;
            }
            v.add(
                format!("{}.window_closed_fallback", path(i)),
                "needs a pool or account_id of WhatsApp Cloud accounts",
            );
        }
    }
    if pools.is_empty() && accounts.is_empty() {
        return v.into_result(());
    }
    let found = db
        .accounts()
        .existing_targets(namespace, &pools, &accounts)
        .await?;
    for (i, t) in tasks.iter_mut().enumerate() {
        let kinds = match &t.target {
            Target::Pool(p) => match found.pools.get(p) {
                Some(kinds) => kinds,
                None => {
                    v.add(
                        format!("{}.pool", path(i)),
                        format!("pool {p} does not exist"),
                    );
                    continue;
                }
            },
            Target::Account(a) => match found.accounts.get(a) {
                Some(kinds) => kinds,
                None => {
                    v.add(
                        format!("{}.account_id", path(i)),
                        format!("account {a} does not exist"),
                    );
                    continue;
                }
            },
            _ => continue,
        };
        // The content must suit every channel the task may go out through. A kind this build
        // does not know (stored by a newer one) is not checked.
        v.under(
            || path(i),
            |v| {
                let kinds: Vec<SenderKind> = kinds.iter().filter_map(|k| k.parse().ok()).collect();
                let problem = kinds
                    .iter()
                    .flat_map(|kind| herald_proto::content::check_for(&t.content, "content", *kind))
                    .next();
                if let Some(p) = problem {
                    v.add(p.field, p.description);
                } else if let Some((field, why)) = kinds
                    .iter()
                    .find_map(|kind| spec_checks::media_id_outlived(&t.content, *kind, &t.due, now))
                {
                    v.add(format!("content.{field}"), why);
                }
            },
        );
        // The fallback answers WhatsApp's own refusal: every account it may go out through
        // must be a WhatsApp Cloud number.
        if t.window_closed_fallback.is_some() {
            if let Some(other) = kinds
                .iter()
                .find(|k| k.as_str() != SenderKind::WhatsappCloud.as_str())
            {
                if t.fallback_inherited {
                    t.window_closed_fallback = None;
                    continue;
                }
                v.add(
                    format!("{}.window_closed_fallback", path(i)),
                    format!(
                        "only whatsapp_cloud accounts send a window-closed fallback; the target \
                         has a {other} account"
                    ),
                );
            }
        }
    }
    v.into_result(())
}
