//! Wiring: builds the store, applies migrations, starts the background jobs and both
//! listeners, and runs the ordered shutdown.

use std::future::Future;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use herald_proto::v1::account_service_server::AccountServiceServer;
use herald_proto::v1::campaign_service_server::CampaignServiceServer;
use herald_proto::v1::lease_service_server::LeaseServiceServer;
use herald_proto::v1::schedule_service_server::ScheduleServiceServer;
use herald_proto::v1::stats_service_server::StatsServiceServer;
use herald_proto::v1::task_service_server::TaskServiceServer;
use herald_proto::v1::template_service_server::TemplateServiceServer;
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::api::accounts::AccountApi;
use crate::api::lease::LeaseApi;
use crate::api::stats::StatsApi;
use crate::api::tasks::TaskApi;
use crate::api::templates::TemplateApi;
use crate::auth::http_admin::HttpAuth;
use crate::auth::layer::{AuthLayer, AuthPolicy};
use crate::auth::rate::{DefaultRate, TokenRates};
use crate::auth::tokens::TokenSet;
use crate::config::Config;
use crate::lease::events::{self, Event};
use crate::lease::registry::Registry;
use crate::lease::session::SessionContext;
use crate::lease::{sweeper, LeaseSettings};
use crate::store::{migrate, ConnectError, Store, StoreError};

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
    /// The tokens file is unusable, or anonymous access was not allowed.
    #[error("{0}")]
    Auth(String),
}

/// The auth policy of `config`: its tokens and rates, or a refusal to run without any.
fn auth_policy(config: &Config) -> Result<AuthPolicy, ServeError> {
    let tokens = match &config.auth_tokens_file {
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
    let store = Store::connect(&config.database_url, config.db_pool_size)?;
    migrate_with_retry(&store).await?;

    let scheduler_id = config.scheduler_id.clone().unwrap_or_else(|| {
        format!(
            "scheduler-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        )
    });
    let settings = Arc::new(LeaseSettings {
        lease_ttl: config.lease_ttl,
        heartbeat_interval: config.heartbeat_interval,
        claim_batch: config.claim_batch.max(1),
        scheduler_id: scheduler_id.clone(),
    });
    let (events_tx, _) = broadcast::channel::<Event>(4096);
    let registry = Registry::default();
    let background = CancellationToken::new();
    let drain = CancellationToken::new();
    let server_stop = CancellationToken::new();

    let mut jobs = tokio::task::JoinSet::new();
    jobs.spawn(events::listen(
        store.pg_config().clone(),
        events_tx.clone(),
        background.clone(),
    ));
    jobs.spawn(route_revokes(
        events_tx.subscribe(),
        registry.clone(),
        background.clone(),
    ));
    jobs.spawn(sweeper::run(
        store.clone(),
        config.lease_ttl.min(Duration::from_secs(1)),
        background.clone(),
    ));
    jobs.spawn(crate::telemetry::metrics::refresh_task_counts(
        store.clone(),
        background.clone(),
    ));
    if let Some(notifier) = notifier {
        jobs.spawn(crate::telemetry::notify::run(
            store.clone(),
            notifier,
            background.clone(),
        ));
    }
    jobs.spawn(crate::schedule::materializer::run(
        store.clone(),
        background.clone(),
    ));
    jobs.spawn(crate::retention::run(
        store.clone(),
        config.task_retention,
        config.idempotency_retention,
        config.retention_interval,
        background.clone(),
    ));

    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<TaskServiceServer<TaskApi>>().await;
    health.set_serving::<LeaseServiceServer<LeaseApi>>().await;
    health.set_serving::<StatsServiceServer<StatsApi>>().await;
    health
        .set_serving::<AccountServiceServer<AccountApi>>()
        .await;
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    // From here on health follows the database: NOT_SERVING while it is unreachable.
    let db_watch = crate::db_watch::DbWatch::spawn(store.pg_config().clone(), health.clone());
    let reflection_builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(herald_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection = reflection_builder()
        .build_v1()
        .map_err(|e| ServeError::Reflection(e.to_string()))?;
    // Many grpcurl and IDE builds still ask the v1alpha reflection service only.
    let reflection_alpha = reflection_builder()
        .build_v1alpha()
        .map_err(|e| ServeError::Reflection(e.to_string()))?;

    let tasks = Arc::new(TaskApi::new(
        store.clone(),
        events_tx.clone(),
        config.cancel_wait,
    ));
    let lease = LeaseApi::new(SessionContext {
        store: store.clone(),
        settings,
        events: events_tx.clone(),
        registry: registry.clone(),
        drain: drain.clone(),
        database: db_watch.reachable(),
    });

    let grpc_stop = server_stop.clone();
    // Lease and report frames are small and latency-bound: without TCP_NODELAY, Nagle's
    // algorithm holds them back for tens of milliseconds (measured in the benchmark's S3).
    let incoming = TcpListenerStream::new(listeners.grpc).map(|conn| {
        if let Ok(stream) = &conn {
            let _ = stream.set_nodelay(true);
        }
        conn
    });
    let max_message = config.max_message_bytes as usize;
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    let grpc = builder
        // Dead executors are noticed by HTTP/2 pings, not only by lease expiry.
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        // Bounds unary handlers; a streaming response is returned at once, so the lease stream
        // itself is not cut by it.
        .timeout(Duration::from_secs(60))
        .layer(AuthLayer::shared(auth.clone()))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_alpha)
        .add_service(
            TaskServiceServer::from_arc(tasks.clone()).max_decoding_message_size(max_message),
        )
        .add_service(
            TemplateServiceServer::new(TemplateApi::new(store.clone(), tasks.clone()))
                .max_decoding_message_size(max_message),
        )
        .add_service(
            AccountServiceServer::new(AccountApi::new(store.clone()))
                .max_decoding_message_size(max_message),
        )
        .add_service(
            ScheduleServiceServer::new(crate::api::schedules::ScheduleApi::new(
                store.clone(),
                config.min_schedule_period,
            ))
            .max_decoding_message_size(max_message),
        )
        .add_service(
            CampaignServiceServer::new(crate::api::campaigns::CampaignApi::new(
                store.clone(),
                events_tx.clone(),
                config.cancel_wait,
            ))
            .max_decoding_message_size(max_message),
        )
        .add_service(LeaseServiceServer::new(lease).max_decoding_message_size(max_message))
        .add_service(
            StatsServiceServer::new(StatsApi::new(store.clone()))
                .max_decoding_message_size(max_message),
        )
        .serve_with_incoming_shutdown(incoming, async move { grpc_stop.cancelled().await });
    let grpc = tokio::spawn(grpc);

    let http_stop = server_stop.clone();
    let http_router = crate::http::router(
        store.clone(),
        HttpAuth {
            policy: auth.clone(),
            protect_metrics: config.metrics_auth,
        },
    );
    let http = tokio::spawn(async move {
        axum::serve(listeners.http, http_router)
            .with_graceful_shutdown(async move { http_stop.cancelled().await })
            .await
    });

    tracing::info!(scheduler_id = %scheduler_id, "scheduler serving");
    on_ready();
    shutdown.await;

    // Ordered shutdown: refuse new work, tell executors to move, give them the grace period to
    // report and reconnect elsewhere, then stop serving and close the pool.
    tracing::info!("shutting down: draining executors");
    db_watch.stop().await;
    health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    health.set_not_serving::<TaskServiceServer<TaskApi>>().await;
    health
        .set_not_serving::<StatsServiceServer<StatsApi>>()
        .await;
    health
        .set_not_serving::<LeaseServiceServer<LeaseApi>>()
        .await;
    drain.cancel();
    let grace = tokio::time::Instant::now() + config.shutdown_grace;
    while !registry.is_empty() && tokio::time::Instant::now() < grace {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server_stop.cancel();
    let grpc_result = match tokio::time::timeout_at(grace + Duration::from_secs(1), grpc).await {
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
    background.cancel();
    while jobs.join_next().await.is_some() {}
    store.close();
    tracing::info!("scheduler stopped");
    grpc_result
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

/// Forwards revokes announced by any replica to the executors connected here.
async fn route_revokes(
    mut events: broadcast::Receiver<Event>,
    registry: Registry,
    stop: CancellationToken,
) {
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            e = events.recv() => e,
        };
        match event {
            Ok(Event::Revoke {
                task_id,
                attempt,
                executor_id,
            }) => registry.revoke(&executor_id, task_id, attempt),
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!(
                    missed = n,
                    "revoke router lagged; some revokes were not forwarded"
                );
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}
