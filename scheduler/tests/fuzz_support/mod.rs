//! Strategies shared by the fuzz targets (`fuzz_*.rs`): wire values that are mostly plausible
//! and often hostile (unicode, control characters, huge, empty, out-of-range numbers, unknown
//! enum values), so both the accepting and the rejecting paths are exercised.

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;

use chrono::Utc;
use proptest::prelude::*;
use proptest::test_runner::Config;

/// Cases per property: `PROPTEST_CASES` when set, else `default` (kept small so the whole fuzz
/// set runs in seconds inside `script/test`).
pub fn config(default: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    Config {
        cases,
        ..Config::default()
    }
}

/// Any string a client could send: plausible names, arbitrary unicode, control characters,
/// whitespace, and very long ones.
pub fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z0-9][a-z0-9._-]{0,12}",
        3 => any::<String>(),
        1 => Just(String::new()),
        1 => Just(" \t".to_string()),
        1 => "[\\x00-\\x1f\\x7f]{1,4}",
        1 => "\\PC{0,80}",
        1 => (0usize..4, 50usize..70_000).prop_map(|(c, n)| ["x", "é", "🦀", "\u{0}"][c].repeat(n)),
    ]
}

/// A short string, for map keys and list items where a huge one would only slow the run.
pub fn short_text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z0-9][a-z0-9._-]{0,12}",
        2 => any::<String>().prop_map(|s| s.chars().take(20).collect()),
        1 => Just(String::new()),
        1 => Just("herald.x".to_string()),
        1 => (0usize..3, 60usize..300).prop_map(|(c, n)| ["k", "ü", "🦀"][c].repeat(n)),
    ]
}

/// A string map (labels, template variables).
pub fn string_map() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop_oneof![
        3 => Just(BTreeMap::new()),
        3 => prop::collection::btree_map(short_text(), short_text(), 0..5),
        1 => prop::collection::btree_map(short_text(), text(), 0..40),
    ]
}

/// An enum field: known values and unknown ones.
pub fn enum_value() -> impl Strategy<Value = i32> {
    prop_oneof![4 => 0..8i32, 1 => any::<i32>()]
}

/// An optional int32: unset, small, or anything.
pub fn opt_i32() -> impl Strategy<Value = Option<i32>> {
    prop_oneof![
        3 => Just(None),
        3 => (-2..12i32).prop_map(Some),
        1 => any::<i32>().prop_map(Some),
    ]
}

/// A float: ordinary, edge and non-finite values.
pub fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        3 => -1.0f64..12.0,
        1 => any::<f64>(),
        1 => prop::sample::select(vec![0.0, -0.0, 1.0, 10.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, f64::MIN_POSITIVE, f64::MAX]),
    ]
}

/// Seconds at the edges of what protobuf, chrono and i64 allow.
fn edge_seconds() -> impl Strategy<Value = i64> {
    prop::sample::select(vec![
        i64::MIN,
        i64::MIN + 1,
        -1,
        0,
        i64::MAX,
        i64::MAX / 1000,
        i64::MAX / 1000 + 1,
        -62_135_596_800, // 0001-01-01
        253_402_300_799, // 9999-12-31T23:59:59
        253_402_300_800,
        -62_135_596_801,
        6_000_000_000_000, // year ~190000: chrono can, PostgreSQL cannot
        8_210_266_876_799, // about chrono's latest instant
        -8_334_601_228_800,
    ])
}

/// Nanos: valid, negative, just out of range, anything.
fn nanos() -> impl Strategy<Value = i32> {
    prop_oneof![
        3 => 0..1_000_000_000i32,
        1 => prop::sample::select(vec![0, -1, 999_999_999, 1_000_000_000, i32::MIN, i32::MAX]),
        1 => any::<i32>(),
    ]
}

/// A wire timestamp: mostly near now (so due-time bounds are crossed both ways), sometimes
/// anywhere or at the edges.
pub fn timestamp() -> impl Strategy<Value = prost_types::Timestamp> {
    let now = Utc::now().timestamp();
    let near = (now - 3 * 86_400..now + 400 * 86_400, 0..1_000_000_000i32);
    prop_oneof![
        4 => near,
        1 => (any::<i64>(), nanos()),
        1 => (edge_seconds(), nanos()),
    ]
    .prop_map(|(seconds, nanos)| prost_types::Timestamp { seconds, nanos })
}

/// A wire duration: mostly sensible, sometimes negative, huge or malformed.
pub fn duration() -> impl Strategy<Value = prost_types::Duration> {
    prop_oneof![
        4 => (0..8 * 86_400i64, 0..1_000_000_000i32),
        1 => (-10..10i64, nanos()),
        1 => (any::<i64>(), nanos()),
        1 => (edge_seconds(), nanos()),
    ]
    .prop_map(|(seconds, nanos)| prost_types::Duration { seconds, nanos })
}

/// An optional wire duration.
pub fn opt_duration() -> impl Strategy<Value = Option<prost_types::Duration>> {
    prop::option::of(duration())
}

/// An IANA zone name, the empty string, or junk.
pub fn zone() -> impl Strategy<Value = String> {
    let names: Vec<String> = chrono_tz::TZ_VARIANTS
        .iter()
        .map(|z| z.name().to_string())
        .collect();
    prop_oneof![
        4 => prop::sample::select(names),
        1 => prop::sample::select(vec![
            "America/New_York".to_string(),
            "Europe/London".to_string(),
            "Australia/Lord_Howe".to_string(),
            "Pacific/Chatham".to_string(),
            "Asia/Kathmandu".to_string(),
        ]),
        1 => Just(String::new()),
        1 => text(),
    ]
}

/// A wall-clock date-time string: well-formed near now, DST edges, far years, the extremes
/// chrono can represent, or junk.
pub fn local_time() -> impl Strategy<Value = String> {
    let year = Utc::now().format("%Y").to_string();
    let y: i32 = year.parse().unwrap_or(2026);
    prop_oneof![
        3 => (y..y + 2, 1..13u32, 1..29u32, 0..24u32, 0..60u32, prop::bool::ANY).prop_map(
            |(y, mo, d, h, mi, secs)| {
                if secs {
                    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:30")
                } else {
                    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}")
                }
            }
        ),
        1 => prop::sample::select(vec![
            "+262143-12-31T23:59".to_string(),
            "+262143-12-31T23:59:59".to_string(),
            "-262144-01-01T00:00".to_string(),
            "-262143-06-01T12:00".to_string(),
            "9999-12-31T23:59".to_string(),
            "0000-01-01T00:00".to_string(),
            format!("{}-03-08T02:30", y + 1),
            format!("{}-11-01T01:30", y + 1),
            "2026-12-24T09:00:60".to_string(),
            "2026-02-30T09:00".to_string(),
        ]),
        1 => "[+-]?[0-9]{4,6}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}(:[0-9]{2})?",
        1 => text(),
    ]
}
