//! The executor's config file, which maps work to senders, and [`SenderRoutes`], its
//! in-memory form.
//!
//! ```toml
//! [queues.default]                   # leases without an account, by queue
//! sender = "log"
//!
//! [queues.hooks]
//! sender = "webhook"
//! url = "http://127.0.0.1:9000/hook"
//! secret = { env = "HOOK_SECRET" }   # or { file = "/path" }, or a literal "whsec_..."
//! timeout = "10s"                    # optional: per-send timeout for this table's sender
//! concurrency = 64                   # optional: sends at once through it
//!
//! [default]                          # optional: the sender for every other queue
//! sender = "log"
//!
//! [accounts.wa-main]                 # leases whose credentials_ref is "wa-main"
//! sender = "whatsapp_cloud"
//! phone_number_id = "106540352242922"
//! access_token = { env = "WA_TOKEN" }
//!
//! [accounts."*"]                     # optional: every account without its own table
//! sender = "log"
//!
//! [media]                            # optional: fetching media links (senders::media)
//! allowed_networks = ["10.1.2.0/24"] # non-public networks fetches may reach (none by default)
//!
//! [whatsapp_webhook]                 # optional: Meta's status callbacks (crate::callbacks)
//! listen = "0.0.0.0:7073"
//! verify_token = { env = "WA_VERIFY_TOKEN" }
//! app_secret = { env = "WA_APP_SECRET" }
//! ```
//!
//! Every table has the same shape: `sender` names a kind (`herald_proto::SenderKind`), the
//! optional `timeout` and `concurrency` apply to any kind, and the rest are that kind's
//! settings, read by the kind's own module (see [`crate::senders::SenderConfig`]).
//! docs/senders.md lists every setting.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use herald_proto::SenderKind;

use crate::callbacks::whatsapp::ConfiguredNumber;
use crate::callbacks::WhatsAppWebhook;
pub use crate::senders::config::ConfigError;
use crate::senders::config::{inline_table, parse_table, BuildContext, Source};
use crate::senders::log::LogSender;
use crate::senders::media::MediaConfig;
use crate::senders::whatsapp::WhatsAppNumber;
use crate::senders::{layered, BoxSender, RouteLimits, Sender, SenderConfig};

/// The name of the catch-all account table, `[accounts."*"]`: it sends for every
/// credentials_ref that has no table of its own.
pub const ANY_ACCOUNT: &str = "*";

/// One table's sender and its optional limits (the executor's defaults apply when absent).
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

/// Which sender handles which queue and which account, plus optional catch-alls for any other
/// queue and any other account.
#[derive(Clone, Default)]
pub struct SenderRoutes {
    routes: BTreeMap<String, Route>,
    default: Option<Route>,
    /// Senders by account (`[accounts.<credentials_ref>]`), for leases naming an account.
    accounts: BTreeMap<String, Route>,
    /// `[accounts."*"]`: the sender of every account without its own table.
    any_account: Option<Route>,
    /// `[whatsapp_webhook]`: where Meta's webhooks are received.
    whatsapp_webhook: Option<WhatsAppWebhook>,
    /// The `whatsapp_cloud` account tables' numbers, for the webhook to map events to accounts.
    whatsapp_numbers: Vec<ConfiguredNumber>,
}

impl std::fmt::Debug for SenderRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SenderRoutes")
            .field("queues", &self.routes.keys().collect::<Vec<_>>())
            .field("default", &self.default.is_some())
            .field("accounts", &self.accounts.keys().collect::<Vec<_>>())
            .field("any_account", &self.any_account.is_some())
            .field("whatsapp_webhook", &self.whatsapp_webhook.is_some())
            .finish()
    }
}

impl SenderRoutes {
    /// No routes at all: every lease is reported PERMANENT until senders are added.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Every queue goes to the `log` sender (accounts have no sender).
    pub fn log_only() -> Self {
        Self::default().with_default(LogSender.boxed())
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

    /// Sends leases naming `credentials_ref` with `route`, whatever their queue;
    /// [`ANY_ACCOUNT`] makes `route` the sender of every account without its own.
    pub fn with_account(mut self, credentials_ref: &str, route: Route) -> Self {
        if credentials_ref == ANY_ACCOUNT {
            self.any_account = Some(route);
        } else {
            self.accounts.insert(credentials_ref.to_owned(), route);
        }
        self
    }

    /// The accounts (credentials refs) with a table of their own; not the catch-all.
    pub fn accounts(&self) -> Vec<String> {
        self.accounts.keys().cloned().collect()
    }

    /// The route of one account, if configured (its own table, else the catch-all).
    pub fn account(&self, credentials_ref: &str) -> Option<&Route> {
        self.accounts
            .get(credentials_ref)
            .or(self.any_account.as_ref())
    }

    /// Whether `[accounts."*"]` sends for every account without its own table.
    pub fn sends_for_any_account(&self) -> bool {
        self.any_account.is_some()
    }

    /// What this executor announces in `Hello.credentials_refs`: its account tables, or
    /// nothing with a catch-all account, which the scheduler reads as "any account".
    pub fn announced_credentials_refs(&self) -> Vec<String> {
        if self.sends_for_any_account() {
            Vec::new()
        } else {
            self.accounts()
        }
    }

    /// Whether there is an account table of any kind (named or catch-all).
    pub fn has_accounts(&self) -> bool {
        !self.accounts.is_empty() || self.any_account.is_some()
    }

    /// The `[whatsapp_webhook]` table, when the file has one.
    pub fn whatsapp_webhook(&self) -> Option<&WhatsAppWebhook> {
        self.whatsapp_webhook.as_ref()
    }

    /// The WhatsApp numbers of the account tables (not the catch-all's, which has no name).
    pub fn whatsapp_numbers(&self) -> &[ConfiguredNumber] {
        &self.whatsapp_numbers
    }

    /// The queues with their own route.
    pub fn queues(&self) -> Vec<String> {
        self.routes.keys().cloned().collect()
    }

    /// The longest per-send timeout a route of the file sets (routes without one use the
    /// executor's `HERALD_SEND_TIMEOUT`).
    pub fn longest_timeout(&self) -> Option<Duration> {
        self.routes
            .values()
            .chain(self.accounts.values())
            .chain(self.default.iter())
            .chain(self.any_account.iter())
            .filter_map(|r| r.timeout)
            .max()
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
        let source = Source { text: src, origin };
        let doc =
            toml_edit::ImDocument::parse(src).map_err(|e| source.syntax(e.span(), e.message()))?;
        let mut cx = BuildContext::new(source, env);
        let mut routes = SenderRoutes::empty();
        let root = doc.as_table();
        // `[media]` first: the senders built below share its fetcher, wherever it sits.
        if let Some(item) = root.get("media") {
            cx.enter("[media]".into(), item_span(root, "media", item));
            let table = inline_table(&cx, item)?;
            let media: MediaConfig = parse_table(&cx, "media settings", table)?;
            let fetcher = media.build(&cx)?;
            cx.set_media(fetcher);
        }
        for (key, item) in root.iter() {
            let span = item_span(root, key, item);
            match key {
                "default" => {
                    routes.default = Some(route(&mut cx, "[default]".into(), span, item)?.0)
                }
                "media" => {}
                "whatsapp_webhook" => {
                    cx.enter("[whatsapp_webhook]".into(), span);
                    let table = inline_table(&cx, item)?;
                    routes.whatsapp_webhook = Some(WhatsAppWebhook::parse(&cx, table)?);
                }
                "queues" | "accounts" => {
                    let tables = item.as_table_like().ok_or_else(|| {
                        source.invalid(span.clone(), format!("`{key}` must hold tables"))
                    })?;
                    for (name, table) in tables.iter() {
                        let span = item_span(tables, name, table);
                        if name.is_empty() {
                            return Err(source.invalid(span, format!("{key} name must not be empty")));
                        }
                        if key == "queues" {
                            let (route, _) = route(&mut cx, format!("queue {name}"), span, table)?;
                            routes = routes.with_route(name, route);
                        } else {
                            let what = if name == ANY_ACCOUNT {
                                "account \"*\" (any account)".to_owned()
                            } else {
                                format!("account {name}")
                            };
                            let (route, number) = route(&mut cx, what, span, table)?;
                            if let Some(number) = number.filter(|_| name != ANY_ACCOUNT) {
                                routes.whatsapp_numbers.push(ConfiguredNumber {
                                    credentials_ref: name.to_owned(),
                                    number,
                                });
                            }
                            routes = routes.with_account(name, route);
                        }
                    }
                }
                other => {
                    return Err(source.invalid(
                        span,
                        format!(
                            "unknown key `{other}`: the file holds `[default]`, `[queues.NAME]`, `[accounts.NAME]`, `[media]` and `[whatsapp_webhook]` tables"
                        ),
                    ))
                }
            }
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
            any_account: self.any_account.map(build),
        }
    }
}

/// Routes with the executor's layers applied, ready to send.
#[derive(Clone)]
pub(crate) struct BuiltRoutes {
    routes: BTreeMap<String, BoxSender>,
    default: Option<BoxSender>,
    accounts: BTreeMap<String, BoxSender>,
    any_account: Option<BoxSender>,
}

impl BuiltRoutes {
    /// The sender for `queue`, if any.
    pub(crate) fn get(&self, queue: &str) -> Option<BoxSender> {
        self.routes.get(queue).or(self.default.as_ref()).cloned()
    }

    /// The sender of the account named `credentials_ref`: its own table's, else the catch-all's.
    pub(crate) fn account(&self, credentials_ref: &str) -> Option<BoxSender> {
        self.accounts
            .get(credentials_ref)
            .or(self.any_account.as_ref())
            .cloned()
    }
}

/// Where `item`, the value of `key` in `table`, starts: its own span, else its key's.
fn item_span(table: &dyn toml_edit::TableLike, key: &str, item: &toml_edit::Item) -> Range<usize> {
    item.span()
        .or_else(|| table.key(key).and_then(toml_edit::Key::span))
        .unwrap_or(0..0)
}

/// Builds one table's route: `sender` picks the kind from the registry, `timeout` and
/// `concurrency` are read here, and the rest goes to the kind's settings. A `whatsapp_cloud`
/// table also gives its number's identity in webhooks.
fn route(
    cx: &mut BuildContext<'_>,
    what: String,
    span: Range<usize>,
    item: &toml_edit::Item,
) -> Result<(Route, Option<WhatsAppNumber>), ConfigError> {
    cx.enter(what, span);
    let mut settings = inline_table(cx, item)?;
    let kind = match settings.remove("sender") {
        None => {
            return Err(cx.invalid_table(format!(
                "`sender` is missing (one of {})",
                SenderKind::expected()
            )))
        }
        Some(v) => {
            let span = v.span().unwrap_or_else(|| cx.table_span());
            v.as_str().and_then(SenderKind::parse).ok_or_else(|| {
                cx.invalid(
                    span,
                    format!(
                        "unknown sender {} (expected one of {})",
                        v.to_string().trim(),
                        SenderKind::expected()
                    ),
                )
            })?
        }
    };
    let timeout = match settings.remove("timeout") {
        None => None,
        Some(v) => {
            let span = v.span().unwrap_or_else(|| cx.table_span());
            let text = v.as_str().unwrap_or_default();
            let d = humantime::parse_duration(text).map_err(|e| {
                cx.invalid(
                    span.clone(),
                    format!("bad timeout {}: {e}", v.to_string().trim()),
                )
            })?;
            if d.is_zero() {
                return Err(cx.invalid(span, "timeout must be positive"));
            }
            Some(d)
        }
    };
    let concurrency = match settings.remove("concurrency") {
        None => None,
        Some(v) => {
            let span = v.span().unwrap_or_else(|| cx.table_span());
            Some(
                v.as_integer()
                    .and_then(|n| usize::try_from(n).ok())
                    .filter(|n| (1..=1_000_000).contains(n))
                    .ok_or_else(|| cx.invalid(span, "concurrency must be between 1 and 1000000"))?,
            )
        }
    };
    let config = SenderConfig::parse(cx, kind, settings)?;
    let number = config.whatsapp_number();
    let sender = config.build(cx)?;
    Ok((
        Route {
            sender,
            timeout,
            concurrency,
        },
        number,
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::credentials::SecretRef;

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

    /// A first attempt of task `t` on queue `q`, for the account `credentials_ref` (empty:
    /// routed by queue).
    fn send_request(credentials_ref: &str) -> crate::senders::SendRequest {
        crate::senders::SendRequest {
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
            account_id: credentials_ref.into(),
            credentials_ref: credentials_ref.into(),
            window_closed_fallback: None,
        }
    }

    /// The line and message of the error that `src` (no environment) is refused with.
    fn error_of(src: &str) -> (usize, String) {
        invalid_line(parse(src, &[]).unwrap_err())
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
        let receipt = sender
            .ready()
            .await
            .unwrap()
            .call(send_request(""))
            .await
            .unwrap();
        assert_eq!(receipt, crate::senders::SendReceipt::default());

        let err = parse("[default]\nsender = \"noop\"\nurl = \"http://x\"\n", &[])
            .err()
            .unwrap();
        let (line, message) = invalid_line(err);
        assert_eq!(line, 3);
        assert!(
            message.contains("[default]: noop sender: unknown field `url`"),
            "{message}"
        );
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
        let (line, message) = error_of(&src);
        assert_eq!(line, 4);
        assert!(message.contains("cannot read secret file"), "{message}");
    }

    #[test]
    fn missing_env_secret_names_the_line_and_variable() {
        let (line, message) = error_of(GOOD);
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
        let (_, message) = error_of("[queues.a]\nsender = \"webhook\"\nsecret = \"x\"\n");
        assert!(
            message.contains("webhook sender: missing field `url`"),
            "{message}"
        );
        let (line, message) =
            error_of("[queues.a]\nsender = \"webhook\"\nurl = \"ftp://x\"\nsecret = \"x\"\n");
        assert_eq!(line, 3);
        assert!(message.contains("http or https"), "{message}");
        let (_, message) = error_of("[queues.a]\nsender = \"webhook\"\nurl = \"http://x/\"\n");
        assert!(
            message.contains("webhook sender: missing field `secret`"),
            "{message}"
        );
    }

    #[test]
    fn bad_timeout_and_concurrency_name_the_line() {
        let (line, _) = error_of("[queues.a]\nsender = \"log\"\ntimeout = \"soon\"\n");
        assert_eq!(line, 3);
        let (line, _) = error_of("[queues.a]\nsender = \"log\"\n\nconcurrency = 0\n");
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
    fn catch_all_account_sends_for_accounts_without_a_table() {
        let src = "[accounts.\"*\"]\nsender = \"log\"\n\n[accounts.hook]\nsender = \"webhook\"\nurl = \"http://127.0.0.1:9/h\"\nsecret = \"s\"\n";
        let routes = parse(src, &[]).unwrap();
        assert!(routes.sends_for_any_account());
        assert_eq!(routes.accounts(), ["hook"]);
        // Announcing no credentials refs is how an executor says "any account".
        assert!(routes.announced_credentials_refs().is_empty());
        assert!(routes.account("wa-1").is_some());
        let built = routes.build(RouteLimits {
            timeout: Duration::from_secs(1),
            concurrency: 1,
        });
        assert!(built.account("wa-1").is_some());
        assert!(built.account("hook").is_some());
        assert!(
            built.get("some-queue").is_none(),
            "accounts do not route queues"
        );

        let named = parse("[accounts.wa]\nsender = \"noop\"\n", &[]).unwrap();
        assert!(!named.sends_for_any_account());
        assert_eq!(named.announced_credentials_refs(), ["wa"]);
        assert!(named.account("other").is_none());
    }

    /// script/server's executor config: every queue and every account go to `log`.
    #[test]
    fn script_servers_config_sends_every_queue_and_account() {
        let src = include_str!("../../script/lib/server-executor.toml");
        let routes = parse(src, &[]).unwrap();
        assert!(routes.has_default());
        assert!(routes.sends_for_any_account());
        assert!(routes.announced_credentials_refs().is_empty());
    }

    #[tokio::test]
    async fn catch_all_account_uses_its_own_sender_and_named_tables_win() {
        use tower::ServiceExt;

        let src = "[accounts.\"*\"]\nsender = \"log\"\n[accounts.hook]\nsender = \"webhook\"\nurl = \"http://127.0.0.1:9/h\"\nsecret = \"s\"\n";
        let built = parse(src, &[]).unwrap().build(RouteLimits {
            timeout: Duration::from_secs(5),
            concurrency: 1,
        });
        let sent = built
            .account("wa-1")
            .unwrap()
            .oneshot(send_request("wa-1"))
            .await;
        assert_eq!(sent, Ok(crate::senders::SendReceipt::default()));
        // Port 9 refuses: the named webhook table, not the catch-all, handled it.
        let err = built
            .account("hook")
            .unwrap()
            .oneshot(send_request("hook"))
            .await
            .unwrap_err();
        assert!(err.message.starts_with("webhook "), "{}", err.message);
    }

    #[test]
    fn a_table_without_sender_and_unknown_top_level_keys_name_the_line() {
        let (line, message) = error_of("\n[accounts.a]\ntimeout = \"1s\"\n");
        assert_eq!(line, 2);
        assert!(
            message.contains("account a: `sender` is missing (one of \"whatsapp_cloud\""),
            "{message}"
        );
        let (line, message) =
            error_of("[default]\nsender = \"log\"\n[queue.a]\nsender = \"log\"\n");
        assert_eq!(line, 3);
        assert!(message.contains("unknown key `queue`"), "{message}");
        let (line, message) = error_of("[default]\nsender = 3\n");
        assert_eq!(line, 2);
        assert!(message.contains("unknown sender 3"), "{message}");
    }

    #[test]
    fn every_kind_is_accepted_in_queue_tables_too() {
        let routes = parse(
            "[queues.wa]\nsender = \"whatsapp_cloud\"\nphone_number_id = \"1\"\naccess_token = \"t\"\n\n[queues.silent]\nsender = \"noop\"\nconcurrency = 8\n",
            &[],
        )
        .unwrap();
        assert_eq!(routes.queues(), ["silent", "wa"]);
        assert_eq!(routes.routes["silent"].concurrency, Some(8));
    }

    #[test]
    fn whatsapp_webhook_table_and_the_numbers_it_maps() {
        let src = "[accounts.wa]\nsender = \"whatsapp_cloud\"\nphone_number_id = \"1065\"\n\
                   access_token = \"t\"\nwaba_id = \"W1\"\ndisplay_phone_number = \"+1 555 0100\"\n\n\
                   [whatsapp_webhook]\nlisten = \"127.0.0.1:0\"\nverify_token = \"v\"\n\
                   app_secret = { env = \"APP_SECRET\" }\n";
        let routes = parse(src, &[("APP_SECRET", "s3cret-app")]).unwrap();
        let webhook = routes.whatsapp_webhook().unwrap();
        assert_eq!(webhook.path, crate::callbacks::DEFAULT_PATH);
        assert_eq!(webhook.app_secret.expose(), "s3cret-app");
        assert!(!format!("{routes:?} {webhook:?}").contains("s3cret"));
        let numbers = routes.whatsapp_numbers();
        assert_eq!(numbers.len(), 1);
        assert_eq!(numbers[0].credentials_ref, "wa");
        assert_eq!(numbers[0].number.phone_number_id, "1065");
        assert_eq!(numbers[0].number.waba_id.as_deref(), Some("W1"));
        assert_eq!(
            numbers[0].number.display_phone_number.as_deref(),
            Some("15550100")
        );

        let (line, message) = error_of(
            "[whatsapp_webhook]\nlisten = \"nowhere\"\nverify_token = \"v\"\napp_secret = \"s\"\n",
        );
        assert_eq!(line, 2);
        assert!(message.contains("`listen` must be an address"), "{message}");
        let (_, message) =
            error_of("[whatsapp_webhook]\nlisten = \"127.0.0.1:0\"\nverify_token = \"v\"\n");
        assert!(
            message.contains("[whatsapp_webhook]: whatsapp_webhook: missing field `app_secret`"),
            "{message}"
        );
        let (line, message) = error_of(
            "[whatsapp_webhook]\nlisten = \"127.0.0.1:0\"\nverify_token = \"v\"\napp_secret = { env = \"NOPE\" }\n",
        );
        assert_eq!(line, 4);
        assert!(message.contains("NOPE"), "{message}");
        let (line, message) = error_of(
            "[whatsapp_webhook]\nlisten = \"127.0.0.1:0\"\npath = \"hook\"\nverify_token = \"v\"\napp_secret = \"s\"\n",
        );
        assert_eq!(line, 3);
        assert!(message.contains("`path` must start with /"), "{message}");
    }

    #[test]
    fn missing_file_is_an_error() {
        let err = SenderRoutes::from_file(Path::new("/nonexistent/herald.toml")).unwrap_err();
        assert!(matches!(err, ConfigError::Read { .. }), "{err}");
    }
}
