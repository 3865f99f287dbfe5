//! What an audience and a contact are, and the rules each must meet when written.

use std::collections::BTreeMap;

use chrono::{DateTime, Datelike, NaiveDate, Utc};

use crate::error::Violations;
use crate::rules;

/// Most contacts one audience holds.
pub const MAX_CONTACTS: i64 = 1_000_000;
/// Most tags on one contact.
const MAX_TAGS: usize = 50;
/// Most attributes on one contact.
const MAX_ATTRIBUTES: usize = 50;
/// Longest attribute value, in characters.
const MAX_ATTRIBUTE_CHARS: usize = 1_024;
/// Longest display name, in characters.
const MAX_NAME_CHARS: usize = 200;
/// Longest audience description, in characters.
const MAX_DESCRIPTION_CHARS: usize = 1_000;

/// The channel an audience's recipients belong to: it decides what a recipient must look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// E.164 numbers.
    WhatsApp,
    /// WeCom user ids.
    WeCom,
}

impl Channel {
    /// Its stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::WhatsApp => "whatsapp",
            Channel::WeCom => "wecom",
        }
    }

    /// The channel of a stored name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "whatsapp" => Some(Channel::WhatsApp),
            "wecom" => Some(Channel::WeCom),
            _ => None,
        }
    }

    /// Why `recipient` is not a recipient of this channel, if it is not.
    pub fn recipient_problem(self, recipient: &str) -> Option<&'static str> {
        match self {
            Channel::WhatsApp => {
                let digits = recipient.strip_prefix('+').unwrap_or("");
                let ok = (8..=15).contains(&digits.len())
                    && digits.bytes().all(|b| b.is_ascii_digit())
                    && !digits.starts_with('0');
                (!ok).then_some("must be an E.164 number: + and 8 to 15 digits, the first not 0")
            }
            Channel::WeCom => {
                let ok = (1..=64).contains(&recipient.len())
                    && recipient
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"_-.@".contains(&b));
                (!ok).then_some("must be a WeCom user id: 1 to 64 letters, digits, _, -, . or @")
            }
        }
    }
}

/// An audience as stored.
#[derive(Debug, Clone)]
pub struct AudienceRecord {
    /// Id.
    pub id: String,
    /// Description.
    pub description: String,
    /// Its recipients' channel.
    pub channel: Channel,
    /// Zone of contacts without one.
    pub default_time_zone: String,
    /// Attributes that hold dates.
    pub date_attributes: Vec<String>,
    /// Contacts held.
    pub contact_count: i64,
    /// Created.
    pub created_at: DateTime<Utc>,
    /// Last change.
    pub updated_at: DateTime<Utc>,
}

impl AudienceRecord {
    /// Checks a new audience under `path` (`audience`); violations are recorded in `v`.
    pub fn check(&self, path: &str, v: &mut Violations) {
        if let Some(p) = rules::name_problem(&self.id) {
            v.add(format!("{path}.id"), p);
        }
        if self.description.chars().count() > MAX_DESCRIPTION_CHARS {
            v.add(
                format!("{path}.description"),
                "is longer than 1,000 characters",
            );
        }
        if !rules::is_time_zone(&self.default_time_zone) {
            v.add(
                format!("{path}.default_time_zone"),
                "is not an IANA time zone name",
            );
        }
        for (i, a) in self.date_attributes.iter().enumerate() {
            if let Some(p) = attribute_name_problem(a) {
                v.add(format!("{path}.date_attributes[{i}]"), p);
            }
        }
    }
}

/// A contact as written and stored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Contact {
    /// Recipient, in the channel's form.
    pub recipient: String,
    /// Display name.
    pub name: String,
    /// IANA zone; empty for the audience's.
    pub time_zone: String,
    /// Locale; may be empty.
    pub locale: String,
    /// Tags.
    pub tags: Vec<String>,
    /// Attributes.
    pub attributes: BTreeMap<String, String>,
    /// Created (stored contacts only).
    pub created_at: Option<DateTime<Utc>>,
    /// Last change (stored contacts only).
    pub updated_at: Option<DateTime<Utc>>,
}

impl Contact {
    /// Checks the contact against `audience`'s rules; violations name fields under `path`
    /// (`contact`, or empty for an import row whose fields are reported bare).
    pub fn check(&self, audience: &AudienceRecord, path: &str, v: &mut Violations) {
        let field = |f: &str| {
            if path.is_empty() {
                f.to_string()
            } else {
                format!("{path}.{f}")
            }
        };
        if self.recipient.is_empty() {
            v.add(field("recipient"), "is required");
        } else if let Some(p) = audience.channel.recipient_problem(&self.recipient) {
            v.add(field("recipient"), p);
        }
        if self.name.chars().count() > MAX_NAME_CHARS {
            v.add(field("name"), "is longer than 200 characters");
        } else if let Some(p) = rules::text_problem(&self.name) {
            v.add(field("name"), p);
        }
        if !self.time_zone.is_empty() && !rules::is_time_zone(&self.time_zone) {
            v.add(field("time_zone"), "is not an IANA time zone name");
        }
        if !self.locale.is_empty() && !is_locale(&self.locale) {
            v.add(
                field("locale"),
                "is not a locale such as en, de-CH or zh_CN",
            );
        }
        if self.tags.len() > MAX_TAGS {
            v.add(field("tags"), "holds more than 50 tags");
        }
        for (i, t) in self.tags.iter().enumerate() {
            if let Some(p) = tag_problem(t) {
                v.add(field(&format!("tags[{i}]")), p);
            }
        }
        if self.attributes.len() > MAX_ATTRIBUTES {
            v.add(field("attributes"), "holds more than 50 attributes");
        }
        for (k, value) in &self.attributes {
            if let Some(p) = attribute_name_problem(k) {
                v.add(field(&format!("attributes.{k}")), p);
            } else if value.chars().count() > MAX_ATTRIBUTE_CHARS {
                v.add(
                    field(&format!("attributes.{k}")),
                    "is longer than 1,024 characters",
                );
            } else if let Some(p) = rules::text_problem(value) {
                v.add(field(&format!("attributes.{k}")), p);
            } else if audience.date_attributes.contains(k) && MonthDay::parse(value).is_none() {
                v.add(
                    field(&format!("attributes.{k}")),
                    "is not a date: YYYY-MM-DD or MM-DD",
                );
            }
        }
    }

    /// Its zone, or the audience's default when it has none.
    pub fn zone_or<'a>(&'a self, default: &'a str) -> &'a str {
        if self.time_zone.is_empty() {
            default
        } else {
            &self.time_zone
        }
    }
}

/// Why `tag` is not a tag, if it is not.
pub fn tag_problem(tag: &str) -> Option<&'static str> {
    let ok = (1..=64).contains(&tag.len())
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b));
    (!ok).then_some("must be 1 to 64 letters, digits, _, -, . or :")
}

/// Why `name` is not an attribute name, if it is not: names are template variables too.
pub fn attribute_name_problem(name: &str) -> Option<&'static str> {
    let ok = (1..=64).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    (!ok).then_some("must be 1 to 64 letters, digits and _, not starting with a digit")
}

fn is_locale(s: &str) -> bool {
    let mut parts = s.split(['-', '_']);
    let first_ok = parts
        .next()
        .is_some_and(|p| (2..=3).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_alphabetic()));
    first_ok
        && s.len() <= 35
        && parts.all(|p| (2..=8).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// A date attribute's month and day: what "is today" compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MonthDay {
    /// 1 to 12.
    pub month: u32,
    /// 1 to 31.
    pub day: u32,
}

impl MonthDay {
    /// Parses `YYYY-MM-DD` or `MM-DD` (29 February is accepted without a year).
    pub fn parse(s: &str) -> Option<Self> {
        let date = match s.len() {
            10 => NaiveDate::parse_from_str(s, "%Y-%m-%d").ok()?,
            // A leap year, so 02-29 is a date.
            5 => NaiveDate::parse_from_str(&format!("2000-{s}"), "%Y-%m-%d").ok()?,
            _ => return None,
        };
        Some(MonthDay {
            month: date.month(),
            day: date.day(),
        })
    }

    /// The month and day of `date`.
    pub fn of(date: NaiveDate) -> Self {
        MonthDay {
            month: date.month(),
            day: date.day(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn audience(channel: Channel) -> AudienceRecord {
        AudienceRecord {
            id: "staff".into(),
            description: String::new(),
            channel,
            default_time_zone: "UTC".into(),
            date_attributes: vec!["birthday".into()],
            contact_count: 0,
            created_at: Utc::now(),
            updated_at: Utc::now(),
        }
    }

    fn fields(c: &Contact, a: &AudienceRecord) -> Vec<String> {
        let mut v = Violations::default();
        c.check(a, "contact", &mut v);
        v.into_fields()
    }

    #[test]
    fn recipients_follow_the_audience_channel() {
        let wa = audience(Channel::WhatsApp);
        let wecom = audience(Channel::WeCom);
        let c = |r: &str| Contact {
            recipient: r.into(),
            ..Default::default()
        };
        assert!(fields(&c("+4915112345678"), &wa).is_empty());
        assert_eq!(fields(&c("4915112345678"), &wa), vec!["contact.recipient"]);
        assert_eq!(fields(&c("+0123456789"), &wa), vec!["contact.recipient"]);
        assert!(fields(&c("zhang.san@corp"), &wecom).is_empty());
        assert_eq!(fields(&c("zhang san"), &wecom), vec!["contact.recipient"]);
    }

    #[test]
    fn each_bad_field_is_named() {
        let a = audience(Channel::WeCom);
        let c = Contact {
            recipient: "ann".into(),
            time_zone: "Mars/Olympus".into(),
            locale: "english!".into(),
            tags: vec!["ok".into(), "not ok".into()],
            attributes: [
                ("birthday".to_string(), "13-45".to_string()),
                ("1st".to_string(), "x".to_string()),
            ]
            .into(),
            ..Default::default()
        };
        assert_eq!(
            fields(&c, &a),
            vec![
                "contact.time_zone",
                "contact.locale",
                "contact.tags[1]",
                "contact.attributes.1st",
                "contact.attributes.birthday"
            ]
        );
    }

    #[test]
    fn dates_with_or_without_a_year() {
        assert_eq!(
            MonthDay::parse("1990-03-07"),
            Some(MonthDay { month: 3, day: 7 })
        );
        assert_eq!(
            MonthDay::parse("02-29"),
            Some(MonthDay { month: 2, day: 29 })
        );
        assert_eq!(MonthDay::parse("1990-02-30"), None);
        assert_eq!(MonthDay::parse("3-7"), None);
        assert!(is_locale("zh_CN") && is_locale("de-CH") && is_locale("en"));
    }
}
