//! Campaigns on the wire.

use herald_proto::v1 as pb;

use super::timestamp;
use crate::campaigns::{CampaignState, CampaignView, Recipient};

/// A wire recipient as a domain recipient.
pub fn recipient(r: &pb::CampaignRecipient) -> Recipient {
    Recipient {
        recipient: r.recipient.clone(),
        time_zone: r.time_zone.clone(),
        variables: r.variables.clone().into_iter().collect(),
    }
}

/// A wire campaign state as the domain's; None for UNSPECIFIED or unknown numbers.
pub fn state_from_wire(value: i32) -> Option<CampaignState> {
    Some(match pb::CampaignState::try_from(value).ok()? {
        pb::CampaignState::Unspecified => return None,
        pb::CampaignState::Active => CampaignState::Active,
        pb::CampaignState::Paused => CampaignState::Paused,
        pb::CampaignState::Cancelled => CampaignState::Cancelled,
        pb::CampaignState::Finished => CampaignState::Finished,
    })
}

/// A campaign with its progress on the wire.
pub fn campaign(c: &CampaignView) -> pb::Campaign {
    let state = match c.state {
        CampaignState::Active => pb::CampaignState::Active,
        CampaignState::Paused => pb::CampaignState::Paused,
        CampaignState::Cancelled => pb::CampaignState::Cancelled,
        CampaignState::Finished => pb::CampaignState::Finished,
    };
    let p = &c.progress;
    pb::Campaign {
        id: c.record.id.to_string(),
        spec: Some(c.spec.clone()),
        state: state as i32,
        progress: Some(pb::CampaignProgress {
            total: i64::from(c.record.recipient_count),
            scheduled: p.live,
            sent: p.succeeded,
            failed: p.failed,
            cancelled: p.cancelled,
            expired: p.expired,
            estimated_finish: c.estimated_finish.map(timestamp),
            delivery: Some(super::delivery_counts(&p.delivery)),
        }),
        created_at: Some(timestamp(c.record.created_at)),
        adding_audience: c.record.audience.pending,
        audience_error: c.record.audience.error.clone().unwrap_or_default(),
    }
}
