//! Audiences: named contact lists per namespace ([`model`]: what an audience and a contact
//! are, and their rules), written one contact at a time or imported in batches ([`Import`],
//! fed by a client stream of contacts or by the CSV parser of [`csv`]), and read by the
//! schedule fan-out (`schedule::fanout`), which turns a run into one task per matching contact.

pub mod csv;
pub mod model;

use std::collections::{BTreeMap, HashMap};

use deadpool_postgres::GenericClient;
use herald_proto::v1 as pb;

use chrono::{DateTime, Datelike as _, Utc};

use self::model::{AudienceRecord, Contact, MonthDay, MAX_CONTACTS};
use crate::error::{Error, Violations};
use crate::store::audiences::{ContactFilter, Upserted};
use crate::store::transaction;
use crate::store::{Db, Store};

/// Most bad rows one import reports in detail (all are counted).
const MAX_REPORTED_ERRORS: usize = 1_000;

/// The audience operations of a replica.
#[derive(Clone)]
pub struct Audiences {
    store: Store,
}

impl Audiences {
    /// Audiences in `store`.
    pub fn new(store: Store) -> Self {
        Audiences { store }
    }

    /// Creates an audience (checked by the caller with [`AudienceRecord::check`]).
    pub async fn create(
        &self,
        namespace: &str,
        a: &AudienceRecord,
    ) -> Result<AudienceRecord, Error> {
        self.store
            .conn()
            .await?
            .audiences()
            .create(namespace, a)
            .await?
            .ok_or_else(|| Error::AlreadyExists(format!("audience {} already exists", a.id)))
    }

    /// Reads an audience.
    pub async fn get(&self, namespace: &str, id: &str) -> Result<AudienceRecord, Error> {
        self.store
            .conn()
            .await?
            .audiences()
            .get(namespace, id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("audience {id}")))
    }

    /// Lists audiences with an id after `after`, by id.
    pub async fn list(
        &self,
        namespace: &str,
        after: &str,
        limit: i64,
    ) -> Result<Vec<AudienceRecord>, Error> {
        Ok(self
            .store
            .conn()
            .await?
            .audiences()
            .list(namespace, after, limit)
            .await?)
    }

    /// Deletes an audience and its contacts.
    pub async fn delete(&self, namespace: &str, id: &str) -> Result<(), Error> {
        if self
            .store
            .conn()
            .await?
            .audiences()
            .delete(namespace, id)
            .await?
        {
            Ok(())
        } else {
            Err(Error::NotFound(format!("audience {id}")))
        }
    }

    /// Checks `contact` against its audience's rules; violations name fields under `contact`.
    async fn checked(
        &self,
        namespace: &str,
        audience_id: &str,
        contact: &Contact,
    ) -> Result<AudienceRecord, Error> {
        let audience = self.get(namespace, audience_id).await?;
        let mut v = Violations::default();
        contact.check(&audience, "contact", &mut v);
        v.into_result(audience)
    }

    /// Adds one contact; ALREADY_EXISTS if the recipient is there.
    pub async fn add_contact(
        &self,
        namespace: &str,
        audience_id: &str,
        contact: &Contact,
    ) -> Result<Contact, Error> {
        self.checked(namespace, audience_id, contact).await?;
        transaction!(self.store, Error, |tx| {
            let a = tx
                .audiences()
                .lock(namespace, audience_id)
                .await?
                .ok_or_else(|| Error::NotFound(format!("audience {audience_id}")))?;
            if a.contact_count >= MAX_CONTACTS {
                return Err(full(audience_id));
            }
            tx.audiences()
                .insert_contact(namespace, audience_id, contact)
                .await?
                .ok_or_else(|| {
                    Error::AlreadyExists(format!(
                        "contact {} already exists in audience {audience_id}",
                        contact.recipient
                    ))
                })
        })
    }

    /// Replaces one contact's fields but its recipient.
    pub async fn update_contact(
        &self,
        namespace: &str,
        audience_id: &str,
        contact: &Contact,
    ) -> Result<Contact, Error> {
        self.checked(namespace, audience_id, contact).await?;
        self.store
            .conn()
            .await?
            .audiences()
            .update_contact(namespace, audience_id, contact)
            .await?
            .ok_or_else(|| not_found(audience_id, &contact.recipient))
    }

    /// Removes one contact.
    pub async fn remove_contact(
        &self,
        namespace: &str,
        audience_id: &str,
        recipient: &str,
    ) -> Result<(), Error> {
        let gone = transaction!(self.store, Error, |tx| {
            tx.audiences()
                .lock(namespace, audience_id)
                .await?
                .ok_or_else(|| Error::NotFound(format!("audience {audience_id}")))?;
            Ok::<_, Error>(
                tx.audiences()
                    .delete_contact(namespace, audience_id, recipient)
                    .await?,
            )
        })?;
        if gone {
            Ok(())
        } else {
            Err(not_found(audience_id, recipient))
        }
    }

    /// Reads one contact.
    pub async fn get_contact(
        &self,
        namespace: &str,
        audience_id: &str,
        recipient: &str,
    ) -> Result<Contact, Error> {
        self.store
            .conn()
            .await?
            .audiences()
            .get_contact(namespace, audience_id, recipient)
            .await?
            .ok_or_else(|| not_found(audience_id, recipient))
    }

    /// A page of contacts after recipient `after` that pass `filter`.
    pub async fn list_contacts(
        &self,
        namespace: &str,
        audience_id: &str,
        after: &str,
        filter: &ContactFilter,
        limit: i64,
    ) -> Result<Vec<Contact>, Error> {
        let conn = self.store.conn().await?;
        if conn
            .audiences()
            .get(namespace, audience_id)
            .await?
            .is_none()
        {
            return Err(Error::NotFound(format!("audience {audience_id}")));
        }
        Ok(conn
            .audiences()
            .list_contacts(namespace, audience_id, after, filter, limit)
            .await?)
    }

    /// Starts an import into an audience: NOT_FOUND before anything is read if there is none.
    pub async fn import(&self, namespace: &str, audience_id: &str) -> Result<Import, Error> {
        let audience = self.get(namespace, audience_id).await?;
        Ok(Import {
            store: self.store.clone(),
            namespace: namespace.to_owned(),
            audience,
            totals: Progress::default(),
            reported: 0,
        })
    }
}

/// Checks that the audience a schedule or campaign targets exists and declares the date
/// attribute it filters on; violations name fields under `path` (`schedule.audience`).
pub async fn target_audience(
    db: &impl GenericClient,
    namespace: &str,
    target: &pb::AudienceTarget,
    path: &str,
) -> Result<AudienceRecord, Error> {
    let Some(audience) = db.audiences().get(namespace, &target.audience_id).await? else {
        return Err(Error::invalid(
            format!("{path}.audience_id"),
            format!("audience {} does not exist", target.audience_id),
        ));
    };
    if !target.date_attribute.is_empty()
        && !audience.date_attributes.contains(&target.date_attribute)
    {
        return Err(Error::invalid(
            format!("{path}.date_attribute"),
            format!(
                "is not one of audience {}'s date attributes",
                target.audience_id
            ),
        ));
    }
    Ok(audience)
}

/// The template variables a contact gives its messages: its attributes, then `recipient`,
/// `name`, `locale` and `time_zone` (its zone, else the audience's `zone`).
pub fn contact_variables(c: &Contact, zone: &str) -> BTreeMap<String, String> {
    let mut vars = c.attributes.clone();
    for (k, v) in [
        ("recipient", c.recipient.as_str()),
        ("name", c.name.as_str()),
        ("locale", c.locale.as_str()),
        ("time_zone", zone),
    ] {
        vars.insert(k.to_owned(), v.to_owned());
    }
    vars
}

/// Whether `contact`'s date attribute `attr` has the month and day of `fire_time`'s date in
/// the contact's zone. 29 February matches 28 February in years without it.
pub fn is_today(
    contact: &Contact,
    attr: &str,
    default_zone: &str,
    fire_time: DateTime<Utc>,
) -> bool {
    let Ok(zone) = contact.zone_or(default_zone).parse::<chrono_tz::Tz>() else {
        return false;
    };
    is_on(contact, attr, fire_time.with_timezone(&zone).date_naive())
}

/// Whether `contact`'s date attribute `attr` has the month and day of `local`, the contact's
/// own date. 29 February matches 28 February in years without it.
pub fn is_on(contact: &Contact, attr: &str, local: chrono::NaiveDate) -> bool {
    let Some(date) = contact
        .attributes
        .get(attr)
        .and_then(|v| MonthDay::parse(v))
    else {
        return false;
    };
    let today = MonthDay::of(local);
    if date == today {
        return true;
    }
    let leap_day = MonthDay { month: 2, day: 29 };
    date == leap_day
        && today == (MonthDay { month: 2, day: 28 })
        && chrono::NaiveDate::from_ymd_opt(local.year(), 2, 29).is_none()
}

fn not_found(audience_id: &str, recipient: &str) -> Error {
    Error::NotFound(format!("contact {recipient} in audience {audience_id}"))
}

fn full(audience_id: &str) -> Error {
    Error::ResourceExhausted(format!(
        "audience {audience_id} would hold more than {MAX_CONTACTS} contacts"
    ))
}

/// One row of an import: a contact read at `line`, or why the row could not be read.
#[derive(Debug, Clone)]
pub enum ImportRow {
    /// A contact to check and write.
    Contact {
        /// Its line (CSV) or position in the stream.
        line: i64,
        /// The contact.
        contact: Contact,
    },
    /// A row that is bad before any rule is checked (a CSV row that does not parse).
    Bad(RowError),
}

/// A row an import skipped, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowError {
    /// Its line (CSV) or position in the stream.
    pub line: i64,
    /// The field at fault; empty for the row as a whole.
    pub field: String,
    /// Why.
    pub reason: String,
}

/// Progress of an import: totals so far, and the rows skipped since the previous report.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    /// Rows read.
    pub received: i64,
    /// Contacts created.
    pub created: i64,
    /// Contacts updated.
    pub updated: i64,
    /// Rows skipped.
    pub rejected: i64,
    /// Rows skipped since the previous report (the first [`MAX_REPORTED_ERRORS`] of an import).
    pub errors: Vec<RowError>,
    /// The audience's contact count after the latest batch.
    pub contact_count: i64,
}

/// An import in progress: each batch is checked against the audience's rules and its good
/// contacts upserted in one transaction, so memory holds one batch whatever the file's size.
pub struct Import {
    store: Store,
    namespace: String,
    audience: AudienceRecord,
    totals: Progress,
    reported: usize,
}

impl Import {
    /// The audience being imported into.
    pub fn audience_id(&self) -> &str {
        &self.audience.id
    }

    /// Checks and writes one batch of rows; returns the totals with this batch's bad rows.
    /// A later row with the same recipient as an earlier one in the batch wins, as it would
    /// in a later batch.
    pub async fn batch(&mut self, rows: Vec<ImportRow>) -> Result<Progress, Error> {
        let mut errors = Vec::new();
        let mut good: Vec<Contact> = Vec::with_capacity(rows.len());
        let mut position: HashMap<String, usize> = HashMap::new();
        self.totals.received += rows.len() as i64;
        for row in rows {
            match row {
                ImportRow::Bad(e) => {
                    errors.push(e);
                    self.totals.rejected += 1;
                }
                ImportRow::Contact { line, contact } => {
                    let mut v = Violations::default();
                    contact.check(&self.audience, "", &mut v);
                    if !v.is_empty() {
                        errors.extend(v.as_slice().iter().map(|f| RowError {
                            line,
                            field: f.field.clone(),
                            reason: f.description.clone(),
                        }));
                        self.totals.rejected += 1;
                        continue;
                    }
                    match position.get(&contact.recipient) {
                        Some(&i) => good[i] = contact,
                        None => {
                            position.insert(contact.recipient.clone(), good.len());
                            good.push(contact);
                        }
                    }
                }
            }
        }
        if !good.is_empty() {
            let written = self.write(&good).await?;
            self.totals.created += written.created;
            self.totals.updated += written.updated;
            self.totals.contact_count = written.contact_count;
        }
        let room = MAX_REPORTED_ERRORS.saturating_sub(self.reported);
        errors.truncate(room);
        self.reported += errors.len();
        Ok(Progress {
            errors,
            ..self.totals.clone()
        })
    }

    /// The totals so far, with no rows.
    pub async fn totals(&self) -> Result<Progress, Error> {
        let mut p = self.totals.clone();
        if p.created == 0 && p.updated == 0 {
            // Nothing written: read the count instead of reporting 0 for a full audience.
            let conn = self.store.conn().await?;
            if let Some(a) = conn
                .audiences()
                .get(&self.namespace, &self.audience.id)
                .await?
            {
                p.contact_count = a.contact_count;
            }
        }
        Ok(p)
    }

    async fn write(&self, contacts: &[Contact]) -> Result<Upserted, Error> {
        let (ns, id) = (self.namespace.as_str(), self.audience.id.as_str());
        // Idempotent: an upsert by recipient applied twice leaves what applying it once did
        // (only the created/updated split of the counts could differ).
        transaction!(self.store, Error, idempotent = true, |tx| {
            tx.audiences()
                .lock(ns, id)
                .await?
                .ok_or_else(|| Error::NotFound(format!("audience {id}")))?;
            let written = tx.audiences().upsert(ns, id, contacts).await?;
            if written.contact_count > MAX_CONTACTS {
                return Err(full(id));
            }
            Ok(written)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn born(zone: &str, birthday: &str) -> Contact {
        Contact {
            recipient: "ann".into(),
            time_zone: zone.into(),
            attributes: [("birthday".to_string(), birthday.to_string())].into(),
            ..Default::default()
        }
    }

    fn at(s: &str) -> Result<DateTime<Utc>, chrono::ParseError> {
        Ok(DateTime::parse_from_rfc3339(s)?.with_timezone(&Utc))
    }

    #[test]
    fn today_is_the_contacts_own_date() -> Result<(), chrono::ParseError> {
        let t = at("2026-03-07T23:30:00Z")?;
        assert!(is_today(&born("UTC", "1990-03-07"), "birthday", "UTC", t));
        assert!(is_today(&born("Asia/Tokyo", "03-08"), "birthday", "UTC", t));
        assert!(!is_today(
            &born("Asia/Tokyo", "03-07"),
            "birthday",
            "UTC",
            t
        ));
        // No zone of its own: the default.
        assert!(is_today(&born("", "03-08"), "birthday", "Europe/Berlin", t));
        assert!(!is_today(&born("UTC", "03-07"), "anniversary", "UTC", t));
        Ok(())
    }

    #[test]
    fn a_leap_day_birthday_is_kept_on_the_28th_in_other_years() -> Result<(), chrono::ParseError> {
        let leapling = born("UTC", "2000-02-29");
        assert!(is_today(
            &leapling,
            "birthday",
            "UTC",
            at("2026-02-28T12:00:00Z")?
        ));
        assert!(!is_today(
            &leapling,
            "birthday",
            "UTC",
            at("2028-02-28T12:00:00Z")?
        ));
        assert!(is_today(
            &leapling,
            "birthday",
            "UTC",
            at("2028-02-29T12:00:00Z")?
        ));
        Ok(())
    }
}
