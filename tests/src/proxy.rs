//! A TCP proxy that can cut the network between two processes.
//!
//! Connections to [`TcpProxy::addr`] are forwarded to the target. [`TcpProxy::cut`] is a
//! partition, not a clean close: bytes stop flowing both ways while every socket stays open,
//! and new connections are accepted but go nowhere, so each side finds out only through its own
//! timeouts (heartbeats, lease TTL), as with a dead switch. [`TcpProxy::restore`] drops the
//! connections that lived through the cut (their peers gave up on them long ago) and forwards
//! new ones again.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The proxy; stops (closing every connection) when dropped.
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    /// True while the network is cut.
    cut: Arc<watch::Sender<bool>>,
    /// Bumped by each restore: connections from before it end.
    epoch: Arc<watch::Sender<u64>>,
    accept: JoinHandle<()>,
}

impl TcpProxy {
    /// Starts forwarding `127.0.0.1:<ephemeral>` to `target` (`host:port`).
    pub async fn start(target: &str) -> Result<Self> {
        let target: SocketAddr = target
            .parse()
            .with_context(|| format!("proxy target {target:?} is not host:port"))?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the proxy")?;
        let addr = listener.local_addr()?;
        let cut = Arc::new(watch::Sender::new(false));
        let epoch = Arc::new(watch::Sender::new(0u64));
        let accept = tokio::spawn(accept_loop(
            listener,
            target,
            Arc::clone(&cut),
            Arc::clone(&epoch),
        ));
        Ok(Self {
            addr,
            cut,
            epoch,
            accept,
        })
    }

    /// The proxy's own address, as `127.0.0.1:PORT`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy as a gRPC endpoint URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Cuts the network: nothing passes in either direction until [`Self::restore`].
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Ends the cut: connections held through it are closed, new ones are forwarded.
    pub fn restore(&self) {
        self.epoch.send_modify(|e| *e += 1);
        self.cut.send_replace(false);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Ends every connection task too.
        self.epoch.send_modify(|e| *e += 1);
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    cut: Arc<watch::Sender<bool>>,
    epoch: Arc<watch::Sender<u64>>,
) {
    while let Ok((inbound, _)) = listener.accept().await {
        let _ = inbound.set_nodelay(true);
        tokio::spawn(connection(
            inbound,
            target,
            cut.subscribe(),
            epoch.subscribe(),
        ));
    }
}

/// One connection: forwards until the cut, then holds both sockets silent until a restore (or
/// the proxy's end) closes them.
async fn connection(
    mut inbound: TcpStream,
    target: SocketAddr,
    mut cut: watch::Receiver<bool>,
    mut epoch: watch::Receiver<u64>,
) {
    let born = *epoch.borrow_and_update();
    let ended = async move {
        let _ = epoch.wait_for(|e| *e != born).await;
    };
    tokio::pin!(ended);
    if *cut.borrow_and_update() {
        // Accepted during the cut: the SYN got an answer from nobody useful. Hold it.
        ended.await;
        return;
    }
    let Ok(mut outbound) = TcpStream::connect(target).await else {
        return;
    };
    let _ = outbound.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {
            let _ = inbound.shutdown().await;
            let _ = outbound.shutdown().await;
        }
        _ = async { cut.wait_for(|c| *c).await.map(|_| ()) } => {
            // Partitioned: keep both sockets open, move nothing.
            ended.await;
        }
        _ = &mut ended => {}
    }
}
