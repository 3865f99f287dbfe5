//! A media host for the tests: an https server on `127.0.0.1:0` serving files put into it,
//! with a certificate for `127.0.0.1` and `localhost` from a throwaway CA whose PEM file the
//! executor's `[media] ca_file` trusts. Counting the requests per path shows what was fetched,
//! and what was not (the SSRF refusals).
//!
//! Why https: the executor fetches https URLs only, and the scheduler accepts only https
//! media links, so the tests use the real scheme; loopback is let through by the executor's
//! `[media] allowed_networks = ["127.0.0.1/32"]`, which the tests that want a refusal leave
//! out.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};
use tokio::task::JoinHandle;

use super::lock;
use crate::loopback_tls::LoopbackTls;

/// What a path answers.
#[derive(Clone, Debug)]
enum Served {
    File { content_type: String, bytes: Bytes },
    Redirect(String),
}

#[derive(Default)]
struct Shared {
    files: Mutex<HashMap<String, Served>>,
    hits: Mutex<HashMap<String, usize>>,
}

/// The https media host. Stops when dropped; its CA file is removed then.
pub struct FakeMedia {
    addr: SocketAddr,
    tls: LoopbackTls,
    shared: Arc<Shared>,
    server: JoinHandle<()>,
}

impl FakeMedia {
    /// Starts the server with a fresh CA and certificate.
    pub async fn start() -> Result<Self> {
        let tls = LoopbackTls::new("media host")?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the media host")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let state = shared.clone();
        let service = hyper::service::service_fn(move |req: Request<_>| {
            let state = state.clone();
            async move { Ok::<_, std::convert::Infallible>(serve(&state, &req)) }
        });
        let server = tls.serve(listener, service);
        Ok(FakeMedia {
            addr,
            tls,
            shared,
            server,
        })
    }

    /// Serves `bytes` as `content_type` at `path` (starting with `/`).
    pub fn put(&self, path: &str, content_type: &str, bytes: impl Into<Bytes>) {
        lock(&self.shared.files).insert(
            path.to_owned(),
            Served::File {
                content_type: content_type.to_owned(),
                bytes: bytes.into(),
            },
        );
    }

    /// Answers `path` with a 302 to `location`.
    pub fn redirect(&self, path: &str, location: &str) {
        lock(&self.shared.files).insert(path.to_owned(), Served::Redirect(location.to_owned()));
    }

    /// `https://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("https://{}{path}", self.addr)
    }

    /// `https://localhost:PORT{path}`: a name that resolves to loopback.
    pub fn url_by_name(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.addr.port())
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// How many requests reached `path`.
    pub fn hits(&self, path: &str) -> usize {
        lock(&self.shared.hits).get(path).copied().unwrap_or(0)
    }

    /// How many requests reached the server at all.
    pub fn total_hits(&self) -> usize {
        lock(&self.shared.hits).values().sum()
    }

    /// The CA's PEM file, for `[media] ca_file`.
    pub fn ca_file(&self) -> &Path {
        self.tls.ca_file()
    }

    /// The executor's `[media]` table that trusts this host and lets fetches reach loopback.
    pub fn media_table(&self) -> String {
        format!(
            "[media]\nallowed_networks = [\"127.0.0.1/32\", \"::1/128\"]\nca_file = \"{}\"\n",
            self.tls.ca_file().display()
        )
    }
}

fn serve<B>(state: &Shared, req: &Request<B>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    *lock(&state.hits).entry(path.clone()).or_default() += 1;
    let served = lock(&state.files).get(&path).cloned();
    let mut response = Response::new(Full::new(Bytes::new()));
    match served {
        Some(Served::File {
            content_type,
            bytes,
        }) => {
            if let Ok(v) = content_type.parse() {
                response.headers_mut().insert(http::header::CONTENT_TYPE, v);
            }
            *response.body_mut() = Full::new(bytes);
        }
        Some(Served::Redirect(location)) => {
            *response.status_mut() = http::StatusCode::FOUND;
            if let Ok(v) = location.parse() {
                response.headers_mut().insert(http::header::LOCATION, v);
            }
        }
        None => *response.status_mut() = http::StatusCode::NOT_FOUND,
    }
    response
}

impl Drop for FakeMedia {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Bytes that start like a PNG (the signature, then padding): what the WeCom fake checks.
pub fn png() -> Vec<u8> {
    let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
    bytes.extend_from_slice(&[0u8; 60]);
    bytes
}
