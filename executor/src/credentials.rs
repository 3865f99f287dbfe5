//! Secrets from the executor's config file: where they come from (literal, environment
//! variable, file) and a type that never prints them.

use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;

/// A secret value. Its `Debug` and `Display` print `[redacted]`; read it with [`Secret::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value itself. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Where a secret comes from, as written in the config file:
/// `"whsec_..."`, `{ env = "NAME" }` or `{ file = "/path" }`.
#[derive(Clone, Deserialize)]
#[serde(untagged)]
pub enum SecretRef {
    /// The value itself, written in the file.
    Literal(String),
    /// The value of an environment variable.
    Env {
        /// The variable's name.
        env: String,
    },
    /// The contents of a file (trailing newlines removed).
    File {
        /// The file's path.
        file: PathBuf,
    },
}

impl fmt::Debug for SecretRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretRef::Literal(_) => f.write_str("Literal([redacted])"),
            SecretRef::Env { env } => f.debug_struct("Env").field("env", env).finish(),
            SecretRef::File { file } => f.debug_struct("File").field("file", file).finish(),
        }
    }
}

/// Why a secret could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The environment variable is not set.
    #[error("environment variable {0} is not set")]
    MissingEnv(String),
    /// The file could not be read.
    #[error("cannot read secret file {path}: {source}")]
    File {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The secret resolved to an empty value.
    #[error("secret is empty")]
    Empty,
}

impl SecretRef {
    /// Reads the secret, looking environment variables up with `env`.
    pub fn resolve(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<Secret, CredentialError> {
        let value = match self {
            SecretRef::Literal(v) => v.clone(),
            SecretRef::Env { env: name } => {
                env(name).ok_or_else(|| CredentialError::MissingEnv(name.clone()))?
            }
            SecretRef::File { file } => std::fs::read_to_string(file)
                .map_err(|source| CredentialError::File {
                    path: file.clone(),
                    source,
                })?
                .trim_end_matches(['\r', '\n'])
                .to_owned(),
        };
        if value.is_empty() {
            return Err(CredentialError::Empty);
        }
        Ok(Secret(value))
    }
}
