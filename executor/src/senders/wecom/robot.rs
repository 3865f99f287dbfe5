//! The `wecom_robot` sender: a group robot's webhook,
//! `POST {base_url}/cgi-bin/webhook/send?key=KEY`. The key in the URL is the whole credential.
//!
//! The task's recipient is not used to address anyone (the robot posts to its group); it is
//! sent as `mentioned_list` when it names userids (`a|b`, or `@all`) for text messages.
//! A robot may send 20 messages a minute; the executor keeps that limit itself.

use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use toml::Spanned;
use tracing::{info, instrument, Span};

use super::{
    check_len, content, errcode, recipients, text_of, upload, MessageType, MAX_TEXT_BYTES,
};
use crate::credentials::{Secret, SecretRef};
use crate::senders::config::{BuildContext, BuildSender, ConfigError};
use crate::senders::limiter::{KeyedLimiter, WindowLimit};
use crate::senders::media::MediaFetcher;
use crate::senders::{
    BoxSender, Content, OutcomeClass, SendError, SendReceipt, SendRequest, Sender,
};

/// Robot markdown limit (bytes).
pub const MAX_ROBOT_MARKDOWN_BYTES: usize = 4096;

/// 20 messages a minute per robot (documented); over it WeCom answers 45009 (unverified), so
/// counting here mostly saves a useless request.
pub fn default_robot_limits() -> Vec<WindowLimit> {
    vec![WindowLimit {
        max: 20,
        window: Duration::from_secs(60),
    }]
}

/// `sender = "wecom_robot"`: `webhook_key` (with an optional `base_url`) or the full `url`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RobotConfig {
    /// The robot's key.
    webhook_key: Option<Spanned<SecretRef>>,
    /// The full webhook URL, key included.
    url: Option<Spanned<SecretRef>>,
    /// The API host, with `webhook_key` only; [`super::DEFAULT_BASE_URL`] when absent.
    base_url: Option<Spanned<String>>,
    /// `text` (default) or `markdown`.
    message_type: Option<Spanned<String>>,
}

impl BuildSender for RobotConfig {
    fn build(self, cx: &mut BuildContext<'_>) -> Result<BoxSender, ConfigError> {
        let endpoint = match (&self.webhook_key, &self.url) {
            (Some(key), None) => RobotEndpoint::Key {
                base_url: cx.base_url(&self.base_url, super::DEFAULT_BASE_URL)?,
                key: cx.secret("webhook_key", key)?,
            },
            (None, Some(url)) => {
                if let Some(b) = &self.base_url {
                    return Err(cx.invalid(b.span(), "`base_url` is not used with a full `url`"));
                }
                RobotEndpoint::Url(cx.secret_url("url", url)?.0)
            }
            (Some(_), Some(url)) => {
                return Err(cx.invalid(url.span(), "give `webhook_key` or `url`, not both"))
            }
            (None, None) => {
                return Err(cx.invalid_table("the wecom_robot sender needs `webhook_key` or `url`"))
            }
        };
        let message_type = MessageType::from_setting(cx, &self.message_type)?;
        let span = match (&self.message_type, &self.url) {
            (Some(t), _) => t.span(),
            (None, Some(u)) => u.span(),
            (None, None) => cx.table_span(),
        };
        let settings = RobotSettings {
            endpoint,
            message_type,
            limits: default_robot_limits(),
            media: cx.media()?,
        };
        let sender =
            RobotSender::new(cx.http_client()?, settings).map_err(|e| cx.invalid(span, e))?;
        Ok(sender.boxed())
    }
}

/// Where the robot's webhook is.
#[derive(Clone)]
pub enum RobotEndpoint {
    /// `{base_url}/cgi-bin/webhook/send?key=KEY`.
    Key {
        /// The API host.
        base_url: reqwest::Url,
        /// The robot's key.
        key: Secret,
    },
    /// The full webhook URL, key included (a secret as a whole).
    Url(Secret),
}

impl fmt::Debug for RobotEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RobotEndpoint::Key { base_url, key } => f
                .debug_struct("Key")
                .field("base_url", &base_url.as_str())
                .field("key", key)
                .finish(),
            RobotEndpoint::Url(url) => f.debug_tuple("Url").field(url).finish(),
        }
    }
}

/// Settings of one `wecom_robot` account.
#[derive(Clone, Debug)]
pub struct RobotSettings {
    /// The webhook.
    pub endpoint: RobotEndpoint,
    /// `text` or `markdown` (`textcard` is not a robot type).
    pub message_type: MessageType,
    /// Limits kept by the executor for this robot.
    pub limits: Vec<WindowLimit>,
    /// Fetches media links (the file's `[media]` policy).
    pub media: MediaFetcher,
}

/// The robot's webhook URL cannot be built.
#[derive(Debug, thiserror::Error)]
#[error("wecom robot: {0}")]
pub struct InvalidRobot(String);

/// Sends through one WeCom group robot.
pub struct RobotSender {
    client: reqwest::Client,
    url: Secret,
    message_type: MessageType,
    limiter: KeyedLimiter,
    media: upload::Media,
    /// `…/webhook/upload_media?key=KEY` (the send URL's sibling), for documents.
    upload_url: Secret,
}

impl fmt::Debug for RobotSender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RobotSender")
            .field("url", &self.url)
            .field("message_type", &self.message_type)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct RobotResponse {
    errcode: i64,
    #[serde(default)]
    errmsg: String,
}

impl RobotSender {
    /// A sender for `settings`, using the shared `client`.
    pub fn new(client: reqwest::Client, settings: RobotSettings) -> Result<Self, InvalidRobot> {
        if settings.message_type == MessageType::TextCard {
            return Err(InvalidRobot(
                "message_type must be \"text\" or \"markdown\"".into(),
            ));
        }
        let url = match settings.endpoint {
            RobotEndpoint::Key { base_url, key } => {
                let mut url = super::api_url(&base_url, &["cgi-bin", "webhook", "send"])
                    .map_err(|e| InvalidRobot(e.to_string()))?;
                url.query_pairs_mut().append_pair("key", key.expose());
                Secret::new(url.to_string())
            }
            RobotEndpoint::Url(url) => {
                reqwest::Url::parse(url.expose())
                    .ok()
                    .filter(|u| matches!(u.scheme(), "http" | "https"))
                    .ok_or_else(|| InvalidRobot("`url` must be an http or https URL".into()))?;
                url
            }
        };
        // The upload endpoint sits beside the send endpoint and takes the same key.
        let upload_url = {
            let mut u = reqwest::Url::parse(url.expose())
                .map_err(|e| InvalidRobot(format!("webhook URL: {e}")))?;
            let path = u.path().to_owned();
            let sibling = match path.strip_suffix("/send") {
                Some(dir) => format!("{dir}/upload_media"),
                None => format!("{}/upload_media", path.trim_end_matches('/')),
            };
            u.set_path(&sibling);
            Secret::new(u.to_string())
        };
        let media = upload::Media::new(client.clone(), settings.media);
        Ok(RobotSender {
            client,
            url,
            media,
            upload_url,
            message_type: settings.message_type,
            limiter: KeyedLimiter::new(settings.limits),
        })
    }

    async fn body(&self, req: &SendRequest) -> Result<Value, SendError> {
        let content = req.content.without_link_preview();
        if let Content::Rich(rich) = content.as_ref() {
            let upload_url = |wtype: &str| -> Result<reqwest::Url, SendError> {
                let mut u = reqwest::Url::parse(self.upload_url.expose())
                    .map_err(|e| SendError::permanent(format!("robot upload URL: {e}")))?;
                u.query_pairs_mut().append_pair("type", wtype);
                Ok(u)
            };
            let (msgtype, object) = content::robot_message(rich, &self.media, upload_url).await?;
            let mut body = json!({ "msgtype": msgtype });
            body[msgtype] = object;
            return Ok(body);
        }
        let text = text_of(&content, "wecom robot message")?;
        Ok(match self.message_type {
            MessageType::Markdown => {
                check_len(text, MAX_ROBOT_MARKDOWN_BYTES, "wecom robot markdown")?;
                json!({ "msgtype": "markdown", "markdown": { "content": text } })
            }
            // TextCard is refused at construction.
            MessageType::Text | MessageType::TextCard => {
                check_len(text, MAX_TEXT_BYTES, "wecom robot text")?;
                let mut body = json!({ "msgtype": "text", "text": { "content": text } });
                let mentioned = recipients(&req.recipient);
                if !mentioned.is_empty() {
                    body["text"]["mentioned_list"] = json!(mentioned);
                }
                body
            }
        })
    }
}

impl Sender for RobotSender {
    #[instrument(name = "wecom_robot_send", skip_all, fields(task_id = %req.task_id, attempt = req.attempt, account = %req.account_id, errcode))]
    async fn send(&self, req: SendRequest) -> Result<SendReceipt, SendError> {
        let body = self.body(&req).await?;
        if let Err(over) = self
            .limiter
            .try_acquire(&["robot".to_owned()], tokio::time::Instant::now())
        {
            return Err(SendError::new(
                OutcomeClass::RateLimited,
                format!(
                    "wecom robot reached {} messages per {}",
                    over.limit.max,
                    humantime::format_duration(over.limit.window)
                ),
            )
            .with_retry_after(Some(over.retry_after)));
        }
        let mut answer: RobotResponse = super::call(
            self.client.post(self.url.expose()).json(&body),
            "wecom robot webhook",
        )
        .await?;
        // An uploaded file id WeCom no longer knows: upload again and resend, once.
        if answer.errcode == errcode::INVALID_MEDIA_ID
            && self.media.forget_rejected(&req.content, &body).await
        {
            info!("wecom refused the cached media id (40007); uploading again and resending once");
            let body = self.body(&req).await?;
            answer = super::call(
                self.client.post(self.url.expose()).json(&body),
                "wecom robot webhook",
            )
            .await?;
        }
        Span::current().record("errcode", answer.errcode);
        if answer.errcode != 0 {
            return Err(errcode::classify(
                answer.errcode,
                &answer.errmsg,
                req.is_retry(),
            ));
        }
        // Robots return no message id.
        Ok(SendReceipt::default())
    }
}
