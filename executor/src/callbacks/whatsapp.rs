//! Meta's WhatsApp webhook payloads (providers-media.md §1.5) as herald provider events.
//!
//! `{"object":"whatsapp_business_account","entry":[{"id":"<WABA id>","changes":[{"field":…,
//! "value":{…}}]}]}`; every entry, change, status and message is read, and anything not
//! understood is skipped (counted as ignored), never an error: Meta adds fields and events.
//!
//! - `messages` → `value.statuses[]`: one delivery report each (`sent` → ACCEPTED,
//!   `delivered`, `read`, `failed` → FAILED_AFTER_ACCEPTANCE with `errors[0]`), the task from
//!   `biz_opaque_callback_data`; `value.messages[]`: an inbound message for the account of
//!   `value.metadata.phone_number_id`.
//! - `phone_number_quality_update` (and `business_capability_update`): quality and messaging
//!   tier for the number named by `display_phone_number`, else every number of the WABA (tiers
//!   are per portfolio since 2025).
//! - `account_update`: DISABLED_UPDATE, ACCOUNT_RESTRICTION, ACCOUNT_DELETED,
//!   ACCOUNT_OFFBOARDED and PARTNER_APP_UNINSTALLED pause every number of the WABA;
//!   ACCOUNT_RECONNECTED (or a DISABLED_UPDATE whose ban state is REINSTATE) resumes them.

use herald_proto::v1 as pb;
use pb::provider_event::Kind;
use serde_json::Value;

use crate::client::truncate as cut;
use crate::senders::whatsapp::{parse_callback_data, WhatsAppNumber};

/// One configured WhatsApp number and the credentials_ref (account table) it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfiguredNumber {
    /// The `[accounts.<name>]` table.
    pub credentials_ref: String,
    /// Its identity in webhooks.
    pub number: WhatsAppNumber,
}

/// One event to forward, with the labels its metric is counted under.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// The event.
    pub event: pb::ProviderEvent,
    /// The webhook field it came from (`messages`, `account_update`, …).
    pub field: &'static str,
    /// What it is (`delivered`, `read`, `failed`, `inbound`, `standing`, `paused`, …).
    pub kind: &'static str,
}

/// The events of one payload, and how many items were skipped.
#[derive(Debug, Default, PartialEq)]
pub struct Events {
    /// The events to forward, in the payload's order.
    pub events: Vec<Parsed>,
    /// Items not understood or naming no configured number.
    pub ignored: usize,
}

/// Why a payload was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PayloadError {
    /// The body is not JSON.
    #[error("the body is not JSON: {0}")]
    NotJson(String),
    /// The JSON is not a WhatsApp Business Account webhook.
    #[error("not a whatsapp_business_account webhook (object {0:?})")]
    WrongObject(String),
}

/// Longest account state reason forwarded (the scheduler's limit).
const MAX_REASON_BYTES: usize = 1000;
/// Longest inbound sender or status recipient forwarded (the scheduler's limit).
const MAX_SENDER_BYTES: usize = 256;
/// Longest message id forwarded (the scheduler's limit); a longer one is left out, not cut,
/// since a cut id would match another.
const MAX_MESSAGE_ID_BYTES: usize = 512;
/// Longest error text forwarded (the scheduler's limit).
const MAX_ERROR_BYTES: usize = 4000;

/// The events of a verified POST body.
pub fn events(body: &[u8], numbers: &[ConfiguredNumber]) -> Result<Events, PayloadError> {
    let payload: Value =
        serde_json::from_slice(body).map_err(|e| PayloadError::NotJson(e.to_string()))?;
    let object = payload["object"].as_str().unwrap_or_default();
    if object != "whatsapp_business_account" {
        return Err(PayloadError::WrongObject(object.to_owned()));
    }
    let mut out = Events::default();
    for entry in array(&payload["entry"]) {
        let waba = text(&entry["id"]);
        for change in array(&entry["changes"]) {
            let value = &change["value"];
            match change["field"].as_str().unwrap_or_default() {
                "messages" => messages(value, numbers, &mut out),
                "phone_number_quality_update" => standing(
                    "phone_number_quality_update",
                    value,
                    waba.as_deref(),
                    numbers,
                    &mut out,
                ),
                "business_capability_update" => standing(
                    "business_capability_update",
                    value,
                    waba.as_deref(),
                    numbers,
                    &mut out,
                ),
                "account_update" => account_update(value, waba.as_deref(), numbers, &mut out),
                _ => out.ignored += 1,
            }
        }
    }
    Ok(out)
}

fn array(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// A string or number field as text, trimmed; None when absent or empty. NUL characters
/// (which PostgreSQL text cannot hold) are dropped.
fn text(v: &Value) -> Option<String> {
    let s = match v {
        Value::String(s) => s.trim().replace('\0', ""),
        Value::Number(n) => n.to_string(),
        _ => return None,
    };
    (!s.is_empty()).then_some(s)
}

/// A Unix-seconds timestamp (Meta sends strings); None outside the years 1 to 9999, the range
/// of a protobuf Timestamp, which the scheduler refuses a whole batch for (the event then
/// counts from when it arrives).
fn timestamp(v: &Value) -> Option<prost_types::Timestamp> {
    /// 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z.
    const SECONDS: std::ops::RangeInclusive<i64> = -62_135_596_800..=253_402_300_799;
    let seconds: i64 = text(v)?.parse().ok()?;
    SECONDS
        .contains(&seconds)
        .then_some(prost_types::Timestamp { seconds, nanos: 0 })
}

fn digits(s: &str) -> String {
    s.chars().filter(char::is_ascii_digit).collect()
}

fn by_phone_number_id<'a>(numbers: &'a [ConfiguredNumber], id: &str) -> Option<&'a str> {
    numbers
        .iter()
        .find(|n| n.number.phone_number_id == id)
        .map(|n| n.credentials_ref.as_str())
}

fn of_waba<'a>(numbers: &'a [ConfiguredNumber], waba: Option<&str>) -> Vec<&'a str> {
    numbers
        .iter()
        .filter(|n| waba.is_some() && n.number.waba_id.as_deref() == waba)
        .map(|n| n.credentials_ref.as_str())
        .collect()
}

impl Events {
    fn push(&mut self, kind: Kind, field: &'static str, label: &'static str) {
        self.events.push(Parsed {
            event: pb::ProviderEvent { kind: Some(kind) },
            field,
            kind: label,
        });
    }
}

fn messages(value: &Value, numbers: &[ConfiguredNumber], out: &mut Events) {
    for status in array(&value["statuses"]) {
        match delivery(status) {
            Some((event, kind)) => out.push(Kind::Delivery(event), "messages", kind),
            None => out.ignored += 1,
        }
    }
    let inbound = array(&value["messages"]);
    if inbound.is_empty() {
        return;
    }
    let account =
        text(&value["metadata"]["phone_number_id"]).and_then(|id| by_phone_number_id(numbers, &id));
    for message in inbound {
        // A sender past the scheduler's limit is no WhatsApp number: skipped, rather than
        // refused with the rest of the payload.
        let sender = text(&message["from"]).filter(|s| s.len() <= MAX_SENDER_BYTES);
        match (account, sender) {
            // A number this executor does not hold still forwards the message, without an
            // account: Meta posts every number's webhooks to one URL, which may reach any
            // executor, and a STOP acknowledged but dropped here would never come again.
            (account, Some(sender)) => out.push(
                Kind::Inbound(pb::InboundMessageEvent {
                    credentials_ref: account.unwrap_or_default().to_owned(),
                    sender,
                    received_at: timestamp(&message["timestamp"]),
                    r#type: text(&message["type"]).map_or_else(String::new, |t| cut(t, 64)),
                    text: reply_text(message).map_or_else(String::new, |t| cut(t, MAX_REPLY)),
                    provider_message_id: text(&message["id"])
                        .filter(|id| id.len() <= MAX_MESSAGE_ID_BYTES)
                        .unwrap_or_default(),
                }),
                "messages",
                "inbound",
            ),
            _ => out.ignored += 1,
        }
    }
}

/// Longest reply text forwarded (the scheduler's limit).
const MAX_REPLY: usize = 4096;

/// What a reply said, by its type: a text's body, a quick-reply button's text, an interactive
/// reply's title. None for media and the rest.
fn reply_text(message: &Value) -> Option<String> {
    match message["type"].as_str()? {
        "text" => text(&message["text"]["body"]),
        "button" => text(&message["button"]["text"]),
        "interactive" => text(&message["interactive"]["button_reply"]["title"])
            .or_else(|| text(&message["interactive"]["list_reply"]["title"])),
        _ => None,
    }
}

/// One `statuses[]` entry; None for a status herald does not track (e.g. `played`).
fn delivery(status: &Value) -> Option<(pb::DeliveryStatusEvent, &'static str)> {
    let (state, kind) = match status["status"].as_str()? {
        "sent" => (pb::DeliveryState::Accepted, "sent"),
        "delivered" => (pb::DeliveryState::Delivered, "delivered"),
        "read" => (pb::DeliveryState::Read, "read"),
        "failed" => (pb::DeliveryState::FailedAfterAcceptance, "failed"),
        _ => return None,
    };
    let provider_message_id = cut(text(&status["id"])?, 512);
    let (task_id, attempt) = text(&status["biz_opaque_callback_data"])
        .as_deref()
        .and_then(parse_callback_data)
        .map(|(t, a)| (t.to_owned(), a))
        .unwrap_or_default();
    let mut event = pb::DeliveryStatusEvent {
        provider_message_id,
        state: state as i32,
        occurred_at: timestamp(&status["timestamp"]),
        task_id,
        attempt,
        recipient: text(&status["recipient_id"])
            .map(|r| cut(r, MAX_SENDER_BYTES))
            .unwrap_or_default(),
        ..Default::default()
    };
    if state == pb::DeliveryState::FailedAfterAcceptance {
        let error = &status["errors"][0];
        event.error_code = error["code"].as_i64().unwrap_or_default();
        let mut parts: Vec<String> = [
            &error["title"],
            &error["message"],
            &error["error_data"]["details"],
        ]
        .into_iter()
        .filter_map(text)
        .collect();
        parts.dedup();
        event.error = cut(parts.join(": "), MAX_ERROR_BYTES);
    }
    Some((event, kind))
}

/// Meta's tier names and figures as herald's tiers; None for values herald does not act on
/// (`TIER_NOT_SET`, anything unknown).
fn tier(v: &Value) -> Option<pb::MessagingTier> {
    use pb::MessagingTier::*;
    if let Some(n) = v.as_i64() {
        return match n {
            -1 => Some(Unlimited),
            50 => Some(Limit50),
            250 => Some(Limit250),
            1_000 => Some(Limit1k),
            2_000 => Some(Limit2k),
            10_000 => Some(Limit10k),
            100_000 => Some(Limit100k),
            _ => None,
        };
    }
    match v.as_str()?.trim().to_ascii_uppercase().as_str() {
        "TIER_50" => Some(Limit50),
        "TIER_250" => Some(Limit250),
        "TIER_1K" => Some(Limit1k),
        "TIER_2K" => Some(Limit2k),
        "TIER_10K" => Some(Limit10k),
        "TIER_100K" => Some(Limit100k),
        "TIER_UNLIMITED" | "UNLIMITED" => Some(Unlimited),
        _ => None,
    }
}

fn standing(
    field: &'static str,
    value: &Value,
    waba: Option<&str>,
    numbers: &[ConfiguredNumber],
    out: &mut Events,
) {
    // The portfolio-level figure wins; `current_limit` goes away in 2026.
    let tier = tier(&value["max_daily_conversations_per_business"])
        .or_else(|| tier(&value["current_limit"]))
        .unwrap_or(pb::MessagingTier::Unspecified);
    let quality = [&value["quality_rating"], &value["quality"]]
        .into_iter()
        .filter_map(text)
        .map(|q| q.to_ascii_lowercase())
        .find(|q| matches!(q.as_str(), "green" | "yellow" | "red" | "unknown"))
        .unwrap_or_default();
    if tier == pb::MessagingTier::Unspecified && quality.is_empty() {
        out.ignored += 1;
        return;
    }
    let named = text(&value["display_phone_number"]).map(|n| digits(&n));
    let accounts: Vec<&str> = match &named {
        Some(n) => numbers
            .iter()
            .filter(|c| c.number.display_phone_number.as_deref() == Some(n.as_str()))
            .map(|c| c.credentials_ref.as_str())
            .collect(),
        None => of_waba(numbers, waba),
    };
    if accounts.is_empty() {
        out.ignored += 1;
    }
    for account in accounts {
        let standing = pb::AccountStandingEvent {
            credentials_ref: account.to_owned(),
            quality: quality.clone(),
            tier: tier as i32,
        };
        out.push(Kind::Standing(standing), field, "standing");
    }
}

/// `account_update` events that take the WABA's numbers out of service.
const PAUSING: &[&str] = &[
    "DISABLED_UPDATE",
    "ACCOUNT_RESTRICTION",
    "ACCOUNT_DELETED",
    "ACCOUNT_OFFBOARDED",
    "PARTNER_APP_UNINSTALLED",
];

fn account_update(
    value: &Value,
    waba: Option<&str>,
    numbers: &[ConfiguredNumber],
    out: &mut Events,
) {
    let event = text(&value["event"]).unwrap_or_default();
    let ban_state = text(&value["ban_info"]["waba_ban_state"]);
    let available = match event.as_str() {
        "DISABLED_UPDATE" if ban_state.as_deref() == Some("REINSTATE") => true,
        e if PAUSING.contains(&e) => false,
        "ACCOUNT_RECONNECTED" => true,
        _ => {
            out.ignored += 1;
            return;
        }
    };
    // The event and whatever details it carries, for the account's state reason.
    let details: Vec<String> = [
        "ban_info",
        "restriction_info",
        "violation_info",
        "lock_info",
    ]
    .into_iter()
    .filter(|k| !value[*k].is_null())
    .map(|k| format!("{k} {}", value[k]))
    .collect();
    let reason = if details.is_empty() {
        format!("account_update {event}")
    } else {
        format!("account_update {event} ({})", details.join(", "))
    };
    let reason = cut(reason.replace('\0', ""), MAX_REASON_BYTES);
    let accounts = of_waba(numbers, waba);
    if accounts.is_empty() {
        out.ignored += 1;
    }
    for account in accounts {
        let availability = pb::AccountAvailabilityEvent {
            credentials_ref: account.to_owned(),
            available,
            reason: reason.clone(),
        };
        let label = if available { "resumed" } else { "paused" };
        out.push(Kind::Availability(availability), "account_update", label);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    fn numbers() -> Vec<ConfiguredNumber> {
        vec![
            ConfiguredNumber {
                credentials_ref: "wa-1".into(),
                number: WhatsAppNumber {
                    phone_number_id: "1001".into(),
                    waba_id: Some("W1".into()),
                    display_phone_number: Some("15550001".into()),
                },
            },
            ConfiguredNumber {
                credentials_ref: "wa-2".into(),
                number: WhatsAppNumber {
                    phone_number_id: "1002".into(),
                    waba_id: Some("W1".into()),
                    display_phone_number: None,
                },
            },
        ]
    }

    fn parse(v: Value) -> Events {
        events(v.to_string().as_bytes(), &numbers()).unwrap()
    }

    fn change(field: &str, value: Value) -> Value {
        json!({"object":"whatsapp_business_account","entry":[{"id":"W1","changes":[
            {"field": field, "value": value}]}]})
    }

    #[test]
    fn every_status_of_every_entry_is_read() {
        let status = |id: &str, s: &str| {
            json!({"id": id, "status": s, "timestamp": "1750000000",
            "recipient_id": "1650", "biz_opaque_callback_data": "0190-task/2"})
        };
        let payload = json!({"object":"whatsapp_business_account","entry":[
            {"id":"W1","changes":[{"field":"messages","value":{"statuses":[
                status("wamid.A","delivered"), status("wamid.A","read"), status("wamid.A","played")]}}]},
            {"id":"W1","changes":[{"field":"messages","value":{"statuses":[
                {"id":"wamid.B","status":"failed","timestamp":"1750000001","errors":[{"code":131047,
                 "title":"Re-engagement message","message":"Re-engagement message",
                 "error_data":{"details":"more than 24 hours"}}]}]}}]}]});
        let out = parse(payload);
        assert_eq!(out.ignored, 1, "played is not tracked");
        let kinds: Vec<&str> = out.events.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, ["delivered", "read", "failed"]);
        let Some(pb::provider_event::Kind::Delivery(d)) = &out.events[0].event.kind else {
            panic!()
        };
        assert_eq!(
            (
                d.task_id.as_str(),
                d.attempt,
                d.provider_message_id.as_str(),
                d.recipient.as_str()
            ),
            ("0190-task", 2, "wamid.A", "1650")
        );
        assert_eq!(d.occurred_at.as_ref().unwrap().seconds, 1_750_000_000);
        let Some(pb::provider_event::Kind::Delivery(f)) = &out.events[2].event.kind else {
            panic!()
        };
        assert_eq!(f.error_code, 131047);
        assert_eq!(f.error, "Re-engagement message: more than 24 hours");
        assert!(f.task_id.is_empty());
        assert!(f.recipient.is_empty(), "no recipient_id, no recipient");
    }

    #[test]
    fn inbound_messages_name_their_number_when_this_executor_holds_it() {
        let value = |phone: &str| {
            json!({"metadata":{"phone_number_id": phone},
                   "messages":[{"from":"1650","id":"wamid.IN","timestamp":"1749416383","type":"text"}]})
        };
        let out = parse(change("messages", value("1002")));
        let Some(pb::provider_event::Kind::Inbound(m)) = &out.events[0].event.kind else {
            panic!("{out:?}")
        };
        assert_eq!(
            (m.credentials_ref.as_str(), m.sender.as_str()),
            ("wa-2", "1650")
        );
        assert_eq!((m.r#type.as_str(), m.text.as_str()), ("text", ""));
        assert_eq!(m.provider_message_id, "wamid.IN");
        // Another executor's number: still forwarded, for its opt-out, without an account.
        let out = parse(change("messages", value("9999")));
        assert_eq!(out.ignored, 0);
        let Some(pb::provider_event::Kind::Inbound(m)) = &out.events[0].event.kind else {
            panic!("{out:?}")
        };
        assert_eq!(
            (m.credentials_ref.as_str(), m.sender.as_str()),
            ("", "1650")
        );
    }

    #[test]
    fn quality_updates_read_both_tier_forms() {
        let out = parse(change(
            "phone_number_quality_update",
            json!({"display_phone_number":"1 555-0001","event":"UPGRADE","current_limit":"TIER_1K",
                   "max_daily_conversations_per_business":"TIER_2K"}),
        ));
        let Some(pb::provider_event::Kind::Standing(s)) = &out.events[0].event.kind else {
            panic!("{out:?}")
        };
        assert_eq!(s.credentials_ref, "wa-1");
        assert_eq!(s.tier, pb::MessagingTier::Limit2k as i32);
        // The old form alone, a quality and no number: every number of the WABA.
        let out = parse(change(
            "phone_number_quality_update",
            json!({"event":"FLAGGED","current_limit":"TIER_50","quality_rating":"RED"}),
        ));
        assert_eq!(out.events.len(), 2);
        let Some(pb::provider_event::Kind::Standing(s)) = &out.events[1].event.kind else {
            panic!()
        };
        assert_eq!(
            (s.tier, s.quality.as_str()),
            (pb::MessagingTier::Limit50 as i32, "red")
        );
        // Unknown and NOT_SET values are informational.
        let out = parse(change(
            "phone_number_quality_update",
            json!({"display_phone_number":"15550001","current_limit":"TIER_NOT_SET"}),
        ));
        assert_eq!((out.events.len(), out.ignored), (0, 1));
    }

    #[test]
    fn account_updates_pause_and_resume_the_wabas_numbers() {
        let out = parse(change(
            "account_update",
            json!({"event":"DISABLED_UPDATE","ban_info":{"waba_ban_state":"DISABLE"}}),
        ));
        assert_eq!(out.events.len(), 2);
        let Some(pb::provider_event::Kind::Availability(a)) = &out.events[0].event.kind else {
            panic!()
        };
        assert!(!a.available);
        assert!(
            a.reason
                .starts_with("account_update DISABLED_UPDATE (ban_info"),
            "{}",
            a.reason
        );
        let out = parse(change(
            "account_update",
            json!({"event":"ACCOUNT_RECONNECTED"}),
        ));
        assert_eq!(out.events[0].kind, "resumed");
        let out = parse(change(
            "account_update",
            json!({"event":"ACCOUNT_VIOLATION"}),
        ));
        assert_eq!((out.events.len(), out.ignored), (0, 1));
    }

    #[test]
    fn other_objects_and_bad_json_are_refused() {
        assert!(matches!(
            events(b"{\"object\":\"page\"}", &[]),
            Err(PayloadError::WrongObject(_))
        ));
        assert!(matches!(
            events(b"not json", &[]),
            Err(PayloadError::NotJson(_))
        ));
    }
}
