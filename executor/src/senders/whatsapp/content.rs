//! A task's content as a Cloud API message (providers-media.md §1): the `type` and the object
//! of that name, merged into the request body by [`super::message_body`].
//!
//! | herald body | Cloud API |
//! | --- | --- |
//! | text (`link_preview`) | `text` (`preview_url`) |
//! | template (variables "1", "2", …; header; buttons) | `template` with `header`, `body` and `button` components |
//! | media IMAGE, DOCUMENT, VIDEO, AUDIO, STICKER | `image`, `document`, `video`, `audio`, `sticker` (`link` or `id`; caption; filename) |
//! | location | `location` |
//! | interactive buttons / list | `interactive` `button` / `list` |
//!
//! Media links are passed to Meta, which fetches them itself: the executor fetches nothing for
//! WhatsApp. Anything else, or content the shared rules refuse, is PERMANENT before sending.

use std::collections::BTreeMap;

use herald_proto::content::{check, check_for};
use herald_proto::v1::{self as pb, content::Body, MediaKind};
use herald_proto::SenderKind;
use serde_json::{json, Value};

use crate::senders::{Content, SendError};

/// `(type, object)` of the message for `content`, or PERMANENT when WhatsApp cannot send it.
pub fn message(content: &Content) -> Result<(&'static str, Value), SendError> {
    let content = content.to_proto();
    let mut violations = check(&content, "content");
    if violations.is_empty() {
        violations = check_for(&content, "content", SenderKind::WhatsappCloud);
    }
    if let Some(v) = violations.first() {
        return Err(SendError::permanent(format!(
            "whatsapp cannot send this content: {} {}",
            v.field, v.description
        )));
    }
    let Some(body) = &content.body else {
        return Err(SendError::permanent("whatsapp: the content has no body"));
    };
    Ok(match body {
        Body::Text(text) => (
            "text",
            json!({ "preview_url": content.link_preview, "body": text }),
        ),
        Body::Template(t) => ("template", template(t)?),
        Body::Media(m) => {
            let (kind, object) = media(m);
            (kind, object)
        }
        Body::Location(l) => {
            let mut o = json!({ "latitude": l.latitude, "longitude": l.longitude });
            set_if(&mut o, "name", &l.name);
            set_if(&mut o, "address", &l.address);
            ("location", o)
        }
        Body::Interactive(i) => ("interactive", interactive(i)),
        other => {
            return Err(SendError::permanent(format!(
                "whatsapp cannot send a {} body",
                herald_proto::content::body_name(other)
            )))
        }
    })
}

/// Sets `key` when `value` is not empty (Meta refuses some empty optional strings).
fn set_if(object: &mut Value, key: &str, value: &str) {
    if !value.is_empty() {
        object[key] = json!(value);
    }
}

/// The Cloud API's name of a media kind.
fn kind_name(kind: MediaKind) -> &'static str {
    match kind {
        MediaKind::Document => "document",
        MediaKind::Video => "video",
        MediaKind::Audio => "audio",
        MediaKind::Sticker => "sticker",
        // Unspecified is refused by the shared checks before this.
        MediaKind::Image | MediaKind::Unspecified => "image",
    }
}

/// `(type, media object)`: `link` or `id`, and the caption and filename where they apply.
fn media(m: &pb::Media) -> (&'static str, Value) {
    let kind = m.kind();
    let mut o = match &m.source {
        Some(pb::media::Source::MediaId(id)) => json!({ "id": id }),
        Some(pb::media::Source::Link(link)) => json!({ "link": link }),
        None => json!({}),
    };
    if matches!(
        kind,
        MediaKind::Image | MediaKind::Video | MediaKind::Document
    ) {
        set_if(&mut o, "caption", &m.caption);
    }
    if kind == MediaKind::Document {
        set_if(&mut o, "filename", &m.filename);
    }
    (kind_name(kind), o)
}

fn template(t: &pb::TemplateContent) -> Result<Value, SendError> {
    if t.language.is_empty() {
        return Err(SendError::permanent(format!(
            "whatsapp template {} needs a language code (e.g. en_US)",
            t.template_id
        )));
    }
    let mut components = Vec::new();
    if let Some(header) = t.header.as_ref().and_then(|h| h.parameter.as_ref()) {
        let parameter = match header {
            pb::template_header::Parameter::Text(text) => json!({ "type": "text", "text": text }),
            pb::template_header::Parameter::Media(m) => {
                let (kind, mut object) = media(m);
                // A template header's media has no caption (WA-OAS `ImageParameter`).
                if let Some(o) = object.as_object_mut() {
                    o.remove("caption");
                }
                let mut parameter = json!({ "type": kind });
                parameter[kind] = object;
                parameter
            }
        };
        components.push(json!({ "type": "header", "parameters": [parameter] }));
    }
    let variables: BTreeMap<String, String> = t.variables.clone().into_iter().collect();
    let params = super::positional_parameters(&variables)?;
    if !params.is_empty() {
        let parameters: Vec<Value> = params
            .into_iter()
            .map(|text| json!({ "type": "text", "text": text }))
            .collect();
        components.push(json!({ "type": "body", "parameters": parameters }));
    }
    for b in &t.buttons {
        let (sub_type, parameter) = match &b.parameter {
            Some(pb::template_button::Parameter::QuickReplyPayload(p)) => {
                ("quick_reply", json!({ "type": "payload", "payload": p }))
            }
            Some(pb::template_button::Parameter::UrlSuffix(s)) => {
                ("url", json!({ "type": "text", "text": s }))
            }
            None => continue,
        };
        components.push(json!({
            "type": "button",
            "sub_type": sub_type,
            // A string, 0-based (WA-OAS `ButtonComponent`).
            "index": b.index.to_string(),
            "parameters": [parameter],
        }));
    }
    let mut o = json!({ "name": t.template_id, "language": { "code": t.language } });
    if !components.is_empty() {
        o["components"] = json!(components);
    }
    Ok(o)
}

fn interactive(i: &pb::Interactive) -> Value {
    use pb::interactive::Action;
    let mut o = json!({ "body": { "text": i.body } });
    if !i.header.is_empty() {
        o["header"] = json!({ "type": "text", "text": i.header });
    }
    if !i.footer.is_empty() {
        o["footer"] = json!({ "text": i.footer });
    }
    match &i.action {
        Some(Action::Buttons(b)) => {
            o["type"] = json!("button");
            let buttons: Vec<Value> = b
                .buttons
                .iter()
                .map(|b| json!({ "type": "reply", "reply": { "id": b.id, "title": b.title } }))
                .collect();
            o["action"] = json!({ "buttons": buttons });
        }
        Some(Action::List(l)) => {
            o["type"] = json!("list");
            let sections: Vec<Value> = l
                .sections
                .iter()
                .map(|s| {
                    let rows: Vec<Value> = s
                        .rows
                        .iter()
                        .map(|r| {
                            let mut row = json!({ "id": r.id, "title": r.title });
                            set_if(&mut row, "description", &r.description);
                            row
                        })
                        .collect();
                    let mut section = json!({ "rows": rows });
                    set_if(&mut section, "title", &s.title);
                    section
                })
                .collect();
            o["action"] = json!({ "button": l.button, "sections": sections });
        }
        // Refused by the shared checks before this.
        None => {}
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_by_id_keeps_its_filename_and_caption() -> anyhow::Result<()> {
        let content = Content::Rich(pb::Content {
            body: Some(Body::Media(pb::Media {
                kind: MediaKind::Document as i32,
                source: Some(pb::media::Source::MediaId("4490709327384033".into())),
                caption: "Q3".into(),
                filename: "q3.pdf".into(),
                ..Default::default()
            })),
            link_preview: false,
        });
        let (kind, o) = message(&content)?;
        assert_eq!(kind, "document");
        assert_eq!(
            o,
            json!({"id": "4490709327384033", "caption": "Q3", "filename": "q3.pdf"})
        );
        Ok(())
    }

    #[test]
    fn a_template_with_header_and_buttons_has_three_kinds_of_component() -> anyhow::Result<()> {
        let content = Content::Rich(pb::Content {
            body: Some(Body::Template(pb::TemplateContent {
                template_id: "order_update".into(),
                language: "en_US".into(),
                variables: [("1".to_owned(), "Alice".to_owned())].into_iter().collect(),
                header: Some(pb::TemplateHeader {
                    parameter: Some(pb::template_header::Parameter::Media(pb::Media {
                        kind: MediaKind::Image as i32,
                        source: Some(pb::media::Source::Link("https://example.com/a.jpg".into())),
                        ..Default::default()
                    })),
                }),
                buttons: vec![pb::TemplateButton {
                    index: 1,
                    parameter: Some(pb::template_button::Parameter::UrlSuffix("o/42".into())),
                }],
            })),
            link_preview: false,
        });
        let (_, o) = message(&content)?;
        let c = &o["components"];
        assert_eq!(
            c[0]["parameters"][0]["image"]["link"],
            "https://example.com/a.jpg"
        );
        assert_eq!(c[1]["parameters"][0]["text"], "Alice");
        assert_eq!(c[2]["sub_type"], "url");
        assert_eq!(c[2]["index"], "1");
        Ok(())
    }

    #[test]
    fn wecom_only_bodies_are_permanent() {
        let err = message(&Content::Rich(pb::Content {
            body: Some(Body::Markdown("**hi**".into())),
            link_preview: false,
        }))
        .unwrap_err();
        assert_eq!(err.class, crate::senders::OutcomeClass::Permanent);
        assert!(err.message.contains("content.markdown"), "{err}");
    }
}
