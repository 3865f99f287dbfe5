//! Audiences and contacts: wire ⇄ domain.

use herald_proto::v1 as pb;

use super::timestamp;
use crate::audiences::model::{AudienceRecord, Channel, Contact};
use crate::audiences::{Progress, RowError};

/// The audience a request defines (output-only fields ignored); an unset channel is reported
/// as `audience.channel`.
pub fn audience_spec(a: &pb::Audience) -> Result<AudienceRecord, crate::error::Error> {
    let channel = match pb::AudienceChannel::try_from(a.channel) {
        Ok(pb::AudienceChannel::Whatsapp) => Channel::WhatsApp,
        Ok(pb::AudienceChannel::Wecom) => Channel::WeCom,
        _ => {
            return Err(crate::error::Error::invalid(
                "audience.channel",
                "is required: WHATSAPP or WECOM",
            ))
        }
    };
    let now = chrono::Utc::now();
    Ok(AudienceRecord {
        id: a.id.clone(),
        description: a.description.clone(),
        channel,
        default_time_zone: if a.default_time_zone.is_empty() {
            "UTC".into()
        } else {
            a.default_time_zone.clone()
        },
        date_attributes: a.date_attributes.clone(),
        contact_count: 0,
        created_at: now,
        updated_at: now,
    })
}

/// A stored audience on the wire.
pub fn audience(a: &AudienceRecord) -> pb::Audience {
    pb::Audience {
        id: a.id.clone(),
        description: a.description.clone(),
        channel: match a.channel {
            Channel::WhatsApp => pb::AudienceChannel::Whatsapp,
            Channel::WeCom => pb::AudienceChannel::Wecom,
        } as i32,
        default_time_zone: a.default_time_zone.clone(),
        date_attributes: a.date_attributes.clone(),
        contact_count: a.contact_count,
        created_at: Some(timestamp(a.created_at)),
        updated_at: Some(timestamp(a.updated_at)),
    }
}

/// A contact from the wire (output-only fields ignored).
pub fn contact_spec(c: &pb::Contact) -> Contact {
    Contact {
        recipient: c.recipient.clone(),
        name: c.name.clone(),
        time_zone: c.time_zone.clone(),
        locale: c.locale.clone(),
        tags: c.tags.clone(),
        attributes: c.attributes.clone(),
        created_at: None,
        updated_at: None,
    }
}

/// A stored contact on the wire.
pub fn contact(c: &Contact) -> pb::Contact {
    pb::Contact {
        recipient: c.recipient.clone(),
        name: c.name.clone(),
        time_zone: c.time_zone.clone(),
        locale: c.locale.clone(),
        tags: c.tags.clone(),
        attributes: c.attributes.clone(),
        created_at: c.created_at.map(timestamp),
        updated_at: c.updated_at.map(timestamp),
    }
}

/// An import's progress on the wire.
pub fn progress(p: &Progress, done: bool) -> pb::ImportProgress {
    pb::ImportProgress {
        received: p.received,
        created: p.created,
        updated: p.updated,
        rejected: p.rejected,
        errors: p.errors.iter().map(row_error).collect(),
        done,
        contact_count: p.contact_count,
    }
}

fn row_error(e: &RowError) -> pb::ImportRowError {
    pb::ImportRowError {
        line: e.line,
        field: e.field.clone(),
        reason: e.reason.clone(),
    }
}
