//! SuppressionService: the namespace's suppression list (add, remove, list, check).

use herald_proto::v1::{self as pb, suppression_service_server::SuppressionService};
use tonic::{Request, Response, Status};

use super::convert;
use crate::auth::namespace_of;
use crate::error::{Error, Violations};
use crate::rules;
use crate::store::{Db, Store};
use crate::suppressions::{Suppression, SuppressionReason};
use crate::tasks::model::{MAX_BATCH, MAX_RECIPIENT_CHARS};

/// Longest note kept with an entry, in characters.
const MAX_NOTE_CHARS: usize = 1024;

/// The SuppressionService implementation.
pub struct SuppressionApi {
    store: Store,
}

impl SuppressionApi {
    /// Serves the suppression list from `store`.
    pub fn new(store: Store) -> Self {
        SuppressionApi { store }
    }

    async fn conn(&self) -> Result<deadpool_postgres::Object, Status> {
        Ok(self.store.conn().await.map_err(Error::from)?)
    }
}

/// An entry on the wire.
fn entry(s: &Suppression) -> pb::Suppression {
    pb::Suppression {
        recipient: s.recipient.clone(),
        reason: reason(s.reason) as i32,
        note: s.note.clone(),
        created_at: Some(convert::timestamp(s.created_at)),
    }
}

fn reason(r: SuppressionReason) -> pb::SuppressionReason {
    match r {
        SuppressionReason::OptOut => pb::SuppressionReason::OptOut,
        SuppressionReason::InvalidRecipient => pb::SuppressionReason::InvalidRecipient,
        SuppressionReason::Manual => pb::SuppressionReason::Manual,
    }
}

/// A wire reason; Ok(None) for UNSPECIFIED, Err for a number that is no reason.
fn reason_from_wire(field: &str, value: i32) -> Result<Option<SuppressionReason>, Error> {
    match pb::SuppressionReason::try_from(value) {
        Ok(pb::SuppressionReason::Unspecified) => Ok(None),
        Ok(wire) => Ok(SuppressionReason::ALL
            .into_iter()
            .find(|r| reason(*r) == wire)),
        Err(_) => Err(Error::invalid(field, "is not a suppression reason")),
    }
}

/// Checks a list of 1 to 1,000 recipients, naming each bad entry.
fn recipients<'a>(list: &'a [String], v: &mut Violations) -> Vec<&'a str> {
    if list.is_empty() {
        v.add("recipients", "must name at least one recipient");
    } else if list.len() > MAX_BATCH {
        v.add(
            "recipients",
            format!("must name at most {MAX_BATCH} recipients"),
        );
    }
    for (i, r) in list.iter().enumerate() {
        if let Some(problem) = recipient_problem(r) {
            v.add(format!("recipients[{i}]"), problem);
        }
    }
    list.iter().map(String::as_str).collect()
}

fn recipient_problem(r: &str) -> Option<String> {
    let bare = r.trim_start_matches('+');
    if bare.trim().is_empty() {
        Some("is required".into())
    } else if r.chars().count() > MAX_RECIPIENT_CHARS {
        Some(format!("must be at most {MAX_RECIPIENT_CHARS} characters"))
    } else {
        rules::text_problem(r).map(str::to_owned)
    }
}

#[tonic::async_trait]
impl SuppressionService for SuppressionApi {
    async fn add_suppressions(
        &self,
        request: Request<pb::AddSuppressionsRequest>,
    ) -> Result<Response<pb::AddSuppressionsResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.get_ref();
        let mut v = Violations::default();
        let list = recipients(&req.recipients, &mut v);
        let why = match pb::SuppressionReason::try_from(req.reason) {
            Err(_) => {
                v.add("reason", "is not a suppression reason");
                None
            }
            Ok(_) => reason_from_wire("reason", req.reason).unwrap_or_default(),
        }
        .unwrap_or(SuppressionReason::Manual);
        if req.note.chars().count() > MAX_NOTE_CHARS {
            v.add(
                "note",
                format!("must be at most {MAX_NOTE_CHARS} characters"),
            );
        } else if let Some(problem) = rules::text_problem(&req.note) {
            v.add("note", problem);
        }
        if !v.is_empty() {
            return Err(v.into_error().into());
        }
        let conn = self.conn().await?;
        let rows = conn
            .suppressions()
            .add(&ns, &list, why, &req.note)
            .await
            .map_err(Error::from)?;
        let added = rows.iter().filter(|(_, new)| *new).count();
        // Every recipient listed, not only those this call added: a retry after a call that
        // listed them and failed before it revoked must still stop their leased sends.
        let listed: Vec<&str> = rows.iter().map(|(s, _)| s.recipient.as_str()).collect();
        crate::suppressions::revoke_leased(&conn, &ns, &listed)
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pb::AddSuppressionsResponse {
            suppressions: rows.iter().map(|(s, _)| entry(s)).collect(),
            added: u32::try_from(added).unwrap_or(u32::MAX),
        }))
    }

    async fn remove_suppression(
        &self,
        request: Request<pb::RemoveSuppressionRequest>,
    ) -> Result<Response<pb::Suppression>, Status> {
        let ns = namespace_of(&request)?;
        let recipient = &request.get_ref().recipient;
        if let Some(problem) = recipient_problem(recipient) {
            return Err(Error::invalid("recipient", problem).into());
        }
        let removed = self
            .conn()
            .await?
            .suppressions()
            .remove(&ns, recipient)
            .await
            .map_err(Error::from)?
            .ok_or_else(|| Error::NotFound(format!("suppression of {recipient}")))?;
        Ok(Response::new(entry(&removed)))
    }

    async fn list_suppressions(
        &self,
        request: Request<pb::ListSuppressionsRequest>,
    ) -> Result<Response<pb::ListSuppressionsResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.get_ref();
        let mut v = Violations::default();
        let why = reason_from_wire("reason", req.reason).unwrap_or_else(|e| {
            v.add("reason", e.to_string());
            None
        });
        let limit = rules::page_size("page_size", req.page_size, 100).unwrap_or_else(|_| {
            v.add("page_size", "must be between 0 and 1000");
            0
        });
        let after = if req.page_token.is_empty() {
            None
        } else {
            let key = convert::page_key(&req.page_token).and_then(|k| String::from_utf8(k).ok());
            if key.is_none() {
                v.add("page_token", "is not a token this service returned");
            }
            key
        };
        if !v.is_empty() {
            return Err(v.into_error().into());
        }
        let rows = self
            .conn()
            .await?
            .suppressions()
            .list(&ns, after.as_deref(), why, limit + 1)
            .await
            .map_err(Error::from)?;
        let (rows, next_page_token) = crate::store::sql::page(rows, limit, |last| {
            convert::page_token(last.recipient.as_bytes())
        });
        Ok(Response::new(pb::ListSuppressionsResponse {
            suppressions: rows.iter().map(entry).collect(),
            next_page_token,
        }))
    }

    async fn check_suppressions(
        &self,
        request: Request<pb::CheckSuppressionsRequest>,
    ) -> Result<Response<pb::CheckSuppressionsResponse>, Status> {
        let ns = namespace_of(&request)?;
        let mut v = Violations::default();
        let list = recipients(&request.get_ref().recipients, &mut v);
        if !v.is_empty() {
            return Err(v.into_error().into());
        }
        let rows = self
            .conn()
            .await?
            .suppressions()
            .get(&ns, &list)
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pb::CheckSuppressionsResponse {
            suppressions: rows.iter().map(entry).collect(),
        }))
    }
}
