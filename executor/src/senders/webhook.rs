//! The `webhook` sender: POSTs the message as JSON, signed the Standard Webhooks way
//! (<https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md>,
//! with the signer shared with the scheduler's notifications, `herald_outbound`), and
//! classifies the response by its status ([`classify_status`]).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use herald_outbound::signing::{WEBHOOK_ID, WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP};
use http::StatusCode;
use serde::Deserialize;
use serde_json::json;
use toml::Spanned;
use tracing::{debug, instrument, Span};

use super::config::{BuildContext, BuildSender, ConfigError};
use super::http::{body_excerpt, retry_after, transport_error};
use super::{BoxSender, Content, OutcomeClass, SendError, SendReceipt, SendRequest, Sender};
use crate::credentials::SecretRef;
pub use herald_outbound::signing::SigningKey;

/// `sender = "webhook"`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookConfig {
    /// The receiver's http(s) URL; a secret when it carries a token.
    url: Spanned<SecretRef>,
    /// The signing secret: `whsec_<base64>` or raw bytes.
    secret: Spanned<SecretRef>,
}

impl BuildSender for WebhookConfig {
    fn build(self, cx: &mut BuildContext<'_>) -> Result<BoxSender, ConfigError> {
        let (_, url) = cx.secret_url("url", &self.url)?;
        let secret = cx.secret("secret", &self.secret)?;
        let key = SigningKey::from_secret(secret.expose())
            .map_err(|e| cx.invalid(self.secret.span(), format!("secret: {e}")))?;
        Ok(WebhookSender::new(cx.http_client()?, url, key).boxed())
    }
}

/// Sends each message as a signed JSON POST to one URL.
#[derive(Clone, Debug)]
pub struct WebhookSender {
    client: reqwest::Client,
    url: reqwest::Url,
    key: SigningKey,
}

impl WebhookSender {
    /// A sender for `url`, signing with `key`. Share one `client` between all senders; it must
    /// not follow redirects (see [`super::http::client`]).
    pub fn new(client: reqwest::Client, url: reqwest::Url, key: SigningKey) -> Self {
        WebhookSender { client, url, key }
    }
}

/// The JSON body of one message.
pub fn body(req: &SendRequest) -> serde_json::Value {
    let content = match req.content.without_link_preview().as_ref() {
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
        // Rich bodies have no JSON form of their own here (prost types carry no serde): the
        // encoded `herald.v1.Content`, which a receiver decodes with herald's protos.
        Content::Rich(c) => json!({
            "body": c.body.as_ref().map(herald_proto::content::body_name).unwrap_or("none"),
            "protobuf_base64": base64::engine::general_purpose::STANDARD
                .encode(prost::Message::encode_to_vec(c)),
        }),
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

impl Sender for WebhookSender {
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
            .header(WEBHOOK_ID, id)
            .header(WEBHOOK_TIMESTAMP, timestamp.to_string())
            .header(WEBHOOK_SIGNATURE, signature)
            .header("Idempotency-Key", id)
            .header("herald-attempt", req.attempt.to_string())
            .body(body)
            .send()
            .await
            .map_err(|e| transport_error("webhook request", e))?;

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
                ..SendReceipt::default()
            });
        }
        let retry_after = retry_after(response.headers(), SystemTime::now());
        let excerpt = body_excerpt(response).await;
        Err(classify_status(status, retry_after, &excerpt))
    }
}

/// Classifies a non-2xx status (docs/senders.md has the table): 429 RATE_LIMITED and every 5xx
/// TRANSIENT honour `Retry-After` (a receiver that says when to come back is not asked again
/// a second later); 408 is TRANSIENT without it; 410 Gone is
/// ACCOUNT_UNAVAILABLE (the endpoint was removed: not the message's fault); every other status,
/// 3xx included (redirects are not followed), is PERMANENT.
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
        500..=599 => (OutcomeClass::Transient, retry_after),
        408 => (OutcomeClass::Transient, None),
        410 => (OutcomeClass::AccountUnavailable, None),
        _ => (OutcomeClass::Permanent, None),
    };
    SendError::new(class, message).with_retry_after(retry_after)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::body::Bytes;
    use axum::response::{IntoResponse, Response};
    use axum::routing::post;
    use axum::Router;
    use base64::engine::general_purpose::STANDARD as BASE64;
    use base64::Engine as _;
    use hmac::{Hmac, Mac};
    use http::HeaderMap;
    use sha2::Sha256;
    use tokio::sync::mpsc;
    use tower::ServiceExt;

    use super::*;
    use crate::senders::http::client as http_client;
    use crate::senders::{layered, RouteLimits};

    type Received = mpsc::UnboundedReceiver<(HeaderMap, Bytes)>;

    /// A local webhook receiver answering every POST /hook with `respond()`.
    async fn receiver(
        respond: impl Fn() -> Response + Send + Sync + 'static,
    ) -> (reqwest::Url, Received) {
        let (tx, rx) = mpsc::unbounded_channel();
        let respond = Arc::new(respond);
        let app = Router::new().route(
            "/hook",
            post(move |headers: HeaderMap, body: Bytes| {
                let tx = tx.clone();
                let respond = respond.clone();
                async move {
                    let _ = tx.send((headers, body));
                    respond()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (format!("http://{addr}/hook").parse().unwrap(), rx)
    }

    fn request() -> SendRequest {
        SendRequest {
            task_id: "task-1".into(),
            attempt: 3,
            queue: "hooks".into(),
            recipient: "+15550001".into(),
            content: Content::Template {
                template_id: "welcome".into(),
                language: "en_US".into(),
                variables: [("name".to_owned(), "Ada".to_owned())].into(),
            },
            idempotency_key: "idem-abc".into(),
            labels: [("tenant".to_owned(), "t1".to_owned())].into(),
            run_at: None,
            leased_at: None,
            attempts_before: 2,
            max_attempts: 5,
            account_id: String::new(),
            credentials_ref: String::new(),
            window_closed_fallback: None,
        }
    }

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn sender(url: reqwest::Url) -> BoxSender {
        let key = SigningKey::from_secret(SECRET).unwrap();
        WebhookSender::new(http_client().unwrap(), url, key).boxed()
    }

    async fn send_with(
        respond: impl Fn() -> Response + Send + Sync + 'static,
    ) -> (Result<SendReceipt, SendError>, Received) {
        let (url, rx) = receiver(respond).await;
        let result = sender(url).oneshot(request()).await;
        (result, rx)
    }

    /// Standard Webhooks verification, written from the spec rather than with `SigningKey`.
    fn verify(headers: &HeaderMap, body: &[u8]) -> bool {
        let id = headers["webhook-id"].to_str().unwrap();
        let ts = headers["webhook-timestamp"].to_str().unwrap();
        let key = BASE64.decode(SECRET.trim_start_matches("whsec_")).unwrap();
        let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
        mac.update(format!("{id}.{ts}.").as_bytes());
        mac.update(body);
        let expected = BASE64.encode(mac.finalize().into_bytes());
        headers["webhook-signature"]
            .to_str()
            .unwrap()
            .split(' ')
            .any(|sig| sig == format!("v1,{expected}"))
    }

    #[tokio::test]
    async fn ok_is_signed_and_carries_the_message() {
        let (result, mut rx) = send_with(|| {
            (StatusCode::OK, [("webhook-message-id", "msg-42")], "fine").into_response()
        })
        .await;
        assert_eq!(
            result.unwrap().provider_message_id.as_deref(),
            Some("msg-42")
        );

        let (headers, body) = rx.recv().await.unwrap();
        assert!(verify(&headers, &body), "signature does not verify");
        assert_eq!(headers["webhook-id"], "idem-abc");
        assert_eq!(headers["idempotency-key"], "idem-abc");
        assert_eq!(headers["herald-attempt"], "3");
        assert_eq!(headers["content-type"], "application/json");
        let ts: i64 = headers["webhook-timestamp"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        assert!((now - ts).abs() <= 5);

        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            json,
            json!({
                "type": "herald.message",
                "task_id": "task-1",
                "attempt": 3,
                "queue": "hooks",
                "recipient": "+15550001",
                "content": {"template": {"template_id": "welcome", "language": "en_US", "variables": {"name": "Ada"}}},
                "labels": {"tenant": "t1"},
            })
        );
    }

    #[tokio::test]
    async fn ok_without_message_id_and_text_content() {
        let (url, mut rx) = receiver(|| StatusCode::NO_CONTENT.into_response()).await;
        let mut req = request();
        req.content = Content::Text("hello".into());
        let receipt = sender(url).oneshot(req).await.unwrap();
        assert_eq!(receipt.provider_message_id, None);
        let (_, body) = rx.recv().await.unwrap();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["content"], json!({"text": "hello"}));
    }

    #[test]
    fn text_with_a_link_preview_is_plain_text_in_the_body() {
        let mut req = request();
        req.content = Content::from_proto(Some(herald_proto::v1::Content {
            body: Some(herald_proto::v1::content::Body::Text(
                "see https://x.example".into(),
            )),
            link_preview: true,
        }))
        .unwrap();
        assert_eq!(
            body(&req)["content"],
            json!({"text": "see https://x.example"})
        );
    }

    #[tokio::test]
    async fn too_many_requests_is_rate_limited_with_retry_after() {
        let (result, _) = send_with(|| {
            (
                StatusCode::TOO_MANY_REQUESTS,
                [("retry-after", "7")],
                "slow down",
            )
                .into_response()
        })
        .await;
        let err = result.unwrap_err();
        assert_eq!(err.class, OutcomeClass::RateLimited);
        assert_eq!(err.retry_after, Some(Duration::from_secs(7)));
        assert!(err.message.contains("429"), "{}", err.message);
        assert!(err.message.contains("slow down"), "{}", err.message);
    }

    #[tokio::test]
    async fn a_server_error_honours_its_retry_after() {
        let (result, _) = send_with(|| {
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [("retry-after", "600")],
                "down for maintenance",
            )
                .into_response()
        })
        .await;
        let err = result.unwrap_err();
        assert_eq!(err.class, OutcomeClass::Transient);
        assert_eq!(err.retry_after, Some(Duration::from_secs(600)));
    }

    #[tokio::test]
    async fn unavailable_is_transient_and_honours_an_http_date() {
        let (result, _) = send_with(|| {
            let at = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
            (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", at)], "").into_response()
        })
        .await;
        let err = result.unwrap_err();
        assert_eq!(err.class, OutcomeClass::Transient);
        let after = err.retry_after.unwrap();
        assert!(
            after > Duration::from_secs(100) && after <= Duration::from_secs(120),
            "{after:?}"
        );
    }

    #[tokio::test]
    async fn statuses_are_classified() {
        let cases = [
            (500, OutcomeClass::Transient),
            (502, OutcomeClass::Transient),
            (408, OutcomeClass::Transient),
            (410, OutcomeClass::AccountUnavailable),
            (400, OutcomeClass::Permanent),
            (401, OutcomeClass::Permanent),
            (404, OutcomeClass::Permanent),
            (422, OutcomeClass::Permanent),
        ];
        for (code, class) in cases {
            let status = StatusCode::from_u16(code).unwrap();
            let (result, _) =
                send_with(move || (status, [("retry-after", "3")], "nope").into_response()).await;
            let err = result.unwrap_err();
            assert_eq!(err.class, class, "status {code}");
            // Only a server's error says when to come back; a refusal is final.
            let honoured = (500..600).contains(&code);
            assert_eq!(
                err.retry_after,
                honoured.then_some(Duration::from_secs(3)),
                "status {code}"
            );
            assert!(err.message.contains(&code.to_string()), "{}", err.message);
        }
    }

    #[tokio::test]
    async fn redirects_are_permanent_and_not_followed() {
        let (result, mut rx) =
            send_with(|| (StatusCode::FOUND, [("location", "/hook")], "moved").into_response())
                .await;
        let err = result.unwrap_err();
        assert_eq!(err.class, OutcomeClass::Permanent);
        assert!(err.message.contains("302"), "{}", err.message);
        assert!(rx.recv().await.is_some());
        assert!(rx.try_recv().is_err(), "the redirect was followed");
    }

    #[tokio::test]
    async fn error_body_is_cut_to_512_bytes() {
        let (result, _) =
            send_with(|| (StatusCode::BAD_REQUEST, "x".repeat(5000)).into_response()).await;
        let err = result.unwrap_err();
        assert_eq!(err.message.matches('x').count(), 512);
    }

    #[tokio::test]
    async fn connection_refused_is_transient() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let url = format!("http://{addr}/hook").parse().unwrap();
        let err = sender(url).oneshot(request()).await.unwrap_err();
        assert_eq!(err.class, OutcomeClass::Transient);
    }

    #[tokio::test]
    async fn hung_webhook_times_out_as_transient() {
        let app = Router::new().route("/hook", post(std::future::pending::<&'static str>));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let url = format!("http://{addr}/hook").parse().unwrap();
        let svc = layered(
            sender(url),
            RouteLimits {
                timeout: Duration::from_millis(200),
                concurrency: 4,
            },
        );
        let err = svc.oneshot(request()).await.unwrap_err();
        assert_eq!(err.class, OutcomeClass::Transient);
        assert_eq!(err.message, "send timed out after 200ms");
    }
}
