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
use herald_outbound::guard::{
    self, parse_network, AddressPolicy, FetchError, FetchLimits, GuardedClient,
};
use herald_outbound::signing::{SigningKey, WEBHOOK_ID, WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP};
use herald_proto::v1 as pb;
use reqwest::header::{HeaderMap, HeaderValue};

use crate::audiences::model::Contact;
use crate::config::Config;
use crate::tasks::model::DEFAULT_MAX_ATTEMPTS;
use crate::tasks::retry_policy::RetryPolicy;

/// Default time one request may take.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest time one request may be given.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest answer read, in bytes: a page of recipients' variables, not a file.
const MAX_ANSWER_BYTES: u64 = 4 * 1024 * 1024;
/// Longest time one connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

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
    client: GuardedClient,
    policy: AddressPolicy,
    signer: Option<SigningKey>,
}

/// Why a source gave no variables; every one is retried per the schedule's retry policy.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The URL, or an address it resolves to, may not be reached (the outbound guard).
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

impl From<FetchError> for SourceError {
    fn from(e: FetchError) -> Self {
        match e {
            FetchError::Refused { .. } => SourceError::Refused(e.to_string()),
            FetchError::Status { status, .. } => SourceError::Status(status),
            FetchError::TooLarge { .. } => SourceError::Answer(e.to_string()),
            FetchError::Network { .. } => SourceError::Request(e.to_string()),
        }
    }
}

/// The addresses variables sources may reach beyond the public internet, and the extra CA
/// certificates they may be signed by, from the scheduler's configuration
/// (HERALD_VARIABLES_SOURCE_ALLOW_PRIVATE, _ALLOWED_NETWORKS, _CA_FILE).
pub fn address_policy(
    config: &Config,
) -> Result<(AddressPolicy, Vec<reqwest::Certificate>), String> {
    let allowed_networks = config
        .variables_source_allowed_networks
        .iter()
        .filter(|n| !n.trim().is_empty())
        .map(|n| {
            parse_network(n).map_err(|e| format!("HERALD_VARIABLES_SOURCE_ALLOWED_NETWORKS: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let roots = match &config.variables_source_ca_file {
        None => Vec::new(),
        Some(path) => {
            let pem = std::fs::read(path)
                .map_err(|e| format!("HERALD_VARIABLES_SOURCE_CA_FILE {}: {e}", path.display()))?;
            reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| format!("HERALD_VARIABLES_SOURCE_CA_FILE {}: {e}", path.display()))?
        }
    };
    let policy = AddressPolicy {
        allow_private_networks: config.variables_source_allow_private,
        allowed_networks,
    };
    Ok((policy, roots))
}

/// Refuses a URL that is not https or whose host is an address `policy` does not permit; a
/// host name is checked again after resolution, when the source is called.
pub fn check_url(url: &str, policy: &AddressPolicy) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("does not parse: {e}"))?;
    guard::check_url(&parsed, policy)
}

impl Sources {
    /// Sources signed with `secret` (unsigned without one), reached through the outbound guard
    /// with `policy`, trusting the system's roots plus `roots`.
    pub fn new(
        secret: Option<&str>,
        policy: AddressPolicy,
        roots: Vec<reqwest::Certificate>,
    ) -> Result<Self, String> {
        let signer = match secret.filter(|s| !s.is_empty()) {
            Some(s) => Some(
                SigningKey::from_secret(s)
                    .map_err(|e| format!("HERALD_VARIABLES_SOURCE_SECRET: {e}"))?,
            ),
            None => None,
        };
        let client = GuardedClient::new(policy.clone(), roots, CONNECT_TIMEOUT)
            .map_err(|e| format!("variables source HTTP client: {e}"))?;
        Ok(Sources {
            client,
            policy,
            signer,
        })
    }

    /// Which addresses sources may reach (CreateSchedule and UpdateSchedule check URLs with it).
    pub fn policy(&self) -> &AddressPolicy {
        &self.policy
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
        let timeout = timeout_of(source);
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
        let mut headers = HeaderMap::new();
        let mut header = |name: &'static str, value: String| -> Result<(), SourceError> {
            let value = HeaderValue::from_str(&value)
                .map_err(|e| SourceError::Request(format!("header {name}: {e}")))?;
            headers.insert(name, value);
            Ok(())
        };
        header("content-type", "application/json".into())?;
        header(WEBHOOK_ID, message_id.to_owned())?;
        header(WEBHOOK_TIMESTAMP, timestamp.to_string())?;
        if let Some(signer) = &self.signer {
            header(WEBHOOK_SIGNATURE, signer.sign(message_id, timestamp, &body))?;
        }
        let limits = FetchLimits {
            max_bytes: MAX_ANSWER_BYTES,
            timeout,
        };
        let answer = self.client.post(&source.url, headers, body, limits).await?;
        parse_answer(&answer.bytes)
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
/// row (1 for the first), or None to give up on the run: the schedule's retry policy and
/// attempt budget, as its tasks' failed sends are spaced (default: exponential from 1 s, 10
/// tries).
pub fn retry_delay(spec: &pb::ScheduleSpec, failures: i32) -> Option<Duration> {
    let budget = spec.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS);
    if failures >= budget {
        return None;
    }
    let policy = spec
        .retry_policy
        .as_ref()
        .and_then(RetryPolicy::from_wire)
        .unwrap_or_else(RetryPolicy::default_exponential);
    Some(Duration::from_millis(
        u64::try_from(policy.delay_ms(failures)).unwrap_or(0),
    ))
}

/// How long one request to `source` may take: its `timeout` to the millisecond (checked to be
/// 1 ms to 60 s when the schedule was stored), else [`DEFAULT_TIMEOUT`].
fn timeout_of(source: &pb::VariablesSource) -> Duration {
    source
        .timeout
        .as_ref()
        .and_then(|d| Duration::try_from(*d).ok())
        .filter(|d| !d.is_zero())
        .unwrap_or(DEFAULT_TIMEOUT)
        .min(MAX_TIMEOUT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sources_timeout_counts_its_milliseconds() {
        let with = |seconds: i64, nanos: i32| pb::VariablesSource {
            url: String::new(),
            timeout: Some(prost_types::Duration { seconds, nanos }),
        };
        assert_eq!(
            timeout_of(&with(0, 500_000_000)),
            Duration::from_millis(500)
        );
        assert_eq!(
            timeout_of(&with(1, 900_000_000)),
            Duration::from_millis(1_900)
        );
        assert_eq!(timeout_of(&with(0, 0)), DEFAULT_TIMEOUT);
        assert_eq!(timeout_of(&with(-1, 0)), DEFAULT_TIMEOUT);
        assert_eq!(timeout_of(&with(600, 0)), MAX_TIMEOUT);
        let unset = pb::VariablesSource::default();
        assert_eq!(timeout_of(&unset), DEFAULT_TIMEOUT);
    }

    #[test]
    fn urls_must_be_https_and_public_unless_allowed() -> anyhow::Result<()> {
        let public = AddressPolicy::default();
        assert!(check_url("https://figures.example.com/v", &public).is_ok());
        assert!(check_url("http://figures.example.com/v", &public).is_err());
        assert!(check_url("https://127.0.0.1/v", &public).is_err());
        assert!(check_url("https://10.1.2.3/v", &public).is_err());
        assert!(check_url("https://[::1]/v", &public).is_err());
        assert!(check_url("https://169.254.169.254/v", &public).is_err());
        let loopback = AddressPolicy {
            allowed_networks: vec![parse_network("127.0.0.1/32").map_err(anyhow::Error::msg)?],
            ..Default::default()
        };
        assert!(check_url("https://127.0.0.1:8443/v", &loopback).is_ok());
        assert!(check_url("https://10.1.2.3/v", &loopback).is_err());
        // Plain http stays refused whatever the addresses allowed.
        assert!(check_url("http://127.0.0.1:8080/v", &loopback).is_err());
        Ok(())
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
    fn a_source_is_retried_per_the_schedules_policy_and_budget() {
        let default = pb::ScheduleSpec::default();
        assert_eq!(retry_delay(&default, 9).map(|d| d.is_zero()), Some(false));
        assert_eq!(retry_delay(&default, DEFAULT_MAX_ATTEMPTS), None);
        let listed = pb::ScheduleSpec {
            max_attempts: Some(3),
            retry_policy: Some(pb::RetryPolicy {
                strategy: Some(pb::retry_policy::Strategy::Delays(pb::FixedDelays {
                    delays: vec![
                        prost_types::Duration {
                            seconds: 60,
                            nanos: 0,
                        },
                        prost_types::Duration {
                            seconds: 300,
                            nanos: 0,
                        },
                    ],
                })),
            }),
            ..Default::default()
        };
        assert_eq!(retry_delay(&listed, 1), Some(Duration::from_secs(60)));
        assert_eq!(retry_delay(&listed, 2), Some(Duration::from_secs(300)));
        assert_eq!(retry_delay(&listed, 3), None);
    }
}
