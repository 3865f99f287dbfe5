//! The `webhook` sender: POSTs the message as JSON, signed the Standard Webhooks way
//! (<https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md>),
//! and classifies the response.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use futures::future::BoxFuture;
use hmac::{Hmac, Mac};
use http::{HeaderMap, StatusCode};
use serde_json::json;
use sha2::Sha256;
use tracing::{debug, instrument, Span};

use super::{BoxSender, Content, OutcomeClass, SendError, SendReceipt, SendRequest};
use crate::credentials::Secret;

/// How much of an error response body goes into the error message.
const BODY_EXCERPT: usize = 512;

/// The HMAC key derived from a webhook secret. Never printed.
#[derive(Clone)]
pub struct SigningKey(Hmac<Sha256>);

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Why a webhook secret cannot be used as a signing key.
#[derive(Debug, thiserror::Error)]
pub enum InvalidSecret {
    /// The secret is `whsec_` followed by something that is not base64.
    #[error("webhook secret has the whsec_ prefix but the rest is not valid base64: {0}")]
    Base64(#[source] base64::DecodeError),
    /// The HMAC rejected the key.
    #[error("webhook secret is not a usable HMAC key")]
    Key,
}

impl SigningKey {
    /// The key for a secret: the base64-decoded part after `whsec_`, or the raw bytes of a
    /// secret without that prefix.
    pub fn from_secret(secret: &Secret) -> Result<Self, InvalidSecret> {
        let raw = secret.expose();
        let key = match raw.strip_prefix("whsec_") {
            Some(b64) => BASE64.decode(b64).map_err(InvalidSecret::Base64)?,
            None => raw.as_bytes().to_vec(),
        };
        Hmac::<Sha256>::new_from_slice(&key)
            .map(SigningKey)
            .map_err(|_| InvalidSecret::Key)
    }

    /// The `webhook-signature` header value: `v1,` + base64(HMAC-SHA256(key, "{id}.{ts}.{body}")).
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut mac = self.0.clone();
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()))
    }
}

/// Sends each message as a signed JSON POST to one URL.
#[derive(Clone, Debug)]
pub struct WebhookSender {
    client: reqwest::Client,
    url: reqwest::Url,
    key: Arc<SigningKey>,
}

impl WebhookSender {
    /// A sender for `url`, signing with `key`. Share one `client` between all senders; it must
    /// not follow redirects (see [`http_client`]).
    pub fn new(client: reqwest::Client, url: reqwest::Url, key: SigningKey) -> Self {
        WebhookSender {
            client,
            url,
            key: Arc::new(key),
        }
    }

    /// The sender, boxed.
    pub fn boxed(self) -> BoxSender {
        tower::util::BoxCloneService::new(self)
    }
}

/// The HTTP client for webhook senders: no redirects (a 3xx is a PERMANENT answer), rustls.
pub fn http_client() -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("herald-executor/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// The JSON body of one message.
pub fn body(req: &SendRequest) -> serde_json::Value {
    let content = match &req.content {
        Content::Text(text) => json!({ "text": text }),
        Content::Template {
            template_id,
            language,
            variables,
        } => json!({ "template": {
            "template_id": template_id,
            "language": language,
            "variables": variables,
        }}),
    };
    json!({
        "type": "herald.message",
        "task_id": req.task_id,
        "attempt": req.attempt,
        "queue": req.queue,
        "recipient": req.recipient,
        "content": content,
        "labels": req.labels,
    })
}

impl tower::Service<SendRequest> for WebhookSender {
    type Response = SendReceipt;
    type Error = SendError;
    type Future = BoxFuture<'static, Result<SendReceipt, SendError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), SendError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: SendRequest) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { this.send(req).await })
    }
}

impl WebhookSender {
    #[instrument(name = "webhook_send", skip_all, fields(task_id = %req.task_id, attempt = req.attempt, queue = %req.queue, status))]
    async fn send(&self, req: SendRequest) -> Result<SendReceipt, SendError> {
        let body = serde_json::to_vec(&body(&req))
            .map_err(|e| SendError::permanent(format!("cannot encode webhook body: {e}")))?;
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or_default();
        let id = req.idempotency_key.as_str();
        let signature = self.key.sign(id, timestamp, &body);

        let response = self
            .client
            .post(self.url.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .header("Idempotency-Key", id)
            .header("herald-attempt", req.attempt.to_string())
            .body(body)
            .send()
            .await
            .map_err(classify_reqwest_error)?;

        let status = response.status();
        Span::current().record("status", status.as_u16());
        if status.is_success() {
            let provider_message_id = response
                .headers()
                .get("webhook-message-id")
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty())
                .map(str::to_owned);
            debug!("webhook accepted");
            return Ok(SendReceipt {
                provider_message_id,
            });
        }
        let retry_after = retry_after(response.headers(), SystemTime::now());
        let excerpt = body_excerpt(response).await;
        Err(classify_status(status, retry_after, &excerpt))
    }
}

fn classify_reqwest_error(e: reqwest::Error) -> SendError {
    if e.is_builder() {
        return SendError::permanent(format!("cannot build webhook request: {e}"));
    }
    let what = if e.is_timeout() {
        "webhook request timed out"
    } else if e.is_connect() {
        "cannot connect to webhook"
    } else {
        "webhook request failed"
    };
    // Print the whole source chain: reqwest's top-level message alone says little.
    let mut message = format!("{what}: {e}");
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    SendError::transient(message)
}

/// Classifies a non-2xx status.
pub fn classify_status(
    status: StatusCode,
    retry_after: Option<Duration>,
    body_excerpt: &str,
) -> SendError {
    let message = if body_excerpt.is_empty() {
        format!("webhook answered {status}")
    } else {
        format!("webhook answered {status}: {body_excerpt}")
    };
    let (class, retry_after) = match status.as_u16() {
        429 => (OutcomeClass::RateLimited, retry_after),
        503 => (OutcomeClass::Transient, retry_after),
        408 | 500..=599 => (OutcomeClass::Transient, None),
        410 => (OutcomeClass::AccountUnavailable, None),
        _ => (OutcomeClass::Permanent, None),
    };
    SendError::new(class, message).with_retry_after(retry_after)
}

/// Parses `Retry-After`: delay seconds or an HTTP-date (a date in the past means now).
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The first bytes of the response body, as lossy UTF-8.
async fn body_excerpt(mut response: reqwest::Response) -> String {
    let mut buf = Vec::with_capacity(BODY_EXCERPT);
    while buf.len() < BODY_EXCERPT {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let take = (BODY_EXCERPT - buf.len()).min(chunk.len());
                buf.extend_from_slice(&chunk[..take]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}
