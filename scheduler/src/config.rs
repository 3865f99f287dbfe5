//! The scheduler's configuration: flags with environment twins, documented in `--help`.

use std::time::Duration;

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
    /// Most leases granted by one claim statement.
    #[arg(long, env = "HERALD_CLAIM_BATCH", default_value_t = 512)]
    pub claim_batch: u32,
    /// How long idempotency keys are remembered after their task ends and is pruned.
    #[arg(long, env = "HERALD_IDEMPOTENCY_RETENTION", default_value = "7d", value_parser = humantime::parse_duration)]
    pub idempotency_retention: Duration,
    /// How long finished tasks and their attempts are kept before pruning.
    #[arg(long, env = "HERALD_TASK_RETENTION", default_value = "7d", value_parser = humantime::parse_duration)]
    pub task_retention: Duration,
    /// How often the pruning pass runs.
    #[arg(long, env = "HERALD_RETENTION_INTERVAL", default_value = "1m", value_parser = humantime::parse_duration)]
    pub retention_interval: Duration,
    /// How long CancelTask waits for the executor holding a lease to confirm.
    #[arg(long, env = "HERALD_CANCEL_WAIT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub cancel_wait: Duration,
    /// How long a shutting-down replica waits for executors to move away before closing.
    #[arg(long, env = "HERALD_SHUTDOWN_GRACE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,
    /// This replica's name in logs and Welcome frames (default: a random one).
    #[arg(long, env = "HERALD_SCHEDULER_ID")]
    pub scheduler_id: Option<String>,
    /// Log format: text or json.
    #[arg(long, env = "HERALD_LOG_FORMAT", default_value = "text")]
    pub log_format: String,
    /// Operator notification webhook: receives task.failed, task.expired and account.offline
    /// events (unset: no notifications are recorded or sent).
    #[arg(long, env = "HERALD_NOTIFY_URL")]
    pub notify_url: Option<String>,
    /// Signing secret for the notification webhook (`whsec_<base64>` or raw); unset: unsigned.
    #[arg(long, env = "HERALD_NOTIFY_SECRET", hide_env_values = true)]
    pub notify_secret: Option<String>,
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
            claim_batch: 512,
            idempotency_retention: Duration::from_secs(7 * 86_400),
            task_retention: Duration::from_secs(7 * 86_400),
            retention_interval: Duration::from_secs(60),
            cancel_wait: Duration::from_secs(5),
            shutdown_grace: Duration::from_secs(10),
            scheduler_id: None,
            log_format: "text".into(),
            notify_url: None,
            notify_secret: None,
        }
    }
}
