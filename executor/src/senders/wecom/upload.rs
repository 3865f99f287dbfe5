//! Media for WeCom, which takes only media ids (or, for a robot's image, inline bytes): fetch
//! a task's `media.link` through the guarded [`MediaFetcher`], check WeCom's type and size
//! limits, upload it (`media/upload` for an app, `webhook/upload_media` for a robot) and cache
//! the id per account ([`UploadCache`], single-flight) until shortly before its 3 days end.
//! When WeCom refuses a send's id anyway (40007: expired or dropped early), the senders drop it
//! ([`Media::forget_rejected`]), upload again and resend once.
//!
//! Limits (providers-media.md §2.1): every file over 5 bytes; image JPG/PNG 10 MB (2 MB for a
//! robot's inline image), voice AMR 2 MB, video MP4 10 MB, file 20 MB.

use std::time::Duration;

use base64::Engine as _;
use herald_proto::v1::{self as pb, MediaKind};
use md5::{Digest, Md5};
use serde::Deserialize;
use serde_json::Value;
use tracing::{debug, info};

use super::{call, errcode};
use crate::senders::media::{MediaFetcher, UploadCache};
use crate::senders::{Content, SendError};

/// A media id lives 3 days; stop using a cached one an hour before.
pub(crate) const MEDIA_ID_TTL: Duration = Duration::from_secs(3 * 24 * 3600 - 3600);
/// WeCom refuses files of 5 bytes or fewer.
const MIN_BYTES: usize = 6;
/// A robot's inline image: 2 MB.
pub(crate) const ROBOT_IMAGE_MAX_BYTES: u64 = 2 * 1024 * 1024;

/// How WeCom takes one kind of media.
struct Limits {
    /// WeCom's media type (`type` of the upload).
    wtype: &'static str,
    /// The size cap, in bytes.
    max: u64,
    /// Accepted content types; empty: any.
    types: &'static [&'static str],
}

/// WeCom's media type for a herald media kind, its size cap and accepted content types.
fn limits(kind: MediaKind) -> Option<Limits> {
    const MB: u64 = 1024 * 1024;
    let (wtype, max, types): (_, _, &'static [&'static str]) = match kind {
        MediaKind::Image => ("image", 10 * MB, &["image/jpeg", "image/png"]),
        MediaKind::Audio => ("voice", 2 * MB, &["audio/amr"]),
        MediaKind::Video => ("video", 10 * MB, &["video/mp4"]),
        // Any type: a file is a file.
        MediaKind::Document => ("file", 20 * MB, &[]),
        MediaKind::Sticker | MediaKind::Unspecified => return None,
    };
    Some(Limits { wtype, max, types })
}

#[derive(Deserialize)]
struct UploadResponse {
    #[serde(default)]
    errcode: i64,
    #[serde(default)]
    errmsg: String,
    #[serde(default)]
    media_id: String,
}

/// What an upload is cached by besides its WeCom type: the link, and the file name it is
/// uploaded under when the task names one. WeCom shows recipients the uploaded name, so two
/// tasks sending one link under different names are two uploads.
fn cache_key<'a>(link: &'a str, m: &pb::Media) -> std::borrow::Cow<'a, str> {
    if m.filename.is_empty() {
        std::borrow::Cow::Borrowed(link)
    } else {
        // A newline is in no URL, so no link and name run into another's.
        std::borrow::Cow::Owned(format!("{link}\n{}", m.filename))
    }
}

/// One account's media: the shared fetcher, the HTTP client and the account's upload cache.
#[derive(Debug)]
pub(crate) struct Media {
    client: reqwest::Client,
    fetcher: MediaFetcher,
    cache: UploadCache,
}

impl Media {
    /// Media for one account.
    pub(crate) fn new(client: reqwest::Client, fetcher: MediaFetcher) -> Self {
        Media {
            client,
            fetcher,
            cache: UploadCache::new(MEDIA_ID_TTL),
        }
    }

    /// The media id of `m` as WeCom type `wtype`: the given id, or the link uploaded to the
    /// endpoint `upload_url(wtype)` (cached).
    pub(crate) async fn media_id(
        &self,
        m: &pb::Media,
        upload_url: impl FnOnce(&str) -> Result<reqwest::Url, SendError>,
    ) -> Result<String, SendError> {
        let Limits { wtype, max, types } = limits(m.kind()).ok_or_else(|| {
            SendError::permanent(format!("wecom cannot send {:?} media", m.kind()))
        })?;
        let link = match &m.source {
            Some(pb::media::Source::MediaId(id)) => return Ok(id.clone()),
            Some(pb::media::Source::Link(link)) => link,
            None => return Err(SendError::permanent("wecom media has no link or media_id")),
        };
        let what = format!("wecom {wtype}");
        self.cache
            .get_or_upload(wtype, &cache_key(link, m), || async move {
                let fetched = self.fetcher.fetch(link, max, types, &what).await?;
                if fetched.bytes.len() < MIN_BYTES {
                    return Err(SendError::permanent(format!(
                        "{what}: the file has {} bytes; WeCom needs more than 5",
                        fetched.bytes.len()
                    )));
                }
                let name = [m.filename.as_str(), fetched.file_name.as_str()]
                    .into_iter()
                    .find(|n| !n.is_empty())
                    .unwrap_or(wtype)
                    .to_owned();
                let mime = if fetched.content_type.is_empty() {
                    "application/octet-stream".to_owned()
                } else {
                    fetched.content_type.clone()
                };
                let length = fetched.bytes.len();
                let part = reqwest::multipart::Part::bytes(fetched.bytes.to_vec())
                    .file_name(name)
                    .mime_str(&mime)
                    .map_err(|e| {
                        SendError::permanent(format!("{what}: content type {mime:?}: {e}"))
                    })?;
                let form = reqwest::multipart::Form::new().part("media", part);
                let url = upload_url(wtype)?;
                let answer: UploadResponse = call(
                    self.client.post(url).multipart(form),
                    &format!("{what} upload"),
                )
                .await?;
                if answer.errcode != 0 {
                    return Err(errcode::classify(answer.errcode, &answer.errmsg, false));
                }
                if answer.media_id.is_empty() {
                    return Err(SendError::transient(format!(
                        "{what} upload answered without a media_id"
                    )));
                }
                info!(wtype, bytes = length, "uploaded media to wecom");
                Ok(answer.media_id)
            })
            .await
    }

    /// After WeCom refused the message `body` sending `content` with 40007 (invalid
    /// media_id): forgets the id the body used when this cache uploaded it from the content's
    /// link, and says whether it did. Then building the body again uploads afresh; a media id
    /// the task gave itself cannot be uploaded again, so it stays refused.
    pub(crate) async fn forget_rejected(&self, content: &Content, body: &Value) -> bool {
        let Content::Rich(pb::Content {
            body: Some(pb::content::Body::Media(m)),
            ..
        }) = content
        else {
            return false;
        };
        let (Some(pb::media::Source::Link(link)), Some(Limits { wtype, .. })) =
            (&m.source, limits(m.kind()))
        else {
            return false;
        };
        let msgtype = body["msgtype"].as_str().unwrap_or_default();
        let Some(id) = body[msgtype]["media_id"].as_str() else {
            return false;
        };
        self.cache.forget(wtype, &cache_key(link, m), id).await;
        true
    }

    /// A robot's inline image: the fetched bytes as base64, and their md5 (over the raw
    /// bytes, not the base64), JPG or PNG of at most 2 MB.
    pub(crate) async fn inline_image(&self, m: &pb::Media) -> Result<(String, String), SendError> {
        let Some(pb::media::Source::Link(link)) = &m.source else {
            return Err(SendError::permanent(
                "a wecom robot sends images inline: give a link, not a media_id",
            ));
        };
        let fetched = self
            .fetcher
            .fetch(
                link,
                ROBOT_IMAGE_MAX_BYTES,
                &["image/jpeg", "image/png"],
                "wecom robot image",
            )
            .await?;
        debug!(bytes = fetched.bytes.len(), "fetched a robot image");
        let md5 = hex::encode(Md5::digest(&fetched.bytes));
        let base64 = base64::engine::general_purpose::STANDARD.encode(&fetched.bytes);
        Ok((base64, md5))
    }
}
