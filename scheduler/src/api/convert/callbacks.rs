//! Provider events (RecordProviderEvents) in, a task's delivery out.

use herald_proto::v1 as pb;

use super::{from_timestamp, timestamp};
use crate::api::convert::accounts::tier_limit;
use crate::callbacks::{Delivery, DeliveryState, ProviderEvent, StatusReport};
use crate::error::{Error, Violations};

/// Most events in one RecordProviderEvents call.
pub const MAX_EVENTS: usize = 1000;
/// Longest provider message id.
const MAX_MESSAGE_ID_BYTES: usize = 512;
/// Longest error text kept per report.
const MAX_ERROR_BYTES: usize = 4096;
/// Longest account state reason from a provider.
const MAX_REASON_BYTES: usize = 1024;
/// Longest credentials_ref, as in Hello.credentials_refs.
const MAX_REF_BYTES: usize = 128;
/// Longest recipient, as in TaskSpec.recipient.
const MAX_RECIPIENT_BYTES: usize = 256;
/// Longest inbound message type.
const MAX_TYPE_BYTES: usize = 64;
/// Longest inbound message text kept.
const MAX_REPLY_BYTES: usize = 4096;

/// The events of a request, checked; INVALID_ARGUMENT names every bad field.
pub fn events(req: &pb::RecordProviderEventsRequest) -> Result<Vec<ProviderEvent>, Error> {
    if req.events.is_empty() || req.events.len() > MAX_EVENTS {
        return Err(Error::invalid(
            "events",
            format!("must hold 1 to {MAX_EVENTS} events"),
        ));
    }
    let mut v = Violations::default();
    let events = req
        .events
        .iter()
        .enumerate()
        .filter_map(|(i, e)| event(e, &format!("events[{i}]"), &mut v))
        .collect();
    v.into_result(events)
}

/// Text that PostgreSQL can store, `1..=max` bytes (or empty when `optional`).
fn text(v: &mut Violations, path: String, value: &str, max: usize, optional: bool) -> String {
    if value.contains('\0') {
        v.add(path, "must not contain NUL characters");
    } else if value.len() > max || (!optional && value.is_empty()) {
        let least = if optional { 0 } else { 1 };
        v.add(path, format!("must be {least} to {max} bytes"));
    }
    value.to_owned()
}

/// An event's `credentials_ref`, checked.
fn credentials_ref(v: &mut Violations, path: &str, value: &str) -> String {
    text(
        v,
        format!("{path}.credentials_ref"),
        value,
        MAX_REF_BYTES,
        false,
    )
}

fn time(
    v: &mut Violations,
    path: String,
    t: &Option<prost_types::Timestamp>,
) -> Option<chrono::DateTime<chrono::Utc>> {
    let t = t.as_ref()?;
    let parsed = from_timestamp(t);
    if parsed.is_none() {
        v.add(path, "is not a valid timestamp");
    }
    parsed
}

fn event(e: &pb::ProviderEvent, path: &str, v: &mut Violations) -> Option<ProviderEvent> {
    use pb::provider_event::Kind;
    let Some(kind) = &e.kind else {
        v.add(path, "names no event kind");
        return None;
    };
    Some(match kind {
        Kind::Delivery(d) => {
            let path = format!("{path}.delivery");
            let state = match pb::DeliveryState::try_from(d.state) {
                Ok(pb::DeliveryState::Accepted) => DeliveryState::Accepted,
                Ok(pb::DeliveryState::Delivered) => DeliveryState::Delivered,
                Ok(pb::DeliveryState::Read) => DeliveryState::Read,
                Ok(pb::DeliveryState::FailedAfterAcceptance) => {
                    DeliveryState::FailedAfterAcceptance
                }
                _ => {
                    v.add(format!("{path}.state"), "is not a delivery state");
                    return None;
                }
            };
            let error = text(v, format!("{path}.error"), &d.error, MAX_ERROR_BYTES, true);
            let recipient = text(
                v,
                format!("{path}.recipient"),
                &d.recipient,
                MAX_RECIPIENT_BYTES,
                true,
            );
            ProviderEvent::Delivery(StatusReport {
                provider_message_id: text(
                    v,
                    format!("{path}.provider_message_id"),
                    &d.provider_message_id,
                    MAX_MESSAGE_ID_BYTES,
                    false,
                ),
                state,
                // Callback data from elsewhere (another installation, a hand-made send) names
                // no task of ours: the message id may still find it.
                task_id: d.task_id.parse().ok(),
                attempt: (d.attempt > 0).then_some(d.attempt),
                occurred_at: time(v, format!("{path}.occurred_at"), &d.occurred_at),
                error_code: (d.error_code != 0).then_some(d.error_code),
                error: (!error.is_empty()).then_some(error),
                recipient: (!recipient.is_empty()).then_some(recipient),
            })
        }
        Kind::Standing(s) => {
            let path = format!("{path}.standing");
            let quality = match s.quality.to_ascii_lowercase().as_str() {
                "" => None,
                q @ ("green" | "yellow" | "red" | "unknown") => Some(q.to_owned()),
                _ => {
                    v.add(
                        format!("{path}.quality"),
                        "must be green, yellow, red or unknown",
                    );
                    None
                }
            };
            let tier = (s.tier != pb::MessagingTier::Unspecified as i32)
                .then(|| tier_limit(s.tier, &format!("{path}.tier"), v));
            ProviderEvent::Standing {
                credentials_ref: credentials_ref(v, &path, &s.credentials_ref),
                quality,
                tier,
            }
        }
        Kind::Availability(a) => {
            let path = format!("{path}.availability");
            ProviderEvent::Availability {
                credentials_ref: credentials_ref(v, &path, &a.credentials_ref),
                available: a.available,
                reason: text(
                    v,
                    format!("{path}.reason"),
                    &a.reason,
                    MAX_REASON_BYTES,
                    false,
                ),
            }
        }
        Kind::Inbound(m) => {
            let path = format!("{path}.inbound");
            ProviderEvent::Inbound {
                // Empty: written to a number the forwarding executor does not hold. Its
                // opt-out still counts (the list is the namespace's); no window is recorded.
                credentials_ref: text(
                    v,
                    format!("{path}.credentials_ref"),
                    &m.credentials_ref,
                    MAX_REF_BYTES,
                    true,
                ),
                sender: text(
                    v,
                    format!("{path}.sender"),
                    &m.sender,
                    MAX_RECIPIENT_BYTES,
                    false,
                ),
                received_at: time(v, format!("{path}.received_at"), &m.received_at),
                kind: if m.r#type.is_empty() {
                    "unknown".to_owned()
                } else {
                    text(v, format!("{path}.type"), &m.r#type, MAX_TYPE_BYTES, false)
                },
                text: (!m.text.is_empty())
                    .then(|| text(v, format!("{path}.text"), &m.text, MAX_REPLY_BYTES, false)),
                provider_message_id: (!m.provider_message_id.is_empty()).then(|| {
                    text(
                        v,
                        format!("{path}.provider_message_id"),
                        &m.provider_message_id,
                        MAX_MESSAGE_ID_BYTES,
                        false,
                    )
                }),
            }
        }
    })
}

/// A task's delivery on the wire.
pub fn delivery(d: &Delivery) -> pb::Delivery {
    pb::Delivery {
        state: match d.state {
            DeliveryState::Accepted => pb::DeliveryState::Accepted,
            DeliveryState::Delivered => pb::DeliveryState::Delivered,
            DeliveryState::Read => pb::DeliveryState::Read,
            DeliveryState::FailedAfterAcceptance => pb::DeliveryState::FailedAfterAcceptance,
        } as i32,
        provider_message_id: d.provider_message_id.clone(),
        accepted_at: d.accepted_at.map(timestamp),
        delivered_at: d.delivered_at.map(timestamp),
        read_at: d.read_at.map(timestamp),
        failed_at: d.failed_at.map(timestamp),
        error_code: d.error_code.unwrap_or_default(),
        error: d.error.clone().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn delivery_event(id: &str, state: pb::DeliveryState, task: &str) -> pb::ProviderEvent {
        pb::ProviderEvent {
            kind: Some(pb::provider_event::Kind::Delivery(
                pb::DeliveryStatusEvent {
                    provider_message_id: id.into(),
                    state: state as i32,
                    task_id: task.into(),
                    ..Default::default()
                },
            )),
        }
    }

    #[test]
    fn bad_events_are_named_and_foreign_task_ids_ignored() {
        let req = pb::RecordProviderEventsRequest {
            events: vec![
                delivery_event("wamid.1", pb::DeliveryState::Read, "job-42/attempt-1"),
                delivery_event("", pb::DeliveryState::Delivered, ""),
                delivery_event("wamid.2", pb::DeliveryState::Unspecified, ""),
                pb::ProviderEvent { kind: None },
            ],
        };
        let Err(Error::InvalidArgument(v)) = events(&req) else {
            panic!("accepted")
        };
        let fields: Vec<&str> = v.iter().map(|v| v.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "events[1].delivery.provider_message_id",
                "events[2].delivery.state",
                "events[3]"
            ]
        );
        let ok = events(&pb::RecordProviderEventsRequest {
            events: vec![delivery_event(
                "wamid.1",
                pb::DeliveryState::Read,
                "job-42/attempt-1",
            )],
        })
        .unwrap();
        assert!(
            matches!(&ok[0], ProviderEvent::Delivery(r) if r.task_id.is_none()),
            "{ok:?}"
        );
        assert!(events(&pb::RecordProviderEventsRequest { events: vec![] }).is_err());
    }
}
