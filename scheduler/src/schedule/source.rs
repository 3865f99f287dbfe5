//! Variables sources: at each fire of a schedule that names one, herald POSTs the run's
//! context and a page of recipients to the source's URL (JSON, signed with Standard Webhooks
//! headers as the notification webhook is) and renders each recipient's message from the
//! variables it answers.
//!
//! Request body:
//! `{"schedule_id", "fire_time", "period_start" (null when unknown), "period_end", "catch_up",
//! "recipients": [{"recipient", "name", "time_zone", "locale", "tags", "attributes"}]}`.
//! Answer: `{"recipients": {"<recipient>": {"<variable>": "<value>", …}, …}}`; values may be
//! strings, numbers or booleans. A recipient the answer leaves out gets no message.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use herald_outbound::signing::{SigningKey, WEBHOOK_ID, WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP};
use herald_proto::v1 as pb;

use crate::audiences::model::Contact;

/// Default time one request may take.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest time one request may be given.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest answer read, in bytes: a page of recipients' variables, not a file.
const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// The run a source is asked about.
#[derive(Debug, Clone)]
pub struct RunContext {
    /// The schedule.
    pub schedule_id: String,
    /// The fire time.
    pub fire_time: DateTime<Utc>,
    /// The period's start: the fire time before (for a catch-up, before the missed ones).
    pub period_start: Option<DateTime<Utc>>,
    /// The period's end.
    pub period_end: DateTime<Utc>,
    /// Fired late, after downtime.
    pub catch_up: bool,
}

/// RFC 3339 in UTC with milliseconds, as every time herald shows a source or a template.
pub fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// How variables sources are reached, from the scheduler's configuration.
#[derive(Clone)]
pub struct Sources {
    client: reqwest::Client,
    signer: Option<SigningKey>,
    allow_private: bool,
}

/// Why a source gave no variables; every one is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The URL may not be reached.
    #[error("variables source url refused: {0}")]
    Refused(String),
    /// The request failed or timed out.
    #[error("variables source request failed: {0}")]
    Request(String),
    /// The source answered with an error status.
    #[error("variables source answered {0}")]
    Status(u16),
    /// The answer was too big or not the expected JSON.
    #[error("variables source answer unusable: {0}")]
    Answer(String),
}

/// The HTTP client variables sources are called with. The one place the outbound address
/// guard (which addresses a configured URL may reach once resolved) belongs when it lands in
/// `herald-outbound`; until then [`check_url`] refuses what it can tell from the URL alone.
pub fn source_client(allow_private: bool) -> Result<reqwest::Client, reqwest::Error> {
    let _ = allow_private;
    reqwest::Client::builder()
        .timeout(MAX_TIMEOUT)
        // A redirect could lead anywhere the URL check did not see.
        .redirect(reqwest::redirect::Policy::none())
        .build()
}

/// Refuses a URL that is not https, or names a loopback, private or link-local address,
/// unless the operator allows private sources (HERALD_VARIABLES_SOURCE_ALLOW_PRIVATE).
pub fn check_url(url: &str, allow_private: bool) -> Result<reqwest::Url, String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("does not parse: {e}"))?;
    match parsed.scheme() {
        "https" => {}
        "http" if allow_private => {}
        _ => return Err("must be an https URL".into()),
    }
    if allow_private {
        return Ok(parsed);
    }
    let host = parsed.host_str().unwrap_or("");
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    let private = match literal.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(ip)) => {
            ip.is_loopback() || ip.is_private() || ip.is_link_local() || ip.is_unspecified()
        }
        Ok(std::net::IpAddr::V6(ip)) => {
            ip.is_loopback() || ip.is_unspecified() || (ip.segments()[0] & 0xfe00) == 0xfc00
        }
        Err(_) => host.is_empty() || host == "localhost" || host.ends_with(".localhost"),
    };
    if private {
        return Err("names a loopback or private address".into());
    }
    Ok(parsed)
}

impl Sources {
    /// Sources signed with `secret` (unsigned without one); `allow_private` lets them be
    /// plain http on loopback or private addresses (development and tests).
    pub fn new(secret: Option<&str>, allow_private: bool) -> Result<Self, String> {
        let signer = match secret.filter(|s| !s.is_empty()) {
            Some(s) => Some(
                SigningKey::from_secret(s)
                    .map_err(|e| format!("HERALD_VARIABLES_SOURCE_SECRET: {e}"))?,
            ),
            None => None,
        };
        let client = source_client(allow_private)
            .map_err(|e| format!("variables source HTTP client: {e}"))?;
        Ok(Sources {
            client,
            signer,
            allow_private,
        })
    }

    /// Whether private addresses are allowed (CreateSchedule checks URLs with it).
    pub fn allow_private(&self) -> bool {
        self.allow_private
    }

    /// Asks `source` for the variables of `contacts` in the run `ctx`, keyed by recipient.
    /// `message_id` is the `webhook-id`: the same for every try of one page.
    pub async fn fetch(
        &self,
        source: &pb::VariablesSource,
        ctx: &RunContext,
        contacts: &[Contact],
        message_id: &str,
    ) -> Result<HashMap<String, BTreeMap<String, String>>, SourceError> {
        let url = check_url(&source.url, self.allow_private).map_err(SourceError::Refused)?;
        let timeout = source
            .timeout
            .as_ref()
            .and_then(|d| u64::try_from(d.seconds).ok())
            .filter(|s| *s > 0)
            .map_or(DEFAULT_TIMEOUT, Duration::from_secs)
            .min(MAX_TIMEOUT);
        let body = serde_json::json!({
            "schedule_id": ctx.schedule_id,
            "fire_time": rfc3339(ctx.fire_time),
            "period_start": ctx.period_start.map(rfc3339),
            "period_end": rfc3339(ctx.period_end),
            "catch_up": ctx.catch_up,
            "recipients": contacts.iter().map(|c| serde_json::json!({
                "recipient": c.recipient,
                "name": c.name,
                "time_zone": c.time_zone,
                "locale": c.locale,
                "tags": c.tags,
                "attributes": c.attributes,
            })).collect::<Vec<_>>(),
        });
        let body = serde_json::to_vec(&body).map_err(|e| SourceError::Request(e.to_string()))?;
        let timestamp = Utc::now().timestamp();
        let mut request = self
            .client
            .post(url)
            .timeout(timeout)
            .header("content-type", "application/json")
            .header(WEBHOOK_ID, message_id)
            .header(WEBHOOK_TIMESTAMP, timestamp.to_string());
        if let Some(signer) = &self.signer {
            request = request.header(WEBHOOK_SIGNATURE, signer.sign(message_id, timestamp, &body));
        }
        let mut response = request
            .body(body)
            .send()
            .await
            .map_err(|e| SourceError::Request(e.to_string()))?;
        if !response.status().is_success() {
            return Err(SourceError::Status(response.status().as_u16()));
        }
        let mut answer = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| SourceError::Request(e.to_string()))?
        {
            if answer.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(SourceError::Answer(format!(
                    "larger than {MAX_ANSWER_BYTES} bytes"
                )));
            }
            answer.extend_from_slice(&chunk);
        }
        parse_answer(&answer)
    }
}

/// Reads `{"recipients": {"<recipient>": {"<name>": value}}}`.
fn parse_answer(answer: &[u8]) -> Result<HashMap<String, BTreeMap<String, String>>, SourceError> {
    #[derive(serde::Deserialize)]
    struct Answer {
        recipients: HashMap<String, BTreeMap<String, serde_json::Value>>,
    }
    let parsed: Answer =
        serde_json::from_slice(answer).map_err(|e| SourceError::Answer(e.to_string()))?;
    parsed
        .recipients
        .into_iter()
        .map(|(recipient, vars)| {
            let vars = vars
                .into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| match v {
                    serde_json::Value::String(s) => Ok((k, s)),
                    serde_json::Value::Number(n) => Ok((k, n.to_string())),
                    serde_json::Value::Bool(b) => Ok((k, b.to_string())),
                    _ => Err(SourceError::Answer(format!(
                        "variable {k:?} of {recipient:?} is not a string, number or boolean"
                    ))),
                })
                .collect::<Result<BTreeMap<_, _>, _>>()?;
            Ok((recipient, vars))
        })
        .collect()
}

/// How long to wait before asking a failed source again after its `failures`-th failure in a
/// row, or None to give up on the run. A fixed bounded backoff (1, 2, 4, 8, 16 s, then give
/// up): the hook where a schedule's own retry policy goes.
pub fn retry_delay(failures: i32) -> Option<Duration> {
    const MAX_FAILURES: i32 = 5;
    (failures < MAX_FAILURES).then(|| Duration::from_secs(1u64 << failures.clamp(0, 4)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_must_be_https_and_public_unless_allowed() {
        assert!(check_url("https://figures.example.com/v", false).is_ok());
        assert!(check_url("http://figures.example.com/v", false).is_err());
        assert!(check_url("https://127.0.0.1/v", false).is_err());
        assert!(check_url("https://10.1.2.3/v", false).is_err());
        assert!(check_url("https://[::1]/v", false).is_err());
        assert!(check_url("https://localhost/v", false).is_err());
        assert!(check_url("http://127.0.0.1:8080/v", true).is_ok());
    }

    #[test]
    fn answers_take_strings_numbers_and_booleans() -> anyhow::Result<()> {
        let vars = parse_answer(
            br#"{"recipients": {"ann": {"total": 1200.5, "region": "north", "top": true, "x": null}}}"#,
        )?;
        let ann = &vars["ann"];
        assert_eq!(ann["total"], "1200.5");
        assert_eq!(ann["region"], "north");
        assert_eq!(ann["top"], "true");
        assert!(!ann.contains_key("x"));
        assert!(parse_answer(br#"{"recipients": {"ann": {"list": [1]}}}"#).is_err());
        assert!(parse_answer(b"not json").is_err());
        Ok(())
    }

    #[test]
    fn retries_back_off_then_give_up() {
        assert_eq!(retry_delay(0), Some(Duration::from_secs(1)));
        assert_eq!(retry_delay(2), Some(Duration::from_secs(4)));
        assert_eq!(retry_delay(5), None);
    }
}
