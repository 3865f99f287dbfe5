//! The `herald-executor` binary: parses the command line, loads the sender routes, binds the
//! HTTP listener (and the WhatsApp webhook's, when configured), prints
//! `READY http=<addr> [whatsapp_webhook=<addr>]` and runs until SIGTERM/SIGINT (a second signal
//! exits at once).

use std::io::Write as _;

use anyhow::Context as _;
use clap::Parser as _;
use herald_executor::{Config, SenderRoutes};

/// glibc's malloc was a quarter of the executor's CPU in the S1 drain; mimalloc's per-thread
/// free lists suit tokio's many short-lived allocations (docs/performance.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    // Held to the end of main: dropping it flushes the spans not yet exported.
    let _telemetry = herald_executor::telemetry::init(&config.log_format);
    herald_process::memory::turn_off_transparent_huge_pages();

    let routes = match &config.config_file {
        Some(path) => SenderRoutes::from_file(path)?,
        None => SenderRoutes::log_only(),
    };
    // Before READY is printed, so a signal sent right after start-up is caught.
    let shutdown = herald_process::shutdown::on_signal().context("cannot handle SIGTERM/SIGINT")?;
    let listener = tokio::net::TcpListener::bind(config.http_addr)
        .await
        .with_context(|| format!("cannot listen on {}", config.http_addr))?;
    let addr = listener.local_addr().context("listener has no address")?;
    let webhook = herald_executor::bind_webhook(routes.whatsapp_webhook()).await?;
    {
        let mut out = std::io::stdout().lock();
        match &webhook {
            Some(w) => {
                let webhook_addr = w.local_addr().context("webhook listener has no address")?;
                writeln!(out, "READY http={addr} whatsapp_webhook={webhook_addr}")
            }
            None => writeln!(out, "READY http={addr}"),
        }
        .context("cannot write to stdout")?;
        out.flush().context("cannot flush stdout")?;
    }
    herald_executor::run_with_webhook(config, routes, listener, webhook, shutdown).await?;
    Ok(())
}
