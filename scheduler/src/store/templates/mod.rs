//! The template repository.

use std::sync::LazyLock;

use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::sql::{column, statement, FromRow, Statement};
use super::{repository, StoreError, WriteError};
use herald_proto::v1 as pb;

use crate::templates::model::{Components, TemplateKind, TemplateRecord};

repository!(
    /// Stored message templates.
    TemplateRepo
);

/// What a template read selects; decoded by [`TemplateRecord::from_row`].
const TEMPLATE_COLUMNS: &str = "id, description, kind, body, provider_name, provider_language, \
     parameters, provider_components, variables, created_at, updated_at, \
     window_closed_fallback";

fn expand(name: &'static str, sql: &str) -> Statement {
    Statement::built(name, sql.replace("{template_columns}", TEMPLATE_COLUMNS))
}

static INSERT_TEMPLATE: LazyLock<Statement> =
    LazyLock::new(|| expand("insert_template", include_str!("insert_template.sql")));
static UPDATE_TEMPLATE: LazyLock<Statement> =
    LazyLock::new(|| expand("update_template", include_str!("update_template.sql")));
static GET_TEMPLATES: LazyLock<Statement> =
    LazyLock::new(|| expand("get_templates", include_str!("get_templates.sql")));
static LIST_TEMPLATES: LazyLock<Statement> =
    LazyLock::new(|| expand("list_templates", include_str!("list_templates.sql")));
const DELETE_TEMPLATE: Statement = statement!("delete_template");

/// A template as its columns: kind, body, provider name, provider language, parameters.
struct Columns<'a> {
    kind: &'static str,
    body: Option<&'a str>,
    name: Option<&'a str>,
    language: Option<&'a str>,
    parameters: &'a [String],
    /// A provider template's fixed components, encoded (none when it has none).
    components: Option<Vec<u8>>,
    /// The window-closed fallback, encoded (none when it has none).
    fallback: Option<Vec<u8>>,
}

impl<'a> Columns<'a> {
    fn of(t: &'a TemplateRecord) -> Self {
        let fallback = t
            .window_closed_fallback
            .as_ref()
            .map(prost::Message::encode_to_vec);
        let columns = match &t.kind {
            TemplateKind::Text { body } => Columns {
                kind: "text",
                body: Some(body),
                name: None,
                language: None,
                parameters: &[],
                components: None,
                fallback: None,
            },
            TemplateKind::Provider {
                name,
                language,
                parameters,
                components,
            } => Columns {
                kind: "provider",
                body: None,
                name: Some(name),
                language: Some(language),
                parameters,
                components: (!components.is_empty()).then(|| {
                    prost::Message::encode_to_vec(&pb::TemplateContent {
                        header: components.header.clone(),
                        buttons: components.buttons.clone(),
                        ..Default::default()
                    })
                }),
                fallback: None,
            },
        };
        Columns {
            fallback,
            ..columns
        }
    }

    /// The parameters of insert_template.sql and update_template.sql.
    fn params<'p>(
        &'p self,
        namespace: &'p &str,
        t: &'p TemplateRecord,
    ) -> [&'p (dyn ToSql + Sync); 11] {
        [
            namespace,
            &t.id,
            &t.description,
            &self.kind,
            &self.body,
            &self.name,
            &self.language,
            &self.parameters,
            &t.variables,
            &self.components,
            &self.fallback,
        ]
    }
}

impl FromRow for TemplateRecord {
    fn from_row(r: &Row) -> Result<Self, StoreError> {
        let kind: &str = column(r, "kind")?;
        let text = |name: &str| -> Result<String, StoreError> {
            Ok(column::<Option<String>>(r, name)?.unwrap_or_default())
        };
        let kind = match kind {
            "text" => TemplateKind::Text {
                body: text("body")?,
            },
            "provider" => {
                let encoded: Option<Vec<u8>> = column(r, "provider_components")?;
                let components = match encoded {
                    None => Components::default(),
                    Some(bytes) => {
                        let t: pb::TemplateContent = prost::Message::decode(bytes.as_slice())
                            .map_err(|e| {
                                StoreError::Corrupt(format!("template components: {e}"))
                            })?;
                        Components {
                            header: t.header,
                            buttons: t.buttons,
                        }
                    }
                };
                TemplateKind::Provider {
                    name: text("provider_name")?,
                    language: text("provider_language")?,
                    parameters: column(r, "parameters")?,
                    components: Box::new(components),
                }
            }
            other => return Err(StoreError::Corrupt(format!("template kind {other:?}"))),
        };
        let fallback: Option<Vec<u8>> = column(r, "window_closed_fallback")?;
        let window_closed_fallback = fallback
            .map(|bytes| {
                prost::Message::decode(bytes.as_slice()).map_err(|e| {
                    StoreError::Corrupt(format!("template window_closed_fallback: {e}"))
                })
            })
            .transpose()?;
        Ok(TemplateRecord {
            id: column(r, "id")?,
            description: column(r, "description")?,
            kind,
            variables: column(r, "variables")?,
            created_at: column(r, "created_at")?,
            updated_at: column(r, "updated_at")?,
            window_closed_fallback,
        })
    }
}

impl<C: GenericClient> TemplateRepo<'_, C> {
    /// Stores a new template.
    pub async fn create(
        &self,
        namespace: &str,
        t: &TemplateRecord,
    ) -> Result<TemplateRecord, WriteError> {
        let columns = Columns::of(t);
        INSERT_TEMPLATE
            .fetch_opt(self.db, &columns.params(&namespace, t))
            .await
            .map_err(|e| WriteError::from_insert(e, || format!("template {}", t.id)))?
            .ok_or_else(|| WriteError::NotFound(format!("template {}", t.id)))
    }

    /// Replaces a template's kind and description.
    pub async fn update(
        &self,
        namespace: &str,
        t: &TemplateRecord,
    ) -> Result<TemplateRecord, WriteError> {
        let columns = Columns::of(t);
        UPDATE_TEMPLATE
            .fetch_opt(self.db, &columns.params(&namespace, t))
            .await?
            .ok_or_else(|| WriteError::NotFound(format!("template {}", t.id)))
    }

    /// Reads the templates among `ids` that exist.
    pub async fn get_many(
        &self,
        namespace: &str,
        ids: &[&str],
    ) -> Result<Vec<TemplateRecord>, StoreError> {
        GET_TEMPLATES.fetch(self.db, &[&namespace, &ids]).await
    }

    /// Every template, ordered by id.
    pub async fn list(
        &self,
        namespace: &str,
        after: Option<&str>,
        limit: i64,
    ) -> Result<Vec<TemplateRecord>, StoreError> {
        LIST_TEMPLATES
            .fetch(self.db, &[&namespace, &after, &limit])
            .await
    }

    /// Deletes a template; false when it did not exist.
    pub async fn delete(&self, namespace: &str, id: &str) -> Result<bool, StoreError> {
        Ok(DELETE_TEMPLATE.execute(self.db, &[&namespace, &id]).await? > 0)
    }
}
