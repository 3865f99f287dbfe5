//! The WhatsApp webhook endpoint: Meta's status callbacks, account and quality updates and
//! inbound messages, received where the app secret lives and forwarded to the scheduler
//! (docs/senders.md#status-callbacks).
//!
//! - `GET <path>`: the subscription handshake. `hub.mode=subscribe` with the configured
//!   `hub.verify_token` is answered 200 with `hub.challenge` as is; anything else 403.
//! - `POST <path>`: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256(app secret, raw body)>` is
//!   checked first (constant time); a missing or wrong signature is 401 and nothing is read.
//!   The events ([`whatsapp`]) go to the scheduler (`LeaseService.RecordProviderEvents`);
//!   200 only once it has recorded all of them, 503 otherwise, so Meta delivers the batch
//!   again (for up to 7 days) and nothing is lost.
//!
//! Configured by the `[whatsapp_webhook]` table of the executor's config file.

pub mod whatsapp;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use hmac::{Hmac, Mac};
use http::{HeaderMap, StatusCode};
use serde::Deserialize;
use sha2::Sha256;
use subtle::ConstantTimeEq;
use toml::Spanned;
use tracing::{debug, error, info, warn};

use crate::client::events::EventForwarder;
use crate::credentials::{Secret, SecretRef};
use crate::senders::config::{parse_table, BuildContext, ConfigError};
use crate::telemetry::metrics::{CALLBACKS_APPLIED, CALLBACKS_RECEIVED, CALLBACKS_REJECTED};
use whatsapp::ConfiguredNumber;

/// The path Meta posts to unless `path` says otherwise.
pub const DEFAULT_PATH: &str = "/whatsapp/webhook";
/// The signature header.
const SIGNATURE_HEADER: &str = "x-hub-signature-256";

/// `[whatsapp_webhook]`, as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WebhookTable {
    listen: Spanned<String>,
    path: Option<Spanned<String>>,
    verify_token: Spanned<SecretRef>,
    app_secret: Spanned<SecretRef>,
}

/// The `[whatsapp_webhook]` table: where Meta's webhooks are received and how they are checked.
#[derive(Clone, Debug)]
pub struct WhatsAppWebhook {
    /// The address to listen on (`listen`), e.g. `0.0.0.0:7073`.
    pub listen: SocketAddr,
    /// The path Meta posts to (`path`, default [`DEFAULT_PATH`]).
    pub path: String,
    /// The token Meta's GET handshake must carry (`verify_token`).
    pub verify_token: Secret,
    /// The Meta app's secret, which signs every POST (`app_secret`).
    pub app_secret: Secret,
}

impl WhatsAppWebhook {
    /// Reads the table's settings.
    pub(crate) fn parse(
        cx: &BuildContext<'_>,
        settings: toml_edit::InlineTable,
    ) -> Result<Self, ConfigError> {
        let t: WebhookTable = parse_table(cx, "whatsapp_webhook", settings)?;
        let listen = t.listen.get_ref().trim().parse().map_err(|_| {
            cx.invalid(
                t.listen.span(),
                format!(
                    "`listen` must be an address like \"0.0.0.0:7073\", got {:?}",
                    t.listen.get_ref()
                ),
            )
        })?;
        let path = match &t.path {
            None => DEFAULT_PATH.to_owned(),
            Some(p) => {
                let path = cx.non_empty("path", p)?;
                if !path.starts_with('/') || path.contains(['?', '#', ' ']) {
                    return Err(cx.invalid(
                        p.span(),
                        "`path` must start with / (e.g. \"/whatsapp/webhook\")",
                    ));
                }
                path.to_owned()
            }
        };
        Ok(WhatsAppWebhook {
            listen,
            path,
            verify_token: cx.secret("verify_token", &t.verify_token)?,
            app_secret: cx.secret("app_secret", &t.app_secret)?,
        })
    }
}

/// What the handlers share.
struct Endpoint {
    settings: WhatsAppWebhook,
    numbers: Vec<ConfiguredNumber>,
    forwarder: EventForwarder,
}

/// The endpoint's router.
pub(crate) fn router(
    settings: WhatsAppWebhook,
    numbers: Vec<ConfiguredNumber>,
    forwarder: EventForwarder,
) -> Router {
    let path = settings.path.clone();
    Router::new()
        .route(&path, get(handshake).post(receive))
        .with_state(Arc::new(Endpoint {
            settings,
            numbers,
            forwarder,
        }))
}

/// The subscription handshake.
async fn handshake(
    State(endpoint): State<Arc<Endpoint>>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let mode = query.get("hub.mode").map(String::as_str);
    let token = query.get("hub.verify_token").map(String::as_str);
    let expected = endpoint.settings.verify_token.expose().as_bytes();
    let token_ok = token.is_some_and(|t| bool::from(t.as_bytes().ct_eq(expected)));
    match (mode, token_ok, query.get("hub.challenge")) {
        (Some("subscribe"), true, Some(challenge)) => {
            info!("whatsapp webhook subscription verified");
            (StatusCode::OK, challenge.clone()).into_response()
        }
        _ => {
            warn!(mode = ?mode, "whatsapp webhook handshake refused");
            StatusCode::FORBIDDEN.into_response()
        }
    }
}

/// Whether `header` is `sha256=<hex HMAC-SHA256(secret, body)>`, compared in constant time.
pub fn signature_ok(secret: &[u8], body: &[u8], header: Option<&str>) -> bool {
    let Some(hex_sig) = header.and_then(|h| h.trim().strip_prefix("sha256=")) else {
        return false;
    };
    let Ok(sig) = hex::decode(hex_sig) else {
        return false;
    };
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret) else {
        return false;
    };
    mac.update(body);
    // verify_slice compares in constant time.
    mac.verify_slice(&sig).is_ok()
}

/// A POST from Meta.
async fn receive(
    State(endpoint): State<Arc<Endpoint>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    metrics::counter!(CALLBACKS_RECEIVED, "provider" => "whatsapp").increment(1);
    let header = headers.get(SIGNATURE_HEADER).and_then(|v| v.to_str().ok());
    if !signature_ok(
        endpoint.settings.app_secret.expose().as_bytes(),
        &body,
        header,
    ) {
        metrics::counter!(CALLBACKS_REJECTED, "provider" => "whatsapp", "reason" => "signature")
            .increment(1);
        warn!(
            signed = header.is_some(),
            "whatsapp webhook refused: bad or missing signature"
        );
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let parsed = match whatsapp::events(&body, &endpoint.numbers) {
        Ok(parsed) => parsed,
        Err(e) => {
            metrics::counter!(CALLBACKS_REJECTED, "provider" => "whatsapp", "reason" => "payload")
                .increment(1);
            warn!(error = %e, "whatsapp webhook refused");
            return (StatusCode::BAD_REQUEST, e.to_string()).into_response();
        }
    };
    if parsed.ignored > 0 {
        debug!(
            ignored = parsed.ignored,
            "whatsapp webhook items not acted on"
        );
    }
    let labels: Vec<(&'static str, &'static str)> =
        parsed.events.iter().map(|p| (p.field, p.kind)).collect();
    let events = parsed.events.into_iter().map(|p| p.event).collect();
    match endpoint.forwarder.record(events).await {
        Ok(applied) => {
            for (field, kind) in labels {
                metrics::counter!(CALLBACKS_APPLIED, "provider" => "whatsapp", "field" => field, "kind" => kind)
                    .increment(1);
            }
            debug!(applied, "whatsapp webhook recorded");
            StatusCode::OK.into_response()
        }
        // Refused as they are, they would be refused on every one of Meta's redeliveries for
        // seven days: the payload is acknowledged and dropped, loudly. The parser keeps what
        // it forwards within the scheduler's rules, so this is a bug of ours, not a retry.
        Err(e) if e.is_refused() => {
            metrics::counter!(CALLBACKS_REJECTED, "provider" => "whatsapp", "reason" => "refused")
                .increment(1);
            error!(error = %e, "whatsapp webhook refused by the scheduler; acknowledged and dropped");
            StatusCode::OK.into_response()
        }
        Err(e) => {
            metrics::counter!(CALLBACKS_REJECTED, "provider" => "whatsapp", "reason" => "unrecorded")
                .increment(1);
            warn!(error = %e, "whatsapp webhook not recorded; Meta will deliver it again");
            (StatusCode::SERVICE_UNAVAILABLE, "not recorded yet; retry").into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sign(secret: &str, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap_or_else(|_| {
            unreachable!("HMAC takes keys of any length");
        });
        mac.update(body);
        format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
    }

    #[test]
    fn signatures_are_checked() {
        let body = br#"{"object":"whatsapp_business_account"}"#;
        let good = sign("app-secret", body);
        assert!(signature_ok(b"app-secret", body, Some(&good)));
        assert!(!signature_ok(b"other-secret", body, Some(&good)));
        assert!(!signature_ok(b"app-secret", b"{}", Some(&good)));
        assert!(!signature_ok(b"app-secret", body, None));
        assert!(!signature_ok(
            b"app-secret",
            body,
            Some(good.trim_start_matches("sha256="))
        ));
        assert!(!signature_ok(b"app-secret", body, Some("sha256=zz")));
    }
}
