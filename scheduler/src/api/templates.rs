//! TemplateService: stored templates, previews and test sends.

use chrono::Utc;
use herald_proto::v1::{self as pb, template_service_server::TemplateService};
use tonic::{Request, Response, Status};

use super::validate::{queue_name_problem, Violations};
use super::{convert, tasks::TaskApi};
use crate::auth::namespace_of;
use crate::error::{Error, FieldViolation};
use crate::model::{TemplateKind, TemplateRecord};
use crate::store::Store;
use crate::template::{variables_of, Renderer};

/// The TemplateService implementation.
pub struct TemplateApi {
    store: Store,
    tasks: std::sync::Arc<TaskApi>,
}

impl TemplateApi {
    /// Serves templates from `store`; test sends go through `tasks`, like any CreateTask.
    pub fn new(store: Store, tasks: std::sync::Arc<TaskApi>) -> Self {
        TemplateApi { store, tasks }
    }
}

fn invalid(field: &str, description: impl Into<String>) -> Error {
    Error::InvalidArgument(vec![FieldViolation {
        field: field.into(),
        description: description.into(),
    }])
}

/// Validates a wire template into a record (timestamps are the store's to set).
pub fn record(t: &pb::Template) -> Result<TemplateRecord, Error> {
    let mut v = Violations::default();
    if let Some(p) = queue_name_problem(&t.id) {
        v.add("template.id", p);
    }
    if t.description.chars().count() > 1024 {
        v.add("template.description", "must be at most 1024 characters");
    }
    let (kind, variables) = match &t.kind {
        None => {
            v.add("template", "set text or provider");
            (None, Vec::new())
        }
        Some(pb::template::Kind::Text(text)) => {
            if text.body.trim().is_empty() || text.body.len() > 64 * 1024 {
                v.add("template.text.body", "must be 1 byte to 64 KiB");
                (None, Vec::new())
            } else {
                match variables_of(&text.body) {
                    Ok(vars) => (
                        Some(TemplateKind::Text {
                            body: text.body.clone(),
                        }),
                        vars,
                    ),
                    Err(e) => {
                        v.add("template.text.body", e);
                        (None, Vec::new())
                    }
                }
            }
        }
        Some(pb::template::Kind::Provider(p)) => {
            if p.name.is_empty() || p.name.len() > 512 {
                v.add("template.provider.name", "must be 1 to 512 characters");
            }
            if p.language.len() > 35 {
                v.add(
                    "template.provider.language",
                    "must be at most 35 characters",
                );
            }
            if p.parameters.len() > 100 || p.parameters.iter().any(|n| n.is_empty()) {
                v.add(
                    "template.provider.parameters",
                    "must be at most 100 non-empty names",
                );
            }
            (
                Some(TemplateKind::Provider {
                    name: p.name.clone(),
                    language: p.language.clone(),
                    parameters: p.parameters.clone(),
                }),
                p.parameters.clone(),
            )
        }
    };
    match (kind, v.is_empty()) {
        (Some(kind), true) => Ok(TemplateRecord {
            id: t.id.clone(),
            description: t.description.clone(),
            kind,
            variables,
            created_at: Utc::now(),
            updated_at: Utc::now(),
        }),
        _ => Err(Error::InvalidArgument(v.0)),
    }
}

fn to_wire(r: &TemplateRecord) -> pb::Template {
    pb::Template {
        id: r.id.clone(),
        description: r.description.clone(),
        kind: Some(match &r.kind {
            TemplateKind::Text { body } => {
                pb::template::Kind::Text(pb::TextTemplate { body: body.clone() })
            }
            TemplateKind::Provider {
                name,
                language,
                parameters,
            } => pb::template::Kind::Provider(pb::ProviderTemplate {
                name: name.clone(),
                language: language.clone(),
                parameters: parameters.clone(),
            }),
        }),
        variables: r.variables.clone(),
        created_at: Some(convert::timestamp(r.created_at)),
        updated_at: Some(convert::timestamp(r.updated_at)),
    }
}

#[tonic::async_trait]
impl TemplateService for TemplateApi {
    async fn create_template(
        &self,
        request: Request<pb::CreateTemplateRequest>,
    ) -> Result<Response<pb::Template>, Status> {
        let ns = namespace_of(&request)?;
        let t = request
            .into_inner()
            .template
            .ok_or_else(|| invalid("template", "is required"))?;
        let r = record(&t)?;
        let stored = self
            .store
            .create_template(&ns, &r)
            .await
            .map_err(Error::from)?;
        Ok(Response::new(to_wire(&stored)))
    }

    async fn update_template(
        &self,
        request: Request<pb::UpdateTemplateRequest>,
    ) -> Result<Response<pb::Template>, Status> {
        let ns = namespace_of(&request)?;
        let t = request
            .into_inner()
            .template
            .ok_or_else(|| invalid("template", "is required"))?;
        let r = record(&t)?;
        let stored = self
            .store
            .update_template(&ns, &r)
            .await
            .map_err(Error::from)?;
        Ok(Response::new(to_wire(&stored)))
    }

    async fn get_template(
        &self,
        request: Request<pb::GetTemplateRequest>,
    ) -> Result<Response<pb::Template>, Status> {
        let ns = namespace_of(&request)?;
        let id = request.into_inner().id;
        if let Some(p) = queue_name_problem(&id) {
            return Err(invalid("id", p).into());
        }
        let found = self
            .store
            .get_templates(&ns, &[id.as_str()])
            .await
            .map_err(Error::from)?;
        let r = found
            .first()
            .ok_or_else(|| Error::NotFound(format!("template {id}")))?;
        Ok(Response::new(to_wire(r)))
    }

    async fn list_templates(
        &self,
        request: Request<pb::ListTemplatesRequest>,
    ) -> Result<Response<pb::ListTemplatesResponse>, Status> {
        let ns = namespace_of(&request)?;
        let all = self.store.list_templates(&ns).await.map_err(Error::from)?;
        Ok(Response::new(pb::ListTemplatesResponse {
            templates: all.iter().map(to_wire).collect(),
        }))
    }

    async fn delete_template(
        &self,
        request: Request<pb::DeleteTemplateRequest>,
    ) -> Result<Response<pb::DeleteTemplateResponse>, Status> {
        let ns = namespace_of(&request)?;
        let id = request.into_inner().id;
        if let Some(p) = queue_name_problem(&id) {
            return Err(invalid("id", p).into());
        }
        if !self
            .store
            .delete_template(&ns, &id)
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
            .ok_or_else(|| invalid("content", "is required"))?;
        let renderer = Renderer::load(&self.store, &ns, Renderer::template_ids([&content]))
            .await
            .map_err(Error::from)?;
        let mut v = Violations::default();
        match renderer.render(&content, "content", &mut v) {
            Some(rendered) if v.is_empty() => Ok(Response::new(pb::RenderContentResponse {
                content: Some(rendered),
            })),
            _ => Err(Error::InvalidArgument(v.0).into()),
        }
    }

    async fn send_test(
        &self,
        request: Request<pb::SendTestRequest>,
    ) -> Result<Response<pb::SendTestResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let mut spec = req.task.ok_or_else(|| invalid("task", "is required"))?;
        if req.test_recipient.trim().is_empty() {
            return Err(invalid("test_recipient", "is required").into());
        }
        // The real recipient is never used; the test goes out now, ahead of everything else.
        spec.recipient = req.test_recipient;
        spec.when = None;
        spec.idempotency_key.clear();
        spec.expire_at = None;
        spec.priority = Some(9);
        spec.max_attempts = Some(1);
        spec.labels.insert("herald.test".into(), "true".into());
        let created = self.tasks.create_one(&ns, spec).await?;
        Ok(Response::new(pb::SendTestResponse { task: created.task }))
    }
}
