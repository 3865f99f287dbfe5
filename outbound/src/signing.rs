//! Standard Webhooks signing
//! (<https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md>):
//! the signature is `v1,` followed by the base64 HMAC-SHA256, keyed by the secret, of
//! `"{webhook-id}.{webhook-timestamp}.{body}"`.

use std::fmt;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Header carrying the message's id: the same for every delivery try of one message, so a
/// receiver can drop repeats.
pub const WEBHOOK_ID: &str = "webhook-id";
/// Header carrying the signing time, in whole seconds since the Unix epoch.
pub const WEBHOOK_TIMESTAMP: &str = "webhook-timestamp";
/// Header carrying the signature(s), see [`SigningKey::sign`].
pub const WEBHOOK_SIGNATURE: &str = "webhook-signature";

/// Prefix of a secret given in Standard Webhooks form: the rest is the key in base64.
const SECRET_PREFIX: &str = "whsec_";

/// The HMAC key derived from a webhook secret. Its `Debug` prints `[redacted]`.
#[derive(Clone)]
pub struct SigningKey(Hmac<Sha256>);

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Why a secret cannot be used as a signing key. Never contains the secret.
#[derive(Debug, thiserror::Error)]
pub enum InvalidSecret {
    /// The secret is `whsec_` followed by something that is not base64.
    #[error("the secret has the whsec_ prefix but the rest is not valid base64: {0}")]
    Base64(#[source] base64::DecodeError),
    /// The HMAC rejected the key.
    #[error("the secret is not a usable HMAC key")]
    Key,
}

impl SigningKey {
    /// The key for `secret`: the base64-decoded part after `whsec_`, or the raw bytes of a
    /// secret without that prefix.
    pub fn from_secret(secret: &str) -> Result<Self, InvalidSecret> {
        let key = match secret.strip_prefix(SECRET_PREFIX) {
            Some(b64) => BASE64.decode(b64).map_err(InvalidSecret::Base64)?,
            None => secret.as_bytes().to_vec(),
        };
        Hmac::<Sha256>::new_from_slice(&key)
            .map(SigningKey)
            .map_err(|_| InvalidSecret::Key)
    }

    /// The [`WEBHOOK_SIGNATURE`] value for a message: `v1,` + base64(HMAC-SHA256(key,
    /// `"{id}.{timestamp}.{body}"`)). `id` and `timestamp` must be the values sent in the
    /// [`WEBHOOK_ID`] and [`WEBHOOK_TIMESTAMP`] headers.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut mac = self.0.clone();
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn signature_matches_the_specification_example() {
        // The example of the Standard Webhooks specification and its reference libraries.
        let key = SigningKey::from_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            key.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn a_secret_without_the_prefix_is_the_raw_key() {
        let raw = SigningKey::from_secret("plain-secret").unwrap();
        let prefixed =
            SigningKey::from_secret(&format!("whsec_{}", BASE64.encode("plain-secret"))).unwrap();
        assert_eq!(raw.sign("id", 1, b"{}"), prefixed.sign("id", 1, b"{}"));
        assert_ne!(raw.sign("id", 1, b"{}"), raw.sign("id", 2, b"{}"));
    }

    #[test]
    fn bad_base64_is_refused_without_echoing_the_secret() {
        let err = SigningKey::from_secret("whsec_%%topsecret").unwrap_err();
        assert!(matches!(err, InvalidSecret::Base64(_)), "{err:?}");
        assert!(!err.to_string().contains("topsecret"), "{err}");
    }

    #[test]
    fn debug_never_prints_the_key() {
        let key = SigningKey::from_secret("plain-secret").unwrap();
        assert_eq!(format!("{key:?}"), "[redacted]");
    }
}
