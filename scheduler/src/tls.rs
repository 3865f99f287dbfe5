//! TLS for the gRPC port from PEM files, and the start-up rule that plaintext must be asked
//! for.

use std::path::Path;

use tonic::transport::{Certificate, Identity, ServerTlsConfig};

use crate::config::Config;

/// Why the TLS settings were refused.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// Which setting.
        what: &'static str,
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The combination of settings is unusable.
    #[error("{0}")]
    Settings(String),
}

/// The gRPC port's TLS configuration, None when plaintext was explicitly allowed.
pub fn server_tls(config: &Config) -> Result<Option<ServerTlsConfig>, TlsError> {
    let (cert, key) = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => (cert, key),
        (None, None) => {
            if config.tls_client_ca.is_some() {
                return Err(TlsError::Settings(
                    "HERALD_TLS_CLIENT_CA needs HERALD_TLS_CERT and HERALD_TLS_KEY".into(),
                ));
            }
            if config.allow_plaintext {
                return Ok(None);
            }
            return Err(TlsError::Settings(
                "refusing to serve gRPC without TLS: set HERALD_TLS_CERT and HERALD_TLS_KEY, or \
                 HERALD_ALLOW_PLAINTEXT=true on a trusted network"
                    .into(),
            ));
        }
        _ => {
            return Err(TlsError::Settings(
                "HERALD_TLS_CERT and HERALD_TLS_KEY must be set together".into(),
            ))
        }
    };
    let identity = Identity::from_pem(read("certificate", cert)?, read("private key", key)?);
    let mut tls = ServerTlsConfig::new().identity(identity);
    if let Some(ca) = &config.tls_client_ca {
        // Optional at the handshake so applications without certificates still reach the
        // client API; the auth layer requires one on the lease stream.
        tls = tls
            .client_ca_root(Certificate::from_pem(read("client CA", ca)?))
            .client_auth_optional(true);
    }
    Ok(Some(tls))
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.display().to_string(),
        source,
    })
}
