//! A task's rich content as a WeCom message (providers-media.md §2): `(msgtype, object)` for
//! an application's `message/send` ([`app_message`]) and a group robot's `webhook/send`
//! ([`robot_message`]). Plain text keeps the account's `message_type` (mod.rs, robot.rs).
//!
//! | herald body | application | robot |
//! | --- | --- | --- |
//! | markdown | `markdown` | `markdown` |
//! | text_card | `textcard` | — |
//! | news | `news` | `news` |
//! | text_notice | `template_card` (`text_notice`) | — |
//! | media IMAGE | `image` (media id, uploaded from a link) | `image` (base64 + md5 of the fetched bytes) |
//! | media DOCUMENT | `file` (media id) | `file` (media id from `webhook/upload_media`) |
//! | media VIDEO | `video` (media id, title, description) | — |
//! | media AUDIO | `voice` (media id) | — |
//!
//! The shared rules (`herald_proto::content`) are checked first: what they refuse is
//! PERMANENT before anything is fetched or sent.

use herald_proto::content::{body_name, check, check_for};
use herald_proto::v1::{self as pb, content::Body, MediaKind};
use herald_proto::SenderKind;
use serde_json::{json, Value};

use super::upload::Media;
use crate::senders::SendError;

/// Checks `content` against the shared rules for `kind`.
fn checked(content: &pb::Content, kind: SenderKind) -> Result<&Body, SendError> {
    let mut violations = check(content, "content");
    if violations.is_empty() {
        violations = check_for(content, "content", kind);
    }
    if let Some(v) = violations.first() {
        return Err(SendError::permanent(format!(
            "{kind} cannot send this content: {} {}",
            v.field, v.description
        )));
    }
    content
        .body
        .as_ref()
        .ok_or_else(|| SendError::permanent(format!("{kind}: the content has no body")))
}

/// `news.articles` as WeCom writes them.
fn articles(n: &pb::News) -> Value {
    let articles: Vec<Value> = n
        .articles
        .iter()
        .map(|a| {
            let mut o = json!({ "title": a.title, "url": a.url });
            if !a.description.is_empty() {
                o["description"] = json!(a.description);
            }
            if !a.picture_url.is_empty() {
                o["picurl"] = json!(a.picture_url);
            }
            o
        })
        .collect();
    json!({ "articles": articles })
}

fn unsupported(kind: SenderKind, body: &Body) -> SendError {
    SendError::permanent(format!("{kind} cannot send a {} body", body_name(body)))
}

/// `(msgtype, object)` of an application message for rich `content`; media links are uploaded
/// through `media` to the endpoint `upload_url(type)`.
pub(crate) async fn app_message(
    content: &pb::Content,
    media: &Media,
    upload_url: impl FnOnce(&str) -> Result<reqwest::Url, SendError>,
) -> Result<(&'static str, Value), SendError> {
    let body = checked(content, SenderKind::Wecom)?;
    Ok(match body {
        Body::Text(t) => ("text", json!({ "content": t })),
        Body::Markdown(t) => ("markdown", json!({ "content": t })),
        Body::TextCard(c) => {
            let mut o = json!({ "title": c.title, "description": c.description, "url": c.url });
            if !c.button_text.is_empty() {
                o["btntxt"] = json!(c.button_text);
            }
            ("textcard", o)
        }
        Body::News(n) => ("news", articles(n)),
        Body::TextNotice(t) => {
            let mut main_title = json!({ "title": t.title });
            if !t.description.is_empty() {
                main_title["desc"] = json!(t.description);
            }
            let mut card = json!({
                "card_type": "text_notice",
                "main_title": main_title,
                "card_action": { "type": 1, "url": t.url },
            });
            if !t.sub_title.is_empty() {
                card["sub_title_text"] = json!(t.sub_title);
            }
            if !t.emphasis.is_empty() {
                card["emphasis_content"] =
                    json!({ "title": t.emphasis, "desc": t.emphasis_description });
            }
            ("template_card", card)
        }
        Body::Media(m) => {
            let media_id = media.media_id(m, upload_url).await?;
            match m.kind() {
                MediaKind::Image => ("image", json!({ "media_id": media_id })),
                MediaKind::Document => ("file", json!({ "media_id": media_id })),
                MediaKind::Audio => ("voice", json!({ "media_id": media_id })),
                MediaKind::Video => {
                    let mut o = json!({ "media_id": media_id });
                    if !m.title.is_empty() {
                        o["title"] = json!(m.title);
                    }
                    if !m.description.is_empty() {
                        o["description"] = json!(m.description);
                    }
                    ("video", o)
                }
                _ => return Err(unsupported(SenderKind::Wecom, body)),
            }
        }
        other => return Err(unsupported(SenderKind::Wecom, other)),
    })
}

/// `(msgtype, object)` of a robot message for rich `content`: an image is fetched and sent
/// inline, a document is uploaded to `upload_url("file")`.
pub(crate) async fn robot_message(
    content: &pb::Content,
    media: &Media,
    upload_url: impl FnOnce(&str) -> Result<reqwest::Url, SendError>,
) -> Result<(&'static str, Value), SendError> {
    let body = checked(content, SenderKind::WecomRobot)?;
    Ok(match body {
        Body::Text(t) => ("text", json!({ "content": t })),
        Body::Markdown(t) => ("markdown", json!({ "content": t })),
        Body::News(n) => ("news", articles(n)),
        Body::Media(m) if m.kind() == MediaKind::Image => {
            let (base64, md5) = media.inline_image(m).await?;
            ("image", json!({ "base64": base64, "md5": md5 }))
        }
        Body::Media(m) if m.kind() == MediaKind::Document => {
            let media_id = media.media_id(m, upload_url).await?;
            ("file", json!({ "media_id": media_id }))
        }
        other => return Err(unsupported(SenderKind::WecomRobot, other)),
    })
}
