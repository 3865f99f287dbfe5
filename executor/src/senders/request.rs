//! The sender contract: a [`SendRequest`] built from a lease, and what a send returns, a
//! [`SendReceipt`] or a [`SendError`] classified into one of the wire's outcome classes.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, SystemTime};

use herald_proto::v1 as pb;

/// What to send. Plain text and body-only templates have their own variants (most sends,
/// and what every sender understands); anything richer travels as the wire's content, which
/// each channel's content module maps (`whatsapp/content.rs`, `wecom/content.rs`).
#[derive(Clone, Debug, PartialEq)]
pub enum Content {
    /// Final text, sent as is.
    Text(String),
    /// A template and the values of its variables.
    Template {
        /// The template's identifier.
        template_id: String,
        /// The template's language code; empty when not given.
        language: String,
        /// Values for the template's variables, by name.
        variables: BTreeMap<String, String>,
    },
    /// Any other body (media, location, interactive, markdown, cards, news), or text or a
    /// template with options the variants above cannot say (a link preview, a template's
    /// header or buttons).
    Rich(pb::Content),
}

impl Content {
    /// The content's size in bytes (text, or template id plus variables; the encoded size of
    /// rich content), for logs.
    pub fn len(&self) -> usize {
        match self {
            Content::Text(t) => t.len(),
            Content::Template {
                template_id,
                language,
                variables,
            } => {
                template_id.len()
                    + language.len()
                    + variables
                        .iter()
                        .map(|(k, v)| k.len() + v.len())
                        .sum::<usize>()
            }
            Content::Rich(c) => prost::Message::encoded_len(c),
        }
    }

    /// Whether the content is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The content as a channel without link previews takes it: text asking for a preview
    /// (carried as rich content, for WhatsApp's `preview_url`) is plain text. Everywhere else
    /// the flag is ignored, as the API says, rather than turning the text into rich content
    /// that WeCom would send without its message type or mentions.
    pub fn without_link_preview(&self) -> std::borrow::Cow<'_, Content> {
        match self {
            Content::Rich(pb::Content {
                body: Some(pb::content::Body::Text(t)),
                ..
            }) => std::borrow::Cow::Owned(Content::Text(t.clone())),
            other => std::borrow::Cow::Borrowed(other),
        }
    }

    /// Converts the wire content; `None` when the lease carried no body.
    pub fn from_proto(content: Option<pb::Content>) -> Option<Self> {
        let content = content?;
        match content.body.as_ref()? {
            pb::content::Body::Text(_) if content.link_preview => Some(Content::Rich(content)),
            pb::content::Body::Text(t) => Some(Content::Text(t.clone())),
            pb::content::Body::Template(t) if t.header.is_none() && t.buttons.is_empty() => {
                Some(Content::Template {
                    template_id: t.template_id.clone(),
                    language: t.language.clone(),
                    variables: t.variables.clone().into_iter().collect(),
                })
            }
            _ => Some(Content::Rich(content)),
        }
    }

    /// The wire content: the one form the channels' content modules map.
    pub fn to_proto(&self) -> pb::Content {
        match self {
            Content::Text(t) => pb::Content {
                body: Some(pb::content::Body::Text(t.clone())),
                link_preview: false,
            },
            Content::Template {
                template_id,
                language,
                variables,
            } => pb::Content {
                body: Some(pb::content::Body::Template(pb::TemplateContent {
                    template_id: template_id.clone(),
                    language: language.clone(),
                    variables: variables.clone().into_iter().collect(),
                    header: None,
                    buttons: Vec::new(),
                })),
                link_preview: false,
            },
            Content::Rich(c) => c.clone(),
        }
    }
}

/// One attempt to send one task, built from a lease.
#[derive(Clone, Debug)]
pub struct SendRequest {
    /// The task's id.
    pub task_id: String,
    /// The attempt number (with `task_id`, the lease's fencing token).
    pub attempt: i32,
    /// The queue the task belongs to.
    pub queue: String,
    /// The recipient.
    pub recipient: String,
    /// What to send.
    pub content: Content,
    /// The provider idempotency key: the same for every attempt of the task.
    pub idempotency_key: String,
    /// The task's labels.
    pub labels: BTreeMap<String, String>,
    /// When the task was due.
    pub run_at: Option<SystemTime>,
    /// When the lease was granted (scheduler's database clock).
    pub leased_at: Option<SystemTime>,
    /// Attempts charged before this one.
    pub attempts_before: i32,
    /// The task's attempt budget.
    pub max_attempts: i32,
    /// The sending account the scheduler chose; empty when the task is routed by queue.
    pub account_id: String,
    /// The name of that account's table in the executor's config file (`[accounts.<name>]`);
    /// empty when the task is routed by queue.
    pub credentials_ref: String,
    /// What to send instead when WhatsApp refuses `content` because the recipient's 24-hour
    /// window is closed (131047): the task's window-closed fallback template, while unused.
    /// Only the WhatsApp sender acts on it.
    pub window_closed_fallback: Option<Content>,
}

impl SendRequest {
    /// Whether an earlier attempt of this task may have reached the provider: an attempt was
    /// charged, or this is not the first lease of the task (a lease that expired without a
    /// report is the zombie case, where the provider may have seen the message).
    pub fn is_retry(&self) -> bool {
        self.attempts_before > 0 || self.attempt > 1
    }
}

/// What a successful send returns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SendReceipt {
    /// The provider's message id, when it returned one.
    pub provider_message_id: Option<String>,
    /// Something the attempt's record should say although the send succeeded, e.g. WeCom
    /// recipients the provider rejected while delivering to the others. Reported as the
    /// attempt's error text with outcome OK.
    pub note: Option<String>,
    /// The refusal of the content (WhatsApp 131047: the window is closed) that made the
    /// sender send the request's window-closed fallback instead; this receipt is the
    /// fallback's. Reported as the attempt's error with outcome OK and the fallback flag.
    pub window_closed: Option<SendError>,
}

/// How a failed send is classified (the non-OK outcome classes of the wire contract).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OutcomeClass {
    /// The provider throttled us; retry after `retry_after` or the policy's backoff.
    RateLimited,
    /// A passing failure (network, timeout, 5xx).
    Transient,
    /// The message can never succeed as sent.
    Permanent,
    /// The sending account is offline, locked or misconfigured; the attempt is not charged.
    AccountUnavailable,
}

impl OutcomeClass {
    /// The wire value.
    pub fn to_proto(self) -> pb::OutcomeClass {
        match self {
            OutcomeClass::RateLimited => pb::OutcomeClass::RateLimited,
            OutcomeClass::Transient => pb::OutcomeClass::Transient,
            OutcomeClass::Permanent => pb::OutcomeClass::Permanent,
            OutcomeClass::AccountUnavailable => pb::OutcomeClass::AccountUnavailable,
        }
    }
}

impl fmt::Display for OutcomeClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OutcomeClass::RateLimited => "rate_limited",
            OutcomeClass::Transient => "transient",
            OutcomeClass::Permanent => "permanent",
            OutcomeClass::AccountUnavailable => "account_unavailable",
        })
    }
}

/// A classified send failure.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{class}: {message}")]
pub struct SendError {
    /// How the failure is classified.
    pub class: OutcomeClass,
    /// The delay the provider asked for, if any.
    pub retry_after: Option<Duration>,
    /// The provider's error text (no secrets). Starts with [`RECIPIENT_SCOPE_MARKER`] when
    /// `recipient_scoped` is set, so the scheduler can tell before the wire has a field for it.
    pub message: String,
    /// The failure concerns this recipient only (WhatsApp's pair rate limit 131056): other
    /// recipients of the same account are unaffected, so the account must not be slowed.
    pub recipient_scoped: bool,
    /// The provider's numeric error code (WhatsApp `error.code`, WeCom `errcode`), when it gave
    /// one: the scheduler keeps it as the task's end code and tells invalid recipients by it.
    pub code: Option<i64>,
    /// The content was refused with WhatsApp's 131047 and this is the failure of the
    /// window-closed fallback sent instead: the scheduler marks the fallback used, so a retry
    /// sends the fallback and never the content again.
    pub window_closed_fallback: bool,
    /// The request reached the provider and its answer was lost (timed out, or the connection
    /// broke after the request went): the message may have been accepted. The scheduler then
    /// waits for a status callback naming the send before sending it again, where the provider
    /// sends them (WhatsApp Cloud).
    pub outcome_unknown: bool,
}

/// Prefix of the error text of a recipient-scoped failure, until `AttemptResult` carries the
/// scope as a field.
pub const RECIPIENT_SCOPE_MARKER: &str = "[recipient] ";

impl SendError {
    /// A failure of the given class without a retry hint.
    pub fn new(class: OutcomeClass, message: impl Into<String>) -> Self {
        SendError {
            class,
            retry_after: None,
            message: message.into(),
            recipient_scoped: false,
            code: None,
            window_closed_fallback: false,
            outcome_unknown: false,
        }
    }

    /// The sending account cannot send (offline, locked, misconfigured): not the task's fault.
    pub fn account_unavailable(message: impl Into<String>) -> Self {
        Self::new(OutcomeClass::AccountUnavailable, message)
    }

    /// Marks the failure as concerning this recipient only, and says so in the error text.
    pub fn scoped_to_recipient(mut self) -> Self {
        if !self.recipient_scoped {
            self.recipient_scoped = true;
            self.message = format!("{RECIPIENT_SCOPE_MARKER}{}", self.message);
        }
        self
    }

    /// A passing failure.
    pub fn transient(message: impl Into<String>) -> Self {
        Self::new(OutcomeClass::Transient, message)
    }

    /// A failure that will not go away by retrying.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self::new(OutcomeClass::Permanent, message)
    }

    /// Sets the provider's error code.
    pub fn with_code(mut self, code: i64) -> Self {
        self.code = Some(code);
        self
    }

    /// Sets the provider's retry hint.
    pub fn with_retry_after(mut self, retry_after: Option<Duration>) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// Marks the failure as one whose answer was lost after the request went.
    pub fn with_outcome_unknown(mut self) -> Self {
        self.outcome_unknown = true;
        self
    }

    /// Whether the scheduler will retry this attempt.
    pub fn is_retryable(&self) -> bool {
        !matches!(self.class, OutcomeClass::Permanent)
    }
}
