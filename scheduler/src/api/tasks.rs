//! TaskService: create, read, list, cancel and re-drive tasks.

use herald_proto::v1::{self as pb, task_service_server::TaskService};
use tonic::{Request, Response, Status};
use tracing::Instrument as _;
use uuid::Uuid;

use super::convert::{self, tasks as wire};
use super::paging::{self, Page};
use crate::auth::namespace_of;
use crate::error::{Error, Violations};
use crate::rules;
use crate::store::tasks::{Created, TaskFilter};
use crate::tasks::edit::{Edit, EditField};
use crate::tasks::model::TaskSpec;
use crate::tasks::model::MAX_BATCH;
use crate::tasks::selection::Selection;
use crate::tasks::{CreatedTask, Tasks};

/// The TaskService implementation.
pub struct TaskApi {
    tasks: Tasks,
}

impl TaskApi {
    /// Serves the task domain `tasks`.
    pub fn new(tasks: Tasks) -> Self {
        TaskApi { tasks }
    }
}

/// Creates tasks from wire specs through the task domain and answers each; `path` names the
/// i-th spec in violations.
pub async fn create(
    tasks: &Tasks,
    ns: &str,
    specs: Vec<pb::TaskSpec>,
    path: &(dyn Fn(usize) -> String + Sync),
    trace_parent: Option<String>,
) -> Result<Vec<pb::CreateTaskResponse>, Error> {
    let domain = specs_from_wire(specs, path)?;
    create_from(tasks, ns, domain, path, trace_parent).await
}

/// Wire specs as the domain's, or INVALID_ARGUMENT naming every bad field (`path` names the
/// i-th spec).
pub fn specs_from_wire(
    specs: Vec<pb::TaskSpec>,
    path: &(dyn Fn(usize) -> String + Sync),
) -> Result<Vec<TaskSpec>, Error> {
    let mut v = Violations::default();
    let domain: Vec<_> = specs
        .into_iter()
        .enumerate()
        .map(|(i, s)| v.under(|| path(i), |v| wire::task_spec(s, v)))
        .collect();
    v.into_result(domain)
}

/// Creates tasks from specs already converted (see [`specs_from_wire`]) and answers each.
pub async fn create_from(
    tasks: &Tasks,
    ns: &str,
    specs: Vec<TaskSpec>,
    path: &(dyn Fn(usize) -> String + Sync),
    trace_parent: Option<String>,
) -> Result<Vec<pb::CreateTaskResponse>, Error> {
    let created = tasks.create(ns, specs, path, trace_parent).await?;
    created.into_iter().map(response).collect()
}

/// The answer for one created task.
fn response(c: CreatedTask) -> Result<pb::CreateTaskResponse, Error> {
    let existing = matches!(c.created, Created::Existing(_));
    let id = c.created.id().to_string();
    let task = match (c.record, c.requested) {
        (Some(record), _) => wire::task(&record)?,
        // The original task was pruned but its key is still remembered: answer with what the
        // request described, so the caller still gets the id.
        (None, Some(asked)) => pb::Task {
            id,
            queue: asked.queue,
            recipient: asked.recipient,
            content: Some(asked.content),
            idempotency_key: asked.idempotency.map(|(key, _)| key).unwrap_or_default(),
            labels: asked.labels,
            ..Default::default()
        },
        // Never made (a retry answered from its stored tasks has every record): the id alone.
        (None, None) => pb::Task {
            id,
            ..Default::default()
        },
    };
    Ok(pb::CreateTaskResponse {
        task: Some(task),
        existing,
    })
}

fn task_id(field: &str, value: &str) -> Result<Uuid, Error> {
    rules::uuid(field, value, "task")
}

/// The filter of a ListTasks request: its `filter` message, or the older top-level fields
/// (the same filter spelled flat), not both.
fn filter(req: &pb::ListTasksRequest, binding: &[u8; 8]) -> Result<TaskFilter, Error> {
    let mut v = Violations::default();
    let flat = pb::TaskFilter {
        states: req.states.clone(),
        end_reasons: req.end_reasons.clone(),
        queue: req.queue.clone(),
        created_after: req.created_after,
        created_before: req.created_before,
        run_after: req.run_after,
        run_before: req.run_before,
        ..Default::default()
    };
    let selection = match &req.filter {
        Some(f) if flat != pb::TaskFilter::default() => {
            v.add(
                "filter",
                "set filter or the top-level filter fields, not both",
            );
            Selection::from_wire(f, "filter", &mut v)
        }
        Some(f) => Selection::from_wire(f, "filter", &mut v),
        None => Selection::from_wire(&flat, "", &mut v),
    };
    let mut filter = TaskFilter {
        selection,
        ..Default::default()
    };
    match rules::page_size("page_size", req.page_size, 100) {
        Ok(n) => filter.limit = n,
        Err(_) => v.add("page_size", "must be between 0 and 1000"),
    }
    if !req.page_token.is_empty() {
        match convert::bound_page_key(&req.page_token, 16, binding, "ListTasks") {
            Ok(key) => match Uuid::from_slice(&key) {
                Ok(id) => filter.before_id = Some(id),
                Err(_) => v.add("page_token", "is not a token returned by ListTasks"),
            },
            Err(problem) => v.add("page_token", problem),
        }
    }
    v.into_result(filter)
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
        let Some(spec) = request.into_inner().task else {
            return Err(Error::invalid("task", "is required").into());
        };
        let mut results = create(
            &self.tasks,
            &ns,
            vec![spec],
            &|_| "task".to_string(),
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
        if req.tasks.is_empty() || req.tasks.len() > MAX_BATCH {
            return Err(Error::invalid("tasks", "must hold 1 to 1000 tasks").into());
        }
        let basic = match pb::ResponseView::try_from(req.response_view) {
            Ok(view) => view == pb::ResponseView::Basic,
            Err(_) => {
                return Err(Error::invalid("response_view", "is not a ResponseView").into());
            }
        };
        span.record("tasks", req.tasks.len());
        let mut results = create(
            &self.tasks,
            &ns,
            req.tasks,
            &|i| format!("tasks[{i}]"),
            trace_parent,
        )
        .instrument(span)
        .await?;
        // The tasks are created by now, so an answer too large to read would leave the caller
        // without their ids: it comes back without the contents instead, and says so.
        let content_omitted = basic || paging::fitting(&results) < results.len();
        if content_omitted {
            for task in results.iter_mut().filter_map(|r| r.task.as_mut()) {
                task.content = None;
            }
        }
        Ok(Response::new(pb::CreateTasksResponse {
            results,
            content_omitted,
        }))
    }

    async fn get_task(
        &self,
        request: Request<pb::GetTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        let ns = namespace_of(&request)?;
        let id = task_id("id", &request.get_ref().id)?;
        let record = self.tasks.get(&ns, id).await?;
        let mut task = wire::task(&record).map_err(Error::from)?;
        task.delivery = self
            .tasks
            .deliveries(&ns, &[id])
            .await?
            .get(&id)
            .map(convert::callbacks::delivery);
        if record.fallback_replaces.is_some() {
            task.replaced_delivery = self
                .tasks
                .replaced_deliveries(&ns, &[id])
                .await?
                .get(&id)
                .map(convert::callbacks::delivery);
        }
        Ok(Response::new(task))
    }

    async fn list_tasks(
        &self,
        request: Request<pb::ListTasksRequest>,
    ) -> Result<Response<pb::ListTasksResponse>, Status> {
        let ns = namespace_of(&request)?;
        let binding = convert::selection_binding(
            &ns,
            &pb::ListTasksRequest {
                page_size: 0,
                page_token: String::new(),
                ..request.get_ref().clone()
            },
        );
        let filter = filter(request.get_ref(), &binding)?;
        let probe = TaskFilter {
            limit: filter.limit + 1,
            ..filter.clone()
        };
        let records = self.tasks.list(&ns, &probe).await?;
        let page = Page::new(records, filter.limit, |last| {
            convert::bound_page_token(last.id.as_bytes(), &binding)
        });
        let records = page.rows();
        let ids: Vec<Uuid> = records.iter().map(|r| r.id).collect();
        let deliveries = self.tasks.deliveries(&ns, &ids).await?;
        let replacing: Vec<Uuid> = records
            .iter()
            .filter(|r| r.fallback_replaces.is_some())
            .map(|r| r.id)
            .collect();
        let replaced = self.tasks.replaced_deliveries(&ns, &replacing).await?;
        let tasks: Vec<pb::Task> = records
            .iter()
            .map(|r| {
                let mut task = wire::task(r)?;
                task.delivery = deliveries.get(&r.id).map(convert::callbacks::delivery);
                task.replaced_delivery = replaced.get(&r.id).map(convert::callbacks::delivery);
                Ok(task)
            })
            .collect::<Result<_, crate::store::StoreError>>()
            .map_err(Error::from)?;
        let (tasks, next_page_token) = page.answer(tasks);
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
        let id = task_id("id", &request.get_ref().id)?;
        let (record, outcome) = self.tasks.cancel(&ns, id).await?;
        Ok(Response::new(pb::CancelTaskResponse {
            task: Some(wire::task(&record).map_err(Error::from)?),
            outcome: wire::cancel_outcome(outcome) as i32,
        }))
    }

    async fn retry_task(
        &self,
        request: Request<pb::RetryTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let id = task_id("id", &req.id)?;
        let run_at = match &req.run_at {
            None => None,
            Some(ts) => Some(
                convert::from_timestamp(ts)
                    .ok_or_else(|| Error::invalid("run_at", "is not a valid timestamp"))?,
            ),
        };
        let record = self.tasks.retry(&ns, id, run_at).await?;
        Ok(Response::new(wire::task(&record).map_err(Error::from)?))
    }

    async fn update_task(
        &self,
        request: Request<pb::UpdateTaskRequest>,
    ) -> Result<Response<pb::Task>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let id = task_id("id", &req.id)?;
        let mut v = Violations::default();
        let mut fields = Vec::new();
        for path in req.update_mask.map(|m| m.paths).unwrap_or_default() {
            match EditField::from_path(&path) {
                Some(f) if !fields.contains(&f) => fields.push(f),
                Some(_) => {}
                None => v.add("update_mask", format!("unknown or read-only path {path:?}")),
            }
        }
        let patch = v.under(
            || "task".into(),
            |v| wire::task_spec(req.task.unwrap_or_default(), v),
        );
        let edit = v.into_result(Edit { fields, patch })?;
        let record = self.tasks.update(&ns, id, edit).await?;
        Ok(Response::new(wire::task(&record).map_err(Error::from)?))
    }

    async fn start_bulk_operation(
        &self,
        request: Request<pb::StartBulkOperationRequest>,
    ) -> Result<Response<pb::StartBulkOperationResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let bulk = wire::bulk_request(req)?;
        let started = self.tasks.start_bulk(&ns, bulk).await?;
        Ok(Response::new(pb::StartBulkOperationResponse {
            matched: started.matched,
            operation: started
                .operation
                .as_ref()
                .map(wire::bulk_operation)
                .transpose()
                .map_err(Error::from)?,
        }))
    }

    async fn get_bulk_operation(
        &self,
        request: Request<pb::GetBulkOperationRequest>,
    ) -> Result<Response<pb::BulkOperation>, Status> {
        let ns = namespace_of(&request)?;
        let id = rules::uuid("id", &request.get_ref().id, "bulk operation")?;
        let op = self.tasks.bulk_operation(&ns, id).await?;
        Ok(Response::new(
            wire::bulk_operation(&op).map_err(Error::from)?,
        ))
    }

    async fn list_bulk_operations(
        &self,
        request: Request<pb::ListBulkOperationsRequest>,
    ) -> Result<Response<pb::ListBulkOperationsResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let limit = rules::page_size("page_size", req.page_size, 100)?;
        // The namespace is the whole selection.
        let binding = convert::selection_binding(&ns, &pb::ListBulkOperationsRequest::default());
        let before = if req.page_token.is_empty() {
            None
        } else {
            let key = convert::bound_page_key(&req.page_token, 16, &binding, "ListBulkOperations")
                .map_err(|problem| Error::invalid("page_token", problem))?;
            Some(Uuid::from_slice(&key).map_err(|_| {
                Error::invalid(
                    "page_token",
                    "is not a token returned by ListBulkOperations",
                )
            })?)
        };
        let ops = self.tasks.bulk_operations(&ns, before, limit + 1).await?;
        let (ops, next_page_token) = crate::store::sql::page(ops, limit, |last| {
            convert::bound_page_token(last.id.as_bytes(), &binding)
        });
        Ok(Response::new(pb::ListBulkOperationsResponse {
            operations: ops
                .iter()
                .map(wire::bulk_operation)
                .collect::<Result<_, _>>()
                .map_err(Error::from)?,
            next_page_token,
        }))
    }

    async fn list_attempts(
        &self,
        request: Request<pb::ListAttemptsRequest>,
    ) -> Result<Response<pb::ListAttemptsResponse>, Status> {
        let ns = namespace_of(&request)?;
        let id = task_id("task_id", &request.get_ref().task_id)?;
        let attempts = self.tasks.attempts(&ns, id).await?;
        Ok(Response::new(pb::ListAttemptsResponse {
            attempts: attempts.iter().map(wire::attempt).collect(),
        }))
    }
}
