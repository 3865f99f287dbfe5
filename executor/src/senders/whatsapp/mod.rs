//! The `whatsapp_cloud` sender: one business phone number of the WhatsApp Business Cloud API
//! (`POST {base_url}/{api_version}/{phone_number_id}/messages` with a bearer token).
//!
//! A task's content is mapped by [`content`] (text, templates with header, body and button
//! parameters, media, location, interactive; docs/senders.md has the table). A template's
//! variables are its body's positional parameters `"1"`, `"2"`, …; other keys, gaps or an
//! empty language are PERMANENT before anything is sent.
//!
//! The lease's fencing token travels as `biz_opaque_callback_data` (`<task id>/<attempt>`),
//! which Meta echoes in status webhooks (`crate::callbacks`); the returned wamid is the provider
//! message id. Errors are classified by `error.code` first,
//! by HTTP status when the body has no code (see [`classify_code`], [`classify_status`]).
//!
//! A send refused with 131047 (the recipient's 24-hour customer-service window is closed) is
//! followed at once, in the same attempt, by the request's window-closed fallback template when
//! the lease carried one: the receipt (or error) is the template's, marked as the fallback's.
//! The lease carries a fallback only while the task has never used it, so it goes at most once.

use std::fmt;
use std::time::{Duration, SystemTime};

use http::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};
use toml::Spanned;
use tracing::{debug, info, instrument, warn, Span};

pub mod content;

use super::config::{BuildContext, BuildSender, ConfigError};
use super::http::{excerpt, retry_after as retry_after_header, transport_error};
use super::{BoxSender, Content, OutcomeClass, SendError, SendReceipt, SendRequest, Sender};
use crate::credentials::{Secret, SecretRef};
use herald_proto::v1 as pb;

/// Meta's Graph API host.
pub const DEFAULT_BASE_URL: &str = "https://graph.facebook.com";
/// The Graph API version used unless the account sets `api_version`.
pub const DEFAULT_API_VERSION: &str = "v23.0";
/// `biz_opaque_callback_data` limit (changelog: raised from 256 to 512 characters).
const MAX_CALLBACK_DATA_CHARS: usize = 512;
/// Meta's pair limit is one message per 6 s to the same user; wait at least that long.
const PAIR_LIMIT_WAIT: Duration = Duration::from_secs(6);
/// 131048 (spam limit) and 131049 (per-user marketing limit) want long pauses ("hours",
/// "increasingly larger increments"); one hour is our choice, not a documented figure.
const LONG_COOL_DOWN: Duration = Duration::from_secs(3600);
/// 131057 (maintenance, e.g. a throughput upgrade of up to a minute): retry after that.
const MAINTENANCE_WAIT: Duration = Duration::from_secs(60);
/// 132015: Meta pauses a template whose quality dropped, and the pause ends by itself after
/// hours (its webhooks name a FIRST_PAUSE, a SECOND_PAUSE, then DISABLED, which is 132016).
/// Three hours is our choice, the length Meta gives a first pause (not in providers.md).
pub const TEMPLATE_PAUSE_WAIT: Duration = Duration::from_secs(3 * 3600);
/// Re-engagement message: the recipient's 24-hour customer-service window is closed, so only
/// an approved template may be sent (providers.md §1.5).
pub const WINDOW_CLOSED: i64 = 131_047;

/// `sender = "whatsapp_cloud"`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WhatsAppConfig {
    /// The business phone number's id (not the number).
    phone_number_id: Spanned<String>,
    /// The system-user access token.
    access_token: Spanned<SecretRef>,
    /// The Graph API host; [`DEFAULT_BASE_URL`] when absent.
    base_url: Option<Spanned<String>>,
    /// The Graph API version; [`DEFAULT_API_VERSION`] when absent.
    api_version: Option<Spanned<String>>,
    /// The WhatsApp Business Account (WABA) id the number belongs to: account-level webhooks
    /// (`account_update`) name only it. Optional.
    waba_id: Option<Spanned<String>>,
    /// The number as Meta writes it (digits, e.g. `15550783881`): quality updates name it.
    /// Optional.
    display_phone_number: Option<Spanned<String>>,
}

/// Who one configured WhatsApp number is in Meta's webhooks, for the webhook endpoint to map
/// events to herald accounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WhatsAppNumber {
    /// The business phone number's id (`value.metadata.phone_number_id` of `messages`).
    pub phone_number_id: String,
    /// The WABA id (`entry[].id`), when configured.
    pub waba_id: Option<String>,
    /// The number's digits (`display_phone_number`), when configured.
    pub display_phone_number: Option<String>,
}

impl WhatsAppConfig {
    /// The number's identity in webhooks.
    pub(crate) fn number(&self) -> WhatsAppNumber {
        let text = |v: &Option<Spanned<String>>| {
            v.as_ref()
                .map(|v| v.get_ref().trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        WhatsAppNumber {
            phone_number_id: self.phone_number_id.get_ref().trim().to_owned(),
            waba_id: text(&self.waba_id),
            display_phone_number: text(&self.display_phone_number)
                .map(|n| n.chars().filter(char::is_ascii_digit).collect()),
        }
    }
}

impl BuildSender for WhatsAppConfig {
    fn build(self, cx: &mut BuildContext<'_>) -> Result<BoxSender, ConfigError> {
        let phone_number_id = cx
            .non_empty("phone_number_id", &self.phone_number_id)?
            .to_owned();
        let access_token = cx.secret("access_token", &self.access_token)?;
        let api_version = match &self.api_version {
            None => DEFAULT_API_VERSION.to_owned(),
            Some(v) => {
                let s = cx.non_empty("api_version", v)?;
                if !s.starts_with('v') || s.contains('/') {
                    return Err(cx.invalid(
                        v.span(),
                        format!("api_version looks like \"v23.0\", got {s:?}"),
                    ));
                }
                s.to_owned()
            }
        };
        let base_url = cx.base_url(&self.base_url, DEFAULT_BASE_URL)?;
        let settings = WhatsAppSettings {
            base_url,
            api_version,
            phone_number_id,
            access_token,
        };
        let sender =
            WhatsAppSender::new(cx.http_client()?, settings).map_err(|e| cx.invalid_table(e))?;
        Ok(sender.boxed())
    }
}

/// Settings of one `whatsapp_cloud` account.
#[derive(Clone)]
pub struct WhatsAppSettings {
    /// The Graph API host, e.g. [`DEFAULT_BASE_URL`] or a local fake.
    pub base_url: reqwest::Url,
    /// The Graph API version, e.g. `v23.0`.
    pub api_version: String,
    /// The business phone number's id (not the phone number).
    pub phone_number_id: String,
    /// The system-user access token.
    pub access_token: Secret,
}

impl fmt::Debug for WhatsAppSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WhatsAppSettings")
            .field("base_url", &self.base_url.as_str())
            .field("api_version", &self.api_version)
            .field("phone_number_id", &self.phone_number_id)
            .field("access_token", &self.access_token)
            .finish()
    }
}

/// Sends through one WhatsApp business phone number.
#[derive(Debug)]
pub struct WhatsAppSender {
    client: reqwest::Client,
    settings: WhatsAppSettings,
    url: reqwest::Url,
}

/// The settings do not make a usable endpoint URL.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the WhatsApp messages URL from base_url {base_url:?}: {reason}")]
pub struct InvalidUrl {
    base_url: String,
    reason: String,
}

impl WhatsAppSender {
    /// A sender for `settings`, using the shared `client`.
    pub fn new(client: reqwest::Client, settings: WhatsAppSettings) -> Result<Self, InvalidUrl> {
        let invalid = |reason: &str| InvalidUrl {
            base_url: settings.base_url.to_string(),
            reason: reason.to_owned(),
        };
        let mut url = settings.base_url.clone();
        url.path_segments_mut()
            .map_err(|()| invalid("it cannot have a path"))?
            .pop_if_empty()
            .extend([
                settings.api_version.as_str(),
                settings.phone_number_id.as_str(),
                "messages",
            ]);
        Ok(WhatsAppSender {
            client,
            settings,
            url,
        })
    }

    /// The messages endpoint this sender posts to.
    pub fn url(&self) -> &reqwest::Url {
        &self.url
    }
}

/// The request body for `req`, or PERMANENT when the content cannot be expressed.
pub fn message_body(req: &SendRequest) -> Result<Value, SendError> {
    body_for(req, &req.content)
}

/// The request body sending `content` (the request's own, or its fallback) for `req`.
fn body_for(req: &SendRequest, content: &super::Content) -> Result<Value, SendError> {
    let mut body = json!({
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "to": req.recipient,
    });
    let (kind, object) = content::message(content)?;
    body["type"] = json!(kind);
    body[kind] = object;
    // Echoed back in status webhooks, so a delivery report finds its task even before (or
    // without) the send's report naming the wamid.
    let data = callback_data(&req.task_id, req.attempt);
    if !req.task_id.is_empty() && data.chars().count() <= MAX_CALLBACK_DATA_CHARS {
        body["biz_opaque_callback_data"] = json!(data);
    }
    Ok(body)
}

/// `biz_opaque_callback_data` of a send: the lease's fencing token, `<task id>/<attempt>`.
pub fn callback_data(task_id: &str, attempt: i32) -> String {
    format!("{task_id}/{attempt}")
}

/// The task id and attempt of a status webhook's `biz_opaque_callback_data`, as
/// [`callback_data`] wrote it (attempt 0 when absent, as older sends wrote the task id alone).
pub fn parse_callback_data(data: &str) -> Option<(&str, i32)> {
    let data = data.trim();
    let (task, attempt) = match data.rsplit_once('/') {
        Some((task, attempt)) => (task, attempt.parse().ok()?),
        None => (data, 0),
    };
    (!task.is_empty()).then_some((task, attempt))
}

/// The variables' values in the order of their keys `"1"`, `"2"`, … `"n"` (the rule both
/// services share, `herald_proto::content::positional_parameters`); PERMANENT otherwise.
pub(crate) fn positional_parameters(
    variables: &std::collections::BTreeMap<String, String>,
) -> Result<Vec<&str>, SendError> {
    herald_proto::content::positional_parameters(variables).map_err(SendError::permanent)
}

#[derive(Deserialize)]
struct ErrorEnvelope {
    error: GraphError,
}

#[derive(Deserialize)]
struct GraphError {
    code: Option<i64>,
    #[serde(default)]
    message: String,
    #[serde(default)]
    error_data: Option<ErrorData>,
    #[serde(default)]
    fbtrace_id: Option<String>,
}

#[derive(Deserialize)]
struct ErrorData {
    #[serde(default)]
    details: String,
}

#[derive(Deserialize)]
struct SuccessBody {
    #[serde(default)]
    messages: Vec<SentMessage>,
}

#[derive(Deserialize)]
struct SentMessage {
    id: String,
}

impl Sender for WhatsAppSender {
    #[instrument(name = "whatsapp_send", skip_all, fields(task_id = %req.task_id, attempt = req.attempt, account = %req.account_id, status, code))]
    async fn send(&self, req: SendRequest) -> Result<SendReceipt, SendError> {
        let refusal = match self.post(&message_body(&req)?).await {
            Err(e) if e.code == Some(WINDOW_CLOSED) => e,
            Err(e) if e.code == Some(MEDIA_FETCH_FAILED) => {
                return Err(media_fetch_failed(&req, e))
            }
            sent => return sent,
        };
        let Some(fallback) = &req.window_closed_fallback else {
            return Err(refusal);
        };
        info!("whatsapp says the 24-hour window is closed (131047); sending the fallback template");
        // Built before posting: a fallback that cannot be expressed is the fallback's failure.
        let sent = match body_for(&req, fallback) {
            Ok(body) => {
                crate::senders::fallback_posted();
                self.post(&body).await
            }
            Err(e) => Err(e),
        };
        match sent {
            Ok(receipt) => Ok(SendReceipt {
                window_closed: Some(refusal),
                ..receipt
            }),
            Err(e) => Err(SendError {
                message: format!(
                    "{}; then the window-closed fallback failed: {}",
                    refusal.message, e.message
                ),
                window_closed_fallback: true,
                ..e
            }),
        }
    }
}

impl WhatsAppSender {
    /// Posts one message body: the receipt, or the Graph API's refusal classified.
    async fn post(&self, body: &Value) -> Result<SendReceipt, SendError> {
        let response = self
            .client
            .post(self.url.clone())
            .bearer_auth(self.settings.access_token.expose())
            .json(body)
            .send()
            .await
            // TRANSIENT: /messages has no idempotency key, so the message may have gone out.
            .map_err(|e| transport_error("whatsapp request", e))?;
        let status = response.status();
        Span::current().record("status", status.as_u16());
        let retry_after = retry_after_header(response.headers(), SystemTime::now());
        let bytes = response
            .bytes()
            .await
            .map_err(|e| transport_error("reading the whatsapp response", e))?;
        if status.is_success() {
            let id = serde_json::from_slice::<SuccessBody>(&bytes)
                .ok()
                .and_then(|b| b.messages.into_iter().next())
                .map(|m| m.id)
                .filter(|id| !id.is_empty());
            if id.is_none() {
                // Accepted (2xx) but no wamid: report OK; status webhooks cannot be matched.
                warn!("whatsapp accepted the message without a message id");
            }
            debug!(wamid = ?id, "whatsapp accepted");
            return Ok(SendReceipt {
                provider_message_id: id,
                ..SendReceipt::default()
            });
        }
        let parsed = serde_json::from_slice::<ErrorEnvelope>(&bytes).ok();
        let error = match parsed.as_ref().and_then(|e| e.error.code.map(|c| (c, e))) {
            Some((code, envelope)) => {
                Span::current().record("code", code);
                let e = &envelope.error;
                let mut text = format!(
                    "whatsapp error {code} (HTTP {}): {}",
                    status.as_u16(),
                    e.message
                );
                if let Some(d) = e.error_data.as_ref().filter(|d| !d.details.is_empty()) {
                    text.push_str(": ");
                    text.push_str(&d.details);
                }
                if let Some(trace) = &e.fbtrace_id {
                    text.push_str(&format!(" (fbtrace_id {trace})"));
                }
                classify_code(code, status, &text)
            }
            None => {
                let error = classify_status(
                    status,
                    &format!(
                        "whatsapp answered HTTP {} without an error code: {}",
                        status.as_u16(),
                        excerpt(&bytes)
                    ),
                );
                // A gateway's timeout (an edge or an egress proxy gave up waiting) may come
                // after Meta took the message: as with a lost answer, the task waits for a
                // status callback before it is sent again (providers.md §1.5.1).
                if matches!(status.as_u16(), 408 | 502 | 504) {
                    error.with_outcome_unknown()
                } else {
                    error
                }
            }
        };
        // A Retry-After header (never documented by Meta) wins over our defaults.
        Err(match retry_after {
            Some(d) => error.with_retry_after(Some(d)),
            None => error,
        })
    }
}

/// 131053: Meta could not fetch or process media the message referenced.
const MEDIA_FETCH_FAILED: i64 = 131053;
/// How long a link Meta could not fetch waits for its one more try.
const MEDIA_REFETCH_WAIT: Duration = Duration::from_secs(120);

/// A 131053 as the task should take it. PERMANENT for that media, but seen transiently under
/// bursty link fetches (providers-media.md §1.2: "allow one delayed retry for `link` sends"),
/// which a campaign sending one link to thousands makes: a send whose media Meta fetches by
/// link, on its first charged attempt, is tried once more after [`MEDIA_REFETCH_WAIT`].
fn media_fetch_failed(req: &SendRequest, error: SendError) -> SendError {
    if req.attempts_before == 0 && fetches_a_link(&req.content) {
        SendError::new(
            OutcomeClass::Transient,
            format!(
                "{} (tried once more: Meta fetches links in bursts)",
                error.message
            ),
        )
        .with_retry_after(Some(MEDIA_REFETCH_WAIT))
        .with_code(MEDIA_FETCH_FAILED)
    } else {
        error
    }
}

/// Whether Meta fetches media of `content` by link: a media message's, or a template header's.
fn fetches_a_link(content: &Content) -> bool {
    let Content::Rich(rich) = content else {
        return false;
    };
    let media = match &rich.body {
        Some(pb::content::Body::Media(m)) => Some(m),
        Some(pb::content::Body::Template(t)) => {
            match t.header.as_ref().and_then(|h| h.parameter.as_ref()) {
                Some(pb::template_header::Parameter::Media(m)) => Some(m),
                _ => None,
            }
        }
        _ => None,
    };
    media.is_some_and(|m| matches!(m.source, Some(pb::media::Source::Link(_))))
}

/// Classifies a Graph API error by its `error.code` (providers.md §1.5); codes not in the
/// table fall back to the HTTP status.
pub fn classify_code(code: i64, status: StatusCode, message: &str) -> SendError {
    use OutcomeClass::*;
    let (class, retry_after, recipient_scoped) = match code {
        // Throttling of the app, the WABA or the number's throughput: slow the account.
        4 | 17 | 341 | 613 | 80007 | 130429 => (RateLimited, None, false),
        // Spam limit: a quality problem; pause the number for long.
        131048 => (RateLimited, Some(LONG_COOL_DOWN), false),
        // Pair limit: only this recipient; other recipients can be sent to right away.
        131056 => (RateLimited, Some(PAIR_LIMIT_WAIT), true),
        // Per-user marketing limit: this recipient, long back-off.
        131049 => (RateLimited, Some(LONG_COOL_DOWN), true),
        // Flow throttled (10 messages an hour per flow).
        132069 => (RateLimited, None, false),
        // Register/deregister limit: not expected on sends; still a throttle.
        133016 => (RateLimited, None, false),
        // Temporary failures (bounded by the task's attempt budget).
        1 | 2 | 131000 | 131016 | 133004 => (Transient, None, false),
        // Maintenance of the number (a throughput upgrade): the number, not the task, waits
        // (providers.md §1.5: pause the sender for a minute or two). As TRANSIENT, every
        // task leased meanwhile spent an attempt on it.
        131057 => (RateLimited, Some(MAINTENANCE_WAIT), false),
        // The template is paused for a while: a campaign's remaining sends wait for it to
        // come back instead of all ending FAILED (providers-media.md §1.5.5: hold, release).
        132015 => (Transient, Some(TEMPLATE_PAUSE_WAIT), false),
        // The recipient, the payload or the template: never succeeds as sent.
        100 | 130472 | 130497 | 131008 | 131009 | 131021 | 131026 | 131047 | 131050 | 131051
        | 131052 | 131053 | 132000 | 132001 | 132005 | 132007 | 132012 | 132016 | 132068 => {
            (Permanent, None, false)
        }
        // Token (system-user tokens cannot be refreshed here), permissions, number deleted,
        // policy block, lock, payment, registration: the account, not the message.
        0 | 3 | 10 | 33 | 190 | 200..=299 | 368 | 131031 | 131042 | 131045 | 133010 => {
            (AccountUnavailable, None, false)
        }
        _ => return classify_status(status, message).with_code(code),
    };
    let error = SendError::new(class, message)
        .with_retry_after(retry_after)
        .with_code(code);
    if recipient_scoped {
        error.scoped_to_recipient()
    } else {
        error
    }
}

/// Classifies by HTTP status alone, when the body has no usable `error.code` (providers.md
/// §1.5.1; a design rule, not Meta's).
pub fn classify_status(status: StatusCode, message: &str) -> SendError {
    let class = match status.as_u16() {
        429 => OutcomeClass::RateLimited,
        // A gateway gave up waiting (the request may yet have reached Meta): passing, as
        // every other sender takes it, not a verdict on the message.
        408 | 500..=599 => OutcomeClass::Transient,
        // 401 would be "refresh the token", but a system-user token has no refresh path.
        401 | 403 => OutcomeClass::AccountUnavailable,
        _ => OutcomeClass::Permanent,
    };
    SendError::new(class, message)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::senders::Content;

    fn req(content: Content) -> SendRequest {
        SendRequest {
            task_id: "task-1".into(),
            attempt: 1,
            queue: "q".into(),
            recipient: "16505551234".into(),
            content,
            idempotency_key: "idem".into(),
            labels: BTreeMap::new(),
            run_at: None,
            leased_at: None,
            attempts_before: 0,
            max_attempts: 3,
            account_id: "acc".into(),
            credentials_ref: "wa".into(),
            window_closed_fallback: None,
        }
    }

    #[test]
    fn template_parameters_in_numeric_order() {
        let vars: BTreeMap<String, String> =
            (1..=11).map(|i| (i.to_string(), format!("v{i}"))).collect();
        let body = message_body(&req(Content::Template {
            template_id: "t".into(),
            language: "en_US".into(),
            variables: vars,
        }))
        .unwrap();
        let params = body["template"]["components"][0]["parameters"]
            .as_array()
            .unwrap();
        let texts: Vec<&str> = params.iter().map(|p| p["text"].as_str().unwrap()).collect();
        assert_eq!(texts[1], "v2");
        assert_eq!(texts[9], "v10");
        assert_eq!(texts.len(), 11);
    }

    #[test]
    fn named_or_gapped_variables_are_permanent() {
        for keys in [vec!["name"], vec!["1", "3"], vec!["0"]] {
            let vars = keys
                .into_iter()
                .map(|k| (k.to_owned(), "x".to_owned()))
                .collect();
            let err = message_body(&req(Content::Template {
                template_id: "t".into(),
                language: "en".into(),
                variables: vars,
            }))
            .unwrap_err();
            assert_eq!(err.class, OutcomeClass::Permanent, "{err}");
        }
    }

    #[test]
    fn settings_debug_hides_the_token() {
        let s = WhatsAppSettings {
            base_url: DEFAULT_BASE_URL.parse().unwrap(),
            api_version: DEFAULT_API_VERSION.into(),
            phone_number_id: "1065".into(),
            access_token: Secret::new("EAAJ-very-secret"),
        };
        assert!(!format!("{s:?}").contains("very-secret"));
        let sender = WhatsAppSender::new(reqwest::Client::new(), s).unwrap();
        assert_eq!(
            sender.url().as_str(),
            "https://graph.facebook.com/v23.0/1065/messages"
        );
        assert!(!format!("{sender:?}").contains("very-secret"));
    }
}
