//! TLS for the tests' https servers on loopback: a throwaway CA, a certificate for `127.0.0.1`
//! and `localhost` signed by it, and the CA's PEM file the binaries under test are told to
//! trust (the executor's `[media] ca_file`, the scheduler's HERALD_VARIABLES_SOURCE_CA_FILE).
//! Outbound calls on behalf of clients are https only, so their fakes speak it too.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use hyper_util::rt::TokioIo;
use rcgen::{CertificateParams, IsCa, Issuer, KeyPair};
use tokio::net::TcpListener;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

/// A loopback server identity. Its CA file is removed when dropped.
#[derive(Clone)]
pub struct LoopbackTls {
    acceptor: TlsAcceptor,
    ca_file: Arc<CaFile>,
}

/// The CA's PEM file, removed with the last holder.
struct CaFile(PathBuf);

impl Drop for CaFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl std::fmt::Debug for LoopbackTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopbackTls")
            .field("ca_file", &self.ca_file.0)
            .finish()
    }
}

impl LoopbackTls {
    /// A fresh CA named after `what` (e.g. "media host") and a certificate signed by it.
    pub fn new(what: &str) -> Result<Self> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("herald test {what} CA"));
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate()?;
        let params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?;
        let cert = params.signed_by(&key, &issuer)?;

        let ca_file = std::env::temp_dir().join(format!(
            "herald-test-ca-{}.pem",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::write(&ca_file, ca_cert.pem())
            .with_context(|| format!("writing the {what} CA"))?;

        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(cert.der().to_vec())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )?;
        Ok(LoopbackTls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            ca_file: Arc::new(CaFile(ca_file)),
        })
    }

    /// The CA's PEM file.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file.0
    }

    /// Accepts TLS connections on `listener` and serves each with HTTP/1 through `service`
    /// until the returned task is aborted.
    pub fn serve<S, B>(&self, listener: TcpListener, service: S) -> tokio::task::JoinHandle<()>
    where
        S: hyper::service::Service<
                hyper::Request<hyper::body::Incoming>,
                Response = hyper::Response<B>,
                Error = std::convert::Infallible,
            > + Clone
            + Send
            + 'static,
        S::Future: Send,
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let acceptor = self.acceptor.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, service) = (acceptor.clone(), service.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), service)
                        .await;
                });
            }
        })
    }
}
