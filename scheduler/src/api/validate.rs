//! Request validation: turns wire specs into domain values or a list of field violations naming
//! every bad field. Nothing here touches the database.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use herald_proto::v1 as pb;
use prost::Message;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::convert::from_timestamp;
use crate::error::FieldViolation;
use crate::model::{DueAt, NewTask, RetryPolicy, Target};

/// Largest text or template payload, in bytes.
pub const MAX_CONTENT_BYTES: usize = 64 * 1024;
/// Largest recipient, in characters.
pub const MAX_RECIPIENT_CHARS: usize = 256;
/// Most tasks in one CreateTasks.
pub const MAX_BATCH: usize = 1_000;
/// How far in the past a run_at may be (a little clock skew or a slow client is fine; a
/// timestamp from yesterday is almost certainly a bug).
pub const MAX_PAST: ChronoDuration = ChronoDuration::hours(24);
/// How far ahead a task may be scheduled.
pub const MAX_AHEAD: ChronoDuration = ChronoDuration::days(366);
/// Default attempt budget.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 10;
/// Default priority.
pub const DEFAULT_PRIORITY: i32 = 5;
const MAX_RETRY_DELAY_MS: i64 = 7 * 24 * 3_600_000;

/// Collects field violations under a path prefix.
#[derive(Debug, Default)]
pub struct Violations(pub Vec<FieldViolation>);

impl Violations {
    /// Records that `field` is invalid.
    pub fn add(&mut self, field: impl Into<String>, description: impl Into<String>) {
        self.0.push(FieldViolation {
            field: field.into(),
            description: description.into(),
        });
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Whether `name` can name a namespace: 1 to 64 of `a-z`, `0-9`, `-`, `_`, `.`. Namespaces
/// prefix route keys (`<namespace>/...`), so `/` and `:` are never allowed.
pub fn valid_namespace(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
}

/// Why a queue name is invalid, if it is.
pub fn queue_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("is required");
    }
    if name.len() > 63 {
        return Some("must be at most 63 characters");
    }
    let mut chars = name.chars();
    let first_ok = chars
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

/// Parses a task id field.
pub fn task_id(field: &str, value: &str) -> Result<Uuid, FieldViolation> {
    value.parse().map_err(|_| FieldViolation {
        field: field.into(),
        description: if value.is_empty() {
            "is required".into()
        } else {
            "is not a task id (a UUID)".into()
        },
    })
}

/// Parses `local_time` in `local_time_zone` into a due instant (see task.proto).
fn local_time(
    spec: &pb::TaskSpec,
    path: &str,
    now: DateTime<Utc>,
    v: &mut Violations,
) -> Option<DueAt> {
    let zone: Option<chrono_tz::Tz> = spec.local_time_zone.parse().ok();
    let Some(zone) = zone else {
        v.add(
            format!("{path}.local_time_zone"),
            "is required with local_time and must be an IANA time zone name",
        );
        return None;
    };
    let Some(local) = parse_local_time(&spec.local_time) else {
        v.add(
            format!("{path}.local_time"),
            "must be a date-time like 2026-12-24T09:00 or 2026-12-24T09:00:30",
        );
        return None;
    };
    match crate::schedule::fire_times::local_to_instant(&zone, local) {
        Some(at) if at < now - MAX_PAST || at > now + MAX_AHEAD => {
            v.add(
                format!("{path}.local_time"),
                "must be within 24 hours in the past and 366 days ahead",
            );
            None
        }
        Some(at) => Some(DueAt::At(at)),
        None => {
            v.add(format!("{path}.local_time"), "does not exist in the zone");
            None
        }
    }
}

/// Parses a wall-clock date-time, with or without seconds.
pub fn parse_local_time(s: &str) -> Option<chrono::NaiveDateTime> {
    chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S")
        .or_else(|_| chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M"))
        .ok()
}

/// Validates one spec; `path` prefixes field names (`task` or `tasks[3]`). `now` is only used
/// for the coarse past/future bounds; due times themselves come from the database clock.
pub fn task_spec(
    spec: &pb::TaskSpec,
    path: &str,
    namespace: &str,
    now: DateTime<Utc>,
    v: &mut Violations,
) -> Option<NewTask> {
    let before = v.0.len();
    let f = |name: &str| format!("{path}.{name}");

    if let Some(problem) = queue_name_problem(&spec.queue) {
        v.add(f("queue"), problem);
    }
    let recipient = spec.recipient.trim();
    if recipient.is_empty() {
        v.add(f("recipient"), "is required");
    } else if spec.recipient.chars().count() > MAX_RECIPIENT_CHARS {
        v.add(f("recipient"), "must be at most 256 characters");
    } else if spec.recipient.chars().any(char::is_control) {
        v.add(f("recipient"), "must not contain control characters");
    }

    let template_id = content(spec.content.as_ref(), &f("content"), v);

    let due = match &spec.when {
        None => Some(DueAt::After(0)),
        Some(pb::task_spec::When::RunAt(ts)) => match from_timestamp(ts) {
            None => {
                v.add(f("run_at"), "is not a valid timestamp");
                None
            }
            Some(at) if at < now - MAX_PAST => {
                v.add(f("run_at"), "is more than 24 hours in the past");
                None
            }
            Some(at) if at > now + MAX_AHEAD => {
                v.add(f("run_at"), "is more than 366 days ahead");
                None
            }
            Some(at) => Some(DueAt::At(at)),
        },
        Some(pb::task_spec::When::Delay(d)) => match duration_ms(d) {
            Some(ms) if ms <= MAX_AHEAD.num_milliseconds() => Some(DueAt::After(ms)),
            Some(_) => {
                v.add(f("delay"), "must be at most 366 days");
                None
            }
            None => {
                v.add(f("delay"), "must be a non-negative duration");
                None
            }
        },
    };

    // Local-time sends: a wall-clock time in the recipient's zone becomes run_at here.
    let due = match (spec.local_time.is_empty(), due) {
        (true, due) => due,
        (false, _) if spec.when.is_some() => {
            v.add(f("local_time"), "cannot be combined with run_at or delay");
            None
        }
        (false, _) => local_time(spec, path, now, v),
    };

    let priority = spec.priority.unwrap_or(DEFAULT_PRIORITY);
    if !(0..=9).contains(&priority) {
        v.add(f("priority"), "must be between 0 and 9");
    }
    let max_attempts = spec.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS);
    if !(1..=100).contains(&max_attempts) {
        v.add(f("max_attempts"), "must be between 1 and 100");
    }
    let key = &spec.idempotency_key;
    if key.len() > 200 {
        v.add(f("idempotency_key"), "must be at most 200 characters");
    } else if key.chars().any(|c| !(' '..='~').contains(&c)) {
        v.add(f("idempotency_key"), "must be printable ASCII");
    }
    let retry = retry_policy(spec.retry_policy.as_ref(), &f("retry_policy"), v);

    let expire_at = spec
        .expire_at
        .as_ref()
        .and_then(|ts| match from_timestamp(ts) {
            None => {
                v.add(f("expire_at"), "is not a valid timestamp");
                None
            }
            Some(at) => {
                let due_at = match due {
                    Some(DueAt::At(t)) => t,
                    Some(DueAt::After(ms)) => now + ChronoDuration::milliseconds(ms),
                    None => now,
                };
                if at <= due_at {
                    v.add(f("expire_at"), "must be after the task's due time");
                }
                Some(at)
            }
        });
    labels(&spec.labels, &f("labels"), v);
    let target = match (spec.pool.is_empty(), spec.account_id.is_empty()) {
        (true, true) => Target::Queue,
        (false, true) => {
            if let Some(p) = queue_name_problem(&spec.pool) {
                v.add(f("pool"), p);
            }
            Target::Pool(spec.pool.clone())
        }
        (true, false) => {
            if let Some(p) = queue_name_problem(&spec.account_id) {
                v.add(f("account_id"), p);
            }
            Target::Account(spec.account_id.clone())
        }
        (false, false) => {
            v.add(f("account_id"), "set pool or account_id, not both");
            Target::Queue
        }
    };

    if v.0.len() > before {
        return None;
    }
    let idempotency = (!key.is_empty()).then(|| {
        // Deterministic: maps are BTreeMaps, so equal requests encode to equal bytes.
        let hash = Sha256::digest(spec.encode_to_vec()).to_vec();
        (key.clone(), hash)
    });
    Some(NewTask {
        id: Uuid::now_v7(),
        namespace: namespace.to_string(),
        queue: spec.queue.clone(),
        recipient: spec.recipient.clone(),
        content: spec
            .content
            .as_ref()
            .map(|c| c.encode_to_vec())
            .unwrap_or_default(),
        template_id: template_id.flatten(),
        labels: spec.labels.clone(),
        priority: priority as i16,
        due: due?,
        expire_at,
        idempotency,
        max_attempts,
        retry: retry?,
        target,
        // Set by the handler from the request's trace context, not from the spec.
        trace_parent: None,
    })
}

/// Validates content; returns Some(template id if any) when valid.
fn content(c: Option<&pb::Content>, path: &str, v: &mut Violations) -> Option<Option<String>> {
    match c.and_then(|c| c.body.as_ref()) {
        None => {
            v.add(path, "is required: set text or template");
            None
        }
        Some(pb::content::Body::Text(text)) => {
            if text.is_empty() {
                v.add(format!("{path}.text"), "must not be empty");
                None
            } else if text.len() > MAX_CONTENT_BYTES {
                v.add(format!("{path}.text"), "must be at most 65536 bytes");
                None
            } else {
                Some(None)
            }
        }
        Some(pb::content::Body::Template(t)) => {
            let before = v.0.len();
            if t.template_id.is_empty() || t.template_id.chars().count() > 200 {
                v.add(
                    format!("{path}.template.template_id"),
                    "must be 1 to 200 characters",
                );
            }
            if t.language.len() > 35 {
                v.add(
                    format!("{path}.template.language"),
                    "must be at most 35 characters",
                );
            }
            let size: usize = t.variables.iter().map(|(k, v)| k.len() + v.len()).sum();
            if size > MAX_CONTENT_BYTES {
                v.add(
                    format!("{path}.template.variables"),
                    "must be at most 65536 bytes in total",
                );
            }
            (v.0.len() == before).then(|| Some(t.template_id.clone()))
        }
    }
}

fn retry_policy(
    p: Option<&pb::RetryPolicy>,
    path: &str,
    v: &mut Violations,
) -> Option<RetryPolicy> {
    match p.and_then(|p| p.strategy.as_ref()) {
        None => Some(RetryPolicy::default_exponential()),
        Some(pb::retry_policy::Strategy::Exponential(e)) => {
            let before = v.0.len();
            let path = format!("{path}.exponential");
            let initial_ms = match e.initial.as_ref().map(duration_ms) {
                None => RetryPolicy::DEFAULT_INITIAL_MS,
                Some(Some(ms)) if ms >= 100 => ms,
                Some(_) => {
                    v.add(format!("{path}.initial"), "must be at least 100ms");
                    0
                }
            };
            let max_ms = match e.max.as_ref().map(duration_ms) {
                None => RetryPolicy::DEFAULT_MAX_MS.max(initial_ms),
                Some(Some(ms)) if ms >= initial_ms && ms <= MAX_RETRY_DELAY_MS => ms,
                Some(_) => {
                    v.add(
                        format!("{path}.max"),
                        "must be at least initial and at most 7 days",
                    );
                    0
                }
            };
            let multiplier = if e.multiplier == 0.0 {
                RetryPolicy::DEFAULT_MULTIPLIER
            } else if (1.0..=10.0).contains(&e.multiplier) {
                e.multiplier
            } else {
                v.add(format!("{path}.multiplier"), "must be between 1.0 and 10.0");
                0.0
            };
            let jitter = match e.jitter {
                None => RetryPolicy::DEFAULT_JITTER,
                Some(j) if (0.0..=1.0).contains(&j) => j,
                Some(_) => {
                    v.add(format!("{path}.jitter"), "must be between 0.0 and 1.0");
                    0.0
                }
            };
            (v.0.len() == before).then_some(RetryPolicy::Exponential {
                initial_ms,
                max_ms,
                multiplier,
                jitter,
            })
        }
        Some(pb::retry_policy::Strategy::Delays(d)) => {
            let path = format!("{path}.delays.delays");
            if d.delays.is_empty() || d.delays.len() > 20 {
                v.add(path, "must list 1 to 20 delays");
                return None;
            }
            let mut out = Vec::with_capacity(d.delays.len());
            for (i, delay) in d.delays.iter().enumerate() {
                match duration_ms(delay) {
                    Some(ms) if ms <= MAX_RETRY_DELAY_MS => out.push(ms),
                    _ => v.add(format!("{path}[{i}]"), "must be between 0 and 7 days"),
                }
            }
            (out.len() == d.delays.len()).then_some(RetryPolicy::Delays(out))
        }
    }
}

fn labels(labels: &BTreeMap<String, String>, path: &str, v: &mut Violations) {
    if labels.len() > 32 {
        v.add(path, "must have at most 32 entries");
        return;
    }
    for (k, value) in labels {
        if k.is_empty() || k.chars().count() > 63 {
            v.add(format!("{path}[{k}]"), "keys must be 1 to 63 characters");
        } else if value.chars().count() > 256 {
            v.add(
                format!("{path}[{k}]"),
                "values must be at most 256 characters",
            );
        }
    }
}

/// A non-negative wire duration in milliseconds.
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

    fn spec() -> pb::TaskSpec {
        pb::TaskSpec {
            queue: "default".into(),
            recipient: "+15550001".into(),
            content: Some(pb::Content {
                body: Some(pb::content::Body::Text("hi".into())),
            }),
            ..Default::default()
        }
    }

    fn check(s: &pb::TaskSpec) -> Vec<String> {
        let mut v = Violations::default();
        task_spec(s, "task", "default", Utc::now(), &mut v);
        v.0.into_iter().map(|f| f.field).collect()
    }

    #[test]
    fn accepts_a_minimal_spec_with_defaults() {
        let mut v = Violations::default();
        let t = task_spec(&spec(), "task", "default", Utc::now(), &mut v).unwrap();
        assert!(v.is_empty());
        assert_eq!(t.priority, 5);
        assert_eq!(t.max_attempts, 10);
        assert_eq!(t.due, DueAt::After(0));
        assert_eq!(t.retry, RetryPolicy::default_exponential());
        assert!(t.idempotency.is_none());
    }

    #[test]
    fn names_each_bad_field() {
        let mut s = spec();
        s.recipient = " ".into();
        s.queue = "Bad Queue".into();
        s.priority = Some(10);
        s.max_attempts = Some(0);
        assert_eq!(
            check(&s),
            vec![
                "task.queue",
                "task.recipient",
                "task.priority",
                "task.max_attempts"
            ]
        );
    }

    #[test]
    fn rejects_oversize_content_and_far_past_run_at() {
        let mut s = spec();
        s.content = Some(pb::Content {
            body: Some(pb::content::Body::Text("x".repeat(MAX_CONTENT_BYTES + 1))),
        });
        s.when = Some(pb::task_spec::When::RunAt(prost_types::Timestamp {
            seconds: Utc::now().timestamp() - 2 * 86_400,
            nanos: 0,
        }));
        assert_eq!(check(&s), vec!["task.content.text", "task.run_at"]);
        s.when = Some(pb::task_spec::When::RunAt(prost_types::Timestamp {
            seconds: 0,
            nanos: -1,
        }));
        assert!(check(&s).contains(&"task.run_at".to_string()));
    }

    #[test]
    fn same_request_hashes_equal_and_different_requests_differ() {
        let mut a = spec();
        a.idempotency_key = "k1".into();
        a.labels.insert("b".into(), "2".into());
        a.labels.insert("a".into(), "1".into());
        let mut b = a.clone();
        let hash = |s: &pb::TaskSpec| {
            let mut v = Violations::default();
            task_spec(s, "task", "default", Utc::now(), &mut v)
                .unwrap()
                .idempotency
                .unwrap()
                .1
        };
        assert_eq!(hash(&a), hash(&b));
        b.recipient = "+15550002".into();
        assert_ne!(hash(&a), hash(&b));
    }

    #[test]
    fn validates_retry_policies() {
        let mut s = spec();
        s.retry_policy = Some(pb::RetryPolicy {
            strategy: Some(pb::retry_policy::Strategy::Delays(pb::FixedDelays {
                delays: vec![prost_types::Duration {
                    seconds: 60,
                    nanos: 0,
                }],
            })),
        });
        assert!(check(&s).is_empty());
        s.retry_policy = Some(pb::RetryPolicy {
            strategy: Some(pb::retry_policy::Strategy::Exponential(
                pb::ExponentialBackoff {
                    initial: Some(prost_types::Duration {
                        seconds: 0,
                        nanos: 1_000_000,
                    }),
                    multiplier: 20.0,
                    ..Default::default()
                },
            )),
        });
        assert_eq!(
            check(&s),
            vec![
                "task.retry_policy.exponential.initial",
                "task.retry_policy.exponential.multiplier"
            ]
        );
    }
}
