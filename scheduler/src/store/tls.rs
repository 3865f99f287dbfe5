//! TLS to PostgreSQL, as `DATABASE_URL`'s `sslmode` asks for it, with libpq's meanings:
//!
//! - `disable`: plaintext.
//! - `prefer` (the default) and `require`: encrypted when the server offers it (`require`
//!   refuses a server that does not), the server's certificate not checked, as libpq does
//!   without a root certificate.
//! - `verify-ca` and `verify-full`: encrypted, and the certificate must chain to a trusted root
//!   and name the host (rustls always checks the name, so `verify-ca` is as strict as
//!   `verify-full`). The roots are the system's, plus the PEM file `PGSSLROOTCERT` names (a
//!   managed database's CA, say).
//!
//! tokio-postgres knows neither `verify-` mode and refused such a URL, so the driver is given
//! `require` and the check is this connector's. Before this, every connection was plaintext
//! whatever the URL said, and `require` failed to connect.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// The connector every herald connection to PostgreSQL goes through.
pub type DbTls = tokio_postgres_rustls::MakeRustlsConnect;

/// The environment variable naming extra trusted roots, as libpq reads it.
pub const ROOT_CERT_ENV: &str = "PGSSLROOTCERT";

/// Why the database's TLS settings were refused.
#[derive(Debug, thiserror::Error)]
pub enum DbTlsError {
    /// The roots file could not be read or holds no certificate.
    #[error("{ROOT_CERT_ENV} {path}: {reason}")]
    Roots {
        /// The file.
        path: String,
        /// What was wrong with it.
        reason: String,
    },
    /// `verify-ca` or `verify-full` with no root to verify against.
    #[error("sslmode=verify-full needs trusted roots: none in the system's store, and {ROOT_CERT_ENV} is not set")]
    NoRoots,
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// `database_url` as the driver takes it, and the connector its `sslmode` asks for.
pub fn for_url(database_url: &str) -> Result<(String, DbTls), DbTlsError> {
    let verify = ["sslmode=verify-full", "sslmode=verify-ca"]
        .iter()
        .any(|mode| database_url.contains(mode));
    let driver_url = database_url
        .replace("sslmode=verify-full", "sslmode=require")
        .replace("sslmode=verify-ca", "sslmode=require");
    let roots = std::env::var_os(ROOT_CERT_ENV);
    let connector = connector(verify, roots.as_deref().map(Path::new))?;
    Ok((driver_url, connector))
}

/// A connector that checks the server's certificate against the system's roots and those in
/// `root_file` when `verify`, and only encrypts otherwise.
pub fn connector(verify: bool, root_file: Option<&Path>) -> Result<DbTls, DbTlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let config = if verify {
        let mut roots = RootCertStore::empty();
        // A system store that cannot be read, wholly or partly, leaves the roots it could.
        roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        if let Some(path) = root_file {
            let shown = path.display().to_string();
            let certs = CertificateDer::pem_file_iter(path)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| DbTlsError::Roots {
                    path: shown.clone(),
                    reason: e.to_string(),
                })?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(DbTlsError::Roots {
                    path: shown,
                    reason: "holds no usable certificate".into(),
                });
            }
        }
        if roots.is_empty() {
            return Err(DbTlsError::NoRoots);
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(EncryptOnly(provider)))
            .with_no_client_auth()
    };
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

/// Takes any certificate, as libpq's `prefer` and `require` do without a root certificate: the
/// connection is encrypted, not authenticated. The handshake's signatures are still checked,
/// so the session is with whoever holds the certificate's key.
#[derive(Debug)]
struct EncryptOnly(Arc<CryptoProvider>);

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_modes_reach_the_driver_as_require() {
        let (url, _) = for_url("postgres://h@db:5432/herald?sslmode=verify-full")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(url, "postgres://h@db:5432/herald?sslmode=require");
        let (url, _) =
            for_url("host=db sslmode=verify-ca dbname=herald").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(url, "host=db sslmode=require dbname=herald");
        let plain = "postgres://h@db/herald?sslmode=disable";
        assert_eq!(for_url(plain).map(|(u, _)| u).ok().as_deref(), Some(plain));
    }

    #[test]
    fn a_roots_file_that_is_missing_or_empty_is_refused() {
        let missing = Path::new("/nonexistent/herald-ca.pem");
        assert!(matches!(
            connector(true, Some(missing)),
            Err(DbTlsError::Roots { .. })
        ));
        let empty =
            std::env::temp_dir().join(format!("herald-empty-ca-{}.pem", std::process::id()));
        std::fs::write(&empty, "").unwrap_or_else(|e| panic!("{e}"));
        let refused = connector(true, Some(&empty));
        let _ = std::fs::remove_file(&empty);
        assert!(matches!(refused, Err(DbTlsError::Roots { .. })));
        // Without verification no roots are needed.
        assert!(connector(false, Some(missing)).is_ok());
    }
}
