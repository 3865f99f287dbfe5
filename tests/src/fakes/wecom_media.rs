//! The fake WeCom API's media and rich message types (providers-media.md §2): the uploads
//! (`media/upload` for an app, `webhook/upload_media` for a robot: multipart part `media`,
//! answering `media_id` and `created_at`), and the shapes of `image`, `voice`, `video`,
//! `file`, `news` and `template_card` messages. A media id must be one the fake issued, of the
//! message's type, and not expired (40007 otherwise). Ids expire only when a test says so
//! ([`MediaStore::expire_all`]), as WeCom's do after 3 days or when it drops them early.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use axum::extract::Multipart;
use base64::Engine as _;
use md5::Digest as _;
use serde_json::{json, Value};

use super::lock;

/// One upload as the fake saw it.
#[derive(Debug, Clone)]
pub struct Upload {
    /// `type` of the query (`image`, `voice`, `video`, `file`).
    pub media_type: String,
    /// The part's file name.
    pub filename: String,
    /// The part's content type.
    pub content_type: String,
    /// The file's size.
    pub len: usize,
    /// Whether it was the robot's endpoint.
    pub robot: bool,
}

/// Uploaded media and the media ids issued.
#[derive(Default)]
pub(crate) struct MediaStore {
    uploads: Mutex<Vec<Upload>>,
    ids: Mutex<HashMap<String, String>>,
    next: AtomicU64,
}

/// WeCom's limits per type: size cap, accepted content types (empty: any).
fn limits(media_type: &str) -> Option<(usize, &'static [&'static str])> {
    const MB: usize = 1024 * 1024;
    Some(match media_type {
        "image" => (10 * MB, &["image/jpeg", "image/png"]),
        "voice" => (2 * MB, &["audio/amr"]),
        "video" => (10 * MB, &["video/mp4"]),
        "file" => (20 * MB, &[]),
        _ => return None,
    })
}

impl MediaStore {
    /// Every upload so far.
    pub(crate) fn uploads(&self) -> Vec<Upload> {
        lock(&self.uploads).clone()
    }

    /// Forgets every media id issued so far: sends naming one are answered 40007 (invalid
    /// media_id), as for an id that expired or that WeCom dropped early. Later uploads issue
    /// new, valid ids.
    pub(crate) fn expire_all(&self) {
        lock(&self.ids).clear();
    }

    /// Reads a multipart upload of `media_type` and answers as WeCom does: the media id and
    /// `created_at`, or an errcode (40004 bad type, 40006 bad size, 41005 no media part).
    pub(crate) async fn upload(&self, media_type: &str, robot: bool, mut form: Multipart) -> Value {
        let Some((max, types)) = limits(media_type) else {
            return json!({ "errcode": 40004, "errmsg": "invalid media type" });
        };
        if robot && !matches!(media_type, "file" | "voice") {
            return json!({ "errcode": 40004, "errmsg": "invalid media type" });
        }
        let mut found = None;
        while let Ok(Some(field)) = form.next_field().await {
            if field.name() != Some("media") {
                continue;
            }
            let filename = field.file_name().unwrap_or_default().to_owned();
            let content_type = field.content_type().unwrap_or_default().to_owned();
            let Ok(bytes) = field.bytes().await else {
                return json!({ "errcode": 40006, "errmsg": "invalid file size" });
            };
            found = Some((filename, content_type, bytes));
        }
        let Some((filename, content_type, bytes)) = found else {
            return json!({ "errcode": 41005, "errmsg": "media data missing" });
        };
        if filename.is_empty() {
            return json!({ "errcode": 41005, "errmsg": "media data missing" });
        }
        if bytes.len() <= 5 || bytes.len() > max {
            return json!({ "errcode": 40006, "errmsg": "invalid file size" });
        }
        if !types.is_empty() && !types.contains(&content_type.as_str()) {
            return json!({ "errcode": 40004, "errmsg": "invalid media type" });
        }
        lock(&self.uploads).push(Upload {
            media_type: media_type.to_owned(),
            filename,
            content_type,
            len: bytes.len(),
            robot,
        });
        let id = format!("media-{}", self.next.fetch_add(1, Ordering::SeqCst) + 1);
        lock(&self.ids).insert(id.clone(), media_type.to_owned());
        json!({
            "errcode": 0, "errmsg": "", "type": media_type, "media_id": id,
            "created_at": "1380000000"
        })
    }

    /// Checks `body[kind].media_id` names media of `media_type` the fake issued.
    fn media_id(&self, body: &Value, kind: &str, media_type: &str) -> Result<(), i64> {
        let id = body[kind]["media_id"].as_str().ok_or(41003_i64)?;
        match lock(&self.ids).get(id) {
            Some(t) if t == media_type => Ok(()),
            _ => Err(40007),
        }
    }

    /// An application message of a rich `msgtype`; None for types this module does not know.
    pub(crate) fn check_app(&self, msgtype: &str, body: &Value) -> Option<Result<(), i64>> {
        Some(match msgtype {
            "image" => self.media_id(body, "image", "image"),
            "voice" => self.media_id(body, "voice", "voice"),
            "file" => self.media_id(body, "file", "file"),
            "video" => self.media_id(body, "video", "video").and_then(|()| {
                let v = &body["video"];
                let long = |k: &str, max: usize| v[k].as_str().is_some_and(|s| s.len() > max);
                if long("title", 128) || long("description", 512) {
                    Err(45002)
                } else {
                    Ok(())
                }
            }),
            "news" => news(body),
            "template_card" => template_card(&body["template_card"]),
            _ => return None,
        })
    }

    /// A robot message of a rich `msgtype`; None for types this module does not know.
    pub(crate) fn check_robot(&self, msgtype: &str, body: &Value) -> Option<Result<(), i64>> {
        Some(match msgtype {
            "image" => robot_image(&body["image"]),
            "file" => self.media_id(body, "file", "file"),
            "voice" => self.media_id(body, "voice", "voice"),
            "news" => news(body),
            _ => return None,
        })
    }
}

/// `news`: 1 to 8 articles, each with a title and an http(s) url.
fn news(body: &Value) -> Result<(), i64> {
    let articles = body["news"]["articles"].as_array().ok_or(41003_i64)?;
    if articles.is_empty() || articles.len() > 8 {
        return Err(40058);
    }
    for a in articles {
        let title = a["title"].as_str().unwrap_or_default();
        let url = a["url"].as_str().unwrap_or_default();
        if title.is_empty() || title.len() > 128 {
            return Err(40058);
        }
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(40058);
        }
    }
    Ok(())
}

/// `template_card` of type `text_notice`: a main title or sub-title text, and a `card_action`
/// of type 1 with a url (or 2 with an appid).
fn template_card(card: &Value) -> Result<(), i64> {
    if card["card_type"].as_str() != Some("text_notice") {
        return Err(40058);
    }
    let title = card["main_title"]["title"].as_str().unwrap_or_default();
    let sub = card["sub_title_text"].as_str().unwrap_or_default();
    if title.is_empty() && sub.is_empty() {
        return Err(40058);
    }
    let action = &card["card_action"];
    match action["type"].as_i64() {
        Some(1)
            if action["url"]
                .as_str()
                .is_some_and(|u| u.starts_with("http")) =>
        {
            Ok(())
        }
        Some(2) if action["appid"].as_str().is_some_and(|a| !a.is_empty()) => Ok(()),
        _ => Err(40058),
    }
}

/// A robot's inline image: base64 that decodes to a JPG or PNG of at most 2 MB, whose md5
/// (over the raw bytes) is `md5`.
fn robot_image(image: &Value) -> Result<(), i64> {
    let b64 = image["base64"].as_str().ok_or(41003_i64)?;
    let md5 = image["md5"].as_str().ok_or(41003_i64)?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|_| 40035_i64)?;
    if bytes.len() > 2 * 1024 * 1024 {
        return Err(40006);
    }
    let png = bytes.starts_with(b"\x89PNG");
    let jpg = bytes.starts_with(&[0xff, 0xd8]);
    if !png && !jpg {
        return Err(40004);
    }
    if md5_hex(&bytes) != md5.to_ascii_lowercase() {
        return Err(40035);
    }
    Ok(())
}

/// md5 of `bytes` in hex.
pub fn md5_hex(bytes: &[u8]) -> String {
    hex::encode(md5::Md5::digest(bytes))
}
