//! The scheduler's configuration: flags with environment twins, documented in `--help`.

use std::path::PathBuf;
use std::time::Duration;

/// Most leases one claim statement grants, by default. A drain's fixed cost per claim (the
/// round trip, the statement's start, the due marks' probe) is paid half as often as at 512:
/// S1 drained 3 points of its baseline faster, and 2,048 no faster again (docs/performance.md).
pub const DEFAULT_CLAIM_BATCH: u32 = 1024;

/// Everything `herald-scheduler serve` needs. Every flag has an environment twin.
#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    /// PostgreSQL connection string, e.g. postgres://herald@db/herald.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// Address of the gRPC API and lease stream (use port 0 for any free port).
    #[arg(long, env = "HERALD_GRPC_ADDR", default_value = "0.0.0.0:7070")]
    pub grpc_addr: String,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "HERALD_HTTP_ADDR", default_value = "0.0.0.0:7071")]
    pub http_addr: String,
    /// Most database connections this replica opens.
    #[arg(long, env = "HERALD_DB_POOL_SIZE", default_value_t = 16)]
    pub db_pool_size: usize,
    /// How long a lease lasts unless the executor extends it.
    #[arg(long, env = "HERALD_LEASE_TTL", default_value = "30s", value_parser = humantime::parse_duration)]
    pub lease_ttl: Duration,
    /// How often idle executors send a heartbeat.
    #[arg(long, env = "HERALD_HEARTBEAT_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub heartbeat_interval: Duration,
    /// Most leases granted by one claim statement (an executor's credit bounds it too).
    #[arg(long, env = "HERALD_CLAIM_BATCH", default_value_t = DEFAULT_CLAIM_BATCH)]
    pub claim_batch: u32,
    /// How often each executor session walks the due index from its oldest entry for tasks
    /// whose rows another transaction held while a claim passed them: how late such a task can
    /// be. Walks made slow by a long-open transaction are spaced further apart.
    #[arg(long, env = "HERALD_STRAGGLER_PERIOD", default_value = "5s", value_parser = humantime::parse_duration)]
    pub straggler_period: Duration,
    /// How long idempotency keys are remembered after their task ends and is pruned.
    #[arg(long, env = "HERALD_IDEMPOTENCY_RETENTION", default_value = "7d", value_parser = humantime::parse_duration)]
    pub idempotency_retention: Duration,
    /// How long finished tasks and their attempts are kept before pruning.
    #[arg(long, env = "HERALD_TASK_RETENTION", default_value = "7d", value_parser = humantime::parse_duration)]
    pub task_retention: Duration,
    /// How often the pruning pass runs.
    #[arg(long, env = "HERALD_RETENTION_INTERVAL", default_value = "1m", value_parser = humantime::parse_duration)]
    pub retention_interval: Duration,
    /// How long a finished task stays in the hot table (where late delivery reports find it
    /// cheapest) before it moves, with its attempts, into the history.
    #[arg(long, env = "HERALD_HISTORY_AFTER", default_value = "10m", value_parser = humantime::parse_duration)]
    pub history_after: Duration,
    /// How wide, in end time, each history partition is: retention drops whole partitions, so
    /// a finished task is kept for the task retention plus up to this much.
    #[arg(long, env = "HERALD_HISTORY_PARTITION", default_value = "1d", value_parser = humantime::parse_duration)]
    pub history_partition: Duration,
    /// Hot tables (tasks, attempts, recipient marks) at least this many MiB on disk and mostly
    /// empty space, as a long-open transaction leaves them, are rewritten to give the space
    /// back (docs/operations.md, "Giving back space").
    #[arg(long, env = "HERALD_COMPACT_MIN_MIB", default_value_t = 512)]
    pub compact_min_mib: u64,
    /// The largest table, in MiB, the scheduler rewrites itself: a rewrite holds the table's
    /// claims, reports and creates for about 0.7 s per GiB. 0: never.
    #[arg(long, env = "HERALD_COMPACT_MAX_MIB", default_value_t = 4096)]
    pub compact_max_mib: u64,
    /// How often account in-flight counts are checked against the leases accounts hold (a
    /// backstop: every lease change keeps them equal in its own transaction).
    #[arg(long, env = "HERALD_RECONCILE_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    pub reconcile_interval: Duration,
    /// How often the successes and freed slots reports leave beside the account rows are
    /// folded into them: each fold locks those rows once, and the success rate and the
    /// adaptive rate's streak lag by up to this much (docs/accounts.md).
    #[arg(long, env = "HERALD_FOLD_INTERVAL", default_value = "200ms", value_parser = humantime::parse_duration)]
    pub fold_interval: Duration,

    /// How often the gauges read from the database (live tasks, account figures) are refreshed.
    #[arg(long, env = "HERALD_METRICS_REFRESH", default_value = "15s", value_parser = humantime::parse_duration)]
    pub metrics_refresh: Duration,

    /// How long a namespace seen without accounts keeps the one-statement claim before the
    /// accounts table is read again. Creating an account ends it at once on every replica; the
    /// expiry only bounds a notification lost while a listener reconnected.
    #[arg(long, env = "HERALD_NO_ACCOUNTS_TTL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub no_accounts_ttl: Duration,
    /// How long CancelTask waits for the executor holding a lease to confirm.
    #[arg(long, env = "HERALD_CANCEL_WAIT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub cancel_wait: Duration,
    /// Duplicate content windows per queue, as `queue=duration,...` (for example
    /// `alerts=10m`): a task of such a queue to a recipient who already has the same message
    /// due within the window ends CANCELLED with end reason DUPLICATE_CONTENT (a task's or
    /// campaign's own `duplicate_window` wins). Empty: none.
    #[arg(long, env = "HERALD_DUPLICATE_CONTENT_WINDOWS", default_value = "")]
    pub duplicate_content_windows: String,
    /// Tasks a bulk operation changes per transaction (StartBulkOperation): bounds each
    /// batch's locks and how much a restart repeats.
    #[arg(long, env = "HERALD_BULK_BATCH_SIZE", default_value_t = 500)]
    pub bulk_batch_size: u32,
    /// Pause between two batches of a bulk operation, leaving the database room for claims
    /// and reports while a large operation runs.
    #[arg(long, env = "HERALD_BULK_BATCH_PAUSE", default_value = "0s", value_parser = humantime::parse_duration)]
    pub bulk_batch_pause: Duration,
    /// How long a shutting-down replica waits for executors to move away before closing.
    #[arg(long, env = "HERALD_SHUTDOWN_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,
    /// This replica's name in logs and Welcome frames (default: a random one).
    #[arg(long, env = "HERALD_SCHEDULER_ID")]
    pub scheduler_id: Option<String>,
    /// Log format: text or json.
    #[arg(long, env = "HERALD_LOG_FORMAT", default_value = "text")]
    pub log_format: String,
    /// Operator notification webhook: receives task.failed, task.expired, account.offline,
    /// account.paused, schedule.run_overran and campaign.finished events (unset: no
    /// notifications are recorded or sent).
    #[arg(long, env = "HERALD_NOTIFY_URL")]
    pub notify_url: Option<String>,
    /// Signing secret for the notification webhook (`whsec_<base64>` or raw); unset: unsigned.
    #[arg(long, env = "HERALD_NOTIFY_SECRET", hide_env_values = true)]
    pub notify_secret: Option<String>,
    /// Signing secret for schedules' variables sources (`whsec_<base64>` or raw); unset:
    /// requests to sources are unsigned.
    #[arg(long, env = "HERALD_VARIABLES_SOURCE_SECRET", hide_env_values = true)]
    pub variables_source_secret: Option<String>,
    /// Let variables sources be on loopback, private and link-local addresses (a source inside
    /// the operator's network; without it a source must resolve to public addresses). Sources
    /// are https either way.
    #[arg(long, env = "HERALD_VARIABLES_SOURCE_ALLOW_PRIVATE")]
    pub variables_source_allow_private: bool,
    /// Non-public networks variables sources may reach, comma-separated CIDRs or addresses
    /// (e.g. `10.1.2.0/24`): narrower than HERALD_VARIABLES_SOURCE_ALLOW_PRIVATE.
    #[arg(
        long,
        env = "HERALD_VARIABLES_SOURCE_ALLOWED_NETWORKS",
        value_delimiter = ','
    )]
    pub variables_source_allowed_networks: Vec<String>,
    /// PEM CA certificates variables sources' https certificates may be signed by, beside the
    /// system's roots (a private CA of an internal source).
    #[arg(long, env = "HERALD_VARIABLES_SOURCE_CA_FILE")]
    pub variables_source_ca_file: Option<PathBuf>,
    /// PEM certificate chain of the gRPC port; with HERALD_TLS_KEY, turns TLS on.
    #[arg(long, env = "HERALD_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the gRPC port's certificate.
    #[arg(long, env = "HERALD_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA bundle for client certificates: turns on mutual TLS, required on the lease stream
    /// (executors) and accepted, not required, on the other services.
    #[arg(long, env = "HERALD_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// Serve gRPC without TLS (loopback and development only; without it the scheduler refuses
    /// to start unless HERALD_TLS_CERT/KEY are set).
    #[arg(long, env = "HERALD_ALLOW_PLAINTEXT")]
    pub allow_plaintext: bool,
    /// TOML file of token hashes with their roles, namespaces and rates (docs/security.md).
    #[arg(long, env = "HERALD_AUTH_TOKENS_FILE")]
    pub auth_tokens_file: Option<PathBuf>,
    /// Let requests without a token act with every role in every namespace (development only;
    /// without it the scheduler refuses to start unless HERALD_AUTH_TOKENS_FILE is set).
    #[arg(long, env = "HERALD_ALLOW_ANONYMOUS")]
    pub allow_anonymous: bool,
    /// Requests per second a token may make, unless its entry sets `rate`.
    #[arg(long, env = "HERALD_TOKEN_RATE", default_value_t = 200,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub token_rate: u32,
    /// Requests a token may make at once above its rate, unless its entry sets `burst`.
    #[arg(long, env = "HERALD_TOKEN_BURST", default_value_t = 400,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub token_burst: u32,
    /// Require an admin token on /metrics too (when tokens are configured, the dashboard and
    /// the console always require an admin or viewer token to read, and admin to act).
    #[arg(long, env = "HERALD_METRICS_AUTH")]
    pub metrics_auth: bool,
    /// Schedules whose fire times come closer than this are refused (INVALID_ARGUMENT).
    #[arg(long, env = "HERALD_MIN_SCHEDULE_PERIOD", default_value = "1m", value_parser = humantime::parse_duration)]
    pub min_schedule_period: Duration,
    /// Largest gRPC message accepted, in bytes; larger ones are refused before decoding.
    #[arg(long, env = "HERALD_MAX_MESSAGE_BYTES", default_value_t = 4 * 1024 * 1024,
          value_parser = clap::value_parser!(u32).range(1024..=(64 * 1024 * 1024)))]
    pub max_message_bytes: u32,
    /// Replies that opt their sender out (comma-separated; compared to the whole reply, trimmed,
    /// in any case): the sender goes on the namespace's suppression list.
    #[arg(
        long,
        env = "HERALD_OPT_OUT_KEYWORDS",
        value_delimiter = ',',
        default_value = "STOP,UNSUBSCRIBE,退订"
    )]
    pub opt_out_keywords: Vec<String>,
    /// How long a task whose WhatsApp lease ran out without a report (the executor may have
    /// crashed after Meta accepted the message), or whose send's answer was lost (timed out,
    /// connection broken after the request went), waits for a status callback naming it before
    /// it is sent again. A callback in that time ends it SUCCEEDED without a second message.
    #[arg(long, env = "HERALD_UNKNOWN_OUTCOME_GRACE", default_value = "2m", value_parser = humantime::parse_duration)]
    pub unknown_outcome_grace: Duration,
}

impl Config {
    /// A configuration with every default, for embedding the scheduler (tests, benchmarks).
    pub fn with_database(database_url: impl Into<String>) -> Self {
        Config {
            database_url: database_url.into(),
            grpc_addr: "127.0.0.1:0".into(),
            http_addr: "127.0.0.1:0".into(),
            db_pool_size: 16,
            lease_ttl: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(10),
            claim_batch: DEFAULT_CLAIM_BATCH,
            straggler_period: Duration::from_secs(5),
            idempotency_retention: Duration::from_secs(7 * 86_400),
            task_retention: Duration::from_secs(7 * 86_400),
            retention_interval: Duration::from_secs(60),
            history_after: Duration::from_secs(600),
            history_partition: Duration::from_secs(86_400),
            compact_min_mib: 512,
            compact_max_mib: 4096,
            reconcile_interval: Duration::from_secs(30),
            fold_interval: Duration::from_millis(200),
            no_accounts_ttl: Duration::from_secs(1),
            metrics_refresh: crate::telemetry::metrics::TASK_COUNT_INTERVAL,
            cancel_wait: Duration::from_secs(5),
            duplicate_content_windows: String::new(),
            bulk_batch_size: 500,
            bulk_batch_pause: Duration::ZERO,
            shutdown_grace: Duration::from_secs(10),
            scheduler_id: None,
            log_format: "text".into(),
            notify_url: None,
            notify_secret: None,
            variables_source_secret: None,
            variables_source_allow_private: false,
            variables_source_allowed_networks: Vec::new(),
            variables_source_ca_file: None,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            // Embedded schedulers (tests, benchmarks) listen on loopback.
            allow_plaintext: true,
            auth_tokens_file: None,
            allow_anonymous: true,
            token_rate: 200,
            token_burst: 400,
            metrics_auth: false,
            max_message_bytes: 4 * 1024 * 1024,
            min_schedule_period: Duration::from_secs(1),
            opt_out_keywords: crate::suppressions::DEFAULT_OPT_OUT_KEYWORDS
                .iter()
                .map(|k| k.to_string())
                .collect(),
            unknown_outcome_grace: Duration::from_secs(120),
        }
    }
}
