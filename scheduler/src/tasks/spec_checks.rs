//! The rules a [`TaskSpec`] must meet before it becomes a [`NewTask`]: recipient, content,
//! due time (absolute, delayed or local), limits, retry policy, send window and duplicate
//! window, each violation recorded under its field's path.

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use herald_proto::v1 as pb;

use super::model::{
    DueAt, NewTask, Origin, RetryPolicy, SendWindow, Target, TaskSpec, When, DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PRIORITY, MAX_AHEAD, MAX_CONTENT_BYTES, MAX_PAST, MAX_RECIPIENT_CHARS,
};
use crate::error::Violations;
use crate::rules;
use uuid::Uuid;

impl TaskSpec {
    /// Checks every rule, recording violations under `path` (`task`, `schedule`,
    /// `campaign`), and returns the task when all hold. `now` is used only for the coarse
    /// past/future bounds; due times themselves come from the database clock.
    pub fn validate(&self, path: &str, now: DateTime<Utc>, v: &mut Violations) -> Option<NewTask> {
        v.under(|| path.to_owned(), |v| self.clone().into_task(now, v))
    }

    /// [`TaskSpec::validate`] consuming the spec, with violations named relative to the spec
    /// (`queue`, `content.text`): the caller puts its path in front with
    /// [`Violations::under`], which builds it only for a spec that has any. Its text and
    /// content move into the task rather than being copied (the create path handles a
    /// thousand specs a call).
    pub fn into_task(self, now: DateTime<Utc>, v: &mut Violations) -> Option<NewTask> {
        let before = v.len();

        if let Some(problem) = rules::name_problem(&self.queue) {
            v.add("queue", problem);
        }
        if self.recipient.trim().is_empty() {
            v.add("recipient", "is required");
        } else if self.recipient.chars().count() > MAX_RECIPIENT_CHARS {
            v.add("recipient", "must be at most 256 characters");
        } else if self.recipient.chars().any(char::is_control) {
            v.add("recipient", "must not contain control characters");
        }
        let template_id = content(self.content.as_ref(), "content", v);
        if let Some(t) = &self.window_closed_fallback {
            check_window_closed_fallback(t, "window_closed_fallback", v);
        }
        let due = self.due(now, v);
        let priority = self.priority.unwrap_or(DEFAULT_PRIORITY);
        if !(0..=9).contains(&priority) {
            v.add("priority", "must be between 0 and 9");
        }
        let max_attempts = self.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS);
        if !(1..=100).contains(&max_attempts) {
            v.add("max_attempts", "must be between 1 and 100");
        }
        if let Some(problem) = crate::rules::idempotency_key_problem(&self.idempotency_key) {
            v.add("idempotency_key", problem);
        }
        let retry = self
            .retry
            .clone()
            .unwrap_or_else(RetryPolicy::default_exponential);
        retry.check("retry_policy", v);
        if let Some(at) = self.expire_at {
            let due_at = match due {
                Some(DueAt::At(t)) => t,
                Some(DueAt::After(ms)) => now + ChronoDuration::milliseconds(ms),
                None => now,
            };
            if at <= due_at {
                v.add("expire_at", "must be after the task's due time");
            }
        }
        rules::labels(&self.labels, "labels", v);
        if let Some(ms) = self.duplicate_window_ms {
            if !(1_000..=super::duplicates::MAX_WINDOW_MS).contains(&ms) {
                v.add("duplicate_window", "must be between 1 s and 7 days");
            }
        }
        let target = self.target(v);
        let local_zone = match &self.when {
            Some(When::Local { zone, .. }) => zone.as_str(),
            _ => "",
        };
        let send_window = self
            .send_window
            .as_ref()
            .and_then(|w| SendWindow::from_wire(w, local_zone, "send_window", v));

        if v.len() > before {
            return None;
        }
        Some(NewTask {
            id: Uuid::now_v7(),
            queue: self.queue,
            recipient: self.recipient,
            content: self.content.unwrap_or_default(),
            template_id: template_id.flatten(),
            labels: self.labels,
            priority: priority as i16,
            due: due?,
            expire_at: self.expire_at,
            idempotency: (!self.idempotency_key.is_empty())
                .then_some((self.idempotency_key, self.request_hash)),
            max_attempts,
            retry,
            target,
            // Set by the caller from the request's trace context, not from the spec.
            trace_parent: None,
            origin: Origin::Request,
            send_window,
            duplicate_window_ms: self.duplicate_window_ms,
            window_closed_fallback: self.window_closed_fallback,
            fallback_inherited: false,
        })
    }

    fn due(&self, now: DateTime<Utc>, v: &mut Violations) -> Option<DueAt> {
        match &self.when {
            None | Some(When::Now) => Some(DueAt::After(0)),
            Some(When::At(at)) if *at < now - MAX_PAST => {
                v.add("run_at", "is more than 24 hours in the past");
                None
            }
            Some(When::At(at)) if *at > now + MAX_AHEAD => {
                v.add("run_at", "is more than 366 days ahead");
                None
            }
            Some(When::At(at)) => Some(DueAt::At(*at)),
            Some(When::After(ms)) if *ms < 0 => {
                v.add("delay", "must be a non-negative duration");
                None
            }
            Some(When::After(ms)) if *ms > MAX_AHEAD.num_milliseconds() => {
                v.add("delay", "must be at most 366 days");
                None
            }
            Some(When::After(ms)) => Some(DueAt::After(*ms)),
            Some(When::Local { time, zone }) => local_time(time, zone, now, v),
        }
    }

    fn target(&self, v: &mut Violations) -> Target {
        match (self.pool.is_empty(), self.account_id.is_empty()) {
            (true, true) => Target::Queue,
            (false, true) => {
                if let Some(p) = rules::name_problem(&self.pool) {
                    v.add("pool", p);
                }
                Target::Pool(self.pool.clone())
            }
            (true, false) => {
                if let Some(p) = rules::name_problem(&self.account_id) {
                    v.add("account_id", p);
                }
                Target::Account(self.account_id.clone())
            }
            (false, false) => {
                v.add("account_id", "set pool or account_id, not both");
                Target::Queue
            }
        }
    }
}

/// A wall-clock time in a zone as a due instant (see task.proto's `local_time`).
fn local_time(time: &str, zone: &str, now: DateTime<Utc>, v: &mut Violations) -> Option<DueAt> {
    let Ok(zone) = zone.parse::<chrono_tz::Tz>() else {
        v.add(
            "local_time_zone",
            "is required with local_time and must be an IANA time zone name",
        );
        return None;
    };
    let Some(local) = rules::parse_local_time(time) else {
        v.add(
            "local_time",
            "must be a date-time like 2026-12-24T09:00 or 2026-12-24T09:00:30",
        );
        return None;
    };
    match crate::schedule::fire_times::local_to_instant(&zone, local) {
        Some(at) if at < now - MAX_PAST || at > now + MAX_AHEAD => {
            v.add(
                "local_time",
                "must be within 24 hours in the past and 366 days ahead",
            );
            None
        }
        Some(at) => Some(DueAt::At(at)),
        None => {
            v.add("local_time", "does not exist in the zone");
            None
        }
    }
}

/// Checks content's shape (the rules shared with the executor, `herald_proto::content`);
/// returns Some(template id if any) when valid. Whether the target's channel can send it is
/// checked once the target is known ([`crate::tasks::prepare`]).
fn content(c: Option<&pb::Content>, path: &str, v: &mut Violations) -> Option<Option<String>> {
    let Some(c) = c else {
        v.add(path, "is required: set one body (text, template, media, …)");
        return None;
    };
    let before = v.len();
    for violation in herald_proto::content::check(c, path) {
        v.add(violation.field, violation.description);
    }
    if let Some(pb::content::Body::Template(t)) = &c.body {
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
    }
    (v.len() == before).then(|| match &c.body {
        Some(pb::content::Body::Template(t)) => Some(t.template_id.clone()),
        _ => None,
    })
}

/// Why a task's content cannot be sent through a `kind` account at its due time, if a provider
/// media id it names will have expired by then: WeCom keeps an uploaded file 3 days, WhatsApp
/// 30 (providers-media.md §1.2, §2.1), and herald cannot upload a file it was given only the id
/// of. (field under the content, description).
pub fn media_id_outlived(
    content: &pb::Content,
    kind: herald_proto::SenderKind,
    due: &DueAt,
    now: DateTime<Utc>,
) -> Option<(&'static str, String)> {
    let (field, media) = match &content.body {
        Some(pb::content::Body::Media(m)) => ("media.media_id", m),
        Some(pb::content::Body::Template(t)) => match t.header.as_ref()?.parameter.as_ref()? {
            pb::template_header::Parameter::Media(m) => ("template.header.media.media_id", m),
            pb::template_header::Parameter::Text(_) => return None,
        },
        _ => return None,
    };
    if !matches!(media.source, Some(pb::media::Source::MediaId(_))) {
        return None;
    }
    let days = match kind {
        herald_proto::SenderKind::Wecom | herald_proto::SenderKind::WecomRobot => 3,
        herald_proto::SenderKind::WhatsappCloud => 30,
        _ => return None,
    };
    let due_at = match due {
        DueAt::At(at) => *at,
        DueAt::After(ms) => now + ChronoDuration::milliseconds(*ms),
    };
    (due_at > now + ChronoDuration::days(days)).then(|| {
        (
            field,
            format!(
                "a {kind} media id lasts {days} days and this task is due later: give a link, \
                 which herald uploads (or the provider fetches) near the send"
            ),
        )
    })
}

/// Checks a window-closed fallback template's shape (a task's, or a stored template's): an id
/// and a language (WhatsApp needs one), variables within the content limit, header and buttons
/// as a content template's. Which accounts may send it is checked once a task's target is known
/// ([`crate::tasks::prepare`]).
pub fn check_window_closed_fallback(t: &pb::TemplateContent, path: &str, v: &mut Violations) {
    if t.template_id.is_empty() || t.template_id.chars().count() > 200 {
        v.add(format!("{path}.template_id"), "must be 1 to 200 characters");
    }
    if t.language.is_empty() || t.language.len() > 35 {
        v.add(
            format!("{path}.language"),
            "is required (the approved template's language code) and at most 35 characters",
        );
    }
    let size: usize = t.variables.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > MAX_CONTENT_BYTES {
        v.add(
            format!("{path}.variables"),
            "must be at most 65536 bytes in total",
        );
    }
    // A fallback only ever goes out through a WhatsApp number, which takes a body's variables
    // by position: keys Meta would refuse (132000) are refused now, not when the window is
    // closed, the one time the fallback matters.
    if let Err(problem) = herald_proto::content::positional_parameters(&t.variables) {
        v.add(format!("{path}.variables"), problem);
    }
    // The shared content rules see a content holding this template and name its fields
    // `<path>.template.<field>`; the fallback is the template itself.
    let as_content = super::model::fallback_content(t);
    let prefix = format!("{path}.template");
    for violation in herald_proto::content::check(&as_content, path) {
        let field = match violation.field.strip_prefix(&prefix) {
            Some(rest) => format!("{path}{rest}"),
            None => violation.field,
        };
        v.add(field, violation.description);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> TaskSpec {
        TaskSpec {
            queue: "default".into(),
            recipient: "+15550001".into(),
            content: Some(pb::Content {
                body: Some(pb::content::Body::Text("hi".into())),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn check(s: &TaskSpec) -> Vec<String> {
        let mut v = Violations::default();
        s.validate("task", Utc::now(), &mut v);
        v.into_fields()
    }

    #[test]
    fn accepts_a_minimal_spec_with_defaults() {
        let mut v = Violations::default();
        let t = spec().validate("task", Utc::now(), &mut v);
        assert!(v.is_empty());
        let Some(t) = t else {
            panic!("a minimal spec was refused")
        };
        assert_eq!(t.priority, 5);
        assert_eq!(t.max_attempts, 10);
        assert_eq!(t.due, DueAt::After(0));
        assert_eq!(t.retry, RetryPolicy::default_exponential());
        assert!(t.idempotency.is_none());
    }

    #[test]
    fn a_send_window_names_its_bad_fields_and_takes_the_local_zone() {
        let mut v = Violations::default();
        let mut bad = spec();
        bad.send_window = Some(pb::SendWindow {
            start: "9am".into(),
            end: "20:00".into(),
            time_zone: "Mars/Base".into(),
            spread: None,
        });
        assert!(bad.validate("task", Utc::now(), &mut v).is_none());
        let fields: Vec<&str> = v.as_slice().iter().map(|f| f.field.as_str()).collect();
        assert_eq!(
            fields,
            vec!["task.send_window.start", "task.send_window.time_zone"]
        );

        let mut good = spec();
        good.when = Some(When::Local {
            time: (Utc::now() + ChronoDuration::days(1))
                .format("%Y-%m-%dT%H:%M")
                .to_string(),
            zone: "Asia/Tokyo".into(),
        });
        good.send_window = Some(pb::SendWindow {
            start: "22:00".into(),
            end: "06:00".into(),
            ..Default::default()
        });
        let mut v = Violations::default();
        let task = good.validate("task", Utc::now(), &mut v);
        let window = task.and_then(|t| t.send_window);
        assert_eq!(
            window.map(|w| w.zone),
            Some("Asia/Tokyo".to_string()),
            "{v:?}"
        );
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
            ..Default::default()
        });
        s.when = Some(When::At(Utc::now() - ChronoDuration::days(2)));
        assert_eq!(check(&s), vec!["task.content.text", "task.run_at"]);
    }

    #[test]
    fn validates_retry_policies() {
        let mut s = spec();
        s.retry = Some(RetryPolicy::Delays(vec![60_000]));
        assert!(check(&s).is_empty());
        s.retry = Some(RetryPolicy::Exponential {
            initial_ms: 1,
            max_ms: RetryPolicy::DEFAULT_MAX_MS,
            multiplier: 20.0,
            jitter: 0.2,
        });
        assert_eq!(
            check(&s),
            vec![
                "task.retry_policy.exponential.initial",
                "task.retry_policy.exponential.multiplier"
            ]
        );
        s.retry = Some(RetryPolicy::Delays(vec![1, -1]));
        assert_eq!(check(&s), vec!["task.retry_policy.delays.delays[1]"]);
    }

    #[test]
    fn a_window_closed_fallback_names_its_bad_fields() {
        let mut s = spec();
        s.window_closed_fallback = Some(pb::TemplateContent {
            template_id: String::new(),
            header: Some(pb::TemplateHeader { parameter: None }),
            ..Default::default()
        });
        assert_eq!(
            check(&s),
            vec![
                "task.window_closed_fallback.template_id",
                "task.window_closed_fallback.language",
                "task.window_closed_fallback.header",
            ]
        );
        s.window_closed_fallback = Some(pb::TemplateContent {
            template_id: "order_update".into(),
            language: "en_US".into(),
            variables: [("1".into(), "A-1001".into())].into(),
            ..Default::default()
        });
        assert!(check(&s).is_empty());
        // Named or gapped keys, which WhatsApp would refuse only when the fallback is sent.
        for keys in [vec!["name"], vec!["1", "3"]] {
            if let Some(f) = s.window_closed_fallback.as_mut() {
                f.variables = keys.iter().map(|k| (k.to_string(), "x".into())).collect();
            }
            assert_eq!(
                check(&s),
                vec!["task.window_closed_fallback.variables"],
                "{keys:?}"
            );
        }
    }

    #[test]
    fn a_provider_media_id_must_outlive_the_wait_for_the_send() {
        use herald_proto::SenderKind::{WecomRobot, WhatsappCloud};
        let now = Utc::now();
        let in_days = |d: i64| DueAt::At(now + ChronoDuration::days(d));
        let image = |source| pb::Content {
            body: Some(pb::content::Body::Media(pb::Media {
                kind: pb::MediaKind::Image as i32,
                source: Some(source),
                ..Default::default()
            })),
            link_preview: false,
        };
        let by_id = image(pb::media::Source::MediaId("m1".into()));
        let by_link = image(pb::media::Source::Link("https://example.com/a.png".into()));
        let field = |c: &pb::Content, kind, due: DueAt| {
            media_id_outlived(c, kind, &due, now).map(|(f, _)| f)
        };
        assert_eq!(
            field(&by_id, WecomRobot, in_days(4)),
            Some("media.media_id")
        );
        assert_eq!(field(&by_id, WecomRobot, in_days(2)), None);
        assert_eq!(field(&by_id, WhatsappCloud, in_days(4)), None);
        assert_eq!(
            field(&by_id, WhatsappCloud, in_days(31)),
            Some("media.media_id")
        );
        assert_eq!(field(&by_link, WecomRobot, in_days(31)), None);
        let header = pb::Content {
            body: Some(pb::content::Body::Template(pb::TemplateContent {
                template_id: "t".into(),
                language: "en".into(),
                header: Some(pb::TemplateHeader {
                    parameter: Some(pb::template_header::Parameter::Media(pb::Media {
                        kind: pb::MediaKind::Image as i32,
                        source: Some(pb::media::Source::MediaId("m2".into())),
                        ..Default::default()
                    })),
                }),
                ..Default::default()
            })),
            link_preview: false,
        };
        assert_eq!(
            field(&header, WhatsappCloud, DueAt::After(31 * 86_400_000)),
            Some("template.header.media.media_id")
        );
    }

    #[test]
    fn a_target_is_a_pool_or_an_account_not_both() {
        let mut s = spec();
        s.pool = "wa".into();
        s.account_id = "wa-1".into();
        assert_eq!(check(&s), vec!["task.account_id"]);
    }
}
