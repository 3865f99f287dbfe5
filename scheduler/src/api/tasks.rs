//! TaskService: create, read, list, cancel and re-drive tasks.

use std::time::Duration;

use base64::Engine;
use chrono::Utc;
use herald_proto::v1::{self as pb, task_service_server::TaskService};
use tokio::sync::broadcast;
use tonic::{Request, Response, Status};
use tracing::Instrument as _;
use uuid::Uuid;

use super::convert;
use super::validate::{self, Violations};
use crate::auth::namespace_of;
use crate::error::{Error, FieldViolation};
use crate::lease::events::Event;
use crate::model::{CancelOutcome, TaskRecord};
use crate::store::tasks::{CancelResult, CreateError, Created, TaskFilter};
use crate::store::Store;
use crate::template::Renderer;

/// The TaskService implementation.
pub struct TaskApi {
    store: Store,
    events: broadcast::Sender<Event>,
    cancel_wait: Duration,
}

impl TaskApi {
    /// `cancel_wait` bounds how long CancelTask waits for the executor holding a lease to say
    /// whether it stopped before sending.
    pub fn new(store: Store, events: broadcast::Sender<Event>, cancel_wait: Duration) -> Self {
        TaskApi {
            store,
            events,
            cancel_wait,
        }
    }

    async fn create(
        &self,
        ns: &str,
        specs: &[pb::TaskSpec],
        path: impl Fn(usize) -> String,
        trace_parent: Option<String>,
    ) -> Result<Vec<pb::CreateTaskResponse>, Error> {
        let now = Utc::now();
        let mut violations = Violations::default();
        let mut tasks: Vec<_> = specs
            .iter()
            .enumerate()
            .filter_map(|(i, s)| validate::task_spec(s, &path(i), ns, now, &mut violations))
            .collect();
        if !violations.is_empty() {
            return Err(Error::InvalidArgument(violations.0));
        }
        for t in &mut tasks {
            t.trace_parent.clone_from(&trace_parent);
        }
        let tasks = self.render(ns, specs, tasks, &path).await?;
        self.check_targets(ns, &tasks, &path).await?;
        let created = match self.store.create_tasks(ns, &tasks).await {
            Ok(c) => c,
            Err(CreateError::KeyConflict { index }) => {
                return Err(Error::AlreadyExists(format!(
                    "{}.idempotency_key: already used for a different request",
                    path(index)
                )))
            }
            Err(CreateError::Store(e)) => return Err(e.into()),
        };
        let ids: Vec<Uuid> = created.iter().map(Created::id).collect();
        let records = self.store.get_tasks(ns, &ids).await?;
        let by_id: std::collections::HashMap<Uuid, &TaskRecord> =
            records.iter().map(|r| (r.id, r)).collect();
        created
            .iter()
            .zip(specs)
            .map(|(c, spec)| {
                let task = match by_id.get(&c.id()) {
                    Some(record) => convert::task(record)?,
                    // The original task was pruned but its key is still remembered: answer
                    // with what the request described, so the caller still gets the id.
                    None => pb::Task {
                        id: c.id().to_string(),
                        queue: spec.queue.clone(),
                        recipient: spec.recipient.clone(),
                        content: spec.content.clone(),
                        idempotency_key: spec.idempotency_key.clone(),
                        labels: spec.labels.clone(),
                        ..Default::default()
                    },
                };
                Ok(pb::CreateTaskResponse {
                    task: Some(task),
                    existing: matches!(c, Created::Existing(_)),
                })
            })
            .collect::<Result<_, crate::store::StoreError>>()
            .map_err(Error::from)
    }

    /// Renders stored templates into each task's content, so the task holds exactly what will
    /// be sent. Specs and tasks are in the same order (validation succeeded for all).
    async fn render(
        &self,
        ns: &str,
        specs: &[pb::TaskSpec],
        mut tasks: Vec<crate::model::NewTask>,
        path: &impl Fn(usize) -> String,
    ) -> Result<Vec<crate::model::NewTask>, Error> {
        use prost::Message;
        let contents: Vec<&pb::Content> = specs.iter().filter_map(|s| s.content.as_ref()).collect();
        let ids = Renderer::template_ids(contents.iter().copied());
        if ids.is_empty() {
            return Ok(tasks);
        }
        let renderer = Renderer::load(&self.store, ns, ids).await?;
        let mut v = Violations::default();
        for (i, (spec, task)) in specs.iter().zip(tasks.iter_mut()).enumerate() {
            if let Some(content) = &spec.content {
                if let Some(rendered) =
                    renderer.render(content, &format!("{}.content", path(i)), &mut v)
                {
                    task.content = rendered.encode_to_vec();
                }
            }
        }
        if v.is_empty() {
            Ok(tasks)
        } else {
            Err(Error::InvalidArgument(v.0))
        }
    }

    /// Creates one task, as CreateTask does (used by test sends too).
    pub async fn create_one(
        &self,
        ns: &str,
        spec: pb::TaskSpec,
    ) -> Result<pb::CreateTaskResponse, Error> {
        let mut results = self
            .create(
                ns,
                std::slice::from_ref(&spec),
                |_| "task".to_string(),
                None,
            )
            .await?;
        results
            .pop()
            .ok_or_else(|| Error::FailedPrecondition("no result for the created task".into()))
    }

    /// A task may only target a pool or account that exists: otherwise it would wait forever.
    async fn check_targets(
        &self,
        ns: &str,
        tasks: &[crate::model::NewTask],
        path: &impl Fn(usize) -> String,
    ) -> Result<(), Error> {
        use crate::model::Target;
        let pools: Vec<&str> = tasks
            .iter()
            .filter_map(|t| match &t.target {
                Target::Pool(p) => Some(p.as_str()),
                _ => None,
            })
            .collect();
        let accounts: Vec<&str> = tasks
            .iter()
            .filter_map(|t| match &t.target {
                Target::Account(a) => Some(a.as_str()),
                _ => None,
            })
            .collect();
        if pools.is_empty() && accounts.is_empty() {
            return Ok(());
        }
        let (found_pools, found_accounts) =
            self.store.existing_targets(ns, &pools, &accounts).await?;
        let mut v = Violations::default();
        for (i, t) in tasks.iter().enumerate() {
            match &t.target {
                Target::Pool(p) if !found_pools.contains(p) => v.add(
                    format!("{}.pool", path(i)),
                    format!("pool {p} does not exist"),
                ),
                Target::Account(a) if !found_accounts.contains(a) => v.add(
                    format!("{}.account_id", path(i)),
                    format!("account {a} does not exist"),
                ),
                _ => {}
            }
        }
        if v.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidArgument(v.0))
        }
    }

    async fn load(&self, ns: &str, id: Uuid) -> Result<TaskRecord, Error> {
        self.store
            .get_task(ns, id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("task {id}")))
    }
}

fn invalid(v: FieldViolation) -> Error {
    Error::InvalidArgument(vec![v])
}

#[tonic::async_trait]
impl TaskService for TaskApi {
    async fn create_task(
        &self,
        request: Request<pb::CreateTaskRequest>,
    ) -> Result<Response<pb::CreateTaskResponse>, Status> {
        let ns = namespace_of(&request)?;
        // Fields only, never the request: it holds recipients and content.
        let span = tracing::info_span!("CreateTask", task_id = tracing::field::Empty);
        let trace_parent = crate::telemetry::adopt_remote_parent(&span, request.metadata());
        let req = request.into_inner();
        let Some(spec) = req.task else {
            return Err(invalid(FieldViolation {
                field: "task".into(),
                description: "is required".into(),
            })
            .into());
        };
        let mut results = self
            .create(
                &ns,
                std::slice::from_ref(&spec),
                |_| "task".to_string(),
                trace_parent,
            )
            .instrument(span.clone())
            .await?;
        if let Some(task) = results.last().and_then(|r| r.task.as_ref()) {
            span.record("task_id", task.id.as_str());
        }
        results
            .pop()
            .map(Response::new)
            .ok_or_else(|| Status::internal("no result for the created task"))
    }

    async fn create_tasks(
        &self,
        request: Request<pb::CreateTasksRequest>,
    ) -> Result<Response<pb::CreateTasksResponse>, Status> {
        let ns = namespace_of(&request)?;
        let span = tracing::info_span!("CreateTasks", tasks = tracing::field::Empty);
        let trace_parent = crate::telemetry::adopt_remote_parent(&span, request.metadata());
        let req = request.into_inner();
        if req.tasks.is_empty() || req.tasks.len() > validate::MAX_BATCH {
            return Err(invalid(FieldViolation {
                field: "tasks".into(),
                description: "must hold 1 to 1000 tasks".into(),
            })
            .into());
        }
        span.record("tasks", req.tasks.len());
        let results = self
            .create(&ns, &req.tasks, |i| format!("tasks[{i}]"), trace_parent)
            .instrument(span)
            .await?;
        Ok(Response::new(pb::CreateTasksResponse { results }))
    }

    async fn get_task(
        &self,
        request: Request<pb::GetTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        let ns = namespace_of(&request)?;
        let id = validate::task_id("id", &request.get_ref().id).map_err(invalid)?;
        let record = self.load(&ns, id).await?;
        Ok(Response::new(convert::task(&record).map_err(Error::from)?))
    }

    async fn list_tasks(
        &self,
        request: Request<pb::ListTasksRequest>,
    ) -> Result<Response<pb::ListTasksResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let mut v = Violations::default();
        let mut filter = TaskFilter::default();
        for (i, s) in req.states.iter().enumerate() {
            match convert::state_from_wire(*s) {
                Some(state) => filter.states.push(state),
                None => v.add(format!("states[{i}]"), "is not a task state"),
            }
        }
        if !req.queue.is_empty() {
            match validate::queue_name_problem(&req.queue) {
                Some(p) => v.add("queue", p),
                None => filter.queue = Some(req.queue.clone()),
            }
        }
        let mut time = |field: &str, ts: &Option<prost_types::Timestamp>| {
            ts.as_ref().and_then(|t| {
                let parsed = convert::from_timestamp(t);
                if parsed.is_none() {
                    v.add(field, "is not a valid timestamp");
                }
                parsed
            })
        };
        filter.created_after = time("created_after", &req.created_after);
        filter.created_before = time("created_before", &req.created_before);
        filter.run_after = time("run_after", &req.run_after);
        filter.run_before = time("run_before", &req.run_before);
        filter.limit = match req.page_size {
            0 => 100,
            n @ 1..=1000 => i64::from(n),
            _ => {
                v.add("page_size", "must be between 0 and 1000");
                0
            }
        };
        if !req.page_token.is_empty() {
            match decode_page_token(&req.page_token) {
                Some(id) => filter.before_id = Some(id),
                None => v.add("page_token", "is not a token returned by ListTasks"),
            }
        }
        if !v.is_empty() {
            return Err(Error::InvalidArgument(v.0).into());
        }
        let records = self
            .store
            .list_tasks(&ns, &filter)
            .await
            .map_err(Error::from)?;
        let next_page_token = match records.last() {
            Some(last) if records.len() as i64 == filter.limit => encode_page_token(last.id),
            _ => String::new(),
        };
        let tasks = records
            .iter()
            .map(convert::task)
            .collect::<Result<_, _>>()
            .map_err(Error::from)?;
        Ok(Response::new(pb::ListTasksResponse {
            tasks,
            next_page_token,
        }))
    }

    async fn cancel_task(
        &self,
        request: Request<pb::CancelTaskRequest>,
    ) -> Result<Response<pb::CancelTaskResponse>, Status> {
        let ns = namespace_of(&request)?;
        let id = validate::task_id("id", &request.get_ref().id).map_err(invalid)?;
        // Subscribe before cancelling, so the executor's answer cannot slip past us.
        let mut events = self.events.subscribe();
        let result = self.store.cancel_task(&ns, id).await.map_err(Error::from)?;
        match result {
            CancelResult::NotFound => return Err(Error::NotFound(format!("task {id}")).into()),
            CancelResult::AlreadyEnded(state) if state != crate::model::TaskState::Cancelled => {
                return Err(Error::FailedPrecondition(format!(
                    "task {id} already ended as {}",
                    state.as_str()
                ))
                .into())
            }
            CancelResult::CancelledLeased { attempt, .. } => {
                tracing::info!(task_id = %id, attempt, "cancelling a leased task");
                let deadline = tokio::time::sleep(self.cancel_wait);
                tokio::pin!(deadline);
                loop {
                    tokio::select! {
                        _ = &mut deadline => break,
                        event = events.recv() => match event {
                            Ok(Event::CancelResolved(task)) if task == id => break,
                            Ok(_) => {}
                            // Missed events: re-read the row below either way.
                            Err(_) => break,
                        },
                    }
                }
            }
            CancelResult::CancelledScheduled | CancelResult::AlreadyEnded(_) => {}
        }
        let record = self.load(&ns, id).await?;
        let outcome = record.cancel_outcome.unwrap_or(CancelOutcome::Unconfirmed);
        Ok(Response::new(pb::CancelTaskResponse {
            task: Some(convert::task(&record).map_err(Error::from)?),
            outcome: convert::cancel_outcome(outcome) as i32,
        }))
    }

    async fn retry_task(
        &self,
        request: Request<pb::RetryTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let id = validate::task_id("id", &req.id).map_err(invalid)?;
        let run_at = match &req.run_at {
            None => None,
            Some(ts) => Some(convert::from_timestamp(ts).ok_or_else(|| {
                invalid(FieldViolation {
                    field: "run_at".into(),
                    description: "is not a valid timestamp".into(),
                })
            })?),
        };
        let changed = self
            .store
            .retry_task(&ns, id, run_at)
            .await
            .map_err(Error::from)?;
        let record = self.load(&ns, id).await?;
        if !changed {
            return Err(Error::FailedPrecondition(format!(
                "task {id} is {}; only FAILED tasks can be retried",
                record.state.as_str()
            ))
            .into());
        }
        Ok(Response::new(convert::task(&record).map_err(Error::from)?))
    }

    async fn list_attempts(
        &self,
        request: Request<pb::ListAttemptsRequest>,
    ) -> Result<Response<pb::ListAttemptsResponse>, Status> {
        let ns = namespace_of(&request)?;
        let id = validate::task_id("task_id", &request.get_ref().task_id).map_err(invalid)?;
        self.load(&ns, id).await?;
        let attempts = self.store.list_attempts(id).await.map_err(Error::from)?;
        Ok(Response::new(pb::ListAttemptsResponse {
            attempts: attempts.iter().map(convert::attempt).collect(),
        }))
    }
}

fn encode_page_token(id: Uuid) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(id.as_bytes())
}

fn decode_page_token(token: &str) -> Option<Uuid> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()?;
    Uuid::from_slice(&bytes).ok()
}
