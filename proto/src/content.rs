//! What a task's [`Content`](crate::v1::Content) may hold, checked the same way by the scheduler
//! (at creation, INVALID_ARGUMENT naming the field) and by the executor (before sending,
//! PERMANENT): the shape of each body ([`check`]) and which bodies a sender kind can send
//! ([`check_for`]).
//!
//! Adding a body: its message in `task.proto`, its shape in [`check`], its channels in
//! [`supports`], and its mapping in each channel's content module of the executor
//! (`senders/whatsapp/content.rs`, `senders/wecom/content.rs`).

use crate::v1::{self as pb, content::Body, MediaKind};
use crate::SenderKind;

/// Text of any channel: 64 KiB.
pub const MAX_TEXT_BYTES: usize = 64 * 1024;
/// Markdown: WeCom robots accept 4096 bytes.
pub const MAX_MARKDOWN_BYTES: usize = 4096;
/// A media link.
pub const MAX_LINK_BYTES: usize = 2048;

/// One thing wrong with content: the field (a path under the caller's prefix) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The field, e.g. `task.content.media.link`.
    pub field: String,
    /// What is wrong, e.g. `must be an https URL`.
    pub description: String,
}

/// Collects violations under a path prefix.
struct Check<'a> {
    path: &'a str,
    out: Vec<Violation>,
}

impl Check<'_> {
    fn add(&mut self, field: &str, description: impl Into<String>) {
        self.out.push(Violation {
            field: format!("{}.{field}", self.path),
            description: description.into(),
        });
    }

    /// `value` has between `min` and `max` characters.
    fn chars(&mut self, field: &str, value: &str, min: usize, max: usize) {
        let n = value.chars().count();
        if n < min || n > max {
            self.add(field, range("characters", min, max));
        }
    }

    /// `value` has between `min` and `max` bytes of UTF-8 (WeCom counts bytes).
    fn bytes(&mut self, field: &str, value: &str, min: usize, max: usize) {
        if value.len() < min || value.len() > max {
            self.add(field, range("bytes", min, max));
        }
    }

    /// An http(s) URL (`https_only`: https only) of at most [`MAX_LINK_BYTES`].
    fn url(&mut self, field: &str, value: &str, https_only: bool, required: bool) {
        if value.is_empty() {
            if required {
                self.add(field, "is required");
            }
            return;
        }
        let lower = value.to_ascii_lowercase();
        let ok_scheme =
            lower.starts_with("https://") || (!https_only && lower.starts_with("http://"));
        if !ok_scheme || value.len() > MAX_LINK_BYTES || value.chars().any(char::is_whitespace) {
            let scheme = if https_only { "an https" } else { "an http(s)" };
            self.add(
                field,
                format!("must be {scheme} URL without spaces, at most {MAX_LINK_BYTES} bytes"),
            );
        }
    }
}

fn range(unit: &str, min: usize, max: usize) -> String {
    if min == 0 {
        format!("must be at most {max} {unit}")
    } else {
        format!("must be {min} to {max} {unit}")
    }
}

/// The name of a body, as its field is named in `Content` (`text`, `media`, …).
pub fn body_name(body: &Body) -> &'static str {
    match body {
        Body::Text(_) => "text",
        Body::Template(_) => "template",
        Body::Media(_) => "media",
        Body::Location(_) => "location",
        Body::Interactive(_) => "interactive",
        Body::Markdown(_) => "markdown",
        Body::TextCard(_) => "text_card",
        Body::News(_) => "news",
        Body::TextNotice(_) => "text_notice",
    }
}

/// The shape of `content`, whatever the channel: required fields, lengths, URLs. `path` is the
/// content's own path (e.g. `task.content`). A template's variables are checked by the caller
/// (stored templates render them first).
pub fn check(content: &pb::Content, path: &str) -> Vec<Violation> {
    let mut c = Check {
        path,
        out: Vec::new(),
    };
    match &content.body {
        None => c.out.push(Violation {
            field: path.to_owned(),
            description: "is required: set one body (text, template, media, …)".into(),
        }),
        Some(Body::Text(t)) => c.bytes("text", t, 1, MAX_TEXT_BYTES),
        Some(Body::Markdown(t)) => c.bytes("markdown", t, 1, MAX_MARKDOWN_BYTES),
        Some(Body::Template(t)) => template(&mut c, t),
        Some(Body::Media(m)) => media(&mut c, "media", m),
        Some(Body::Location(l)) => {
            if !(-90.0..=90.0).contains(&l.latitude) {
                c.add("location.latitude", "must be between -90 and 90");
            }
            if !(-180.0..=180.0).contains(&l.longitude) {
                c.add("location.longitude", "must be between -180 and 180");
            }
            c.chars("location.name", &l.name, 0, 1000);
            c.chars("location.address", &l.address, 0, 1000);
        }
        Some(Body::Interactive(i)) => interactive(&mut c, i),
        Some(Body::TextCard(t)) => {
            c.bytes("text_card.title", &t.title, 1, 128);
            c.bytes("text_card.description", &t.description, 1, 512);
            c.url("text_card.url", &t.url, false, true);
            c.chars("text_card.button_text", &t.button_text, 0, 4);
        }
        Some(Body::News(n)) => {
            if n.articles.is_empty() || n.articles.len() > 8 {
                c.add("news.articles", "must hold 1 to 8 articles");
            }
            for (i, a) in n.articles.iter().enumerate() {
                let p = format!("news.articles[{i}]");
                c.bytes(&format!("{p}.title"), &a.title, 1, 128);
                c.bytes(&format!("{p}.description"), &a.description, 0, 512);
                c.url(&format!("{p}.url"), &a.url, false, true);
                c.url(&format!("{p}.picture_url"), &a.picture_url, false, false);
            }
        }
        Some(Body::TextNotice(t)) => {
            c.chars("text_notice.title", &t.title, 1, 36);
            c.chars("text_notice.description", &t.description, 0, 44);
            c.chars("text_notice.sub_title", &t.sub_title, 0, 112);
            c.url("text_notice.url", &t.url, false, true);
            c.chars("text_notice.emphasis", &t.emphasis, 0, 10);
            c.chars(
                "text_notice.emphasis_description",
                &t.emphasis_description,
                0,
                15,
            );
        }
    }
    c.out
}

fn template(c: &mut Check<'_>, t: &pb::TemplateContent) {
    if let Some(h) = &t.header {
        match &h.parameter {
            None => c.add("template.header", "set text or media"),
            Some(pb::template_header::Parameter::Text(s)) => {
                c.chars("template.header.text", s, 1, 60)
            }
            Some(pb::template_header::Parameter::Media(m)) => {
                media(c, "template.header.media", m);
                if !matches!(
                    m.kind(),
                    MediaKind::Image | MediaKind::Video | MediaKind::Document
                ) {
                    c.add(
                        "template.header.media.kind",
                        "must be IMAGE, VIDEO or DOCUMENT",
                    );
                }
                if !m.caption.is_empty() {
                    c.add(
                        "template.header.media.caption",
                        "a template header has no caption",
                    );
                }
            }
        }
    }
    if t.buttons.len() > 10 {
        c.add("template.buttons", "must hold at most 10 buttons");
    }
    let mut seen = Vec::new();
    for (i, b) in t.buttons.iter().enumerate() {
        let p = format!("template.buttons[{i}]");
        if b.index > 9 {
            c.add(&format!("{p}.index"), "must be 0 to 9");
        } else if seen.contains(&b.index) {
            c.add(&format!("{p}.index"), "is given twice");
        }
        seen.push(b.index);
        match &b.parameter {
            None => c.add(&p, "set quick_reply_payload or url_suffix"),
            Some(pb::template_button::Parameter::QuickReplyPayload(s)) => {
                c.chars(&format!("{p}.quick_reply_payload"), s, 1, 1000)
            }
            Some(pb::template_button::Parameter::UrlSuffix(s)) => {
                c.chars(&format!("{p}.url_suffix"), s, 1, 2000)
            }
        }
    }
}

fn media(c: &mut Check<'_>, p: &str, m: &pb::Media) {
    if m.kind() == MediaKind::Unspecified {
        c.add(&format!("{p}.kind"), "is required");
    }
    match &m.source {
        None => c.add(p, "set link or media_id"),
        Some(pb::media::Source::Link(l)) => c.url(&format!("{p}.link"), l, true, true),
        Some(pb::media::Source::MediaId(id)) => {
            if id.is_empty() || id.len() > 256 || id.chars().any(char::is_whitespace) {
                c.add(
                    &format!("{p}.media_id"),
                    "must be 1 to 256 bytes without spaces",
                );
            }
        }
    }
    c.chars(&format!("{p}.caption"), &m.caption, 0, 1024);
    if !m.caption.is_empty() && matches!(m.kind(), MediaKind::Audio | MediaKind::Sticker) {
        c.add(
            &format!("{p}.caption"),
            "only an image, video or document has a caption",
        );
    }
    c.chars(&format!("{p}.filename"), &m.filename, 0, 240);
    if m.filename.contains(['/', '\\']) {
        c.add(
            &format!("{p}.filename"),
            "must not contain a path separator",
        );
    }
    c.bytes(&format!("{p}.title"), &m.title, 0, 128);
    c.bytes(&format!("{p}.description"), &m.description, 0, 512);
}

fn interactive(c: &mut Check<'_>, i: &pb::Interactive) {
    use pb::interactive::Action;
    c.chars("interactive.header", &i.header, 0, 60);
    c.chars("interactive.body", &i.body, 1, 1024);
    c.chars("interactive.footer", &i.footer, 0, 60);
    match &i.action {
        None => c.add("interactive", "set buttons or list"),
        Some(Action::Buttons(b)) => {
            if b.buttons.is_empty() || b.buttons.len() > 3 {
                c.add("interactive.buttons.buttons", "must hold 1 to 3 buttons");
            }
            let mut ids = Vec::new();
            let mut titles = Vec::new();
            for (n, button) in b.buttons.iter().enumerate() {
                let p = format!("interactive.buttons.buttons[{n}]");
                c.chars(&format!("{p}.id"), &button.id, 1, 256);
                if button.id.trim() != button.id {
                    c.add(&format!("{p}.id"), "must not start or end with spaces");
                }
                c.chars(&format!("{p}.title"), &button.title, 1, 20);
                if ids.contains(&&button.id) {
                    c.add(&format!("{p}.id"), "must be unique");
                }
                if titles.contains(&&button.title) {
                    c.add(&format!("{p}.title"), "must be unique");
                }
                ids.push(&button.id);
                titles.push(&button.title);
            }
        }
        Some(Action::List(l)) => {
            c.chars("interactive.list.button", &l.button, 1, 20);
            if l.sections.is_empty() || l.sections.len() > 10 {
                c.add("interactive.list.sections", "must hold 1 to 10 sections");
            }
            let rows: usize = l.sections.iter().map(|s| s.rows.len()).sum();
            if rows > 10 {
                c.add(
                    "interactive.list.sections",
                    "must hold at most 10 rows in all",
                );
            }
            let mut ids = Vec::new();
            for (n, s) in l.sections.iter().enumerate() {
                let p = format!("interactive.list.sections[{n}]");
                let min_title = usize::from(l.sections.len() > 1);
                c.chars(&format!("{p}.title"), &s.title, min_title, 24);
                if s.rows.is_empty() {
                    c.add(&format!("{p}.rows"), "must hold 1 to 10 rows");
                }
                for (r, row) in s.rows.iter().enumerate() {
                    let p = format!("{p}.rows[{r}]");
                    c.chars(&format!("{p}.id"), &row.id, 1, 200);
                    if ids.contains(&&row.id) {
                        c.add(&format!("{p}.id"), "must be unique in the list");
                    }
                    ids.push(&row.id);
                    c.chars(&format!("{p}.title"), &row.title, 1, 24);
                    c.chars(&format!("{p}.description"), &row.description, 0, 72);
                }
            }
        }
    }
}

/// Whether a sender kind can send a body.
enum Support {
    /// It can.
    Yes,
    /// It cannot send this body at all.
    No,
    /// It sends this body, but not this kind of media: the kinds it sends.
    NotThisMedia(&'static str),
}

/// Whether `kind` can send `body`. The generic kinds (webhook, log, noop) pass everything on.
fn supports(kind: SenderKind, body: &Body) -> Support {
    use SenderKind::*;
    match (kind, body) {
        (Webhook | Log | Noop, _) | (_, Body::Text(_)) => Support::Yes,
        (
            WhatsappCloud,
            Body::Template(_) | Body::Media(_) | Body::Location(_) | Body::Interactive(_),
        ) => Support::Yes,
        (Wecom, Body::Markdown(_) | Body::TextCard(_) | Body::News(_) | Body::TextNotice(_)) => {
            Support::Yes
        }
        (WecomRobot, Body::Markdown(_) | Body::News(_)) => Support::Yes,
        (Wecom, Body::Media(m)) => match m.kind() {
            MediaKind::Image | MediaKind::Document | MediaKind::Video | MediaKind::Audio => {
                Support::Yes
            }
            _ => Support::NotThisMedia("IMAGE, DOCUMENT, VIDEO or AUDIO"),
        },
        (WecomRobot, Body::Media(m)) => match m.kind() {
            MediaKind::Image | MediaKind::Document => Support::Yes,
            _ => Support::NotThisMedia("IMAGE or DOCUMENT"),
        },
        _ => Support::No,
    }
}

/// A WhatsApp template's parameter values in the order of their keys `"1"`, `"2"`, … `"n"`
/// (its body's positional parameters), or why the keys are not that. Checked when a task is
/// created and used when it is sent, so a task whose keys Meta would refuse (132000) is refused
/// at once instead of failing at its send time.
pub fn positional_parameters(
    variables: &std::collections::BTreeMap<String, String>,
) -> Result<Vec<&str>, String> {
    let mut numbered = Vec::with_capacity(variables.len());
    for (key, value) in variables {
        let n = key.parse::<usize>().ok().filter(|n| *n >= 1).ok_or_else(|| {
            format!(
                "whatsapp template variables must be named \"1\", \"2\", … (positional parameters); got {key:?}"
            )
        })?;
        numbered.push((n, value.as_str()));
    }
    numbered.sort_by_key(|(n, _)| *n);
    for (i, (n, _)) in numbered.iter().enumerate() {
        if *n != i + 1 {
            return Err(format!(
                "whatsapp template variables must be numbered 1 to {} without gaps; {} is missing",
                numbered.len(),
                i + 1
            ));
        }
    }
    Ok(numbered.into_iter().map(|(_, v)| v).collect())
}

/// Checks that a `kind` sender can send `content` (whose shape [`check`] accepted): the body,
/// the media kind, and the channel's own limits.
pub fn check_for(content: &pb::Content, path: &str, kind: SenderKind) -> Vec<Violation> {
    let Some(body) = &content.body else {
        return Vec::new();
    };
    match supports(kind, body) {
        Support::Yes => {}
        Support::No => {
            return vec![Violation {
                field: format!("{path}.{}", body_name(body)),
                description: format!("a {kind} account cannot send it"),
            }]
        }
        Support::NotThisMedia(kinds) => {
            return vec![Violation {
                field: format!("{path}.media.kind"),
                description: format!("a {kind} account sends {kinds}"),
            }]
        }
    }
    let mut c = Check {
        path,
        out: Vec::new(),
    };
    match (kind, body) {
        (SenderKind::Wecom | SenderKind::WecomRobot, Body::Text(t)) => c.bytes("text", t, 1, 2048),
        (SenderKind::Wecom, Body::Markdown(t)) => c.bytes("markdown", t, 1, 2048),
        (SenderKind::WhatsappCloud, Body::Text(t)) => c.chars("text", t, 1, 4096),
        (SenderKind::Wecom | SenderKind::WecomRobot, Body::Media(m)) => {
            if kind == SenderKind::WecomRobot
                && matches!(m.source, Some(pb::media::Source::MediaId(_)))
                && m.kind() == MediaKind::Image
            {
                c.add(
                    "media.media_id",
                    "a wecom robot sends images inline: give a link",
                );
            }
            // WeCom's media messages carry the media alone (a video a title and description
            // too); text given here would be dropped unseen.
            if !m.caption.is_empty() {
                c.add(
                    "media.caption",
                    format!(
                        "a {kind} account sends media without a caption: send the text as a \
                         message of its own"
                    ),
                );
            }
            if !(kind == SenderKind::Wecom && m.kind() == MediaKind::Video) {
                for (field, value) in [("title", &m.title), ("description", &m.description)] {
                    if !value.is_empty() {
                        c.add(
                            &format!("media.{field}"),
                            format!("a {kind} account sends a {field} only with a video"),
                        );
                    }
                }
            }
        }
        (SenderKind::WhatsappCloud, Body::Media(m)) => {
            for (field, value) in [("title", &m.title), ("description", &m.description)] {
                if !value.is_empty() {
                    c.add(
                        &format!("media.{field}"),
                        format!("a {kind} account sends no {field}: use caption"),
                    );
                }
            }
            if !m.filename.is_empty() && m.kind() != MediaKind::Document {
                c.add(
                    "media.filename",
                    format!("a {kind} account shows a file name only for a document"),
                );
            }
        }
        (SenderKind::WecomRobot, Body::News(n)) => {
            for (i, a) in n.articles.iter().enumerate() {
                if a.url.is_empty() {
                    c.add(&format!("news.articles[{i}].url"), "is required");
                }
            }
        }
        (SenderKind::WhatsappCloud, Body::Template(t)) => {
            if t.language.is_empty() {
                c.add(
                    "template.language",
                    "a whatsapp template needs a language code",
                );
            }
            if let Err(problem) = positional_parameters(&t.variables) {
                c.add("template.variables", problem);
            }
        }
        _ => {}
    }
    c.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(link: &str) -> pb::Content {
        pb::Content {
            body: Some(Body::Media(pb::Media {
                kind: MediaKind::Image as i32,
                source: Some(pb::media::Source::Link(link.into())),
                ..Default::default()
            })),
            link_preview: false,
        }
    }

    #[test]
    fn a_media_link_must_be_https() {
        let v = check(&image("http://example.com/a.png"), "task.content");
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].field, "task.content.media.link");
        assert!(check(&image("https://example.com/a.png"), "c").is_empty());
    }

    #[test]
    fn media_text_a_channel_would_drop_is_refused() {
        let with = |kind: MediaKind, f: fn(&mut pb::Media)| {
            let mut m = pb::Media {
                kind: kind as i32,
                source: Some(pb::media::Source::Link("https://example.com/a".into())),
                ..Default::default()
            };
            f(&mut m);
            pb::Content {
                body: Some(Body::Media(m)),
                link_preview: false,
            }
        };
        let fields = |c: &pb::Content, kind: SenderKind| -> Vec<String> {
            check_for(c, "c", kind)
                .into_iter()
                .map(|v| v.field)
                .collect()
        };
        let captioned = with(MediaKind::Image, |m| m.caption = "Your invoice".into());
        assert_eq!(
            fields(&captioned, SenderKind::Wecom),
            vec!["c.media.caption"]
        );
        assert_eq!(
            fields(&captioned, SenderKind::WecomRobot),
            vec!["c.media.caption"]
        );
        assert!(fields(&captioned, SenderKind::WhatsappCloud).is_empty());
        let titled = |kind| {
            with(kind, |m| {
                m.title = "Demo".into();
                m.description = "How it works".into();
            })
        };
        assert!(fields(&titled(MediaKind::Video), SenderKind::Wecom).is_empty());
        assert_eq!(
            fields(&titled(MediaKind::Image), SenderKind::Wecom),
            vec!["c.media.title", "c.media.description"]
        );
        assert_eq!(
            fields(&titled(MediaKind::Video), SenderKind::WhatsappCloud),
            vec!["c.media.title", "c.media.description"]
        );
        let named = |kind| with(kind, |m| m.filename = "a.pdf".into());
        assert!(fields(&named(MediaKind::Document), SenderKind::WhatsappCloud).is_empty());
        assert_eq!(
            fields(&named(MediaKind::Image), SenderKind::WhatsappCloud),
            vec!["c.media.filename"]
        );
        // WeCom names the uploaded file whatever its kind.
        assert!(fields(&named(MediaKind::Image), SenderKind::Wecom).is_empty());
    }

    #[test]
    fn channels_refuse_what_they_cannot_send() {
        let loc = pb::Content {
            body: Some(Body::Location(pb::Location::default())),
            link_preview: false,
        };
        let v = check_for(&loc, "task.content", SenderKind::Wecom);
        assert_eq!(v[0].field, "task.content.location");
        assert!(check_for(&loc, "c", SenderKind::WhatsappCloud).is_empty());
        let mut sticker = image("https://example.com/s.webp");
        if let Some(Body::Media(m)) = &mut sticker.body {
            m.kind = MediaKind::Sticker as i32;
        }
        let v = check_for(&sticker, "task.content", SenderKind::WecomRobot);
        assert_eq!(v[0].field, "task.content.media.kind");
    }

    #[test]
    fn reply_buttons_are_unique_and_few() {
        let b = |id: &str| pb::ReplyButton {
            id: id.into(),
            title: id.into(),
        };
        let content = pb::Content {
            body: Some(Body::Interactive(pb::Interactive {
                body: "pick".into(),
                action: Some(pb::interactive::Action::Buttons(pb::ReplyButtons {
                    buttons: vec![b("a"), b("a"), b("c"), b("d")],
                })),
                ..Default::default()
            })),
            link_preview: false,
        };
        let fields: Vec<String> = check(&content, "c").into_iter().map(|v| v.field).collect();
        assert!(fields.contains(&"c.interactive.buttons.buttons".to_owned()));
        assert!(fields.contains(&"c.interactive.buttons.buttons[1].id".to_owned()));
    }
}
