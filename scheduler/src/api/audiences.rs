//! AudienceService: contact lists (see the `audiences` domain). Imports are bidirectional
//! streams: the client sends batches (or CSV chunks), the server answers each committed batch
//! with the totals so far.

use herald_proto::v1::{self as pb, audience_service_server::AudienceService};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::convert::audiences as wire;
use super::convert::{page_key, page_token};
use crate::audiences::{Audiences, Import, ImportRow};
use crate::auth::namespace_of;
use crate::auth::rate::{paced, PacedStream};
use crate::error::{Error, Violations};
use crate::rules;
use crate::store::audiences::ContactFilter;

/// Most contacts in one ImportContacts message.
const MAX_CONTACTS_PER_MESSAGE: usize = 1_000;

/// The AudienceService implementation.
pub struct AudienceApi {
    audiences: Audiences,
}

impl AudienceApi {
    /// Serves the audience domain.
    pub fn new(audiences: Audiences) -> Self {
        AudienceApi { audiences }
    }
}

/// The progress messages of an import.
type ProgressStream = ReceiverStream<Result<pb::ImportProgress, Status>>;

/// The audience an import stream names: required in the first message, the same (or empty)
/// in later ones.
fn stream_audience(first: &mut Option<String>, named: &str) -> Result<(), Error> {
    match first {
        None if named.is_empty() => Err(Error::invalid("audience_id", "is required")),
        None => {
            // A name no audience can have is the request's mistake, not a missing audience.
            rules::name("audience_id", named)?;
            *first = Some(named.to_owned());
            Ok(())
        }
        Some(id) if named.is_empty() || named == id => Ok(()),
        Some(_) => Err(Error::invalid(
            "audience_id",
            "must name the same audience in every message",
        )),
    }
}

/// Runs an import on its own task and returns its progress stream: `drive` sends each
/// batch's progress itself; a failure ends the stream with its status.
fn progress_stream<F>(
    drive: impl FnOnce(mpsc::Sender<Result<pb::ImportProgress, Status>>) -> F,
) -> ProgressStream
where
    F: std::future::Future<Output = Result<(), Error>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(4);
    let work = drive(tx.clone());
    tokio::spawn(async move {
        if let Err(e) = work.await {
            let _ = tx.send(Err(Status::from(e))).await;
        }
    });
    ReceiverStream::new(rx)
}

/// Sends a progress message; false when the client went away.
async fn report(
    tx: &mpsc::Sender<Result<pb::ImportProgress, Status>>,
    p: pb::ImportProgress,
) -> bool {
    tx.send(Ok(p)).await.is_ok()
}

/// The next message of a client stream; a broken stream is CANCELLED, with its reason.
async fn next<T>(inbound: &mut PacedStream<T>) -> Result<Option<T>, Error> {
    inbound
        .message()
        .await
        .map_err(|s| Error::Cancelled(format!("import stream broke: {}", s.message())))
}

/// Checks a contact request's audience id and contact.
fn contact_request(
    audience_id: &str,
    contact: Option<&pb::Contact>,
) -> Result<crate::audiences::model::Contact, Error> {
    rules::name("audience_id", audience_id)?;
    contact
        .map(wire::contact_spec)
        .ok_or_else(|| Error::invalid("contact", "is required"))
}

#[tonic::async_trait]
impl AudienceService for AudienceApi {
    type ImportContactsStream = ProgressStream;
    type ImportContactsCsvStream = ProgressStream;

    async fn create_audience(
        &self,
        request: Request<pb::CreateAudienceRequest>,
    ) -> Result<Response<pb::Audience>, Status> {
        let ns = namespace_of(&request)?;
        let a = request
            .into_inner()
            .audience
            .ok_or_else(|| Error::invalid("audience", "is required"))?;
        let record = wire::audience_spec(&a)?;
        let mut v = Violations::default();
        record.check("audience", &mut v);
        v.into_result(())?;
        let created = self.audiences.create(&ns, &record).await?;
        Ok(Response::new(wire::audience(&created)))
    }

    async fn get_audience(
        &self,
        request: Request<pb::GetAudienceRequest>,
    ) -> Result<Response<pb::Audience>, Status> {
        let ns = namespace_of(&request)?;
        rules::name("id", &request.get_ref().id)?;
        let a = self.audiences.get(&ns, &request.get_ref().id).await?;
        Ok(Response::new(wire::audience(&a)))
    }

    async fn list_audiences(
        &self,
        request: Request<pb::ListAudiencesRequest>,
    ) -> Result<Response<pb::ListAudiencesResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let limit = rules::page_size("page_size", req.page_size, 100)?;
        let rows = self.audiences.list(&ns, &req.page_token, limit + 1).await?;
        let (rows, next_page_token) = crate::store::sql::page(rows, limit, |a| a.id.clone());
        Ok(Response::new(pb::ListAudiencesResponse {
            audiences: rows.iter().map(wire::audience).collect(),
            next_page_token,
        }))
    }

    async fn delete_audience(
        &self,
        request: Request<pb::DeleteAudienceRequest>,
    ) -> Result<Response<pb::DeleteAudienceResponse>, Status> {
        let ns = namespace_of(&request)?;
        rules::name("id", &request.get_ref().id)?;
        self.audiences.delete(&ns, &request.get_ref().id).await?;
        Ok(Response::new(pb::DeleteAudienceResponse {}))
    }

    async fn import_contacts(
        &self,
        request: Request<Streaming<pb::ImportContactsRequest>>,
    ) -> Result<Response<Self::ImportContactsStream>, Status> {
        let ns = namespace_of(&request)?;
        let mut inbound = paced(request);
        let audiences = self.audiences.clone();
        Ok(Response::new(progress_stream(|tx| async move {
            let mut named = None;
            let mut import: Option<Import> = None;
            let mut position: i64 = 0;
            while let Some(msg) = next(&mut inbound).await? {
                stream_audience(&mut named, &msg.audience_id)?;
                if msg.contacts.len() > MAX_CONTACTS_PER_MESSAGE {
                    return Err(Error::invalid(
                        "contacts",
                        "holds more than 1,000 contacts in one message",
                    ));
                }
                let mut current = match import.take() {
                    Some(i) => i,
                    None => {
                        audiences
                            .import(&ns, named.as_deref().unwrap_or(""))
                            .await?
                    }
                };
                let rows = msg
                    .contacts
                    .iter()
                    .map(|c| {
                        position += 1;
                        ImportRow::Contact {
                            line: position - 1,
                            contact: wire::contact_spec(c),
                        }
                    })
                    .collect();
                let p = current.batch(rows).await?;
                import = Some(current);
                if !report(&tx, wire::progress(&p, false)).await {
                    return Ok(());
                }
            }
            let Some(import) = import else {
                return Err(Error::invalid("audience_id", "is required"));
            };
            report(&tx, wire::progress(&import.totals().await?, true)).await;
            Ok(())
        })))
    }

    async fn import_contacts_csv(
        &self,
        request: Request<Streaming<pb::ImportContactsCsvRequest>>,
    ) -> Result<Response<Self::ImportContactsCsvStream>, Status> {
        let ns = namespace_of(&request)?;
        let mut inbound = paced(request);
        let audiences = self.audiences.clone();
        Ok(Response::new(progress_stream(|tx| async move {
            let Some(first) = next(&mut inbound).await? else {
                return Err(Error::invalid("audience_id", "is required"));
            };
            let mut named = None;
            stream_audience(&mut named, &first.audience_id)?;
            let mut import = audiences.import(&ns, &first.audience_id).await?;
            let parse = crate::audiences::csv::spawn();
            let chunks = parse.chunks;
            let mut batches = parse.batches;
            // The client's chunks go to the parser on their own task, so reading the stream
            // and writing batches overlap; the channels bound what either side holds.
            // The file's end is said (`None`); a feeder that fails ends without saying it, and
            // the parser then drops the row it was in the middle of.
            let feeder = tokio::spawn(async move {
                if chunks.send(Some(first.data)).await.is_err() {
                    return Ok(());
                }
                while let Some(msg) = next(&mut inbound).await? {
                    stream_audience(&mut named, &msg.audience_id)?;
                    if chunks.send(Some(msg.data)).await.is_err() {
                        return Ok(());
                    }
                }
                let _ = chunks.send(None).await;
                Ok::<_, Error>(())
            });
            while let Some(batch) = batches.recv().await {
                let batch = match batch {
                    Ok(batch) => batch,
                    // The upload broke off: the feeder has ended, and says why.
                    Err(Error::Cancelled(why)) => {
                        return Err(match feeder.await {
                            Ok(Err(e)) => e,
                            _ => Error::Cancelled(why),
                        });
                    }
                    Err(e) => {
                        feeder.abort();
                        return Err(e);
                    }
                };
                let p = import.batch(batch).await?;
                if !report(&tx, wire::progress(&p, false)).await {
                    feeder.abort();
                    return Ok(());
                }
            }
            // The parser ends only after the feeder closed its channel (or failed).
            match feeder.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(e) => return Err(Error::Cancelled(format!("import stream ended: {e}"))),
            }
            report(&tx, wire::progress(&import.totals().await?, true)).await;
            Ok(())
        })))
    }

    async fn add_contact(
        &self,
        request: Request<pb::AddContactRequest>,
    ) -> Result<Response<pb::Contact>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.get_ref();
        let c = contact_request(&req.audience_id, req.contact.as_ref())?;
        let added = self
            .audiences
            .add_contact(&ns, &req.audience_id, &c)
            .await?;
        Ok(Response::new(wire::contact(&added)))
    }

    async fn update_contact(
        &self,
        request: Request<pb::UpdateContactRequest>,
    ) -> Result<Response<pb::Contact>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.get_ref();
        let c = contact_request(&req.audience_id, req.contact.as_ref())?;
        let updated = self
            .audiences
            .update_contact(&ns, &req.audience_id, &c)
            .await?;
        Ok(Response::new(wire::contact(&updated)))
    }

    async fn remove_contact(
        &self,
        request: Request<pb::RemoveContactRequest>,
    ) -> Result<Response<pb::RemoveContactResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.get_ref();
        rules::name("audience_id", &req.audience_id)?;
        self.audiences
            .remove_contact(&ns, &req.audience_id, &req.recipient)
            .await?;
        Ok(Response::new(pb::RemoveContactResponse {}))
    }

    async fn get_contact(
        &self,
        request: Request<pb::GetContactRequest>,
    ) -> Result<Response<pb::Contact>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.get_ref();
        rules::name("audience_id", &req.audience_id)?;
        let c = self
            .audiences
            .get_contact(&ns, &req.audience_id, &req.recipient)
            .await?;
        Ok(Response::new(wire::contact(&c)))
    }

    async fn list_contacts(
        &self,
        request: Request<pb::ListContactsRequest>,
    ) -> Result<Response<pb::ListContactsResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        rules::name("audience_id", &req.audience_id)?;
        let limit = rules::page_size("page_size", req.page_size, 100)?;
        let after = page_key(&req.page_token)
            .and_then(|k| String::from_utf8(k).ok())
            .ok_or_else(|| Error::invalid("page_token", "is not a token from this service"))?;
        let mut v = Violations::default();
        for (i, t) in req.tags.iter().enumerate() {
            if let Some(p) = crate::audiences::model::tag_problem(t) {
                v.add(format!("tags[{i}]"), p);
            }
        }
        v.into_result(())?;
        let filter = ContactFilter {
            tags: req.tags,
            recipient_prefix: req.recipient_prefix,
            name_contains: req.name_contains,
        };
        let rows = self
            .audiences
            .list_contacts(&ns, &req.audience_id, &after, &filter, limit + 1)
            .await?;
        let (rows, next_page_token) =
            crate::store::sql::page(rows, limit, |c| page_token(c.recipient.as_bytes()));
        Ok(Response::new(pb::ListContactsResponse {
            contacts: rows.iter().map(wire::contact).collect(),
            next_page_token,
        }))
    }
}
