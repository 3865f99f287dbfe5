//! Graceful shutdown on SIGTERM or SIGINT, with a second signal exiting at once.

use std::future::Future;
use std::io;

/// Installs the SIGTERM/SIGINT handlers now, so a signal sent right after the binary prints
/// READY is already caught, and returns a future that resolves on the first one; a second one
/// exits the process at once (status 130).
pub fn on_signal() -> io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("signal received; shutting down (send another to exit at once)");
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::warn!("second signal; exiting now");
            std::process::exit(130);
        });
    })
}
