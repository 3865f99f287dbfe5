//! What every sender kind's config table shares: the errors (each naming the file and line),
//! the [`BuildContext`] a kind builds its sender with (secrets, URLs, the shared HTTP client),
//! and [`parse_settings`], which reads a table's settings into a kind's own struct.
//!
//! Each kind's settings are a struct in its own module with `#[serde(deny_unknown_fields)]`
//! and `toml::Spanned` fields, so a misspelt or misplaced setting, a missing one and a bad
//! value all point at their line without hand-written checks.

use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::{DeserializeOwned, IntoDeserializer as _};
use serde::Deserialize;
use toml::Spanned;

use super::BoxSender;
use crate::credentials::{Secret, SecretRef};

/// A bad config file. Messages name the file and the line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML.
    #[error("{origin}:{line}:{column}: {message}")]
    Syntax {
        /// The file's name.
        origin: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// A table or value is well-formed TOML but not acceptable.
    #[error("{origin}:{line}: {message}")]
    Invalid {
        /// The file's name.
        origin: String,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The shared HTTP client could not be built.
    #[error("cannot build the HTTP client for the senders: {0}")]
    HttpClient(#[source] reqwest::Error),
}

/// The text of a config file and its name, to turn byte spans into `file:line` errors.
#[derive(Clone, Copy)]
pub(crate) struct Source<'a> {
    /// The file's contents.
    pub(crate) text: &'a str,
    /// The file's name in messages.
    pub(crate) origin: &'a str,
}

impl Source<'_> {
    /// An error at the line where `span` starts.
    pub(crate) fn invalid(&self, span: Range<usize>, message: String) -> ConfigError {
        ConfigError::Invalid {
            origin: self.origin.to_owned(),
            line: line_col(self.text, span.start).0,
            message,
        }
    }

    /// A TOML syntax error at `span`.
    pub(crate) fn syntax(&self, span: Option<Range<usize>>, message: &str) -> ConfigError {
        let (line, column) = span.map_or((1, 1), |s| line_col(self.text, s.start));
        ConfigError::Syntax {
            origin: self.origin.to_owned(),
            line,
            column,
            message: message.trim().to_owned(),
        }
    }
}

/// The 1-based line and column of a byte offset.
fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(src.len());
    let before = src.get(..offset).unwrap_or(src);
    let line = before.matches('\n').count() + 1;
    let column = before.rfind('\n').map_or(offset, |nl| offset - nl - 1) + 1;
    (line, column)
}

/// What building one table's sender needs: where errors point, the environment that
/// `{ env = "..." }` secrets come from, and the HTTP client all senders of a file share.
pub(crate) struct BuildContext<'a> {
    source: Source<'a>,
    env: &'a dyn Fn(&str) -> Option<String>,
    client: Option<reqwest::Client>,
    /// The media fetcher of the file's `[media]` table, or the public-only default.
    media: Option<super::media::MediaFetcher>,
    /// The table in messages: `account wa-main`, `queue hooks`, `[default]`.
    what: String,
    /// The table's own span, for errors about the table as a whole (a missing setting).
    table: Range<usize>,
}

impl<'a> BuildContext<'a> {
    /// A context for the tables of one file.
    pub(crate) fn new(source: Source<'a>, env: &'a dyn Fn(&str) -> Option<String>) -> Self {
        BuildContext {
            source,
            env,
            client: None,
            media: None,
            what: String::new(),
            table: 0..0,
        }
    }

    /// Points the context at the table named `what` at `span`.
    pub(crate) fn enter(&mut self, what: String, span: Range<usize>) {
        self.what = what;
        self.table = span;
    }

    /// The span of the table being built.
    pub(crate) fn table_span(&self) -> Range<usize> {
        self.table.clone()
    }

    /// An error at the line of `span`, prefixed with the table's name.
    pub(crate) fn invalid(
        &self,
        span: Range<usize>,
        message: impl std::fmt::Display,
    ) -> ConfigError {
        self.source
            .invalid(span, format!("{}: {message}", self.what))
    }

    /// An error about the table as a whole, at its first line.
    pub(crate) fn invalid_table(&self, message: impl std::fmt::Display) -> ConfigError {
        self.invalid(self.table.clone(), message)
    }

    /// Sets the media fetcher built from the file's `[media]` table.
    pub(crate) fn set_media(&mut self, media: super::media::MediaFetcher) {
        self.media = Some(media);
    }

    /// The media fetcher every sender of the file shares: the `[media]` table's, or one that
    /// reaches public addresses only.
    pub(crate) fn media(&mut self) -> Result<super::media::MediaFetcher, ConfigError> {
        match &self.media {
            Some(m) => Ok(m.clone()),
            None => {
                let m =
                    super::media::MediaFetcher::public_only().map_err(|e| self.invalid_table(e))?;
                self.media = Some(m.clone());
                Ok(m)
            }
        }
    }

    /// The shared HTTP client of every sender built from the file (one connection pool).
    pub(crate) fn http_client(&mut self) -> Result<reqwest::Client, ConfigError> {
        match &self.client {
            Some(c) => Ok(c.clone()),
            None => {
                let c = super::http::client().map_err(ConfigError::HttpClient)?;
                self.client = Some(c.clone());
                Ok(c)
            }
        }
    }

    /// Reads the secret of setting `field`.
    pub(crate) fn secret(
        &self,
        field: &str,
        r: &Spanned<SecretRef>,
    ) -> Result<Secret, ConfigError> {
        r.get_ref()
            .resolve(self.env)
            .map_err(|e| self.invalid(r.span(), format!("{field}: {e}")))
    }

    /// The trimmed text of setting `field`, which must not be empty.
    pub(crate) fn non_empty<'s>(
        &self,
        field: &str,
        v: &'s Spanned<String>,
    ) -> Result<&'s str, ConfigError> {
        let s = v.get_ref().trim();
        if s.is_empty() {
            return Err(self.invalid(v.span(), format!("`{field}` must not be empty")));
        }
        Ok(s)
    }

    /// The `base_url` setting, or `default` when absent: an http(s) URL that can take a path.
    pub(crate) fn base_url(
        &self,
        value: &Option<Spanned<String>>,
        default: &str,
    ) -> Result<reqwest::Url, ConfigError> {
        let (text, span) = match value {
            Some(v) => (v.get_ref().as_str(), v.span()),
            None => (default, self.table.clone()),
        };
        reqwest::Url::parse(text)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && !u.cannot_be_a_base())
            .ok_or_else(|| {
                self.invalid(
                    span,
                    format!("`base_url` must be an http or https URL, got {text:?}"),
                )
            })
    }

    /// Setting `field` as an http(s) URL. The URL may be a secret, so it is not printed.
    pub(crate) fn secret_url(
        &self,
        field: &str,
        r: &Spanned<SecretRef>,
    ) -> Result<(Secret, reqwest::Url), ConfigError> {
        let secret = self.secret(field, r)?;
        let url = reqwest::Url::parse(secret.expose())
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            .ok_or_else(|| {
                self.invalid(r.span(), format!("`{field}` must be an http or https URL"))
            })?;
        Ok((secret, url))
    }
}

/// A length of time as written in a config file: `"30m"` or a number of seconds.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum DurationSpec {
    /// Whole seconds.
    Seconds(i64),
    /// Human-readable, e.g. `"90s"`, `"30m"`.
    Text(String),
}

impl DurationSpec {
    /// The duration, or None when it is negative or unreadable.
    pub(crate) fn to_duration(&self) -> Option<Duration> {
        match self {
            DurationSpec::Seconds(s) => u64::try_from(*s).ok().map(Duration::from_secs),
            DurationSpec::Text(t) => humantime::parse_duration(t).ok(),
        }
    }
}

/// What a sender kind's settings struct implements: check the settings and build the sender.
pub(crate) trait BuildSender: DeserializeOwned {
    /// Builds the sender, reporting bad values with their line through `cx`.
    fn build(self, cx: &mut BuildContext<'_>) -> Result<BoxSender, ConfigError>;
}

/// Reads `T`, one kind's settings, from the table's settings (`sender`, `timeout` and
/// `concurrency` already taken out). `kind` names the sender in messages.
pub(crate) fn parse_settings<T: DeserializeOwned>(
    cx: &BuildContext<'_>,
    kind: &str,
    settings: toml_edit::InlineTable,
) -> Result<T, ConfigError> {
    parse_table(cx, &format!("{kind} sender"), settings)
}

/// Reads `T` from a table's settings; `label` prefixes the messages (`webhook sender`).
pub(crate) fn parse_table<T: DeserializeOwned>(
    cx: &BuildContext<'_>,
    label: &str,
    settings: toml_edit::InlineTable,
) -> Result<T, ConfigError> {
    T::deserialize(toml_edit::Value::InlineTable(settings).into_deserializer()).map_err(|e| {
        let span = e.span().unwrap_or_else(|| cx.table.clone());
        cx.invalid(span, format!("{label}: {}", e.message().trim()))
    })
}

/// A table of the file as an inline table (`[name]` and `name = { ... }` alike).
pub(crate) fn inline_table(
    cx: &BuildContext<'_>,
    item: &toml_edit::Item,
) -> Result<toml_edit::InlineTable, ConfigError> {
    match item {
        toml_edit::Item::Table(t) => Ok(t.clone().into_inline_table()),
        toml_edit::Item::Value(toml_edit::Value::InlineTable(t)) => Ok(t.clone()),
        _ => Err(cx.invalid_table("must be a table")),
    }
}
