//! Field rules every domain shares: names, namespaces, labels, time zones, wall-clock times.

use std::collections::BTreeMap;

use uuid::Uuid;

use crate::error::{Error, Violations};

/// Whether `name` can name a namespace: 1 to 64 of `a-z`, `0-9`, `-`, `_`, `.`. Namespaces
/// prefix route keys (`<namespace>/...`), so `/` and `:` are never allowed.
pub fn valid_namespace(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
}

/// Why a name (of a queue, pool, account, template or schedule) is invalid, if it is.
pub fn name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("is required");
    }
    if name.len() > 63 {
        return Some("must be at most 63 characters");
    }
    let first_ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let rest_ok = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'));
    if !first_ok || !rest_ok {
        return Some(
            "must be lower-case letters, digits, '.', '_' or '-', starting with a letter or digit",
        );
    }
    None
}

/// The name in `field`, or INVALID_ARGUMENT saying what is wrong with it.
pub fn name(field: &str, value: &str) -> Result<(), Error> {
    match name_problem(value) {
        Some(problem) => Err(Error::invalid(field, problem)),
        None => Ok(()),
    }
}

/// Parses an id field holding a UUID; `what` names the thing (`task`, `campaign`).
pub fn uuid(field: &str, value: &str, what: &str) -> Result<Uuid, Error> {
    value.parse().map_err(|_| {
        if value.is_empty() {
            Error::invalid(field, "is required")
        } else {
            Error::invalid(field, format!("is not a {what} id (a UUID)"))
        }
    })
}

/// Checks a label map: at most 32 entries, keys 1 to 63 characters, values at most 256, and
/// neither holding a NUL character (labels are stored as `jsonb`, which refuses `\u0000`).
pub fn labels(labels: &BTreeMap<String, String>, path: &str, v: &mut Violations) {
    if labels.len() > 32 {
        v.add(path, "must have at most 32 entries");
        return;
    }
    for (k, value) in labels {
        // The key is escaped in the path: a field name with a NUL in it would be one more
        // string PostgreSQL, a log line or a client chokes on.
        let field = format!("{path}[{}]", k.escape_debug());
        if k.is_empty() || k.chars().count() > 63 {
            v.add(field, "keys must be 1 to 63 characters");
        } else if value.chars().count() > 256 {
            v.add(field, "values must be at most 256 characters");
        } else if let Some(problem) = text_problem(k).or_else(|| text_problem(value)) {
            v.add(field, problem);
        }
    }
}

/// Why a free text (a note, a description, a name) cannot be stored, if it cannot: PostgreSQL
/// refuses NUL characters in `text` and `jsonb` alike.
pub fn text_problem(value: &str) -> Option<&'static str> {
    value
        .contains('\0')
        .then_some("must not contain NUL characters")
}

/// Why an idempotency key (of a task or a campaign) cannot be one, if it cannot: at most 200
/// characters of printable ASCII, so it fits an index and every client can print it.
pub fn idempotency_key_problem(key: &str) -> Option<&'static str> {
    if key.len() > 200 {
        Some("must be at most 200 characters")
    } else if key.chars().any(|c| !(' '..='~').contains(&c)) {
        Some("must be printable ASCII")
    } else {
        None
    }
}

/// The form two spellings of one recipient share: a phone number with and without its leading
/// `+` (WhatsApp takes both, and answers with the digits alone) is one person. The suppression
/// list compares recipients this way (`herald.recipient_key` in SQL), and so do the checks that keep
/// a campaign or a schedule from messaging one person twice.
pub fn recipient_key(recipient: &str) -> &str {
    recipient.trim_start_matches('+')
}

/// Whether `zone` is an IANA time zone name.
pub fn is_time_zone(zone: &str) -> bool {
    zone.parse::<chrono_tz::Tz>().is_ok()
}

/// Parses a wall-clock date-time, with or without seconds (`2026-12-24T09:00[:30]`).
pub fn parse_local_time(s: &str) -> Option<chrono::NaiveDateTime> {
    chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S")
        .or_else(|_| chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M"))
        .ok()
}

/// Parses a time of day written `HH:MM`.
pub fn parse_clock(s: &str) -> Option<chrono::NaiveTime> {
    chrono::NaiveTime::parse_from_str(s, "%H:%M").ok()
}

/// A protobuf timestamp (as requests and stored documents carry) as an instant; None when
/// malformed or outside the range protobuf's Timestamp allows (years 1 to 9999). PostgreSQL
/// stores that whole range; a year-200000 start time or deadline used to fail the statement
/// that stored it (found by fuzzing, #10).
pub fn timestamp(t: &prost_types::Timestamp) -> Option<chrono::DateTime<chrono::Utc>> {
    /// 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z.
    const SECONDS: std::ops::RangeInclusive<i64> = -62_135_596_800..=253_402_300_799;
    if !(0..1_000_000_000).contains(&t.nanos) || !SECONDS.contains(&t.seconds) {
        return None;
    }
    chrono::DateTime::from_timestamp(t.seconds, t.nanos as u32)
}

/// A page size: 0 means `default`, otherwise 1 to 1000.
pub fn page_size(field: &str, requested: i32, default: i64) -> Result<i64, Error> {
    match requested {
        0 => Ok(default),
        n @ 1..=1000 => Ok(i64::from(n)),
        _ => Err(Error::invalid(field, "must be between 0 and 1000")),
    }
}

/// A non-negative wire duration in milliseconds; None when negative or malformed.
pub fn duration_ms(d: &prost_types::Duration) -> Option<i64> {
    if d.seconds < 0 || d.nanos < 0 || d.nanos >= 1_000_000_000 {
        return None;
    }
    d.seconds
        .checked_mul(1000)?
        .checked_add(i64::from(d.nanos / 1_000_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_namespaces() {
        assert!(name_problem("wa-main.1").is_none());
        assert!(name_problem("").is_some());
        assert!(name_problem("Upper").is_some());
        assert!(name_problem(&"a".repeat(64)).is_some());
        assert!(valid_namespace("team-a"));
        assert!(!valid_namespace("team/a"));
    }

    #[test]
    fn local_times_with_or_without_seconds() {
        assert!(parse_local_time("2026-12-24T09:00").is_some());
        assert!(parse_local_time("2026-12-24T09:00:30").is_some());
        assert!(parse_local_time("2026-12-24 09:00").is_none());
    }
}
