//! CampaignService: one message to many recipients, spread over a window, with progress,
//! pause, resume and cancel (see the `campaigns` domain).

use herald_proto::v1::{self as pb, campaign_service_server::CampaignService};
use tonic::{Request, Response, Status, Streaming};
use uuid::Uuid;

use super::convert::{self, campaigns as wire};
use super::paging::Page;
use crate::auth::namespace_of;
use crate::campaigns::model::Added;
use crate::campaigns::{Campaigns, Recipient};
use crate::error::{Error, Violations};
use crate::rules;

/// The CampaignService implementation.
pub struct CampaignApi {
    campaigns: Campaigns,
}

impl CampaignApi {
    /// Serves the campaign domain.
    pub fn new(campaigns: Campaigns) -> Self {
        CampaignApi { campaigns }
    }

    async fn add(&self, ns: &str, chunk: &pb::AddRecipientsRequest) -> Result<Added, Error> {
        let id = campaign_id("campaign_id", &chunk.campaign_id)?;
        let recipients: Vec<Recipient> = chunk.recipients.iter().map(wire::recipient).collect();
        self.campaigns.add(ns, id, &recipients, "recipients").await
    }
}

fn campaign_id(field: &str, value: &str) -> Result<Uuid, Error> {
    rules::uuid(field, value, "campaign")
}

fn added(a: &Added) -> pb::AddRecipientsResponse {
    pb::AddRecipientsResponse {
        added: a.added as i32,
        duplicates: a.duplicates as i32,
        total: i64::from(a.total),
    }
}

#[tonic::async_trait]
impl CampaignService for CampaignApi {
    async fn create_campaign(
        &self,
        request: Request<pb::CreateCampaignRequest>,
    ) -> Result<Response<pb::Campaign>, Status> {
        let ns = namespace_of(&request)?;
        let pb::CreateCampaignRequest {
            campaign,
            recipients,
            idempotency_key,
        } = request.into_inner();
        let recipients: Vec<Recipient> = recipients.iter().map(wire::recipient).collect();
        let key = (!idempotency_key.is_empty()).then_some(idempotency_key.as_str());
        let view = self
            .campaigns
            .create(&ns, campaign.unwrap_or_default(), &recipients, key)
            .await?;
        Ok(Response::new(wire::campaign(&view)))
    }

    async fn add_recipients(
        &self,
        request: Request<pb::AddRecipientsRequest>,
    ) -> Result<Response<pb::AddRecipientsResponse>, Status> {
        let ns = namespace_of(&request)?;
        let a = self.add(&ns, request.get_ref()).await?;
        Ok(Response::new(added(&a)))
    }

    async fn stream_recipients(
        &self,
        request: Request<Streaming<pb::AddRecipientsRequest>>,
    ) -> Result<Response<pb::AddRecipientsResponse>, Status> {
        let ns = namespace_of(&request)?;
        let mut stream = crate::auth::rate::paced(request);
        let mut total = pb::AddRecipientsResponse::default();
        while let Some(chunk) = stream.message().await? {
            let r = added(&self.add(&ns, &chunk).await?);
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
        Ok(Response::new(wire::campaign(
            &self.campaigns.get(&ns, id).await?,
        )))
    }

    async fn list_campaigns(
        &self,
        request: Request<pb::ListCampaignsRequest>,
    ) -> Result<Response<pb::ListCampaignsResponse>, Status> {
        let ns = namespace_of(&request)?;
        let req = request.into_inner();
        let mut v = Violations::default();
        let mut states = Vec::new();
        for (i, s) in req.states.iter().enumerate() {
            match wire::state_from_wire(*s) {
                Some(state) => states.push(state),
                None => v.add(format!("states[{i}]"), "is not a campaign state"),
            }
        }
        let limit = match rules::page_size("page_size", req.page_size, 100) {
            Ok(n) => n,
            Err(_) => {
                v.add("page_size", "must be between 0 and 1000");
                100
            }
        };
        let mut before = None;
        if !req.page_token.is_empty() {
            match convert::page_key(&req.page_token).and_then(|b| Uuid::from_slice(&b).ok()) {
                Some(id) => before = Some(id),
                None => v.add("page_token", "is not a token returned by ListCampaigns"),
            }
        }
        v.into_result(())?;
        let views = self.campaigns.list(&ns, &states, before, limit + 1).await?;
        let page = Page::new(views, limit, |last| {
            convert::page_token(last.record.id.as_bytes())
        });
        let campaigns = page.rows().iter().map(wire::campaign).collect();
        let (campaigns, next_page_token) = page.answer(campaigns);
        Ok(Response::new(pb::ListCampaignsResponse {
            campaigns,
            next_page_token,
        }))
    }

    async fn pause_campaign(
        &self,
        request: Request<pb::PauseCampaignRequest>,
    ) -> Result<Response<pb::Campaign>, Status> {
        let ns = namespace_of(&request)?;
        let id = campaign_id("id", &request.get_ref().id)?;
        let view = self.campaigns.set_paused(&ns, id, true).await?;
        Ok(Response::new(wire::campaign(&view)))
    }

    async fn resume_campaign(
        &self,
        request: Request<pb::ResumeCampaignRequest>,
    ) -> Result<Response<pb::Campaign>, Status> {
        let ns = namespace_of(&request)?;
        let id = campaign_id("id", &request.get_ref().id)?;
        let view = self.campaigns.set_paused(&ns, id, false).await?;
        Ok(Response::new(wire::campaign(&view)))
    }

    async fn cancel_campaign(
        &self,
        request: Request<pb::CancelCampaignRequest>,
    ) -> Result<Response<pb::CancelCampaignResponse>, Status> {
        let ns = namespace_of(&request)?;
        let id = campaign_id("id", &request.get_ref().id)?;
        let s = self.campaigns.cancel(&ns, id).await?;
        Ok(Response::new(pb::CancelCampaignResponse {
            campaign: Some(wire::campaign(&s.campaign)),
            cancelled_scheduled: s.cancelled_scheduled,
            revoked: s.revoked,
            in_flight_at_cancel: s.in_flight_at_cancel,
        }))
    }
}
