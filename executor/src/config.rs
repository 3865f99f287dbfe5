//! The executor's command line; every flag has an environment twin.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::credentials::Secret;

/// herald-executor: leases due tasks from the herald scheduler, sends them with the configured
/// senders and reports each outcome.
#[derive(Clone, Debug, Parser)]
#[command(name = "herald-executor", version, about, long_about = None)]
pub struct Config {
    /// Scheduler gRPC endpoints, comma-separated; the executor connects to one at a time,
    /// round-robin on failure or Drain.
    #[arg(
        long = "scheduler",
        env = "HERALD_SCHEDULER",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:7070"
    )]
    pub schedulers: Vec<String>,

    /// TOML file mapping queues and sending accounts to senders (docs/senders.md). Absent:
    /// every queue uses the `log` sender and no account has one; `[accounts."*"]` in the file
    /// sends for any account without a table of its own.
    #[arg(long = "config", env = "HERALD_EXECUTOR_CONFIG")]
    pub config_file: Option<PathBuf>,

    /// Address of the HTTP listener (/healthz, /metrics).
    #[arg(long, env = "HERALD_HTTP_ADDR", default_value = "0.0.0.0:7072")]
    pub http_addr: SocketAddr,

    /// A stable, unique name for this process (1 to 128 characters). Default: executor-<pid>-<random>.
    #[arg(long, env = "HERALD_EXECUTOR_ID", default_value_t = default_executor_id())]
    pub executor_id: String,

    /// How many leases this executor holds at once (the credit it offers the scheduler).
    #[arg(long, env = "HERALD_MAX_IN_FLIGHT", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_in_flight: u32,

    /// Timeout of one send, unless its queue sets its own (e.g. `30s`, `1m`).
    #[arg(long, env = "HERALD_SEND_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub send_timeout: Duration,

    /// On shutdown, how long in-flight sends get to finish and be reported. Keep it above
    /// every send timeout: a send cut off by the grace goes unreported and is sent again once
    /// its lease lapses.
    #[arg(long, env = "HERALD_SHUTDOWN_GRACE", default_value = "35s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,

    /// Queues to ask for, comma-separated. Empty: every queue in the config file, or every
    /// queue when there is no file (or the file has a `[default]` sender).
    #[arg(long, env = "HERALD_QUEUES", value_delimiter = ',')]
    pub queues: Vec<String>,

    /// Serve from `http://` scheduler endpoints, without TLS (trusted networks only; without
    /// it, only `https://` endpoints are accepted).
    #[arg(long, env = "HERALD_ALLOW_PLAINTEXT")]
    pub allow_plaintext: bool,

    /// PEM CA bundle that signed the scheduler's certificate (default: the system's roots).
    #[arg(long, env = "HERALD_TLS_CA")]
    pub tls_ca: Option<PathBuf>,

    /// PEM client certificate for mutual TLS, with HERALD_TLS_KEY.
    #[arg(long, env = "HERALD_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of the client certificate.
    #[arg(long, env = "HERALD_TLS_KEY")]
    pub tls_key: Option<PathBuf>,

    /// Name to verify the scheduler's certificate against, when it differs from the
    /// endpoint's host.
    #[arg(long, env = "HERALD_TLS_DOMAIN")]
    pub tls_domain: Option<String>,

    /// File holding the bearer token (a token with the executor role).
    #[arg(long, env = "HERALD_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,

    /// The bearer token itself (prefer HERALD_AUTH_TOKEN_FILE: environments leak).
    #[arg(long, env = "HERALD_AUTH_TOKEN", hide_env_values = true, value_parser = parse_secret)]
    pub auth_token: Option<Secret>,

    /// The namespace to lease in (default: the token's first).
    #[arg(long, env = "HERALD_NAMESPACE")]
    pub namespace: Option<String>,

    /// Log format: text or json.
    #[arg(long, env = "HERALD_LOG_FORMAT", default_value = "text")]
    pub log_format: String,
}

fn parse_secret(value: &str) -> Result<Secret, String> {
    Ok(Secret::new(value))
}

impl Config {
    /// A config with every default, pointing at `schedulers`; for tests and embedding.
    /// Unlike parsing, this reads no environment variable.
    pub fn for_schedulers<I: IntoIterator<Item = S>, S: Into<String>>(schedulers: I) -> Self {
        Config {
            schedulers: schedulers.into_iter().map(Into::into).collect(),
            config_file: None,
            http_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            executor_id: default_executor_id(),
            max_in_flight: 256,
            send_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(35),
            queues: Vec::new(),
            allow_plaintext: true,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            tls_domain: None,
            auth_token_file: None,
            auth_token: None,
            namespace: None,
            log_format: "text".into(),
        }
    }

    /// The endpoints, trimmed, empty entries removed.
    pub fn endpoints(&self) -> Vec<String> {
        self.schedulers
            .iter()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect()
    }
}

/// `executor-<pid>-<6 random hex digits>`.
pub fn default_executor_id() -> String {
    format!(
        "executor-{}-{:06x}",
        std::process::id(),
        rand::random::<u32>() & 0xff_ffff
    )
}
