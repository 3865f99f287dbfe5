//! herald-executor: leases due tasks from the herald scheduler, sends each with the sender
//! configured for its queue, and reports every outcome on the same stream.
//!
//! Map of the crate:
//! - [`config`]: the command line ([`Config`]), every flag with an environment twin.
//! - [`routes`]: the TOML file mapping queues and sending accounts to senders
//!   ([`SenderRoutes`]): `[queues.*]`/`[default]` by queue, `[accounts.*]` for leases naming an
//!   account's `credentials_ref`, `[accounts."*"]` for any account;
//!   [`credentials`]: the secrets they reference, never printed.
//! - [`senders`]: the registry of sender kinds ([`senders::SenderConfig`], one variant per
//!   `herald_proto::SenderKind`, each kind's module owning its settings and construction), the
//!   sender contract ([`SendRequest`] → [`SendReceipt`] or [`SendError`]), the one tower adapter
//!   and the layers every route gets.
//! - `client`: the lease stream session (Hello/Welcome, leases, reports, credit, extension,
//!   revoke, drain) and reconnection; in-flight leases outlive any one stream.
//! - [`callbacks`]: the WhatsApp webhook endpoint (`[whatsapp_webhook]`): status callbacks
//!   and account events, verified and forwarded to the scheduler (`client/events.rs`).
//! - `http`: `/healthz` and `/metrics`; [`telemetry`]: logs, OTLP traces and the metrics.
//! - [`run`]: ties them together; shutdown is a parameter.

pub mod callbacks;
pub mod config;
pub mod credentials;
pub mod routes;
pub mod senders;
pub mod telemetry;

mod client;
mod connection;
mod http;

use std::future::Future;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use config::Config;
pub use routes::{ConfigError, Route, SenderRoutes};
pub use senders::{BoxSender, Content, OutcomeClass, SendError, SendReceipt, SendRequest};

/// Why the executor could not run.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// The configuration is not usable.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The config file is bad.
    #[error(transparent)]
    ConfigFile(#[from] ConfigError),
    /// The HTTP server failed.
    #[error("http server failed: {0}")]
    Http(#[source] std::io::Error),
}

/// Runs the executor until `shutdown` resolves and in-flight sends are reported (or
/// `config.shutdown_grace` runs out). `http_listener` serves `/healthz` and `/metrics`; the
/// WhatsApp webhook, when the config file has `[whatsapp_webhook]`, listens on its own address.
pub async fn run(
    config: Config,
    routes: SenderRoutes,
    http_listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ExecutorError> {
    run_with_webhook(config, routes, http_listener, None, shutdown).await
}

/// Binds the `[whatsapp_webhook]` table's address (`routes.whatsapp_webhook()`), if any.
pub async fn bind_webhook(
    webhook: Option<&callbacks::WhatsAppWebhook>,
) -> Result<Option<tokio::net::TcpListener>, ExecutorError> {
    let Some(webhook) = webhook else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(webhook.listen)
        .await
        .map_err(|e| {
            ExecutorError::Http(std::io::Error::new(
                e.kind(),
                format!(
                    "cannot listen on {} for the WhatsApp webhook: {e}",
                    webhook.listen
                ),
            ))
        })?;
    Ok(Some(listener))
}

/// [`run`], with the WhatsApp webhook on `webhook_listener` (bound with [`bind_webhook`], so
/// the caller knows its address); None binds the configured address here.
pub async fn run_with_webhook(
    config: Config,
    routes: SenderRoutes,
    http_listener: tokio::net::TcpListener,
    webhook_listener: Option<tokio::net::TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ExecutorError> {
    let endpoints = config.endpoints();
    if endpoints.is_empty() {
        return Err(ExecutorError::InvalidConfig(
            "no scheduler endpoint given".into(),
        ));
    }
    let connection = connection::Connection::from_config(&config, &endpoints)
        .map_err(|e| ExecutorError::InvalidConfig(e.to_string()))?;
    if config.executor_id.is_empty() || config.executor_id.chars().count() > 128 {
        return Err(ExecutorError::InvalidConfig(
            "executor id must be 1 to 128 characters".into(),
        ));
    }
    let wanted: Vec<String> = config
        .queues
        .iter()
        .map(|q| q.trim().to_owned())
        .filter(|q| !q.is_empty())
        .collect();
    let longest_send = routes
        .longest_timeout()
        .map_or(config.send_timeout, |t| t.max(config.send_timeout));
    if config.shutdown_grace < longest_send {
        tracing::warn!(
            grace = %humantime::format_duration(config.shutdown_grace),
            longest_send = %humantime::format_duration(longest_send),
            "HERALD_SHUTDOWN_GRACE is shorter than the longest send timeout: a send still \
             running when the grace ends is cut off unreported, and once its lease lapses it is \
             sent again; set the grace above every send timeout"
        );
    }
    let accounts = routes.announced_credentials_refs();
    let queues = if !wanted.is_empty() {
        wanted
    } else if routes.has_default() || (routes.queues().is_empty() && routes.has_accounts()) {
        // Every queue: with only accounts configured, leases are routed by account.
        Vec::new()
    } else {
        routes.queues()
    };
    if queues.is_empty() && !routes.has_default() && !routes.has_accounts() {
        return Err(ExecutorError::InvalidConfig(
            "no queue has a sender: the config file needs a [queues.NAME], [default] or [accounts.NAME] table"
                .into(),
        ));
    }
    if !routes.has_default() && !routes.queues().is_empty() {
        let known = routes.queues();
        for q in queues.iter().filter(|q| !known.contains(q)) {
            warn!(queue = %q, "queue has no sender; its leases will fail PERMANENT");
        }
    }

    let webhook = routes.whatsapp_webhook().cloned();
    let webhook_listener = match webhook_listener {
        Some(l) => Some(l),
        None => bind_webhook(webhook.as_ref()).await?,
    };
    let numbers = routes.whatsapp_numbers().to_vec();
    let routes_any_account = routes.sends_for_any_account();
    let built = routes.build(senders::RouteLimits {
        timeout: config.send_timeout,
        concurrency: config.max_in_flight as usize,
    });
    let stats = Arc::new(client::Stats::default());
    telemetry::metrics::install();

    let stop = CancellationToken::new();
    let trigger = stop.clone();
    tokio::spawn(async move {
        shutdown.await;
        trigger.cancel();
    });

    let http_stop = CancellationToken::new();
    let server = axum::serve(http_listener, http::router(stats.clone()))
        .with_graceful_shutdown(http_stop.clone().cancelled_owned());
    let http = tokio::spawn(async move { server.await });
    // Meta's webhook on its own listener (it is the one exposed to the internet); it stops
    // with the HTTP server, after the lease client has reported what is in flight.
    let webhook_server = match (webhook, webhook_listener) {
        (Some(settings), Some(listener)) => {
            let forwarder = client::events::EventForwarder::new(&endpoints, connection.clone());
            info!(path = %settings.path, addr = ?listener.local_addr().ok(), "whatsapp webhook listening");
            let app = callbacks::router(settings, numbers, forwarder);
            let server = axum::serve(listener, app)
                .with_graceful_shutdown(http_stop.clone().cancelled_owned());
            Some(tokio::spawn(async move {
                if let Err(e) = server.await {
                    tracing::error!(error = %e, "whatsapp webhook server failed");
                }
            }))
        }
        _ => None,
    };

    info!(
        executor_id = %config.executor_id,
        endpoints = ?endpoints,
        queues = ?queues,
        accounts = ?accounts,
        any_account = routes_any_account,
        max_in_flight = config.max_in_flight,
        "executor starting"
    );
    let settings = client::ClientSettings {
        endpoints,
        executor_id: config.executor_id.clone(),
        queues,
        credentials_refs: accounts,
        max_in_flight: config.max_in_flight,
        shutdown_grace: config.shutdown_grace,
        connection,
    };
    let lease_client = client::LeaseClient::new(settings, built, stats);
    let mut http = std::pin::pin!(http);
    let http_result = tokio::select! {
        () = lease_client.run(stop) => {
            http_stop.cancel();
            http.await
        }
        // The HTTP server only ends on its own if it fails.
        result = &mut http => result,
    };
    // Also when the HTTP server failed on its own: the webhook must not outlive the executor.
    http_stop.cancel();
    if let Some(server) = webhook_server {
        let _ = server.await;
    }
    info!("executor stopped");
    match http_result {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(ExecutorError::Http(e)),
        Err(join) => Err(ExecutorError::Http(std::io::Error::other(join))),
    }
}
