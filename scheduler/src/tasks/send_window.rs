//! A recipient-local send window: when, in the recipient's own time zone, a task may be sent.
//! What the claim does with it lives in SQL (`store/tasks/functions.sql`).

use chrono::NaiveTime;
use herald_proto::v1 as pb;

use crate::error::Violations;
use crate::rules;

/// A recipient-local send window (see task.proto's `SendWindow`).
#[derive(Debug, Clone, PartialEq)]
pub struct SendWindow {
    /// Opening, inclusive, local time.
    pub start: NaiveTime,
    /// Closing, exclusive; earlier than start when the window spans midnight.
    pub end: NaiveTime,
    /// The recipient's IANA time zone.
    pub zone: String,
    /// How long after the opening held tasks are spread over, in milliseconds.
    pub spread_ms: i64,
}

impl SendWindow {
    /// The default spread: half an hour.
    pub const DEFAULT_SPREAD_MS: i64 = 1_800_000;

    /// A wire window checked under `path`; `default_zone` applies when it names none.
    pub fn from_wire(
        w: &pb::SendWindow,
        default_zone: &str,
        path: &str,
        v: &mut Violations,
    ) -> Option<SendWindow> {
        let f = |name: &str| format!("{path}.{name}");
        let start = rules::parse_clock(&w.start);
        let end = rules::parse_clock(&w.end);
        if start.is_none() {
            v.add(f("start"), "must be HH:MM");
        }
        if end.is_none() {
            v.add(f("end"), "must be HH:MM");
        }
        if start.is_some() && start == end {
            v.add(f("end"), "must differ from start");
        }
        let zone = match (w.time_zone.as_str(), default_zone) {
            ("", "") => "UTC",
            ("", zone) => zone,
            (zone, _) => zone,
        };
        if !rules::is_time_zone(zone) {
            v.add(f("time_zone"), "is not an IANA time zone name");
        }
        let spread_ms = match &w.spread {
            None => Self::DEFAULT_SPREAD_MS,
            Some(d) => d
                .seconds
                .saturating_mul(1000)
                .saturating_add(i64::from(d.nanos) / 1_000_000),
        };
        if !(0..=86_400_000).contains(&spread_ms) {
            v.add(f("spread"), "must be between 0 and 24 hours");
        } else if let (Some(s), Some(e), Some(_)) = (start, end, &w.spread) {
            // As the proto says: a spread past the closing would be cut there silently. The
            // default is cut to a short window's length instead, since nobody asked for it.
            let length_ms = (e - s).num_milliseconds().rem_euclid(86_400_000);
            if spread_ms > length_ms {
                v.add(f("spread"), "must be at most the window's length");
            }
        }
        Some(SendWindow {
            start: start?,
            end: end?,
            zone: zone.to_owned(),
            spread_ms,
        })
    }

    /// The window stored in a task's columns, if it has one.
    pub fn from_columns(
        start: Option<NaiveTime>,
        end: Option<NaiveTime>,
        zone: Option<String>,
        spread_ms: Option<i64>,
    ) -> Option<SendWindow> {
        Some(SendWindow {
            start: start?,
            end: end?,
            zone: zone.unwrap_or_else(|| "UTC".into()),
            spread_ms: spread_ms.unwrap_or(Self::DEFAULT_SPREAD_MS),
        })
    }

    /// The window on the wire.
    pub fn to_wire(&self) -> pb::SendWindow {
        pb::SendWindow {
            start: self.start.format("%H:%M").to_string(),
            end: self.end.format("%H:%M").to_string(),
            time_zone: self.zone.clone(),
            spread: Some(prost_types::Duration {
                seconds: self.spread_ms / 1000,
                nanos: ((self.spread_ms % 1000) * 1_000_000) as i32,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(start: &str, end: &str, spread_s: Option<i64>) -> pb::SendWindow {
        pb::SendWindow {
            start: start.into(),
            end: end.into(),
            time_zone: "Asia/Shanghai".into(),
            spread: spread_s.map(|seconds| prost_types::Duration { seconds, nanos: 0 }),
        }
    }

    fn fields(w: &pb::SendWindow) -> Vec<String> {
        let mut v = Violations::default();
        SendWindow::from_wire(w, "", "task.send_window", &mut v);
        v.as_slice().iter().map(|f| f.field.clone()).collect()
    }

    /// A spread is at most the window's length, as the proto says (two hours over a one-hour
    /// window were accepted and cut at the closing); across midnight the length wraps. Left
    /// out, the default half hour is cut to a short window, not refused.
    #[test]
    fn a_spread_past_the_windows_length_is_refused() {
        assert_eq!(
            fields(&window("09:00", "10:00", Some(7200))),
            ["task.send_window.spread"]
        );
        assert!(fields(&window("09:00", "10:00", Some(3600))).is_empty());
        assert!(fields(&window("23:00", "01:00", Some(7200))).is_empty());
        assert_eq!(
            fields(&window("23:00", "01:00", Some(7300))),
            ["task.send_window.spread"]
        );
        assert!(fields(&window("09:00", "09:10", None)).is_empty());
    }
}
