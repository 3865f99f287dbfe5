//! TemplateService: stored message templates, previews and test sends.

use herald_proto::v1::{self as pb, template_service_server::TemplateService};
use tonic::{Request, Response, Status};
use tracing::Instrument as _;

use super::convert::templates as wire;
use crate::auth::namespace_of;
use crate::error::{Error, Violations};
use crate::rules;
use crate::store::{Db, WriteError};
use crate::tasks::Tasks;
use crate::templates::model::TemplateRecord;
use crate::templates::Renderer;

/// The TemplateService implementation.
pub struct TemplateApi {
    tasks: Tasks,
}

impl TemplateApi {
    /// Serves templates; test sends are created through `tasks`.
    pub fn new(tasks: Tasks) -> Self {
        TemplateApi { tasks }
    }

    /// Checks a CreateTemplate or UpdateTemplate request and stores it with `write`.
    async fn write(
        &self,
        request: Request<impl WithTemplate>,
        write: impl AsyncFnOnce(
            &deadpool_postgres::Object,
            &str,
            TemplateRecord,
        ) -> Result<TemplateRecord, WriteError>,
    ) -> Result<Response<pb::Template>, Status> {
        let ns = namespace_of(&request)?;
        let t = request
            .into_inner()
            .template()
            .ok_or_else(|| Error::invalid("template", "is required"))?;
        let mut v = Violations::default();
        let record = wire::template_spec(&t).validate("template", &mut v);
        let record = match record {
            Some(r) if v.is_empty() => r,
            _ => return Err(v.into_error().into()),
        };
        let conn = self.tasks.store().conn().await.map_err(Error::from)?;
        let stored = write(&conn, &ns, record).await.map_err(Error::from)?;
        Ok(Response::new(wire::template(&stored)))
    }
}

/// A request that carries a template.
trait WithTemplate {
    fn template(self) -> Option<pb::Template>;
}

impl WithTemplate for pb::CreateTemplateRequest {
    fn template(self) -> Option<pb::Template> {
        self.template
    }
}

impl WithTemplate for pb::UpdateTemplateRequest {
    fn template(self) -> Option<pb::Template> {
        self.template
    }
}

#[tonic::async_trait]
impl TemplateService for TemplateApi {
    async fn create_template(
        &self,
        request: Request<pb::CreateTemplateRequest>,
    ) -> Result<Response<pb::Template>, Status> {
        self.write(request, async |db, ns, t| {
            db.templates().create(ns, &t).await
        })
        .await
    }

    async fn update_template(
        &self,
        request: Request<pb::UpdateTemplateRequest>,
    ) -> Result<Response<pb::Template>, Status> {
        self.write(request, async |db, ns, t| {
            db.templates().update(ns, &t).await
        })
        .await
    }

    async fn get_template(
        &self,
        request: Request<pb::GetTemplateRequest>,
    ) -> Result<Response<pb::Template>, Status> {
        let ns = namespace_of(&request)?;
        let id = request.into_inner().id;
        rules::name("id", &id)?;
        let conn = self.tasks.store().conn().await.map_err(Error::from)?;
        let found = conn
            .templates()
            .get_many(&ns, &[id.as_str()])
            .await
            .map_err(Error::from)?;
        let r = found
            .first()
            .ok_or_else(|| Error::NotFound(format!("template {id}")))?;
        Ok(Response::new(wire::template(r)))
    }

    async fn list_templates(
        &self,
        request: Request<pb::ListTemplatesRequest>,
    ) -> Result<Response<pb::ListTemplatesResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let limit = rules::page_size("page_size", req.page_size, 100)?;
        let after = super::convert::page_after_name(&req.page_token, "ListTemplates")?;
        let conn = self.tasks.store().conn().await.map_err(Error::from)?;
        let rows = conn
            .templates()
            .list(&ns, after.as_deref(), limit + 1)
            .await
            .map_err(Error::from)?;
        // Templates of 64 KiB each: a page of a hundred would pass what clients accept.
        let page = super::paging::Page::new(rows, limit, |last| {
            super::convert::page_token(last.id.as_bytes())
        });
        let items = page.rows().iter().map(wire::template).collect();
        let (templates, next_page_token) = page.answer(items);
        Ok(Response::new(pb::ListTemplatesResponse {
            templates,
            next_page_token,
        }))
    }

    async fn delete_template(
        &self,
        request: Request<pb::DeleteTemplateRequest>,
    ) -> Result<Response<pb::DeleteTemplateResponse>, Status> {
        let ns = namespace_of(&request)?;
        let id = request.into_inner().id;
        rules::name("id", &id)?;
        let conn = self.tasks.store().conn().await.map_err(Error::from)?;
        let users = crate::templates::users::users(&conn, &ns, &id)
            .await
            .map_err(Error::from)?;
        if !users.is_empty() {
            return Err(Error::FailedPrecondition(format!(
                "template {id} is rendered by {}: change or delete them first (without it, \
                 their content would go out as a provider template named {id})",
                users.join(", ")
            ))
            .into());
        }
        if !conn
            .templates()
            .delete(&ns, &id)
            .await
            .map_err(Error::from)?
        {
            return Err(Error::NotFound(format!("template {id}")).into());
        }
        Ok(Response::new(pb::DeleteTemplateResponse {}))
    }

    async fn render_content(
        &self,
        request: Request<pb::RenderContentRequest>,
    ) -> Result<Response<pb::RenderContentResponse>, Status> {
        let ns = namespace_of(&request)?;
        let content = request
            .into_inner()
            .content
            .ok_or_else(|| Error::invalid("content", "is required"))?;
        let conn = self.tasks.store().conn().await.map_err(Error::from)?;
        let renderer = Renderer::load(&conn, &ns, Renderer::template_ids([&content]))
            .await
            .map_err(Error::from)?;
        let mut v = Violations::default();
        match renderer.render(&content, "content", &mut v) {
            Some(rendered) if v.is_empty() => Ok(Response::new(pb::RenderContentResponse {
                content: Some(rendered),
            })),
            _ => Err(v.into_error().into()),
        }
    }

    async fn send_test(
        &self,
        request: Request<pb::SendTestRequest>,
    ) -> Result<Response<pb::SendTestResponse>, Status> {
        let ns = namespace_of(&request)?;
        // The test's trace: the caller's, continued, as CreateTask's.
        let span = tracing::info_span!("SendTest");
        let trace_parent = crate::telemetry::adopt_remote_parent(&span, request.metadata());
        let req = request.into_inner();
        let mut spec = req
            .task
            .ok_or_else(|| Error::invalid("task", "is required"))?;
        if req.test_recipient.trim().is_empty() {
            return Err(Error::invalid("test_recipient", "is required").into());
        }
        // The real recipient is never used; the test goes out now, ahead of everything else.
        spec.recipient = req.test_recipient;
        // Every way a spec can say "later": a local time scheduled the test for that day (or
        // refused it when past), a send window held it, a duplicate window dropped a second
        // test of the same content.
        spec.when = None;
        spec.local_time.clear();
        spec.local_time_zone.clear();
        spec.send_window = None;
        spec.duplicate_window = None;
        spec.idempotency_key.clear();
        spec.expire_at = None;
        spec.priority = Some(9);
        spec.max_attempts = Some(1);
        let path = |_: usize| "task".to_string();
        let mut specs = super::tasks::specs_from_wire(vec![spec], &path)?;
        // herald's own label, set after the edge's check, which refuses it from a client.
        for spec in &mut specs {
            spec.labels.insert("herald.test".into(), "true".into());
        }
        let mut created = super::tasks::create_from(&self.tasks, &ns, specs, &path, trace_parent)
            .instrument(span)
            .await
            .map_err(|e| e.renamed("task.recipient", "test_recipient"))?;
        let created = created
            .pop()
            .ok_or_else(|| Status::internal("no result for the created task"))?;
        Ok(Response::new(pb::SendTestResponse { task: created.task }))
    }
}
