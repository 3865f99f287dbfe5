//! `[accounts.<credentials_ref>]` tables of the executor's config file: one sending account's
//! sender, settings and secrets. A lease whose `credentials_ref` names a table is sent by that
//! table's sender, whatever its queue.
//!
//! ```toml
//! [accounts.wa-main]
//! sender = "whatsapp_cloud"
//! phone_number_id = "106540352242922"
//! access_token = { env = "WA_TOKEN" }      # or { file = "/run/secrets/wa" }, or a literal
//! # base_url = "https://graph.facebook.com"  api_version = "v23.0"
//!
//! [accounts.wecom-ops]
//! sender = "wecom"
//! corp_id = "ww0123456789"
//! corp_secret = { env = "WECOM_SECRET" }
//! agent_id = 1000002
//! message_type = "text"                  # "markdown", "textcard"
//! duplicate_check_interval = "30m"       # or seconds; at most 4h
//!
//! [accounts.ops-robot]
//! sender = "wecom_robot"
//! webhook_key = { env = "ROBOT_KEY" }    # or url = { env = "ROBOT_URL" } (the full URL)
//! ```
//!
//! Every table also takes `timeout` and `concurrency`, like a queue. A setting that the
//! table's sender does not use is an error naming its line, as is a missing one.

use std::ops::Range;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::credentials::{Secret, SecretRef};
use crate::routes::{Builder, ConfigError, Route};
use crate::senders::log::LogSender;
use crate::senders::webhook::{SigningKey, WebhookSender};
use crate::senders::wecom::robot::{
    default_robot_limits, RobotEndpoint, RobotSender, RobotSettings,
};
use crate::senders::wecom::{
    self, default_member_limits, CardDefaults, MessageType, WeComSender, WeComSettings,
    MAX_DUPLICATE_CHECK_INTERVAL,
};
use crate::senders::whatsapp::{self, WhatsAppSender, WhatsAppSettings};
use crate::senders::BoxSender;

/// One `[accounts.*]` table as written. Fields are checked against the sender afterwards,
/// so an unused one is reported with its line.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AccountSpec {
    sender: Spanned<String>,
    timeout: Option<Spanned<String>>,
    concurrency: Option<Spanned<i64>>,
    base_url: Option<Spanned<String>>,
    // webhook (plain URL or secret), wecom_robot (the full URL, key included: a secret).
    url: Option<Spanned<SecretRef>>,
    secret: Option<Spanned<SecretRef>>,
    // whatsapp_cloud
    phone_number_id: Option<Spanned<String>>,
    access_token: Option<Spanned<SecretRef>>,
    api_version: Option<Spanned<String>>,
    // wecom
    corp_id: Option<Spanned<String>>,
    corp_secret: Option<Spanned<SecretRef>>,
    agent_id: Option<Spanned<i64>>,
    message_type: Option<Spanned<String>>,
    duplicate_check_interval: Option<Spanned<DurationSpec>>,
    card_title: Option<Spanned<String>>,
    card_url: Option<Spanned<String>>,
    card_button: Option<Spanned<String>>,
    // wecom_robot
    webhook_key: Option<Spanned<SecretRef>>,
}

/// `"30m"` or a number of seconds.
#[derive(Deserialize)]
#[serde(untagged)]
enum DurationSpec {
    Seconds(i64),
    Text(String),
}

impl AccountSpec {
    /// Every optional setting present, by name, with its span.
    fn present(&self) -> Vec<(&'static str, Range<usize>)> {
        fn s<T>(
            name: &'static str,
            v: &Option<Spanned<T>>,
        ) -> Option<(&'static str, Range<usize>)> {
            v.as_ref().map(|v| (name, v.span()))
        }
        [
            s("base_url", &self.base_url),
            s("url", &self.url),
            s("secret", &self.secret),
            s("phone_number_id", &self.phone_number_id),
            s("access_token", &self.access_token),
            s("api_version", &self.api_version),
            s("corp_id", &self.corp_id),
            s("corp_secret", &self.corp_secret),
            s("agent_id", &self.agent_id),
            s("message_type", &self.message_type),
            s("duplicate_check_interval", &self.duplicate_check_interval),
            s("card_title", &self.card_title),
            s("card_url", &self.card_url),
            s("card_button", &self.card_button),
            s("webhook_key", &self.webhook_key),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

impl Builder<'_> {
    /// Builds the route of account `name`.
    pub(crate) fn account(
        &mut self,
        name: &str,
        spec: &Spanned<AccountSpec>,
    ) -> Result<Route, ConfigError> {
        let a = spec.get_ref();
        let what = format!("account {name}");
        let sender_name = a.sender.get_ref().as_str();
        let allowed: &[&str] = match sender_name {
            "log" | "noop" => &[],
            "webhook" => &["url", "secret"],
            "whatsapp_cloud" => &["base_url", "phone_number_id", "access_token", "api_version"],
            "wecom" => &[
                "base_url",
                "corp_id",
                "corp_secret",
                "agent_id",
                "message_type",
                "duplicate_check_interval",
                "card_title",
                "card_url",
                "card_button",
            ],
            "wecom_robot" => &["base_url", "webhook_key", "url", "message_type"],
            other => {
                return Err(self.invalid(
                    a.sender.span(),
                    format!(
                        "{what}: unknown sender {other:?} (expected \"whatsapp_cloud\", \"wecom\", \"wecom_robot\", \"webhook\", \"log\" or \"noop\")"
                    ),
                ))
            }
        };
        if let Some((field, span)) = a.present().into_iter().find(|(f, _)| !allowed.contains(f)) {
            return Err(self.invalid(
                span,
                format!("{what}: `{field}` is not used by the {sender_name} sender"),
            ));
        }
        let sender = match sender_name {
            "log" => LogSender::boxed(),
            // Succeeds silently: for benchmarks of accounts at their limits.
            "noop" => crate::senders::noop::NoopSender::boxed(),
            "webhook" => self.account_webhook(&what, spec)?,
            "whatsapp_cloud" => self.account_whatsapp(&what, spec)?,
            "wecom" => self.account_wecom(&what, spec)?,
            _ => self.account_robot(&what, spec)?,
        };
        let timeout = match &a.timeout {
            None => None,
            Some(t) => {
                let d = humantime::parse_duration(t.get_ref()).map_err(|e| {
                    self.invalid(
                        t.span(),
                        format!("{what}: bad timeout {:?}: {e}", t.get_ref()),
                    )
                })?;
                if d.is_zero() {
                    return Err(self.invalid(t.span(), format!("{what}: timeout must be positive")));
                }
                Some(d)
            }
        };
        let concurrency = match &a.concurrency {
            None => None,
            Some(c) => Some(
                usize::try_from(*c.get_ref())
                    .ok()
                    .filter(|n| (1..=1_000_000).contains(n))
                    .ok_or_else(|| {
                        self.invalid(
                            c.span(),
                            format!("{what}: concurrency must be between 1 and 1000000"),
                        )
                    })?,
            ),
        };
        Ok(Route {
            sender,
            timeout,
            concurrency,
        })
    }

    fn required<'s, T>(
        &self,
        what: &str,
        spec: &Spanned<AccountSpec>,
        field: &str,
        value: &'s Option<Spanned<T>>,
    ) -> Result<&'s Spanned<T>, ConfigError> {
        value.as_ref().ok_or_else(|| {
            self.invalid(
                spec.span(),
                format!(
                    "{what}: the {} sender needs `{field}`",
                    spec.get_ref().sender.get_ref()
                ),
            )
        })
    }

    fn secret(
        &self,
        what: &str,
        field: &str,
        r: &Spanned<SecretRef>,
    ) -> Result<Secret, ConfigError> {
        r.get_ref()
            .resolve(self.env)
            .map_err(|e| self.invalid(r.span(), format!("{what}: {field}: {e}")))
    }

    fn non_empty<'s>(
        &self,
        what: &str,
        field: &str,
        v: &'s Spanned<String>,
    ) -> Result<&'s str, ConfigError> {
        let s = v.get_ref().trim();
        if s.is_empty() {
            return Err(self.invalid(v.span(), format!("{what}: `{field}` must not be empty")));
        }
        Ok(s)
    }

    fn base_url(
        &self,
        what: &str,
        value: &Option<Spanned<String>>,
        default: &str,
    ) -> Result<reqwest::Url, ConfigError> {
        let (text, span) = match value {
            Some(v) => (v.get_ref().as_str(), Some(v.span())),
            None => (default, None),
        };
        reqwest::Url::parse(text)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && !u.cannot_be_a_base())
            .ok_or_else(|| {
                self.invalid(
                    span.unwrap_or(0..0),
                    format!("{what}: `base_url` must be an http or https URL, got {text:?}"),
                )
            })
    }

    fn message_type(
        &self,
        what: &str,
        value: &Option<Spanned<String>>,
    ) -> Result<MessageType, ConfigError> {
        match value {
            None => Ok(MessageType::default()),
            Some(v) => MessageType::parse(v.get_ref()).ok_or_else(|| {
                self.invalid(
                    v.span(),
                    format!(
                        "{what}: message_type must be \"text\", \"markdown\" or \"textcard\", got {:?}",
                        v.get_ref()
                    ),
                )
            }),
        }
    }

    fn account_webhook(
        &mut self,
        what: &str,
        spec: &Spanned<AccountSpec>,
    ) -> Result<BoxSender, ConfigError> {
        let a = spec.get_ref();
        let url_ref = self.required(what, spec, "url", &a.url)?;
        let url = self.secret(what, "url", url_ref)?;
        let parsed = reqwest::Url::parse(url.expose())
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            .ok_or_else(|| {
                self.invalid(
                    url_ref.span(),
                    format!("{what}: `url` must be an http or https URL"),
                )
            })?;
        let secret_ref = self.required(what, spec, "secret", &a.secret)?;
        let secret = self.secret(what, "secret", secret_ref)?;
        let key = SigningKey::from_secret(secret.expose())
            .map_err(|e| self.invalid(secret_ref.span(), format!("{what}: {e}")))?;
        let client = self.http_client()?;
        Ok(WebhookSender::new(client, parsed, key).boxed())
    }

    fn account_whatsapp(
        &mut self,
        what: &str,
        spec: &Spanned<AccountSpec>,
    ) -> Result<BoxSender, ConfigError> {
        let a = spec.get_ref();
        let phone = self.required(what, spec, "phone_number_id", &a.phone_number_id)?;
        let phone_number_id = self.non_empty(what, "phone_number_id", phone)?.to_owned();
        let token_ref = self.required(what, spec, "access_token", &a.access_token)?;
        let access_token = self.secret(what, "access_token", token_ref)?;
        let api_version = match &a.api_version {
            None => whatsapp::DEFAULT_API_VERSION.to_owned(),
            Some(v) => {
                let s = self.non_empty(what, "api_version", v)?;
                if !s.starts_with('v') || s.contains('/') {
                    return Err(self.invalid(
                        v.span(),
                        format!("{what}: api_version looks like \"v23.0\", got {s:?}"),
                    ));
                }
                s.to_owned()
            }
        };
        let base_url = self.base_url(what, &a.base_url, whatsapp::DEFAULT_BASE_URL)?;
        let client = self.http_client()?;
        let sender = WhatsAppSender::new(
            client,
            WhatsAppSettings {
                base_url,
                api_version,
                phone_number_id,
                access_token,
            },
        )
        .map_err(|e| self.invalid(spec.span(), format!("{what}: {e}")))?;
        Ok(sender.boxed())
    }

    fn account_wecom(
        &mut self,
        what: &str,
        spec: &Spanned<AccountSpec>,
    ) -> Result<BoxSender, ConfigError> {
        let a = spec.get_ref();
        let corp = self.required(what, spec, "corp_id", &a.corp_id)?;
        let corp_id = self.non_empty(what, "corp_id", corp)?.to_owned();
        let secret_ref = self.required(what, spec, "corp_secret", &a.corp_secret)?;
        let corp_secret = self.secret(what, "corp_secret", secret_ref)?;
        let agent = self.required(what, spec, "agent_id", &a.agent_id)?;
        if *agent.get_ref() <= 0 {
            return Err(self.invalid(
                agent.span(),
                format!("{what}: agent_id must be a positive integer"),
            ));
        }
        let message_type = self.message_type(what, &a.message_type)?;
        let duplicate_check_interval = match &a.duplicate_check_interval {
            None => None,
            Some(d) => {
                let parsed = match d.get_ref() {
                    DurationSpec::Seconds(s) => u64::try_from(*s).ok().map(Duration::from_secs),
                    DurationSpec::Text(t) => humantime::parse_duration(t).ok(),
                };
                Some(
                    parsed
                        .filter(|d| !d.is_zero() && *d <= MAX_DUPLICATE_CHECK_INTERVAL)
                        .ok_or_else(|| {
                            self.invalid(
                                d.span(),
                                format!("{what}: duplicate_check_interval must be between 1s and 4h (e.g. \"30m\" or 1800)"),
                            )
                        })?,
                )
            }
        };
        let card = CardDefaults {
            title: a.card_title.as_ref().map(|t| t.get_ref().clone()),
            url: a.card_url.as_ref().map(|t| t.get_ref().clone()),
            button: a.card_button.as_ref().map(|t| t.get_ref().clone()),
        };
        let base_url = self.base_url(what, &a.base_url, wecom::DEFAULT_BASE_URL)?;
        let client = self.http_client()?;
        let sender = WeComSender::new(
            client,
            WeComSettings {
                base_url,
                corp_id,
                corp_secret,
                agent_id: *agent.get_ref(),
                message_type,
                duplicate_check_interval,
                card,
                member_limits: default_member_limits(),
            },
        )
        .map_err(|e| self.invalid(spec.span(), format!("{what}: {e}")))?;
        Ok(sender.boxed())
    }

    fn account_robot(
        &mut self,
        what: &str,
        spec: &Spanned<AccountSpec>,
    ) -> Result<BoxSender, ConfigError> {
        let a = spec.get_ref();
        let endpoint = match (&a.webhook_key, &a.url) {
            (Some(key), None) => RobotEndpoint::Key {
                base_url: self.base_url(what, &a.base_url, wecom::DEFAULT_BASE_URL)?,
                key: self.secret(what, "webhook_key", key)?,
            },
            (None, Some(url)) => {
                if let Some(b) = &a.base_url {
                    return Err(self.invalid(
                        b.span(),
                        format!("{what}: `base_url` is not used with a full `url`"),
                    ));
                }
                RobotEndpoint::Url(self.secret(what, "url", url)?)
            }
            (Some(_), Some(url)) => {
                return Err(self.invalid(
                    url.span(),
                    format!("{what}: give `webhook_key` or `url`, not both"),
                ))
            }
            (None, None) => {
                return Err(self.invalid(
                    spec.span(),
                    format!("{what}: the wecom_robot sender needs `webhook_key` or `url`"),
                ))
            }
        };
        let message_type = self.message_type(what, &a.message_type)?;
        let span = a.url.as_ref().map(|u| u.span()).unwrap_or(spec.span());
        let client = self.http_client()?;
        let sender = RobotSender::new(
            client,
            RobotSettings {
                endpoint,
                message_type,
                limits: default_robot_limits(),
            },
        )
        .map_err(|e| self.invalid(span, format!("{what}: {e}")))?;
        Ok(sender.boxed())
    }
}
