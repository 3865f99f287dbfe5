//! Security fixtures: a throwaway PKI (CA, scheduler certificate, executor client certificate)
//! and tokens files, plus clients that speak TLS and carry a token.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
use sha2::{Digest, Sha256};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// PEM files of a CA, a server certificate for `127.0.0.1`/`localhost` and a client
/// certificate, in a temporary folder removed on drop.
pub struct TestPki {
    dir: PathBuf,
    /// The CA certificate.
    pub ca: PathBuf,
    /// The scheduler's certificate chain.
    pub server_cert: PathBuf,
    /// The scheduler's key.
    pub server_key: PathBuf,
    /// The executor's client certificate.
    pub client_cert: PathBuf,
    /// The executor's client key.
    pub client_key: PathBuf,
}

impl TestPki {
    /// Generates the CA and both certificates.
    pub fn generate() -> Result<Self> {
        let dir =
            std::env::temp_dir().join(format!("herald-pki-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "herald test CA");
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);

        let server_key = KeyPair::generate()?;
        let mut server_params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?;
        server_params
            .extended_key_usages
            .push(ExtendedKeyUsagePurpose::ServerAuth);
        let server_cert = server_params.signed_by(&server_key, &issuer)?;

        let client_key = KeyPair::generate()?;
        let mut client_params = CertificateParams::new(vec!["executor.test".to_owned()])?;
        client_params
            .extended_key_usages
            .push(ExtendedKeyUsagePurpose::ClientAuth);
        let client_cert = client_params.signed_by(&client_key, &issuer)?;

        let write = |name: &str, pem: String| -> Result<PathBuf> {
            let path = dir.join(name);
            std::fs::write(&path, pem).with_context(|| format!("writing {}", path.display()))?;
            Ok(path)
        };
        Ok(TestPki {
            ca: write("ca.crt", ca_cert.pem())?,
            server_cert: write("server.crt", server_cert.pem())?,
            server_key: write("server.key", server_key.serialize_pem())?,
            client_cert: write("client.crt", client_cert.pem())?,
            client_key: write("client.key", client_key.serialize_pem())?,
            dir,
        })
    }

    /// A channel to `https://addr` trusting the test CA, with the client certificate when
    /// `with_client_cert`.
    pub async fn channel(&self, addr: &str, with_client_cert: bool) -> Result<Channel> {
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(&self.ca)?));
        if with_client_cert {
            tls = tls.identity(Identity::from_pem(
                read(&self.client_cert)?,
                read(&self.client_key)?,
            ));
        }
        Channel::from_shared(format!("https://{addr}"))?
            .tls_config(tls)?
            .connect()
            .await
            .with_context(|| format!("TLS connect to {addr}"))
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// One entry of a tokens file, with the clear token the test presents.
#[derive(Debug, Clone)]
pub struct TestToken {
    /// The entry's name.
    pub name: String,
    /// The clear token (only its hash goes into the file).
    pub token: String,
    /// Roles: client, executor, admin.
    pub roles: Vec<String>,
    /// Namespaces; the first is the default.
    pub namespaces: Vec<String>,
    /// Requests per second and burst, if limited.
    pub rate: Option<(u32, u32)>,
}

impl TestToken {
    /// A token named `name` with a random value.
    pub fn new(name: &str, roles: &[&str], namespaces: &[&str]) -> Self {
        TestToken {
            name: name.to_owned(),
            token: format!("hrld_test_{}", uuid::Uuid::new_v4().simple()),
            roles: roles.iter().map(|r| (*r).to_owned()).collect(),
            namespaces: namespaces.iter().map(|n| (*n).to_owned()).collect(),
            rate: None,
        }
    }

    /// Limits the token to `per_second` with `burst`.
    pub fn with_rate(mut self, per_second: u32, burst: u32) -> Self {
        self.rate = Some((per_second, burst));
        self
    }

    /// `Bearer <token>`, for the authorization metadata.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.token)
    }

    /// Wraps `message` in a request carrying this token (and a namespace, if given).
    pub fn request<T>(&self, message: T, namespace: Option<&str>) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        authorize(&mut request, Some(self), namespace);
        request
    }
}

/// Adds `authorization` and `x-herald-namespace` metadata to a request.
pub fn authorize<T>(
    request: &mut tonic::Request<T>,
    token: Option<&TestToken>,
    namespace: Option<&str>,
) {
    if let Some(t) = token {
        if let Ok(v) = t.bearer().parse() {
            request.metadata_mut().insert("authorization", v);
        }
    }
    if let Some(ns) = namespace {
        if let Ok(v) = ns.parse() {
            request.metadata_mut().insert("x-herald-namespace", v);
        }
    }
}

/// Writes a tokens file holding the hashes of `tokens`; the file lives as long as the returned
/// guard.
pub fn write_tokens_file(tokens: &[TestToken]) -> Result<TokensFile> {
    let mut text = String::new();
    for t in tokens {
        let hash = hex::encode(Sha256::digest(t.token.as_bytes()));
        let list = |items: &[String]| {
            items
                .iter()
                .map(|i| format!("{i:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        text.push_str(&format!(
            "[[token]]\nname = {:?}\nsha256 = \"{hash}\"\nroles = [{}]\nnamespaces = [{}]\n",
            t.name,
            list(&t.roles),
            list(&t.namespaces)
        ));
        if let Some((rate, burst)) = t.rate {
            text.push_str(&format!("rate = {rate}\nburst = {burst}\n"));
        }
        text.push('\n');
    }
    let path = std::env::temp_dir().join(format!(
        "herald-tokens-{}.toml",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(TokensFile { path })
}

/// A tokens file on disk, removed on drop.
pub struct TokensFile {
    /// Where it is.
    pub path: PathBuf,
}

impl Drop for TokensFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
