//! The `herald-executor` binary: parses the command line, loads the sender routes, binds the
//! HTTP listener, prints `READY http=<addr>` and runs until SIGTERM/SIGINT (a second signal
//! exits at once).

use std::io::Write as _;

use anyhow::Context as _;
use clap::Parser as _;
use herald_executor::{Config, SenderRoutes};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    init_tracing();

    let routes = match &config.config_file {
        Some(path) => SenderRoutes::from_file(path)?,
        None => SenderRoutes::log_only(),
    };
    let listener = tokio::net::TcpListener::bind(config.http_addr)
        .await
        .with_context(|| format!("cannot listen on {}", config.http_addr))?;
    let addr = listener.local_addr().context("listener has no address")?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "READY http={addr}").context("cannot write to stdout")?;
        out.flush().context("cannot flush stdout")?;
    }
    herald_executor::run(config, routes, listener, signals()).await?;
    Ok(())
}

/// Resolves on the first SIGTERM/SIGINT; the second one exits the process at once.
async fn signals() {
    wait_for_signal().await;
    tracing::info!("signal received; shutting down (send another to exit at once)");
    tokio::spawn(async {
        wait_for_signal().await;
        tracing::warn!("second signal; exiting now");
        std::process::exit(130);
    });
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGTERM; only Ctrl-C stops the executor");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

fn init_tracing() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if std::env::var("HERALD_LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json")) {
        builder.json().init();
    } else {
        builder.init();
    }
}
