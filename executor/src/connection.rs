//! How the executor reaches the scheduler: TLS (with an optional client certificate for mutual
//! TLS), the bearer token and the namespace it leases in. Plaintext endpoints must be allowed
//! explicitly, so a token is never sent in clear by accident.

use std::path::Path;

use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::config::Config;
use crate::credentials::Secret;

/// Metadata key naming the namespace (one the token grants).
const NAMESPACE_HEADER: &str = "x-herald-namespace";

/// Everything needed to open a lease stream, checked once at start-up. Not `Debug`: the TLS
/// identity holds the private key.
#[derive(Clone)]
pub(crate) struct Connection {
    tls: Option<ClientTlsConfig>,
    allow_plaintext: bool,
    token: Option<Secret>,
    namespace: Option<String>,
}

/// Why the connection settings were refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectionError {
    #[error("cannot read {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Settings(String),
}

impl Connection {
    /// Reads the TLS files and the token named in `config`, and checks every endpoint.
    pub(crate) fn from_config(
        config: &Config,
        endpoints: &[String],
    ) -> Result<Self, ConnectionError> {
        for endpoint in endpoints {
            let plaintext = endpoint.starts_with("http://");
            if plaintext && !config.allow_plaintext {
                return Err(ConnectionError::Settings(format!(
                    "refusing plaintext endpoint {endpoint}: use https://, or set \
                     HERALD_ALLOW_PLAINTEXT=true on a trusted network"
                )));
            }
            if !plaintext && !endpoint.starts_with("https://") {
                return Err(ConnectionError::Settings(format!(
                    "endpoint {endpoint} must start with https:// (or http:// with \
                     HERALD_ALLOW_PLAINTEXT=true)"
                )));
            }
        }
        let mut tls = ClientTlsConfig::new();
        match &config.tls_ca {
            Some(ca) => tls = tls.ca_certificate(Certificate::from_pem(read("CA", ca)?)),
            None => tls = tls.with_native_roots(),
        }
        match (&config.tls_cert, &config.tls_key) {
            (Some(cert), Some(key)) => {
                tls = tls.identity(Identity::from_pem(
                    read("client certificate", cert)?,
                    read("client key", key)?,
                ));
            }
            (None, None) => {}
            _ => {
                return Err(ConnectionError::Settings(
                    "HERALD_TLS_CERT and HERALD_TLS_KEY must be set together".into(),
                ))
            }
        }
        if let Some(domain) = &config.tls_domain {
            tls = tls.domain_name(domain.clone());
        }
        let token = match (&config.auth_token, &config.auth_token_file) {
            (Some(_), Some(_)) => {
                return Err(ConnectionError::Settings(
                    "set HERALD_AUTH_TOKEN or HERALD_AUTH_TOKEN_FILE, not both".into(),
                ))
            }
            (Some(token), None) => Some(token.clone()),
            (None, Some(path)) => {
                let text = String::from_utf8(read("token file", path)?).map_err(|_| {
                    ConnectionError::Settings(format!("{} is not UTF-8", path.display()))
                })?;
                Some(Secret::new(text.trim_end_matches(['\r', '\n'])))
            }
            (None, None) => None,
        };
        if let Some(t) = &token {
            if t.expose().is_empty() || MetadataValue::try_from(bearer(t)).is_err() {
                return Err(ConnectionError::Settings(
                    "the token is empty or holds characters a header cannot carry".into(),
                ));
            }
        }
        if let Some(ns) = &config.namespace {
            if MetadataValue::try_from(ns.as_str()).is_err() || ns.is_empty() {
                return Err(ConnectionError::Settings(format!(
                    "HERALD_NAMESPACE {ns:?} is not a namespace name"
                )));
            }
        }
        Ok(Connection {
            tls: Some(tls),
            allow_plaintext: config.allow_plaintext,
            token,
            namespace: config.namespace.clone(),
        })
    }

    /// Applies TLS to an `https://` endpoint.
    pub(crate) fn configure(
        &self,
        endpoint: Endpoint,
    ) -> Result<Endpoint, tonic::transport::Error> {
        if endpoint.uri().scheme_str() == Some("https") {
            if let Some(tls) = &self.tls {
                return endpoint.tls_config(tls.clone());
            }
        }
        Ok(endpoint)
    }

    /// Whether `endpoint` may be used (checked again for endpoints found later, e.g. by DNS).
    pub(crate) fn allows(&self, endpoint: &str) -> bool {
        endpoint.starts_with("https://") || self.allow_plaintext
    }

    /// Adds the token and namespace to a request's metadata.
    pub(crate) fn authorize<T>(&self, request: &mut tonic::Request<T>) {
        if let Some(token) = &self.token {
            if let Ok(value) = MetadataValue::try_from(bearer(token)) {
                request.metadata_mut().insert("authorization", value);
            }
        }
        if let Some(ns) = &self.namespace {
            if let Ok(value) = MetadataValue::try_from(ns.as_str()) {
                request.metadata_mut().insert(NAMESPACE_HEADER, value);
            }
        }
    }
}

fn bearer(token: &Secret) -> String {
    format!("Bearer {}", token.expose())
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, ConnectionError> {
    std::fs::read(path).map_err(|source| ConnectionError::Read {
        what,
        path: path.display().to_string(),
        source,
    })
}
