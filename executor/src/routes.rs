//! The config file that maps queues to senders, and [`SenderRoutes`], its in-memory form.
//!
//! ```toml
//! [queues.default]
//! sender = "log"
//!
//! [queues.hooks]
//! sender = "webhook"
//! url = "http://127.0.0.1:9000/hook"
//! secret = { env = "HOOK_SECRET" }   # or { file = "/path" }, or a literal "whsec_..."
//! timeout = "10s"                    # optional: per-send timeout for this queue
//! concurrency = 64                   # optional: sends at once on this queue
//!
//! [default]                          # optional: the sender for every other queue
//! sender = "log"
//! ```

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::credentials::SecretRef;
use crate::senders::webhook::{http_client, SigningKey, WebhookSender};
use crate::senders::{layered, log::LogSender, BoxSender, RouteLimits};

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
    /// The file is not valid TOML or does not have the expected shape.
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
    /// A value is well-formed TOML but not acceptable.
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
    #[error("cannot build the HTTP client for webhook senders: {0}")]
    HttpClient(#[source] reqwest::Error),
}

/// One queue's sender and its optional limits (the executor's defaults apply when absent).
#[derive(Clone)]
pub struct Route {
    /// The sender, before the executor's layers.
    pub sender: BoxSender,
    /// Per-send timeout for this route.
    pub timeout: Option<Duration>,
    /// Sends at once on this route.
    pub concurrency: Option<usize>,
}

impl Route {
    /// A route with the executor's default limits.
    pub fn new(sender: BoxSender) -> Self {
        Route {
            sender,
            timeout: None,
            concurrency: None,
        }
    }
}

/// Which sender handles which queue, plus an optional sender for any other queue.
#[derive(Clone, Default)]
pub struct SenderRoutes {
    routes: BTreeMap<String, Route>,
    default: Option<Route>,
}

impl std::fmt::Debug for SenderRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SenderRoutes")
            .field("queues", &self.routes.keys().collect::<Vec<_>>())
            .field("default", &self.default.is_some())
            .finish()
    }
}

impl SenderRoutes {
    /// No routes at all: every lease is reported PERMANENT until senders are added.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Every queue goes to the `log` sender.
    pub fn log_only() -> Self {
        Self::default().with_default(LogSender::boxed())
    }

    /// Routes `queue` to `sender` (with the executor's default limits).
    pub fn with_sender(self, queue: &str, sender: BoxSender) -> Self {
        self.with_route(queue, Route::new(sender))
    }

    /// Routes `queue` to `route`.
    pub fn with_route(mut self, queue: &str, route: Route) -> Self {
        self.routes.insert(queue.to_owned(), route);
        self
    }

    /// Sends every queue without its own route to `sender`.
    pub fn with_default(mut self, sender: BoxSender) -> Self {
        self.default = Some(Route::new(sender));
        self
    }

    /// The queues with their own route.
    pub fn queues(&self) -> Vec<String> {
        self.routes.keys().cloned().collect()
    }

    /// Whether there is a sender for queues without their own route.
    pub fn has_default(&self) -> bool {
        self.default.is_some()
    }

    /// Reads a config file, resolving `{ env = ... }` secrets from the process environment.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        Self::from_file_with_env(path, &|name| std::env::var(name).ok())
    }

    /// Reads a config file, resolving `{ env = ... }` secrets with `env`.
    pub fn from_file_with_env(
        path: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let src = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml(&src, &path.display().to_string(), env)
    }

    /// Parses config file text; `origin` names it in errors.
    pub fn from_toml(
        src: &str,
        origin: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let file: FileSpec = toml::from_str(src).map_err(|e| {
            let (line, column) = e
                .span()
                .map(|span| line_col(src, span.start))
                .unwrap_or((1, 1));
            ConfigError::Syntax {
                origin: origin.to_owned(),
                line,
                column,
                message: e.message().trim().to_owned(),
            }
        })?;
        let mut builder = Builder {
            src,
            origin,
            env,
            client: None,
        };
        let mut routes = SenderRoutes::empty();
        for (queue, spec) in &file.queues {
            if queue.is_empty() {
                return Err(builder.invalid(spec.span(), "queue name must not be empty".into()));
            }
            let route = builder.route(queue, spec)?;
            routes = routes.with_route(queue, route);
        }
        if let Some(spec) = &file.default {
            routes.default = Some(builder.route("[default]", spec)?);
        }
        Ok(routes)
    }

    /// Applies the executor's layers to every route.
    pub(crate) fn build(self, defaults: RouteLimits) -> BuiltRoutes {
        let build = |route: Route| {
            layered(
                route.sender,
                RouteLimits {
                    timeout: route.timeout.unwrap_or(defaults.timeout),
                    concurrency: route.concurrency.unwrap_or(defaults.concurrency),
                },
            )
        };
        BuiltRoutes {
            routes: self
                .routes
                .into_iter()
                .map(|(q, r)| (q, build(r)))
                .collect(),
            default: self.default.map(build),
        }
    }
}

/// Routes with the executor's layers applied, ready to send.
#[derive(Clone)]
pub(crate) struct BuiltRoutes {
    routes: BTreeMap<String, BoxSender>,
    default: Option<BoxSender>,
}

impl BuiltRoutes {
    /// The sender for `queue`, if any.
    pub(crate) fn get(&self, queue: &str) -> Option<BoxSender> {
        self.routes.get(queue).or(self.default.as_ref()).cloned()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    #[serde(default)]
    default: Option<Spanned<QueueSpec>>,
    #[serde(default)]
    queues: BTreeMap<String, Spanned<QueueSpec>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QueueSpec {
    sender: Spanned<String>,
    url: Option<Spanned<String>>,
    secret: Option<Spanned<SecretRef>>,
    timeout: Option<Spanned<String>>,
    concurrency: Option<Spanned<i64>>,
}

struct Builder<'a> {
    src: &'a str,
    origin: &'a str,
    env: &'a dyn Fn(&str) -> Option<String>,
    client: Option<reqwest::Client>,
}

impl Builder<'_> {
    fn invalid(&self, span: Range<usize>, message: String) -> ConfigError {
        ConfigError::Invalid {
            origin: self.origin.to_owned(),
            line: line_col(self.src, span.start).0,
            message,
        }
    }

    fn route(&mut self, queue: &str, spec: &Spanned<QueueSpec>) -> Result<Route, ConfigError> {
        let q = spec.get_ref();
        let timeout = match &q.timeout {
            None => None,
            Some(t) => Some(humantime::parse_duration(t.get_ref()).map_err(|e| {
                self.invalid(
                    t.span(),
                    format!("queue {queue}: bad timeout {:?}: {e}", t.get_ref()),
                )
            })?),
        };
        if timeout == Some(Duration::ZERO) {
            let span = q.timeout.as_ref().map(|t| t.span()).unwrap_or(spec.span());
            return Err(self.invalid(span, format!("queue {queue}: timeout must be positive")));
        }
        let concurrency = match &q.concurrency {
            None => None,
            Some(c) if *c.get_ref() >= 1 && *c.get_ref() <= 1_000_000 => {
                usize::try_from(*c.get_ref()).ok()
            }
            Some(c) => {
                return Err(self.invalid(
                    c.span(),
                    format!("queue {queue}: concurrency must be between 1 and 1000000"),
                ))
            }
        };
        let sender =
            match q.sender.get_ref().as_str() {
                "log" => {
                    for (name, span) in [
                        ("url", q.url.as_ref().map(|u| u.span())),
                        ("secret", q.secret.as_ref().map(|s| s.span())),
                    ] {
                        if let Some(span) = span {
                            return Err(self.invalid(
                                span,
                                format!("queue {queue}: `{name}` is not used by the log sender"),
                            ));
                        }
                    }
                    LogSender::boxed()
                }
                "webhook" => self.webhook(queue, spec)?,
                other => return Err(self.invalid(
                    q.sender.span(),
                    format!(
                        "queue {queue}: unknown sender {other:?} (expected \"log\" or \"webhook\")"
                    ),
                )),
            };
        Ok(Route {
            sender,
            timeout,
            concurrency,
        })
    }

    fn webhook(
        &mut self,
        queue: &str,
        spec: &Spanned<QueueSpec>,
    ) -> Result<BoxSender, ConfigError> {
        let q = spec.get_ref();
        let url = q.url.as_ref().ok_or_else(|| {
            self.invalid(
                spec.span(),
                format!("queue {queue}: webhook sender needs `url`"),
            )
        })?;
        let parsed = reqwest::Url::parse(url.get_ref())
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            .ok_or_else(|| {
                self.invalid(
                    url.span(),
                    format!(
                        "queue {queue}: `url` must be an http or https URL, got {:?}",
                        url.get_ref()
                    ),
                )
            })?;
        let secret_ref = q.secret.as_ref().ok_or_else(|| {
            self.invalid(
                spec.span(),
                format!("queue {queue}: webhook sender needs `secret`"),
            )
        })?;
        let secret = secret_ref
            .get_ref()
            .resolve(self.env)
            .map_err(|e| self.invalid(secret_ref.span(), format!("queue {queue}: secret: {e}")))?;
        let key = SigningKey::from_secret(&secret)
            .map_err(|e| self.invalid(secret_ref.span(), format!("queue {queue}: {e}")))?;
        let client = match &self.client {
            Some(c) => c.clone(),
            None => {
                let c = http_client().map_err(ConfigError::HttpClient)?;
                self.client = Some(c.clone());
                c
            }
        };
        Ok(WebhookSender::new(client, parsed, key).boxed())
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
