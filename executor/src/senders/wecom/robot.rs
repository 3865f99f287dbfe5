//! The `wecom_robot` sender: a group robot's webhook,
//! `POST {base_url}/cgi-bin/webhook/send?key=KEY`. The key in the URL is the whole credential.
//!
//! The task's recipient is not used to address anyone (the robot posts to its group); it is
//! sent as `mentioned_list` when it names userids (`a|b`, or `@all`) for text messages.
//! A robot may send 20 messages a minute; the executor keeps that limit itself.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_json::{json, Value};
use tracing::{instrument, Span};

use super::{check_len, errcode, recipients, text_of, MessageType, MAX_TEXT_BYTES};
use crate::credentials::Secret;
use crate::senders::limiter::{KeyedLimiter, WindowLimit};
use crate::senders::{BoxSender, OutcomeClass, SendError, SendReceipt, SendRequest};

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
}

/// The robot's webhook URL cannot be built.
#[derive(Debug, thiserror::Error)]
#[error("wecom robot: {0}")]
pub struct InvalidRobot(String);

/// Sends through one WeCom group robot.
#[derive(Clone, Debug)]
pub struct RobotSender {
    inner: Arc<Inner>,
}

struct Inner {
    client: reqwest::Client,
    url: Secret,
    message_type: MessageType,
    limiter: KeyedLimiter,
}

impl fmt::Debug for Inner {
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
        Ok(RobotSender {
            inner: Arc::new(Inner {
                client,
                url,
                message_type: settings.message_type,
                limiter: KeyedLimiter::new(settings.limits),
            }),
        })
    }

    /// The sender, boxed.
    pub fn boxed(self) -> BoxSender {
        tower::util::BoxCloneService::new(self)
    }
}

impl tower::Service<SendRequest> for RobotSender {
    type Response = SendReceipt;
    type Error = SendError;
    type Future = BoxFuture<'static, Result<SendReceipt, SendError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), SendError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: SendRequest) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move { inner.send(req).await })
    }
}

impl Inner {
    fn body(&self, req: &SendRequest) -> Result<Value, SendError> {
        let text = text_of(&req.content, "wecom robot message")?;
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

    #[instrument(name = "wecom_robot_send", skip_all, fields(task_id = %req.task_id, attempt = req.attempt, account = %req.account_id, errcode))]
    async fn send(&self, req: SendRequest) -> Result<SendReceipt, SendError> {
        let body = self.body(&req)?;
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
        let response = self
            .client
            .post(self.url.expose())
            .json(&body)
            .send()
            .await
            .map_err(|e| errcode::transport_error("wecom robot webhook failed", e))?;
        let status = response.status();
        if !status.is_success() {
            return Err(errcode::classify_http(status, "wecom robot webhook"));
        }
        let answer: RobotResponse = response.json().await.map_err(|e| {
            SendError::transient(format!(
                "wecom robot webhook answered something that is not its JSON: {}",
                e.without_url()
            ))
        })?;
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
