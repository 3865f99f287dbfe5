//! WeCom (企业微信) senders: application messages (`wecom`, this module) and group robots
//! ([`robot`]).
//!
//! An application message goes to `POST {base_url}/cgi-bin/message/send?access_token=…` with
//! the app's token from `gettoken`, cached per app ([`token`]). The task's recipient is
//! WeCom's `touser`: one userid or several joined by `|` (`@all` for everyone in the app's
//! visible range). WeCom drops, without an error, messages beyond 30 a minute or 1,000 an hour
//! per app and member, so this sender counts them itself and answers RATE_LIMITED before the
//! limit instead of sending into the void.
//!
//! Outcomes beyond [`errcode::classify`]: `invaliduser` naming every recipient is PERMANENT;
//! naming some is OK for the message, with the rejected users in the attempt's note.

mod content;
pub mod errcode;
pub mod robot;
mod token;
mod upload;

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use toml::Spanned;
use tracing::{debug, info, instrument, warn, Span};

use super::config::{BuildContext, BuildSender, ConfigError, DurationSpec};
use super::http::transport_error;
use super::limiter::{KeyedLimiter, WindowLimit};
use super::media::MediaFetcher;
use super::{BoxSender, Content, OutcomeClass, SendError, SendReceipt, SendRequest, Sender};
use crate::credentials::{Secret, SecretRef};
use token::TokenCache;

/// WeCom's API host.
pub const DEFAULT_BASE_URL: &str = "https://qyapi.weixin.qq.com";
/// `text.content` limit (bytes).
pub const MAX_TEXT_BYTES: usize = 2048;
/// Application `markdown.content` limit. Unverified for app messages (robots allow 4096), so
/// the text limit is used: the safe side.
pub const MAX_APP_MARKDOWN_BYTES: usize = 2048;
/// `textcard.title` limit (bytes); WeCom truncates beyond it, we refuse instead.
pub const MAX_CARD_TITLE_BYTES: usize = 128;
/// `textcard.description` limit (bytes); WeCom truncates beyond it, we refuse instead.
pub const MAX_CARD_DESCRIPTION_BYTES: usize = 512;
/// `textcard.url` limit (bytes).
pub const MAX_CARD_URL_BYTES: usize = 2048;
/// `textcard.btntxt` limit (characters).
pub const MAX_CARD_BUTTON_CHARS: usize = 4;
/// `duplicate_check_interval` maximum: 4 hours.
pub const MAX_DUPLICATE_CHECK_INTERVAL: Duration = Duration::from_secs(4 * 3600);

/// WeCom's per-app, per-member limits (providers.md §2.4, documented): 30 a minute and 1,000
/// an hour; the excess is dropped silently. A sliding window is stricter than any fixed
/// window of the same length, so these values are safe whichever kind WeCom uses.
pub fn default_member_limits() -> Vec<WindowLimit> {
    vec![
        WindowLimit {
            max: 30,
            window: Duration::from_secs(60),
        },
        WindowLimit {
            max: 1000,
            window: Duration::from_secs(3600),
        },
    ]
}

/// Which WeCom message type a `wecom` account sends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MessageType {
    /// `text`.
    #[default]
    Text,
    /// `markdown`.
    Markdown,
    /// `textcard`: the text is the description; title and link from the task's labels
    /// `title` and `url`, or the account's `card_title` and `card_url`.
    TextCard,
}

impl MessageType {
    /// Parses the config value.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "text" => Some(Self::Text),
            "markdown" => Some(Self::Markdown),
            "textcard" => Some(Self::TextCard),
            _ => None,
        }
    }

    /// The `message_type` setting, [`MessageType::Text`] when absent.
    pub(crate) fn from_setting(
        cx: &BuildContext<'_>,
        value: &Option<Spanned<String>>,
    ) -> Result<Self, ConfigError> {
        match value {
            None => Ok(MessageType::default()),
            Some(v) => MessageType::parse(v.get_ref()).ok_or_else(|| {
                cx.invalid(
                    v.span(),
                    format!(
                        "message_type must be \"text\", \"markdown\" or \"textcard\", got {:?}",
                        v.get_ref()
                    ),
                )
            }),
        }
    }
}

/// `sender = "wecom"`: one application of one corp.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeComConfig {
    /// The enterprise id.
    corp_id: Spanned<String>,
    /// The application's secret.
    corp_secret: Spanned<SecretRef>,
    /// The application's id.
    agent_id: Spanned<i64>,
    /// The API host; [`DEFAULT_BASE_URL`] when absent.
    base_url: Option<Spanned<String>>,
    /// `text` (default), `markdown` or `textcard`.
    message_type: Option<Spanned<String>>,
    /// Sent on retries, at most 4 h; WeCom's default (1800 s) when absent.
    duplicate_check_interval: Option<Spanned<DurationSpec>>,
    /// `retries` (default) or `always`: which attempts ask WeCom's duplicate check.
    duplicate_check: Option<Spanned<String>>,
    /// `textcard` title unless the task has a `title` label.
    card_title: Option<Spanned<String>>,
    /// `textcard` link unless the task has a `url` label.
    card_url: Option<Spanned<String>>,
    /// `textcard` button text.
    card_button: Option<Spanned<String>>,
}

impl BuildSender for WeComConfig {
    fn build(self, cx: &mut BuildContext<'_>) -> Result<BoxSender, ConfigError> {
        let corp_id = cx.non_empty("corp_id", &self.corp_id)?.to_owned();
        let corp_secret = cx.secret("corp_secret", &self.corp_secret)?;
        let agent_id = *self.agent_id.get_ref();
        if agent_id <= 0 {
            return Err(cx.invalid(self.agent_id.span(), "agent_id must be a positive integer"));
        }
        let message_type = MessageType::from_setting(cx, &self.message_type)?;
        let duplicate_check_interval = match &self.duplicate_check_interval {
            None => None,
            Some(d) => Some(
                d.get_ref()
                    .to_duration()
                    .filter(|d| !d.is_zero() && *d <= MAX_DUPLICATE_CHECK_INTERVAL)
                    .ok_or_else(|| {
                        cx.invalid(
                            d.span(),
                            "duplicate_check_interval must be between 1s and 4h (e.g. \"30m\" or 1800)",
                        )
                    })?,
            ),
        };
        // Checked here, where the line can be named, rather than failing every send.
        if let Some(title) = &self.card_title {
            if title.get_ref().len() > MAX_CARD_TITLE_BYTES {
                return Err(cx.invalid(title.span(), "card_title must be at most 128 bytes"));
            }
        }
        if let Some(url) = &self.card_url {
            let u = url.get_ref();
            if !(u.starts_with("http://") || u.starts_with("https://"))
                || u.len() > MAX_CARD_URL_BYTES
            {
                return Err(cx.invalid(
                    url.span(),
                    "card_url must be an http(s) link of at most 2048 bytes",
                ));
            }
        }
        if let Some(button) = &self.card_button {
            let chars = button.get_ref().chars().count();
            if chars == 0 || chars > MAX_CARD_BUTTON_CHARS {
                return Err(cx.invalid(
                    button.span(),
                    "card_button must be 1 to 4 characters (WeCom's btntxt)",
                ));
            }
        }
        let duplicate_check_always = match &self.duplicate_check {
            None => false,
            Some(d) => match d.get_ref().as_str() {
                "retries" => false,
                "always" => true,
                _ => {
                    return Err(cx.invalid(
                        d.span(),
                        "duplicate_check must be \"retries\" or \"always\"",
                    ))
                }
            },
        };
        let card = CardDefaults {
            title: self.card_title.map(Spanned::into_inner),
            url: self.card_url.map(Spanned::into_inner),
            button: self.card_button.map(Spanned::into_inner),
        };
        let base_url = cx.base_url(&self.base_url, DEFAULT_BASE_URL)?;
        let settings = WeComSettings {
            base_url,
            corp_id,
            corp_secret,
            agent_id,
            message_type,
            duplicate_check_interval,
            duplicate_check_always,
            card,
            member_limits: default_member_limits(),
            media: cx.media()?,
        };
        let sender =
            WeComSender::new(cx.http_client()?, settings).map_err(|e| cx.invalid_table(e))?;
        Ok(sender.boxed())
    }
}

/// Defaults for `textcard` messages.
#[derive(Clone, Debug, Default)]
pub struct CardDefaults {
    /// Title when the task has no `title` label.
    pub title: Option<String>,
    /// Link when the task has no `url` label.
    pub url: Option<String>,
    /// Button text (WeCom's default is "详情").
    pub button: Option<String>,
}

/// Settings of one `wecom` account (one application of one corp).
#[derive(Clone)]
pub struct WeComSettings {
    /// The API host, e.g. [`DEFAULT_BASE_URL`] or a local fake.
    pub base_url: reqwest::Url,
    /// The enterprise id (`corpid`).
    pub corp_id: String,
    /// The application's secret (`corpsecret`).
    pub corp_secret: Secret,
    /// The application's id (`agentid`).
    pub agent_id: i64,
    /// The message type sent.
    pub message_type: MessageType,
    /// `duplicate_check_interval` sent on retries; WeCom's default (1800 s) when `None`.
    pub duplicate_check_interval: Option<Duration>,
    /// Whether the first attempt asks for the duplicate check too. Then a retry after a lost
    /// first answer is surely one WeCom matches, at the price that the same text to the same
    /// member within the interval from another task is not delivered either (an alert sent
    /// twice in half an hour, say): opt-in, per account.
    pub duplicate_check_always: bool,
    /// `textcard` defaults.
    pub card: CardDefaults,
    /// Per-member limits kept by the executor.
    pub member_limits: Vec<WindowLimit>,
    /// Fetches media links for upload (the file's `[media]` policy).
    pub media: MediaFetcher,
}

impl fmt::Debug for WeComSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeComSettings")
            .field("base_url", &self.base_url.as_str())
            .field("corp_id", &self.corp_id)
            .field("corp_secret", &self.corp_secret)
            .field("agent_id", &self.agent_id)
            .field("message_type", &self.message_type)
            .field("duplicate_check_interval", &self.duplicate_check_interval)
            .field("duplicate_check_always", &self.duplicate_check_always)
            .finish_non_exhaustive()
    }
}

/// The base URL does not take an API path.
#[derive(Debug, thiserror::Error)]
#[error("base_url {0:?} cannot be used as a WeCom API base")]
pub struct InvalidBaseUrl(pub String);

/// Joins `segments` under `base` (keeping any path prefix `base` has).
pub(crate) fn api_url(
    base: &reqwest::Url,
    segments: &[&str],
) -> Result<reqwest::Url, InvalidBaseUrl> {
    let mut url = base.clone();
    url.set_query(None);
    url.path_segments_mut()
        .map_err(|()| InvalidBaseUrl(base.to_string()))?
        .pop_if_empty()
        .extend(segments);
    Ok(url)
}

/// Makes one WeCom API call (`what` names it in errors) and reads its JSON answer. WeCom
/// answers errors with HTTP 200 and an `errcode`, left to the caller; transport failures and
/// non-2xx statuses (proxies, outages) are classified here, and a body that is not the
/// expected JSON is TRANSIENT. URLs, which carry tokens and keys, stay out of the errors.
pub(crate) async fn call<T: serde::de::DeserializeOwned>(
    request: reqwest::RequestBuilder,
    what: &str,
) -> Result<T, SendError> {
    let response = request.send().await.map_err(|e| transport_error(what, e))?;
    let status = response.status();
    if !status.is_success() {
        return Err(errcode::classify_http(status, what));
    }
    response.json::<T>().await.map_err(|e| {
        SendError::transient(format!(
            "{what} answered something that is not its JSON: {}",
            e.without_url()
        ))
    })
}

/// Sends application messages of one WeCom app.
#[derive(Debug)]
pub struct WeComSender {
    client: reqwest::Client,
    settings: WeComSettings,
    send_url: reqwest::Url,
    tokens: TokenCache,
    members: KeyedLimiter,
    media: upload::Media,
    upload_url: reqwest::Url,
}

impl WeComSender {
    /// A sender for `settings`, using the shared `client`.
    pub fn new(client: reqwest::Client, settings: WeComSettings) -> Result<Self, InvalidBaseUrl> {
        let send_url = api_url(&settings.base_url, &["cgi-bin", "message", "send"])?;
        let token_url = api_url(&settings.base_url, &["cgi-bin", "gettoken"])?;
        let tokens = TokenCache::new(
            client.clone(),
            token_url,
            settings.corp_id.clone(),
            settings.corp_secret.clone(),
        );
        let members = KeyedLimiter::new(settings.member_limits.clone());
        let upload_url = api_url(&settings.base_url, &["cgi-bin", "media", "upload"])?;
        let media = upload::Media::new(client.clone(), settings.media.clone());
        Ok(WeComSender {
            client,
            settings,
            send_url,
            tokens,
            members,
            media,
            upload_url,
        })
    }
}

/// The userids of a `touser` value (`a|b|c`), without empty entries.
pub fn recipients(touser: &str) -> Vec<&str> {
    touser
        .split('|')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect()
}

/// The text of `content`, or PERMANENT for a template (WeCom has no templates of ours: the
/// scheduler renders them first) or empty text (WeCom's 44004). Rich content is mapped by
/// [`content`] instead.
pub(crate) fn text_of<'a>(content: &'a Content, what: &str) -> Result<&'a str, SendError> {
    match content {
        Content::Rich(c) => Err(SendError::permanent(format!(
            "{what}: expected text, got a {} body",
            c.body
                .as_ref()
                .map(herald_proto::content::body_name)
                .unwrap_or("missing")
        ))),
        Content::Template { template_id, .. } => Err(SendError::permanent(format!(
            "wecom needs rendered text; got template {template_id} ({what})"
        ))),
        Content::Text(t) if t.is_empty() => {
            Err(SendError::permanent(format!("{what}: text is empty")))
        }
        Content::Text(t) => Ok(t),
    }
}

/// Refuses text over `max` bytes (WeCom's 45002 "content too large").
pub(crate) fn check_len(text: &str, max: usize, what: &str) -> Result<(), SendError> {
    if text.len() > max {
        return Err(SendError::permanent(format!(
            "{what} is {} bytes; WeCom accepts at most {max}",
            text.len()
        )));
    }
    Ok(())
}

#[derive(Deserialize)]
struct SendResponse {
    errcode: i64,
    #[serde(default)]
    errmsg: String,
    #[serde(default)]
    invaliduser: String,
    #[serde(default)]
    invalidparty: String,
    #[serde(default)]
    invalidtag: String,
    #[serde(default)]
    unlicenseduser: String,
    #[serde(default)]
    msgid: String,
}

impl WeComSender {
    /// The request body (without the token, which goes in the query). Rich content's media
    /// links are fetched and uploaded here (cached per account).
    async fn body(&self, req: &SendRequest) -> Result<Value, SendError> {
        let s = &self.settings;
        let mut body = json!({ "touser": req.recipient, "agentid": s.agent_id });
        let content = req.content.without_link_preview();
        if let Content::Rich(rich) = content.as_ref() {
            let needs_upload = matches!(
                &rich.body,
                Some(herald_proto::v1::content::Body::Media(m))
                    if matches!(m.source, Some(herald_proto::v1::media::Source::Link(_)))
            );
            let token = if needs_upload {
                Some(self.tokens.get().await?)
            } else {
                None
            };
            // An upload with a token WeCom invalidated early is refreshed once and tried again,
            // as a send is: otherwise the cached token kept failing every media send for up
            // to two hours, and took the account offline.
            let (msgtype, object) = match self.rich_message(rich, token.as_ref()).await {
                Err(e) if e.code.is_some_and(errcode::is_token_rejected) => {
                    let Some(stale) = &token else { return Err(e) };
                    debug!(
                        errcode = e.code,
                        "wecom rejected the upload's access token; refreshing once"
                    );
                    let fresh = self.tokens.refresh(stale).await.map_err(|e| SendError {
                        message: format!(
                            "wecom upload's token was rejected and refreshing it failed: {}",
                            e.message
                        ),
                        ..e
                    })?;
                    self.rich_message(rich, Some(&fresh)).await?
                }
                other => other?,
            };
            body["msgtype"] = json!(msgtype);
            body[msgtype] = object;
            self.duplicate_check(req, &mut body);
            return Ok(body);
        }
        let text = text_of(&content, "wecom application message")?;
        match s.message_type {
            MessageType::Text => {
                check_len(text, MAX_TEXT_BYTES, "wecom text")?;
                body["msgtype"] = json!("text");
                body["text"] = json!({ "content": text });
            }
            MessageType::Markdown => {
                check_len(text, MAX_APP_MARKDOWN_BYTES, "wecom markdown")?;
                body["msgtype"] = json!("markdown");
                body["markdown"] = json!({ "content": text });
            }
            MessageType::TextCard => {
                let title = req
                    .labels
                    .get("title")
                    .or(s.card.title.as_ref())
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| {
                        SendError::permanent(
                            "wecom textcard needs a title: a `title` label or the account's card_title",
                        )
                    })?;
                check_len(title, MAX_CARD_TITLE_BYTES, "wecom textcard title")?;
                let url = req
                    .labels
                    .get("url")
                    .or(s.card.url.as_ref())
                    .filter(|u| u.starts_with("http://") || u.starts_with("https://"))
                    .ok_or_else(|| {
                        SendError::permanent(
                            "wecom textcard needs an http(s) link: a `url` label or the account's card_url",
                        )
                    })?;
                check_len(url, MAX_CARD_URL_BYTES, "wecom textcard url")?;
                check_len(
                    text,
                    MAX_CARD_DESCRIPTION_BYTES,
                    "wecom textcard description",
                )?;
                let mut card = json!({ "title": title, "description": text, "url": url });
                if let Some(button) = &s.card.button {
                    card["btntxt"] = json!(button);
                }
                body["msgtype"] = json!("textcard");
                body["textcard"] = card;
            }
        }
        self.duplicate_check(req, &mut body);
        Ok(body)
    }

    /// WeCom's duplicate check is its only idempotency: an identical request within the
    /// interval is not delivered again. Set on every attempt that may follow a delivered one
    /// (see `SendRequest::is_retry`), and on first attempts too when the account asks.
    fn duplicate_check(&self, req: &SendRequest, body: &mut Value) {
        if req.is_retry() || self.settings.duplicate_check_always {
            body["enable_duplicate_check"] = json!(1);
            if let Some(interval) = self.settings.duplicate_check_interval {
                body["duplicate_check_interval"] = json!(interval.as_secs());
            }
        }
    }

    async fn post(&self, token: &Secret, body: &Value) -> Result<SendResponse, SendError> {
        let mut url = self.send_url.clone();
        url.query_pairs_mut()
            .append_pair("access_token", token.expose());
        call(self.client.post(url).json(body), "wecom message/send").await
    }
}

impl WeComSender {
    /// `(msgtype, object)` of rich content, its media links uploaded with `token`.
    async fn rich_message(
        &self,
        rich: &herald_proto::v1::Content,
        token: Option<&Secret>,
    ) -> Result<(&'static str, Value), SendError> {
        let upload_url = |wtype: &str| -> Result<reqwest::Url, SendError> {
            let mut url = self.upload_url.clone();
            let token = token.ok_or_else(|| {
                SendError::permanent("wecom media upload without an access token")
            })?;
            url.query_pairs_mut()
                .append_pair("access_token", token.expose())
                .append_pair("type", wtype);
            Ok(url)
        };
        content::app_message(rich, &self.media, upload_url).await
    }
}

impl Sender for WeComSender {
    #[instrument(name = "wecom_send", skip_all, fields(task_id = %req.task_id, attempt = req.attempt, account = %req.account_id, errcode))]
    async fn send(&self, req: SendRequest) -> Result<SendReceipt, SendError> {
        let users = recipients(&req.recipient);
        if users.is_empty() {
            return Err(SendError::permanent("wecom recipient (touser) is empty"));
        }
        let body = self.body(&req).await?;
        // `@all` cannot be counted per member; the limits cover named members only.
        if !users.contains(&"@all") {
            let keys: Vec<String> = users.iter().map(|u| u.to_lowercase()).collect();
            if let Err(over) = self.members.try_acquire(&keys, tokio::time::Instant::now()) {
                return Err(SendError::new(
                    OutcomeClass::RateLimited,
                    format!(
                        "wecom member {} reached {} messages per {} for this app (WeCom drops the excess silently)",
                        over.key,
                        over.limit.max,
                        humantime::format_duration(over.limit.window)
                    ),
                )
                .with_retry_after(Some(over.retry_after))
                // One member's limit: the app goes on sending to everyone else.
                .scoped_to_recipient());
            }
        }
        let mut token = self.tokens.get().await?;
        let mut response = self.post(&token, &body).await?;
        if errcode::is_token_rejected(response.errcode) {
            debug!(
                errcode = response.errcode,
                "wecom rejected the access token; refreshing once"
            );
            let fresh = self.tokens.refresh(&token).await.map_err(|e| SendError {
                message: format!(
                    "wecom token was rejected and refreshing it failed: {}",
                    e.message
                ),
                ..e
            })?;
            response = self.post(&fresh, &body).await?;
            token = fresh;
        }
        // An uploaded media id WeCom no longer knows (expired or dropped early): upload the
        // link again and resend, once; a second 40007 is classified PERMANENT below.
        if response.errcode == errcode::INVALID_MEDIA_ID
            && self.media.forget_rejected(&req.content, &body).await
        {
            info!("wecom refused the cached media id (40007); uploading again and resending once");
            let body = self.body(&req).await?;
            response = self.post(&token, &body).await?;
        }
        Span::current().record("errcode", response.errcode);
        if response.errcode != 0 {
            return Err(errcode::classify(
                response.errcode,
                &response.errmsg,
                req.is_retry(),
            ));
        }
        outcome(&users, response)
    }
}

/// The result of an `errcode: 0` answer, given the users asked for.
fn outcome(users: &[&str], r: SendResponse) -> Result<SendReceipt, SendError> {
    let listed = |s: &str| -> BTreeSet<String> {
        recipients(s).into_iter().map(str::to_lowercase).collect()
    };
    // WeCom lower-cases the userids it returns. A member without a licence is as unreachable
    // as an unknown one (providers.md §2.5: PERMANENT for the listed ids).
    let mut unreachable = listed(&r.invaliduser);
    unreachable.extend(listed(&r.unlicenseduser));
    let asked: BTreeSet<String> = users.iter().map(|u| u.to_lowercase()).collect();
    if !asked.contains("@all") && !asked.is_empty() && asked.is_subset(&unreachable) {
        return Err(SendError::permanent(format!(
            "wecom rejected every recipient (invaliduser: {}; unlicenseduser: {})",
            r.invaliduser, r.unlicenseduser
        )));
    }
    let mut skipped = Vec::new();
    for (field, value) in [
        ("invaliduser", &r.invaliduser),
        ("invalidparty", &r.invalidparty),
        ("invalidtag", &r.invalidtag),
        ("unlicenseduser", &r.unlicenseduser),
    ] {
        if !value.is_empty() {
            skipped.push(format!("{field}: {value}"));
        }
    }
    let note = if skipped.is_empty() {
        None
    } else {
        warn!(skipped = %skipped.join("; "), "wecom delivered to some recipients only");
        Some(format!(
            "[partial] wecom delivered to the other recipients but not to ({})",
            skipped.join("; ")
        ))
    };
    Ok(SendReceipt {
        provider_message_id: Some(r.msgid).filter(|m| !m.is_empty()),
        note,
        window_closed: None,
    })
}
