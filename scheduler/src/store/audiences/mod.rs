//! The audience repository: audiences, their contacts (with the contact count kept in the
//! transaction of every write), and the fan-outs of schedule runs that target an audience.

use std::sync::LazyLock;

use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use super::sql::{column, statement, FromRow, Statement};
use super::{repository, StoreError};
use crate::audiences::model::{AudienceRecord, Channel, Contact};

repository!(
    /// Audiences and their contacts.
    AudienceRepo
);

/// What an audience read selects; decoded by [`AudienceRecord::from_row`].
const AUDIENCE_COLUMNS: &str = "id, channel, description, default_time_zone, date_attributes, \
     contact_count, created_at, updated_at";
/// What a contact read selects; decoded by [`Contact::from_row`].
const CONTACT_COLUMNS: &str =
    "recipient, name, time_zone, locale, tags, attributes, created_at, updated_at";

fn expand(name: &'static str, sql: &str) -> Statement {
    Statement::built(
        name,
        sql.replace("{audience_columns}", AUDIENCE_COLUMNS)
            .replace("{contact_columns}", CONTACT_COLUMNS),
    )
}

macro_rules! expanded {
    ($name:literal) => {
        LazyLock::new(|| expand($name, include_str!(concat!($name, ".sql"))))
    };
}

static INSERT_AUDIENCE: LazyLock<Statement> = expanded!("insert_audience");
static GET_AUDIENCE: LazyLock<Statement> = expanded!("get_audience");
static LOCK_AUDIENCE: LazyLock<Statement> = expanded!("lock_audience");
static LIST_AUDIENCES: LazyLock<Statement> = expanded!("list_audiences");
static INSERT_CONTACT: LazyLock<Statement> = expanded!("insert_contact");
static UPDATE_CONTACT: LazyLock<Statement> = expanded!("update_contact");
static GET_CONTACT: LazyLock<Statement> = expanded!("get_contact");
static LIST_CONTACTS: LazyLock<Statement> = expanded!("list_contacts");
const DELETE_AUDIENCE: Statement = statement!("delete_audience");
const DELETE_CONTACT: Statement = statement!("delete_contact");
const UPSERT_CONTACTS: Statement = statement!("upsert_contacts");
const ADD_TO_COUNT: Statement = statement!("add_to_count");

impl FromRow for AudienceRecord {
    fn from_row(r: &Row) -> Result<Self, StoreError> {
        let channel: String = column(r, "channel")?;
        Ok(AudienceRecord {
            id: column(r, "id")?,
            description: column(r, "description")?,
            channel: Channel::parse(&channel)
                .ok_or_else(|| StoreError::Corrupt(format!("audience channel {channel:?}")))?,
            default_time_zone: column(r, "default_time_zone")?,
            date_attributes: column(r, "date_attributes")?,
            contact_count: column(r, "contact_count")?,
            created_at: column(r, "created_at")?,
            updated_at: column(r, "updated_at")?,
        })
    }
}

impl FromRow for Contact {
    fn from_row(r: &Row) -> Result<Self, StoreError> {
        let attributes: serde_json::Value = column(r, "attributes")?;
        Ok(Contact {
            recipient: column(r, "recipient")?,
            name: column(r, "name")?,
            time_zone: column(r, "time_zone")?,
            locale: column(r, "locale")?,
            tags: column(r, "tags")?,
            attributes: serde_json::from_value(attributes)
                .map_err(|e| StoreError::Corrupt(format!("contact attributes: {e}")))?,
            created_at: Some(column(r, "created_at")?),
            updated_at: Some(column(r, "updated_at")?),
        })
    }
}

/// A contact's fields as `insert_contact.sql` and `update_contact.sql` both take them ($1 to $8,
/// in this order; `attributes` is [`attributes_json`] of the contact), so a new contact field
/// is bound in one place.
fn contact_params<'a>(
    namespace: &'a &str,
    audience_id: &'a &str,
    c: &'a Contact,
    attributes: &'a serde_json::Value,
) -> [&'a (dyn ToSql + Sync); 8] {
    [
        namespace,
        audience_id,
        &c.recipient,
        &c.name,
        &c.time_zone,
        &c.locale,
        &c.tags,
        attributes,
    ]
}

fn attributes_json(c: &Contact) -> serde_json::Value {
    serde_json::Value::Object(
        c.attributes
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect(),
    )
}

/// What a batch of upserts did.
#[derive(Debug, Clone, Copy, Default)]
pub struct Upserted {
    /// Contacts created.
    pub created: i64,
    /// Contacts that existed and were replaced.
    pub updated: i64,
    /// The audience's contact count after the batch.
    pub contact_count: i64,
}

/// A contact search: every filter must hold.
#[derive(Debug, Clone, Default)]
pub struct ContactFilter {
    /// Every one of these tags.
    pub tags: Vec<String>,
    /// Recipients starting with this (empty: any).
    pub recipient_prefix: String,
    /// Names containing this, ignoring case (empty: any).
    pub name_contains: String,
}

impl<C: GenericClient> AudienceRepo<'_, C> {
    /// Inserts an audience; None if the id is taken.
    pub async fn create(
        &self,
        namespace: &str,
        a: &AudienceRecord,
    ) -> Result<Option<AudienceRecord>, StoreError> {
        INSERT_AUDIENCE
            .fetch_opt(
                self.db,
                &[
                    &namespace,
                    &a.id,
                    &a.channel.as_str(),
                    &a.description,
                    &a.default_time_zone,
                    &a.date_attributes,
                ],
            )
            .await
    }

    /// Reads an audience.
    pub async fn get(
        &self,
        namespace: &str,
        id: &str,
    ) -> Result<Option<AudienceRecord>, StoreError> {
        GET_AUDIENCE.fetch_opt(self.db, &[&namespace, &id]).await
    }

    /// Reads an audience and locks it for a contact write (in a transaction).
    pub async fn lock(
        &self,
        namespace: &str,
        id: &str,
    ) -> Result<Option<AudienceRecord>, StoreError> {
        LOCK_AUDIENCE.fetch_opt(self.db, &[&namespace, &id]).await
    }

    /// Audiences with an id after `after`, by id.
    pub async fn list(
        &self,
        namespace: &str,
        after: &str,
        limit: i64,
    ) -> Result<Vec<AudienceRecord>, StoreError> {
        LIST_AUDIENCES
            .fetch(self.db, &[&namespace, &after, &limit])
            .await
    }

    /// Deletes an audience and its contacts; false if there was none.
    pub async fn delete(&self, namespace: &str, id: &str) -> Result<bool, StoreError> {
        Ok(DELETE_AUDIENCE.execute(self.db, &[&namespace, &id]).await? > 0)
    }

    /// Moves the audience's contact count by `delta`; returns the new count.
    async fn add_to_count(&self, namespace: &str, id: &str, delta: i64) -> Result<i64, StoreError> {
        let row = ADD_TO_COUNT
            .query_one(self.db, &[&namespace, &id, &delta])
            .await?;
        column(&row, "contact_count")
    }

    /// Upserts contacts by recipient (each recipient once in `contacts`) and moves the count;
    /// run under [`AudienceRepo::lock`].
    pub async fn upsert(
        &self,
        namespace: &str,
        audience_id: &str,
        contacts: &[Contact],
    ) -> Result<Upserted, StoreError> {
        let recipients: Vec<&str> = contacts.iter().map(|c| c.recipient.as_str()).collect();
        let names: Vec<&str> = contacts.iter().map(|c| c.name.as_str()).collect();
        let zones: Vec<&str> = contacts.iter().map(|c| c.time_zone.as_str()).collect();
        let locales: Vec<&str> = contacts.iter().map(|c| c.locale.as_str()).collect();
        let tags: Vec<serde_json::Value> = contacts
            .iter()
            .map(|c| serde_json::Value::from(c.tags.clone()))
            .collect();
        let attributes: Vec<serde_json::Value> = contacts.iter().map(attributes_json).collect();
        let row = UPSERT_CONTACTS
            .query_one(
                self.db,
                &[
                    &namespace,
                    &audience_id,
                    &recipients,
                    &names,
                    &zones,
                    &locales,
                    &tags,
                    &attributes,
                ],
            )
            .await?;
        let created: i64 = column(&row, "created")?;
        let written: i64 = column(&row, "written")?;
        let contact_count = self.add_to_count(namespace, audience_id, created).await?;
        Ok(Upserted {
            created,
            updated: written - created,
            contact_count,
        })
    }

    /// Inserts one contact and counts it; None if the recipient is there already. Run under
    /// [`AudienceRepo::lock`].
    pub async fn insert_contact(
        &self,
        namespace: &str,
        audience_id: &str,
        c: &Contact,
    ) -> Result<Option<Contact>, StoreError> {
        let attributes = attributes_json(c);
        let inserted: Option<Contact> = INSERT_CONTACT
            .fetch_opt(
                self.db,
                &contact_params(&namespace, &audience_id, c, &attributes),
            )
            .await?;
        if inserted.is_some() {
            self.add_to_count(namespace, audience_id, 1).await?;
        }
        Ok(inserted)
    }

    /// Replaces a contact's fields but its recipient; None if there is none.
    pub async fn update_contact(
        &self,
        namespace: &str,
        audience_id: &str,
        c: &Contact,
    ) -> Result<Option<Contact>, StoreError> {
        let attributes = attributes_json(c);
        UPDATE_CONTACT
            .fetch_opt(
                self.db,
                &contact_params(&namespace, &audience_id, c, &attributes),
            )
            .await
    }

    /// Removes a contact and uncounts it; false if there was none. Run under
    /// [`AudienceRepo::lock`].
    pub async fn delete_contact(
        &self,
        namespace: &str,
        audience_id: &str,
        recipient: &str,
    ) -> Result<bool, StoreError> {
        let gone = DELETE_CONTACT
            .execute(self.db, &[&namespace, &audience_id, &recipient])
            .await?
            > 0;
        if gone {
            self.add_to_count(namespace, audience_id, -1).await?;
        }
        Ok(gone)
    }

    /// Reads one contact.
    pub async fn get_contact(
        &self,
        namespace: &str,
        audience_id: &str,
        recipient: &str,
    ) -> Result<Option<Contact>, StoreError> {
        GET_CONTACT
            .fetch_opt(self.db, &[&namespace, &audience_id, &recipient])
            .await
    }

    /// Up to `limit` contacts after recipient `after` that pass `filter`, by recipient.
    pub async fn list_contacts(
        &self,
        namespace: &str,
        audience_id: &str,
        after: &str,
        filter: &ContactFilter,
        limit: i64,
    ) -> Result<Vec<Contact>, StoreError> {
        LIST_CONTACTS
            .fetch(
                self.db,
                &[
                    &namespace,
                    &audience_id,
                    &after,
                    &filter.tags,
                    &filter.recipient_prefix,
                    &filter.name_contains,
                    &limit,
                ],
            )
            .await
    }
}
