//! The template aggregate.

use tokio_postgres::Row;

use super::accounts::AccountWriteError;
use super::{Store, StoreError};
use crate::model::{TemplateKind, TemplateRecord};

const COLUMNS: &str = "id, description, kind, body, provider_name, provider_language, parameters, \
     variables, created_at, updated_at";

impl Store {
    /// Stores a new template.
    pub async fn create_template(
        &self,
        namespace: &str,
        t: &TemplateRecord,
    ) -> Result<TemplateRecord, AccountWriteError> {
        let conn = self.conn().await?;
        let (kind, body, name, language, parameters) = columns(&t.kind);
        let inserted = conn
            .query_one(
                &format!(
                    "INSERT INTO herald.templates (namespace, id, description, kind, body,
                         provider_name, provider_language, parameters, variables)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                     RETURNING {COLUMNS}"
                ),
                &[
                    &namespace,
                    &t.id,
                    &t.description,
                    &kind,
                    &body,
                    &name,
                    &language,
                    &parameters,
                    &t.variables,
                ],
            )
            .await
            .map_err(StoreError::query("creating a template"));
        match inserted {
            Ok(row) => Ok(from_row(&row)?),
            Err(e) if e.sql_state() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
                Err(AccountWriteError::AlreadyExists(format!(
                    "template {}",
                    t.id
                )))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Replaces a template's kind and description.
    pub async fn update_template(
        &self,
        namespace: &str,
        t: &TemplateRecord,
    ) -> Result<TemplateRecord, AccountWriteError> {
        let conn = self.conn().await?;
        let (kind, body, name, language, parameters) = columns(&t.kind);
        let row = conn
            .query_opt(
                &format!(
                    "UPDATE herald.templates SET description = $3, kind = $4, body = $5,
                         provider_name = $6, provider_language = $7, parameters = $8,
                         variables = $9, updated_at = now()
                     WHERE namespace = $1 AND id = $2
                     RETURNING {COLUMNS}"
                ),
                &[
                    &namespace,
                    &t.id,
                    &t.description,
                    &kind,
                    &body,
                    &name,
                    &language,
                    &parameters,
                    &t.variables,
                ],
            )
            .await
            .map_err(StoreError::query("updating a template"))?;
        match row {
            Some(row) => Ok(from_row(&row)?),
            None => Err(AccountWriteError::NotFound(format!("template {}", t.id))),
        }
    }

    /// Reads the templates among `ids` that exist.
    pub async fn get_templates(
        &self,
        namespace: &str,
        ids: &[&str],
    ) -> Result<Vec<TemplateRecord>, StoreError> {
        let conn = self.conn().await?;
        let stmt = conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM herald.templates WHERE namespace = $1 AND id = ANY($2)"
            ))
            .await
            .map_err(StoreError::query("preparing template read"))?;
        conn.query(&stmt, &[&namespace, &ids])
            .await
            .map_err(StoreError::query("reading templates"))?
            .iter()
            .map(from_row)
            .collect()
    }

    /// Every template, ordered by id.
    pub async fn list_templates(&self, namespace: &str) -> Result<Vec<TemplateRecord>, StoreError> {
        let conn = self.conn().await?;
        conn.query(
            &format!("SELECT {COLUMNS} FROM herald.templates WHERE namespace = $1 ORDER BY id"),
            &[&namespace],
        )
        .await
        .map_err(StoreError::query("listing templates"))?
        .iter()
        .map(from_row)
        .collect()
    }

    /// Deletes a template; false when it did not exist.
    pub async fn delete_template(&self, namespace: &str, id: &str) -> Result<bool, StoreError> {
        let conn = self.conn().await?;
        Ok(conn
            .execute(
                "DELETE FROM herald.templates WHERE namespace = $1 AND id = $2",
                &[&namespace, &id],
            )
            .await
            .map_err(StoreError::query("deleting a template"))?
            > 0)
    }
}

type Columns<'a> = (
    &'static str,
    Option<&'a str>,
    Option<&'a str>,
    Option<&'a str>,
    &'a [String],
);

fn columns(kind: &TemplateKind) -> Columns<'_> {
    match kind {
        TemplateKind::Text { body } => ("text", Some(body), None, None, &[]),
        TemplateKind::Provider {
            name,
            language,
            parameters,
        } => ("provider", None, Some(name), Some(language), parameters),
    }
}

fn from_row(r: &Row) -> Result<TemplateRecord, StoreError> {
    let kind: &str = r.get(2);
    let kind = match kind {
        "text" => TemplateKind::Text {
            body: r.get::<_, Option<String>>(3).unwrap_or_default(),
        },
        "provider" => TemplateKind::Provider {
            name: r.get::<_, Option<String>>(4).unwrap_or_default(),
            language: r.get::<_, Option<String>>(5).unwrap_or_default(),
            parameters: r.get(6),
        },
        other => return Err(StoreError::Corrupt(format!("template kind {other:?}"))),
    };
    Ok(TemplateRecord {
        id: r.get(0),
        description: r.get(1),
        kind,
        variables: r.get(7),
        created_at: r.get(8),
        updated_at: r.get(9),
    })
}
