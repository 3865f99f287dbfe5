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
//! sender = "log"                     # or "noop": succeeds silently (benchmarks)
//!
//! [accounts.wa-main]                 # leases whose credentials_ref is "wa-main"
//! sender = "whatsapp_cloud"          # or "wecom", "wecom_robot", "webhook", "log"
//! phone_number_id = "106540352242922"
//! access_token = { env = "WA_TOKEN" }
//! ```
//!
//! Account tables are parsed in [`crate::accounts`]; docs/senders.md lists every setting.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::credentials::SecretRef;
use crate::senders::webhook::{http_client, SigningKey, WebhookSender};
use crate::senders::{layered, log::LogSender, noop::NoopSender, BoxSender, RouteLimits};

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
    /// Senders by account (`[accounts.<credentials_ref>]`), for leases naming an account.
    accounts: BTreeMap<String, Route>,
}

impl std::fmt::Debug for SenderRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SenderRoutes")
            .field("queues", &self.routes.keys().collect::<Vec<_>>())
            .field("default", &self.default.is_some())
            .field("accounts", &self.accounts.keys().collect::<Vec<_>>())
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

    /// Sends leases naming `credentials_ref` with `route`, whatever their queue.
    pub fn with_account(mut self, credentials_ref: &str, route: Route) -> Self {
        self.accounts.insert(credentials_ref.to_owned(), route);
        self
    }

    /// The accounts (credentials refs) this executor holds credentials for.
    pub fn accounts(&self) -> Vec<String> {
        self.accounts.keys().cloned().collect()
    }

    /// The route of one account, if configured.
    pub fn account(&self, credentials_ref: &str) -> Option<&Route> {
        self.accounts.get(credentials_ref)
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
        for (name, spec) in &file.accounts {
            if name.is_empty() {
                return Err(builder.invalid(spec.span(), "account name must not be empty".into()));
            }
            let route = builder.account(name, spec)?;
            routes = routes.with_account(name, route);
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
            accounts: self
                .accounts
                .into_iter()
                .map(|(a, r)| (a, build(r)))
                .collect(),
        }
    }
}

/// Routes with the executor's layers applied, ready to send.
#[derive(Clone)]
pub(crate) struct BuiltRoutes {
    routes: BTreeMap<String, BoxSender>,
    default: Option<BoxSender>,
    accounts: BTreeMap<String, BoxSender>,
}

impl BuiltRoutes {
    /// The sender for `queue`, if any.
    pub(crate) fn get(&self, queue: &str) -> Option<BoxSender> {
        self.routes.get(queue).or(self.default.as_ref()).cloned()
    }

    /// The sender of the account named `credentials_ref`, if this executor holds it.
    pub(crate) fn account(&self, credentials_ref: &str) -> Option<BoxSender> {
        self.accounts.get(credentials_ref).cloned()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    #[serde(default)]
    default: Option<Spanned<QueueSpec>>,
    #[serde(default)]
    queues: BTreeMap<String, Spanned<QueueSpec>>,
    #[serde(default)]
    accounts: BTreeMap<String, Spanned<crate::accounts::AccountSpec>>,
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

pub(crate) struct Builder<'a> {
    src: &'a str,
    origin: &'a str,
    pub(crate) env: &'a dyn Fn(&str) -> Option<String>,
    client: Option<reqwest::Client>,
}

impl Builder<'_> {
    /// The shared HTTP client of every sender built from the file (one connection pool).
    pub(crate) fn http_client(&mut self) -> Result<reqwest::Client, ConfigError> {
        match &self.client {
            Some(c) => Ok(c.clone()),
            None => {
                let c = http_client().map_err(ConfigError::HttpClient)?;
                self.client = Some(c.clone());
                Ok(c)
            }
        }
    }

    pub(crate) fn invalid(&self, span: Range<usize>, message: String) -> ConfigError {
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
        let sender = match q.sender.get_ref().as_str() {
            name @ ("log" | "noop") => {
                for (field, span) in [
                    ("url", q.url.as_ref().map(|u| u.span())),
                    ("secret", q.secret.as_ref().map(|s| s.span())),
                ] {
                    if let Some(span) = span {
                        return Err(self.invalid(
                            span,
                            format!("queue {queue}: `{field}` is not used by the {name} sender"),
                        ));
                    }
                }
                if name == "log" {
                    LogSender::boxed()
                } else {
                    NoopSender::boxed()
                }
            }
            "webhook" => self.webhook(queue, spec)?,
            other => {
                return Err(self.invalid(
                    q.sender.span(),
                    format!(
                        "queue {queue}: unknown sender {other:?} (expected \"log\", \"noop\" or \"webhook\")"
                    ),
                ))
            }
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
        let key = SigningKey::from_secret(secret.expose())
            .map_err(|e| self.invalid(secret_ref.span(), format!("queue {queue}: {e}")))?;
        let client = self.http_client()?;
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn parse(src: &str, vars: &[(&str, &str)]) -> Result<SenderRoutes, ConfigError> {
        SenderRoutes::from_toml(src, "executor.toml", &env(vars))
    }

    fn invalid_line(err: ConfigError) -> (usize, String) {
        match err {
            ConfigError::Invalid { line, message, .. } => (line, message),
            ConfigError::Syntax { line, message, .. } => (line, message),
            other => panic!("unexpected error {other:?}"),
        }
    }

    const GOOD: &str = r#"
[queues.default]
sender = "log"

[queues.hooks]
sender = "webhook"
url = "http://127.0.0.1:9000/hook"
secret = { env = "HOOK_SECRET" }
timeout = "10s"
concurrency = 64

[queues.literal]
sender = "webhook"
url = "https://example.com/hook"
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
"#;

    #[test]
    fn good_file() {
        let routes = parse(GOOD, &[("HOOK_SECRET", "s3cret")]).unwrap();
        assert_eq!(routes.queues(), vec!["default", "hooks", "literal"]);
        assert!(!routes.has_default());
        let hooks = &routes.routes["hooks"];
        assert_eq!(hooks.timeout, Some(Duration::from_secs(10)));
        assert_eq!(hooks.concurrency, Some(64));
        assert_eq!(routes.routes["default"].timeout, None);
    }

    #[test]
    fn default_table_routes_every_queue() {
        let routes = parse("[default]\nsender = \"log\"\n", &[]).unwrap();
        assert!(routes.has_default());
        assert!(routes.queues().is_empty());
        let built = routes.build(RouteLimits {
            timeout: Duration::from_secs(1),
            concurrency: 1,
        });
        assert!(built.get("anything").is_some());
        assert!(SenderRoutes::empty()
            .build(RouteLimits {
                timeout: Duration::from_secs(1),
                concurrency: 1
            })
            .get("anything")
            .is_none());
    }

    #[tokio::test]
    async fn noop_sender_succeeds_and_takes_no_url() {
        use tower::{Service, ServiceExt};

        let routes = parse("[default]\nsender = \"noop\"\n", &[]).unwrap();
        let mut sender = routes
            .build(RouteLimits {
                timeout: Duration::from_secs(1),
                concurrency: 1,
            })
            .get("q")
            .unwrap();
        let request = crate::senders::SendRequest {
            task_id: "t".into(),
            attempt: 1,
            queue: "q".into(),
            recipient: "r".into(),
            content: crate::senders::Content::Text("hi".into()),
            idempotency_key: "k".into(),
            labels: Default::default(),
            run_at: None,
            leased_at: None,
            attempts_before: 0,
            max_attempts: 1,
            account_id: String::new(),
            credentials_ref: String::new(),
        };
        let receipt = sender.ready().await.unwrap().call(request).await.unwrap();
        assert_eq!(receipt, crate::senders::SendReceipt::default());

        let err = parse("[default]\nsender = \"noop\"\nurl = \"http://x\"\n", &[])
            .err()
            .unwrap();
        let (line, message) = invalid_line(err);
        assert_eq!(line, 3);
        assert!(message.contains("not used by the noop sender"), "{message}");
    }

    #[test]
    fn secret_from_file() {
        let path = std::env::temp_dir().join(format!(
            "herald-executor-secret-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::write(&path, "from-a-file\n").unwrap();
        let src = format!(
            "[queues.q]\nsender = \"webhook\"\nurl = \"http://localhost/h\"\nsecret = {{ file = {:?} }}\n",
            path.display().to_string()
        );
        let resolved = SecretRef::File { file: path.clone() }
            .resolve(&env(&[]))
            .unwrap();
        assert_eq!(resolved.expose(), "from-a-file");
        assert!(parse(&src, &[]).is_ok());
        std::fs::remove_file(&path).unwrap();
        let (line, message) = invalid_line(parse(&src, &[]).unwrap_err());
        assert_eq!(line, 4);
        assert!(message.contains("cannot read secret file"), "{message}");
    }

    #[test]
    fn missing_env_secret_names_the_line_and_variable() {
        let (line, message) = invalid_line(parse(GOOD, &[]).unwrap_err());
        assert_eq!(line, 8);
        assert!(message.contains("HOOK_SECRET"), "{message}");
    }

    #[test]
    fn syntax_error_names_the_line() {
        let err = parse("[queues.a]\nsender = \"log\"\nurl = \n", &[]).unwrap_err();
        assert!(matches!(err, ConfigError::Syntax { line: 3, .. }), "{err}");
        assert!(err.to_string().starts_with("executor.toml:3:"), "{err}");
    }

    #[test]
    fn unknown_field_names_the_line() {
        let err = parse("[queues.a]\nsender = \"log\"\n\nsecrett = \"x\"\n", &[]).unwrap_err();
        let (line, message) = invalid_line(err);
        assert_eq!(line, 4);
        assert!(message.contains("secrett"), "{message}");
    }

    #[test]
    fn unknown_sender_names_the_line() {
        let err = parse("[queues.a]\n\nsender = \"carrier-pigeon\"\n", &[]).unwrap_err();
        assert!(err.to_string().starts_with("executor.toml:3: "), "{err}");
        assert!(err.to_string().contains("carrier-pigeon"), "{err}");
    }

    #[test]
    fn webhook_needs_url_and_secret() {
        let (_, message) = invalid_line(
            parse("[queues.a]\nsender = \"webhook\"\nsecret = \"x\"\n", &[]).unwrap_err(),
        );
        assert!(message.contains("needs `url`"), "{message}");
        let (line, message) = invalid_line(
            parse(
                "[queues.a]\nsender = \"webhook\"\nurl = \"ftp://x\"\nsecret = \"x\"\n",
                &[],
            )
            .unwrap_err(),
        );
        assert_eq!(line, 3);
        assert!(message.contains("http or https"), "{message}");
        let (_, message) = invalid_line(
            parse(
                "[queues.a]\nsender = \"webhook\"\nurl = \"http://x/\"\n",
                &[],
            )
            .unwrap_err(),
        );
        assert!(message.contains("needs `secret`"), "{message}");
    }

    #[test]
    fn bad_timeout_and_concurrency_name_the_line() {
        let (line, _) = invalid_line(
            parse("[queues.a]\nsender = \"log\"\ntimeout = \"soon\"\n", &[]).unwrap_err(),
        );
        assert_eq!(line, 3);
        let (line, _) = invalid_line(
            parse("[queues.a]\nsender = \"log\"\n\nconcurrency = 0\n", &[]).unwrap_err(),
        );
        assert_eq!(line, 4);
    }

    #[test]
    fn secrets_are_never_printed() {
        let literal = SecretRef::Literal("whsec_topsecret".into());
        assert!(!format!("{literal:?}").contains("topsecret"));
        let secret = literal.resolve(&env(&[])).unwrap();
        assert_eq!(format!("{secret:?} {secret}"), "[redacted] [redacted]");
        let err = parse(
            "[queues.a]\nsender = \"webhook\"\nurl = \"http://x/\"\nsecret = \"whsec_%%topsecret\"\n",
            &[],
        )
        .unwrap_err();
        assert!(!err.to_string().contains("topsecret"), "{err}");
    }

    #[test]
    fn missing_file_is_an_error() {
        let err = SenderRoutes::from_file(Path::new("/nonexistent/herald.toml")).unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }), "{err}");
    }
}
