//! Wiring: builds the store, applies migrations, starts the background jobs and both
//! listeners, and runs the ordered shutdown. [`run`] is the sequence; each step is a function
//! of its own: [`background`] jobs, the [`grpc`] server and its services, [`health`].

pub(crate) mod background;
mod grpc;
mod health;

use std::future::Future;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::auth::http_admin::HttpAuth;
use crate::auth::layer::AuthPolicy;
use crate::auth::rate::{DefaultRate, TokenRates};
use crate::auth::tokens::TokenSet;
use crate::config::Config;
use crate::lease::events::{Event, Followers};
use crate::lease::registry::Registry;
use crate::lease::session::SessionContext;
use crate::lease::LeaseSettings;
use crate::schedule::source::Sources;
use crate::store::{migrate, ConnectError, Store, StoreError};
use crate::tasks::Tasks;

/// The two listeners, bound before `run` so callers know the addresses (port 0 works).
pub struct Listeners {
    /// gRPC API and lease stream.
    pub grpc: TcpListener,
    /// /healthz, /readyz, /metrics.
    pub http: TcpListener,
}

impl Listeners {
    /// Binds both addresses of `config`.
    pub async fn bind(config: &Config) -> std::io::Result<Self> {
        Ok(Listeners {
            grpc: TcpListener::bind(&config.grpc_addr).await?,
            http: TcpListener::bind(&config.http_addr).await?,
        })
    }
}

/// Why the scheduler stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// DATABASE_URL or the pool is unusable.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// Migrations could not be applied.
    #[error("cannot apply migrations: {0}")]
    Migrate(#[source] StoreError),
    /// The reflection service could not be built.
    #[error("cannot build the reflection service: {0}")]
    Reflection(String),
    /// The gRPC server failed.
    #[error("gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    /// The HTTP server failed.
    #[error("HTTP server failed: {0}")]
    Http(#[source] std::io::Error),
    /// HERALD_NOTIFY_URL or HERALD_NOTIFY_SECRET is unusable.
    #[error("invalid notification webhook settings: {0}")]
    Notify(String),
    /// The TLS settings are unusable, or plaintext was not allowed.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// HERALD_VARIABLES_SOURCE_SECRET is unusable.
    #[error("invalid variables source settings: {0}")]
    Sources(String),
    /// The tokens file is unusable, or anonymous access was not allowed.
    #[error("{0}")]
    Auth(String),
    /// HERALD_DUPLICATE_CONTENT_WINDOWS does not parse.
    #[error("invalid HERALD_DUPLICATE_CONTENT_WINDOWS: {0}")]
    DuplicateWindows(String),
    /// The history partition width does not fit the task retention.
    #[error("invalid retention settings: {0}")]
    Retention(String),
}

/// What the running parts of a replica share.
struct Replica {
    store: Store,
    events: broadcast::Sender<Event>,
    registry: Registry,
    tasks: Tasks,
    /// What the event listener keeps current (clock skew, namespaces without accounts).
    followers: Followers,
    /// How schedules' variables sources are reached.
    sources: Sources,
    /// Stops the background jobs, last.
    background: CancellationToken,
    /// Tells lease sessions to drain.
    drain: CancellationToken,
    /// Stops both servers.
    server_stop: CancellationToken,
}

impl Replica {
    /// The schedules service as both the gRPC API and the console use it: this replica's
    /// store, clock, variables-source policy and duplicate windows.
    fn schedules(&self, min_period: std::time::Duration) -> crate::schedule::Schedules {
        crate::schedule::Schedules::new(
            self.store.clone(),
            self.followers.clock.clone(),
            min_period,
        )
        .source_policy(self.sources.policy().clone())
        .duplicate_windows(self.tasks.duplicate_windows().clone())
    }
}

/// Runs the scheduler until `shutdown` resolves, then drains executors and stops in order.
/// `on_ready` is called once migrations are applied and both listeners serve.
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_ready: impl FnOnce() + Send,
) -> Result<(), ServeError> {
    crate::telemetry::metrics::install();
    // Refuse an unsafe configuration before touching the database.
    let tls = crate::tls::server_tls(&config)?;
    let auth = Arc::new(auth_policy(&config)?);
    let notifier = crate::telemetry::notify::from_config(&config).map_err(ServeError::Notify)?;
    let duplicate_windows =
        crate::tasks::duplicates::DuplicateWindows::parse(&config.duplicate_content_windows)
            .map_err(ServeError::DuplicateWindows)?;
    crate::retention::Retention::of(&config)
        .check()
        .map_err(ServeError::Retention)?;
    let (source_policy, source_roots) =
        crate::schedule::source::address_policy(&config).map_err(ServeError::Sources)?;
    let sources = Sources::new(
        config.variables_source_secret.as_deref(),
        source_policy,
        source_roots,
    )
    .map_err(ServeError::Sources)?;
    let store = Store::connect(&config.database_url, config.db_pool_size)?;
    migrate_with_retry(&store).await?;

    let scheduler_id = config.scheduler_id.clone().unwrap_or_else(|| {
        format!(
            "scheduler-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        )
    });
    let (events, _) = broadcast::channel::<Event>(4096);
    let followers = Followers::new(config.no_accounts_ttl);
    let replica = Replica {
        tasks: Tasks::new(
            store.clone(),
            events.clone(),
            config.cancel_wait,
            followers.clock.clone(),
        )
        .with_duplicate_windows(duplicate_windows),
        followers,
        sources,
        store,
        events,
        registry: Registry::default(),
        background: CancellationToken::new(),
        drain: CancellationToken::new(),
        server_stop: CancellationToken::new(),
    };
    let mut jobs = background::start(&replica, &config, notifier);
    let (health, health_service) = health::Health::start(&replica.store).await;
    let sessions = SessionContext {
        store: replica.store.clone(),
        settings: Arc::new(LeaseSettings {
            lease_ttl: config.lease_ttl,
            heartbeat_interval: config.heartbeat_interval,
            claim_batch: config.claim_batch.max(1),
            straggler_period: config.straggler_period,
            scheduler_id: scheduler_id.clone(),
            opt_out_keywords: config.opt_out_keywords.clone(),
            unknown_outcome_grace: config.unknown_outcome_grace,
        }),
        events: replica.events.clone(),
        registry: replica.registry.clone(),
        drain: replica.drain.clone(),
        database: health.database(),
        no_accounts: replica.followers.no_accounts.clone(),
    };
    let grpc = grpc::serve(
        &replica,
        &config,
        listeners.grpc,
        tls,
        auth.clone(),
        sessions,
        health_service,
    )?;
    let readiness = crate::http::Readiness {
        draining: replica.drain.clone(),
        database: health.database(),
    };
    let http = serve_http(&replica, &config, listeners.http, auth, readiness);

    tracing::info!(scheduler_id = %scheduler_id, "scheduler serving");
    on_ready();
    shutdown.await;
    let result = stop(&replica, &config, health, grpc, http).await;
    replica.background.cancel();
    while jobs.join_next().await.is_some() {}
    replica.store.close();
    tracing::info!("scheduler stopped");
    result
}

/// Serves /healthz, /readyz, /metrics and the dashboard until the servers stop.
fn serve_http(
    replica: &Replica,
    config: &Config,
    listener: TcpListener,
    auth: Arc<AuthPolicy>,
    readiness: crate::http::Readiness,
) -> tokio::task::JoinHandle<std::io::Result<()>> {
    let stop = replica.server_stop.clone();
    let console = crate::http::console::Console::new(
        replica.tasks.clone(),
        replica.schedules(config.min_schedule_period),
    );
    let router = crate::http::router(
        replica.tasks.clone(),
        console,
        HttpAuth {
            policy: auth,
            protect_metrics: config.metrics_auth,
        },
        readiness,
    );
    tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
    })
}

/// The ordered shutdown: refuse new work, tell executors to move, give them the grace period
/// to report and reconnect elsewhere, then stop serving.
async fn stop(
    replica: &Replica,
    config: &Config,
    health: health::Health,
    grpc: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    http: tokio::task::JoinHandle<std::io::Result<()>>,
) -> Result<(), ServeError> {
    tracing::info!("shutting down: draining executors");
    health.shut_down().await;
    replica.drain.cancel();
    let grace = tokio::time::Instant::now() + config.shutdown_grace;
    while !replica.registry.is_empty() && tokio::time::Instant::now() < grace {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    replica.server_stop.cancel();
    let result = match tokio::time::timeout_at(grace + Duration::from_secs(1), grpc).await {
        Ok(Ok(r)) => r.map_err(ServeError::from),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "gRPC server task failed");
            Ok(())
        }
        Err(_) => {
            tracing::warn!("gRPC connections still open after the grace period; closing");
            Ok(())
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), http).await;
    result
}

/// The auth policy of `config`: its tokens and rates, or a refusal to run without any.
fn auth_policy(config: &Config) -> Result<AuthPolicy, ServeError> {
    let tokens = match &config.auth_tokens_file {
        Some(path) if config.allow_anonymous => {
            // Allowed (a development set-up trying tokens out), but easy to ship by mistake:
            // the tokens then restrict only those who present one.
            tracing::warn!(
                "HERALD_ALLOW_ANONYMOUS=true with a tokens file: a request without a token \
                 still acts with every role in every namespace"
            );
            TokenSet::load(path).map_err(|e| ServeError::Auth(e.to_string()))?
        }
        Some(path) => TokenSet::load(path).map_err(|e| ServeError::Auth(e.to_string()))?,
        None if config.allow_anonymous => TokenSet::default(),
        None => {
            return Err(ServeError::Auth(
                "refusing to serve without authentication: set HERALD_AUTH_TOKENS_FILE, or \
                 HERALD_ALLOW_ANONYMOUS=true for development"
                    .into(),
            ))
        }
    };
    let nonzero = |v: u32| NonZeroU32::new(v).unwrap_or(NonZeroU32::MIN);
    let rates = TokenRates::new(
        &tokens,
        DefaultRate {
            per_second: nonzero(config.token_rate),
            burst: nonzero(config.token_burst),
        },
    );
    Ok(AuthPolicy {
        tokens,
        allow_anonymous: config.allow_anonymous,
        rates,
        executor_cert_required: config.tls_client_ca.is_some(),
    })
}

/// Applies migrations, retrying while the database is starting up.
async fn migrate_with_retry(store: &Store) -> Result<(), ServeError> {
    let mut delay = Duration::from_millis(200);
    let mut tries = 0;
    loop {
        match migrate::run(store).await {
            Ok(applied) => {
                if applied > 0 {
                    tracing::info!(applied, "migrations applied");
                }
                return Ok(());
            }
            Err(e) if e.is_unavailable() && tries < 20 => {
                tracing::warn!(error = %e, "database not reachable yet; retrying migrations");
                tries += 1;
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(3));
            }
            Err(e) => return Err(ServeError::Migrate(e)),
        }
    }
}
