//! CampaignService: one message to many recipients, spread over a window, with progress,
//! pause, resume and cancel (see `store/campaigns.rs` for how pause and cancel keep tasks from
//! the claim).

use std::time::Duration;

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use herald_proto::v1::{self as pb, campaign_service_server::CampaignService};
use prost::Message;
use tokio::sync::broadcast;
use tonic::{Request, Response, Status, Streaming};
use uuid::Uuid;

use super::convert::{from_timestamp, timestamp};
use super::validate::{self, Violations};
use crate::auth::{namespace_of, DEFAULT_NAMESPACE};
use crate::error::Error;
use crate::lease::events::Event;
use crate::model::{CancelOutcome, NewTask};
use crate::schedule::{fire_times, spread};
use crate::store::campaigns::{AddError, CampaignRecord};
use crate::store::{Store, StoreError};
use crate::template::Renderer;

/// Most recipients per chunk.
pub const MAX_CHUNK: usize = 1_000;
/// Most recipients per campaign.
pub const MAX_RECIPIENTS: i32 = 100_000;

/// The CampaignService implementation.
pub struct CampaignApi {
    store: Store,
    events: broadcast::Sender<Event>,
    cancel_wait: Duration,
}

impl CampaignApi {
    /// `cancel_wait` bounds how long CancelCampaign waits for executors' revoke answers.
    pub fn new(store: Store, events: broadcast::Sender<Event>, cancel_wait: Duration) -> Self {
        CampaignApi {
            store,
            events,
            cancel_wait,
        }
    }

    async fn load(&self, ns: &str, id: Uuid) -> Result<CampaignRecord, Error> {
        self.store
            .get_campaign(ns, id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("campaign {id}")))
    }

    async fn to_wire(&self, ns: &str, c: &CampaignRecord) -> Result<pb::Campaign, Error> {
        let spec = decode(c)?;
        let p = self
            .store
            .campaign_progress(ns, c.id, c.pool.as_deref())
            .await?;
        let mut state = match c.state.as_str() {
            "paused" => pb::CampaignState::Paused,
            "cancelled" => pb::CampaignState::Cancelled,
            "finished" => pb::CampaignState::Finished,
            _ => pb::CampaignState::Active,
        };
        if state == pb::CampaignState::Active && p.live == 0 && c.recipient_count > 0 {
            state = pb::CampaignState::Finished;
        }
        // The later of the last slot and what the pool's current rates allow for what is left.
        let estimated_finish = match (state, p.now) {
            (pb::CampaignState::Active, Some(now)) if p.live > 0 => {
                let by_rate = (p.pool_rate > 0.0).then(|| {
                    now + ChronoDuration::milliseconds(
                        (p.live as f64 / p.pool_rate * 1000.0) as i64,
                    )
                });
                [Some(now), p.last_due, by_rate].into_iter().flatten().max()
            }
            _ => None,
        };
        Ok(pb::Campaign {
            id: c.id.to_string(),
            spec: Some(spec),
            state: state as i32,
            progress: Some(pb::CampaignProgress {
                total: i64::from(c.recipient_count),
                scheduled: p.live,
                sent: p.succeeded,
                failed: p.failed,
                cancelled: p.cancelled,
                expired: p.expired,
                estimated_finish: estimated_finish.map(timestamp),
            }),
            created_at: Some(timestamp(c.created_at)),
        })
    }

    async fn add(
        &self,
        ns: &str,
        id: Uuid,
        recipients: &[pb::CampaignRecipient],
        path: &str,
    ) -> Result<pb::AddRecipientsResponse, Error> {
        if recipients.len() > MAX_CHUNK {
            let mut v = Violations::default();
            v.add(path, "must hold at most 1,000 recipients per chunk");
            return Err(Error::InvalidArgument(v.0));
        }
        let campaign = self.load(ns, id).await?;
        if campaign.recipient_count + recipients.len() as i32 > MAX_RECIPIENTS {
            return Err(Error::FailedPrecondition(format!(
                "campaign {id} would exceed 100,000 recipients"
            )));
        }
        let spec = decode(&campaign)?;
        let now = Utc::now();
        // Validate every recipient before touching the database.
        let mut v = Violations::default();
        // Render each recipient's content now: what the task stores is what will be sent, and a
        // recipient missing a variable is refused here rather than failing at send time.
        let renderer =
            Renderer::load(&self.store, ns, Renderer::template_ids(spec.content.iter())).await?;
        let contents: Vec<Option<pb::Content>> = recipients
            .iter()
            .enumerate()
            .map(|(i, r)| {
                merge_variables(spec.content.as_ref(), r)
                    .and_then(|c| renderer.render(&c, &format!("{path}[{i}].content"), &mut v))
            })
            .collect();
        let mut dues = Vec::with_capacity(recipients.len());
        for (i, r) in recipients.iter().enumerate() {
            let zone_name = if r.time_zone.is_empty() {
                &spec.time_zone
            } else {
                &r.time_zone
            };
            match zone_name.parse::<chrono_tz::Tz>() {
                Ok(z) => dues.push(Some(z)),
                Err(_) => {
                    v.add(
                        format!("{path}[{i}].time_zone"),
                        "is not an IANA time zone name",
                    );
                    dues.push(None);
                }
            }
            let probe = task_for(&spec, r, contents[i].clone(), &id);
            validate::task_spec(&probe, &format!("{path}[{i}]"), ns, now, &mut v);
        }
        if !v.is_empty() {
            return Err(Error::InvalidArgument(v.0));
        }
        let names: Vec<&str> = recipients.iter().map(|r| r.recipient.as_str()).collect();
        let start = spec
            .start_at
            .as_ref()
            .and_then(from_timestamp)
            .unwrap_or(campaign.created_at);
        let local_start = validate::parse_local_time(&spec.local_start);
        let window = ms(spec.window.as_ref());
        let spacing = ms(spec.spacing.as_ref());
        let scope = id.to_string();
        let added = self
            .store
            .add_campaign_recipients(ns, id, &names, |fresh| {
                fresh
                    .iter()
                    .filter_map(|&(i, seq)| {
                        let r = &recipients[i];
                        let base = match (local_start, dues[i]) {
                            (Some(local), Some(zone)) => {
                                fire_times::local_to_instant(&zone, local).unwrap_or(start)
                            }
                            _ => start,
                        };
                        let due = if spacing > 0 {
                            base + ChronoDuration::milliseconds(spacing * i64::from(seq))
                        } else {
                            base + spread::stagger_offset(
                                &scope,
                                &r.recipient,
                                ChronoDuration::milliseconds(window),
                            )
                        };
                        let mut t = task_for(&spec, r, contents[i].clone(), &id);
                        t.when = Some(pb::task_spec::When::RunAt(timestamp(due.max(now))));
                        let mut tv = Violations::default();
                        validate::task_spec(&t, "recipient", ns, now, &mut tv)
                    })
                    .collect::<Vec<NewTask>>()
            })
            .await
            .map_err(|e| match e {
                AddError::NotFound => Error::NotFound(format!("campaign {id}")),
                AddError::Ended(state) => {
                    Error::FailedPrecondition(format!("campaign {id} is {state}"))
                }
                AddError::Store(e) => Error::Store(e),
            })?;
        Ok(pb::AddRecipientsResponse {
            added: added.added as i32,
            duplicates: added.duplicates as i32,
            total: i64::from(added.total),
        })
    }
}

fn ms(d: Option<&prost_types::Duration>) -> i64 {
    d.map_or(0, |d| {
        // Saturating: a huge duration is out of range, not an overflow (found by fuzzing, #10).
        d.seconds
            .saturating_mul(1000)
            .saturating_add(i64::from(d.nanos) / 1_000_000)
    })
}

fn decode(c: &CampaignRecord) -> Result<pb::CampaignSpec, Error> {
    pb::CampaignSpec::decode(c.spec.as_slice())
        .map_err(|e| Error::Store(StoreError::Corrupt(format!("campaign {} spec: {e}", c.id))))
}

/// The task of one recipient, before its due time is set.
fn task_for(
    spec: &pb::CampaignSpec,
    r: &pb::CampaignRecipient,
    content: Option<pb::Content>,
    id: &Uuid,
) -> pb::TaskSpec {
    let mut labels = spec.labels.clone();
    labels.insert("herald.campaign_id".into(), id.to_string());
    pb::TaskSpec {
        queue: spec.queue.clone(),
        recipient: r.recipient.clone(),
        content,
        priority: spec.priority,
        max_attempts: spec.max_attempts,
        expire_at: spec.expire_at,
        labels,
        pool: spec.pool.clone(),
        ..Default::default()
    }
}

/// Per-recipient content before rendering: the recipient's variables over the campaign's.
fn merge_variables(
    content: Option<&pb::Content>,
    r: &pb::CampaignRecipient,
) -> Option<pb::Content> {
    let mut content = content.cloned()?;
    if let Some(pb::content::Body::Template(t)) = content.body.as_mut() {
        for (k, v) in &r.variables {
            t.variables.insert(k.clone(), v.clone());
        }
    }
    Some(content)
}

fn campaign_id(field: &str, value: &str) -> Result<Uuid, Error> {
    value.parse().map_err(|_| {
        let mut v = Violations::default();
        v.add(field, "is not a campaign id (a UUID)");
        Error::InvalidArgument(v.0)
    })
}

/// Checks a campaign spec before anything is stored: the campaign's own fields, and its
/// content, queue and target as a task would be checked. Empty when valid.
pub fn validate_spec(spec: &pb::CampaignSpec, now: DateTime<Utc>) -> Violations {
    let mut v = Violations::default();
    if spec.name.chars().count() > 200 {
        v.add("campaign.name", "must be at most 200 characters");
    }
    if !spec.time_zone.is_empty() && spec.time_zone.parse::<chrono_tz::Tz>().is_err() {
        v.add("campaign.time_zone", "is not an IANA time zone name");
    }
    if !spec.local_start.is_empty() && validate::parse_local_time(&spec.local_start).is_none() {
        v.add(
            "campaign.local_start",
            "must be a date-time like 2026-12-24T09:00",
        );
    }
    if !(0..=7 * 86_400_000).contains(&ms(spec.window.as_ref())) {
        v.add("campaign.window", "must be between 0 and 7 days");
    }
    if !(0..=86_400_000).contains(&ms(spec.spacing.as_ref())) {
        v.add("campaign.spacing", "must be between 0 and 24 hours");
    }
    if spec.labels.keys().any(|k| k.starts_with("herald.")) {
        v.add("campaign.labels", "keys starting with herald. are reserved");
    }
    // The content, queue and target are checked as a task would be.
    let probe = task_for(
        spec,
        &pb::CampaignRecipient {
            recipient: "probe".into(),
            ..Default::default()
        },
        spec.content.clone(),
        &Uuid::nil(),
    );
    // Only validity matters here: the probe is never stored, so its namespace is moot.
    validate::task_spec(&probe, "campaign", DEFAULT_NAMESPACE, now, &mut v);
    v.0.retain(|f| !f.field.starts_with("campaign.labels") || f.description.contains("herald"));
    v
}

#[tonic::async_trait]
impl CampaignService for CampaignApi {
    async fn create_campaign(
        &self,
        request: Request<pb::CreateCampaignRequest>,
    ) -> Result<Response<pb::Campaign>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let spec = req.campaign.unwrap_or_default();
        let v = validate_spec(&spec, Utc::now());
        if !v.is_empty() {
            return Err(Error::InvalidArgument(v.0).into());
        }
        if !spec.pool.is_empty() {
            let (pools, _) = self
                .store
                .existing_targets(&ns, &[spec.pool.as_str()], &[])
                .await
                .map_err(Error::from)?;
            if !pools.contains(&spec.pool) {
                let mut v = Violations::default();
                v.add(
                    "campaign.pool",
                    format!("pool {} does not exist", spec.pool),
                );
                return Err(Error::InvalidArgument(v.0).into());
            }
        }
        let mut stored = spec.clone();
        if stored.time_zone.is_empty() {
            stored.time_zone = "UTC".into();
        }
        let id = Uuid::now_v7();
        let pool = (!spec.pool.is_empty()).then_some(spec.pool.as_str());
        let campaign = self
            .store
            .create_campaign(&ns, id, &spec.name, &stored.encode_to_vec(), pool)
            .await
            .map_err(Error::from)?;
        if !req.recipients.is_empty() {
            self.add(&ns, campaign.id, &req.recipients, "recipients")
                .await?;
        }
        let campaign = self.load(&ns, id).await?;
        Ok(Response::new(self.to_wire(&ns, &campaign).await?))
    }

    async fn add_recipients(
        &self,
        request: Request<pb::AddRecipientsRequest>,
    ) -> Result<Response<pb::AddRecipientsResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let id = campaign_id("campaign_id", &req.campaign_id)?;
        Ok(Response::new(
            self.add(&ns, id, &req.recipients, "recipients").await?,
        ))
    }

    async fn stream_recipients(
        &self,
        request: Request<Streaming<pb::AddRecipientsRequest>>,
    ) -> Result<Response<pb::AddRecipientsResponse>, Status> {
        let ns = namespace_of(&request)?;
        let mut stream = request.into_inner();
        let mut total = pb::AddRecipientsResponse::default();
        while let Some(chunk) = stream.message().await? {
            let id = campaign_id("campaign_id", &chunk.campaign_id)?;
            let r = self.add(&ns, id, &chunk.recipients, "recipients").await?;
            total.added += r.added;
            total.duplicates += r.duplicates;
            total.total = r.total;
        }
        Ok(Response::new(total))
    }

    async fn get_campaign(
        &self,
        request: Request<pb::GetCampaignRequest>,
    ) -> Result<Response<pb::Campaign>, Status> {
        let ns = namespace_of(&request)?;
        let id = campaign_id("id", &request.get_ref().id)?;
        let c = self.load(&ns, id).await?;
        Ok(Response::new(self.to_wire(&ns, &c).await?))
    }

    async fn pause_campaign(
        &self,
        request: Request<pb::PauseCampaignRequest>,
    ) -> Result<Response<pb::Campaign>, Status> {
        let ns = namespace_of(&request)?;
        let id = campaign_id("id", &request.get_ref().id)?;
        let c = self
            .store
            .set_campaign_paused(&ns, id, true)
            .await
            .map_err(Error::from)?
            .ok_or_else(|| Error::NotFound(format!("campaign {id}")))?;
        Ok(Response::new(self.to_wire(&ns, &c).await?))
    }

    async fn resume_campaign(
        &self,
        request: Request<pb::ResumeCampaignRequest>,
    ) -> Result<Response<pb::Campaign>, Status> {
        let ns = namespace_of(&request)?;
        let id = campaign_id("id", &request.get_ref().id)?;
        let c = self
            .store
            .set_campaign_paused(&ns, id, false)
            .await
            .map_err(Error::from)?
            .ok_or_else(|| Error::NotFound(format!("campaign {id}")))?;
        Ok(Response::new(self.to_wire(&ns, &c).await?))
    }

    async fn cancel_campaign(
        &self,
        request: Request<pb::CancelCampaignRequest>,
    ) -> Result<Response<pb::CancelCampaignResponse>, Status> {
        let ns = namespace_of(&request)?;
        let id = campaign_id("id", &request.get_ref().id)?;
        // Subscribe before revoking, so no executor's answer slips past.
        let mut events = self.events.subscribe();
        let rows = self
            .store
            .cancel_campaign_rows(&ns, id)
            .await
            .map_err(Error::from)?
            .ok_or_else(|| Error::NotFound(format!("campaign {id}")))?;
        let mut waiting = std::collections::HashSet::new();
        let mut cancelled_scheduled = rows.scheduled as i64;
        for task in &rows.leased {
            match self
                .store
                .cancel_task(&ns, *task)
                .await
                .map_err(Error::from)?
            {
                crate::store::tasks::CancelResult::CancelledLeased { .. } => {
                    waiting.insert(*task);
                }
                crate::store::tasks::CancelResult::CancelledScheduled => cancelled_scheduled += 1,
                _ => {}
            }
        }
        let revoked = waiting.len() as i64;
        let deadline = tokio::time::sleep(self.cancel_wait);
        tokio::pin!(deadline);
        while !waiting.is_empty() {
            tokio::select! {
                _ = &mut deadline => break,
                event = events.recv() => match event {
                    Ok(Event::CancelResolved(task)) => { waiting.remove(&task); }
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => break,
                },
            }
        }
        let revoked_ids: Vec<Uuid> = rows.leased.clone();
        let records = self
            .store
            .get_tasks(&ns, &revoked_ids)
            .await
            .map_err(Error::from)?;
        let in_flight = records
            .iter()
            .filter(|r| {
                !matches!(
                    r.cancel_outcome,
                    Some(CancelOutcome::NotStarted | CancelOutcome::StoppedBeforeSend)
                ) && r.state == crate::model::TaskState::Cancelled
            })
            .count() as i64;
        let c = self.load(&ns, id).await?;
        Ok(Response::new(pb::CancelCampaignResponse {
            campaign: Some(self.to_wire(&ns, &c).await?),
            cancelled_scheduled,
            revoked,
            in_flight_at_cancel: in_flight,
        }))
    }
}
