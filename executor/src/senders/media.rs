//! Media the executor fetches on a client's behalf (a task's `media.link` for WeCom, which
//! takes only uploaded media ids or inline bytes), and the cache of uploaded media ids.
//!
//! - [`MediaConfig`] is the file's optional `[media]` table: which non-public networks fetches
//!   may reach (none by default), an extra CA for an internal store, the time cap.
//! - [`MediaFetcher`] fetches through `herald_outbound::guard` (https only, addresses checked
//!   after resolution and on every redirect) and classifies failures: a refused address, a
//!   body over the channel's cap or a type the channel does not take is PERMANENT; network
//!   trouble and 5xx are TRANSIENT.
//! - [`UploadCache`] keeps one account's uploaded media ids, by (type, URL), until shortly
//!   before they expire, and uploads single-flight: concurrent sends of the same URL wait for
//!   one upload and share its id. An id the provider refused (WeCom 40007) is forgotten, so
//!   the next ask uploads again.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use herald_outbound::guard::{parse_network, AddressPolicy, FetchLimits, Fetched, GuardedClient};
use serde::Deserialize;
use tokio::sync::Mutex;
use tokio::time::Instant;
use toml::Spanned;
use tracing::debug;

use super::config::{BuildContext, ConfigError, DurationSpec};
use super::SendError;

/// The whole fetch of one media URL, unless `[media] fetch_timeout` says otherwise.
pub const DEFAULT_FETCH_TIMEOUT: Duration = Duration::from_secs(30);
/// Connecting to a media host.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The `[media]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MediaConfig {
    /// Let fetches reach any non-public address (loopback, private, link-local, CGNAT,
    /// unique-local). Default false.
    allow_private_networks: Option<Spanned<bool>>,
    /// Non-public networks fetches may reach, as CIDRs or addresses (`"10.1.2.0/24"`).
    allowed_networks: Option<Spanned<Vec<String>>>,
    /// A PEM file of extra CA certificates trusted for media hosts (an internal store).
    ca_file: Option<Spanned<PathBuf>>,
    /// The whole fetch of one URL; default 30 s.
    fetch_timeout: Option<Spanned<DurationSpec>>,
}

impl MediaConfig {
    /// Checks the table and builds the fetcher every sender of the file shares.
    pub(crate) fn build(self, cx: &BuildContext<'_>) -> Result<MediaFetcher, ConfigError> {
        let mut allowed_networks = Vec::new();
        if let Some(list) = &self.allowed_networks {
            for n in list.get_ref() {
                allowed_networks.push(
                    parse_network(n)
                        .map_err(|e| cx.invalid(list.span(), format!("allowed_networks: {e}")))?,
                );
            }
        }
        let policy = AddressPolicy {
            allow_private_networks: self
                .allow_private_networks
                .as_ref()
                .is_some_and(|b| *b.get_ref()),
            allowed_networks,
        };
        let mut roots = Vec::new();
        if let Some(path) = &self.ca_file {
            let pem = std::fs::read(path.get_ref()).map_err(|e| {
                cx.invalid(
                    path.span(),
                    format!("ca_file {}: {e}", path.get_ref().display()),
                )
            })?;
            roots = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| cx.invalid(path.span(), format!("ca_file is not PEM: {e}")))?;
        }
        let timeout = match &self.fetch_timeout {
            None => DEFAULT_FETCH_TIMEOUT,
            Some(d) => d
                .get_ref()
                .to_duration()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    cx.invalid(d.span(), "fetch_timeout must be positive, e.g. \"30s\"")
                })?,
        };
        MediaFetcher::new(policy, roots, timeout).map_err(|e| cx.invalid_table(e))
    }
}

/// Fetches media URLs through the outbound guard.
#[derive(Clone, Debug)]
pub struct MediaFetcher {
    client: GuardedClient,
    timeout: Duration,
}

impl MediaFetcher {
    /// A fetcher for `policy`, trusting the system roots plus `roots`.
    pub fn new(
        policy: AddressPolicy,
        roots: Vec<reqwest::Certificate>,
        timeout: Duration,
    ) -> Result<Self, herald_outbound::guard::BuildError> {
        Ok(MediaFetcher {
            client: GuardedClient::new(policy, roots, CONNECT_TIMEOUT)?,
            timeout,
        })
    }

    /// The default fetcher: public addresses only.
    pub fn public_only() -> Result<Self, herald_outbound::guard::BuildError> {
        Self::new(AddressPolicy::default(), Vec::new(), DEFAULT_FETCH_TIMEOUT)
    }

    /// Fetches `url`, at most `max_bytes`, whose type must be one of `types` (checked against
    /// the server's `Content-Type`, or the file's first bytes when that names no format;
    /// `what` names the media in errors, e.g. `wecom image`).
    pub async fn fetch(
        &self,
        url: &str,
        max_bytes: u64,
        types: &[&str],
        what: &str,
    ) -> Result<Fetched, SendError> {
        let limits = FetchLimits {
            max_bytes,
            timeout: self.timeout,
        };
        let mut fetched = self.client.fetch(url, limits).await.map_err(|e| {
            let message = format!("{what}: {e}");
            if e.is_retryable() {
                SendError::transient(message)
            } else {
                SendError::permanent(message)
            }
        })?;
        // Object stores and web servers without a mapping for the extension (S3's default,
        // nginx for AMR) name no real type: the file's first bytes say what it is.
        // The wanted types are tried first: a format's signature can begin another's (an AMR
        // file's "#!AMR" reads as a shell script's "#!").
        if GENERIC_TYPES.contains(&fetched.content_type.as_str()) {
            let sniffed = match types.iter().find(|t| infer::is_mime(&fetched.bytes, t)) {
                Some(wanted) => Some(*wanted),
                None => infer::get(&fetched.bytes).map(|k| k.mime_type()),
            };
            if let Some(sniffed) = sniffed {
                fetched.content_type = sniffed.to_owned();
            }
        }
        if !types.is_empty() && !types.contains(&fetched.content_type.as_str()) {
            return Err(SendError::permanent(format!(
                "{what}: the file is of type {:?}; it must be one of {}",
                fetched.content_type,
                types.join(", ")
            )));
        }
        Ok(fetched)
    }
}

/// `Content-Type`s that say nothing of a file's format (or none sent at all).
const GENERIC_TYPES: &[&str] = &["", "application/octet-stream", "binary/octet-stream"];

/// One cached upload: the provider's media id and when to stop using it.
#[derive(Clone, Debug)]
struct Uploaded {
    media_id: String,
    use_until: Instant,
}

/// The slot of one (type, URL): filled by the first upload, awaited by the sends behind it.
type UploadSlot = Arc<Mutex<Option<Uploaded>>>;

/// One account's uploaded media ids by (type, URL), single-flight.
#[derive(Debug)]
pub struct UploadCache {
    /// How long an uploaded id is used: the provider's lifetime minus a margin.
    ttl: Duration,
    entries: StdMutex<HashMap<(String, String), UploadSlot>>,
}

impl UploadCache {
    /// A cache whose ids are used for `ttl` after their upload started.
    pub fn new(ttl: Duration) -> Self {
        UploadCache {
            ttl,
            entries: StdMutex::new(HashMap::new()),
        }
    }

    /// The media id for (`kind`, `url`): cached, or from `upload` (run once however many
    /// sends ask at the same time; the others wait for it). A failed upload is not cached.
    pub async fn get_or_upload<F, Fut>(
        &self,
        kind: &str,
        url: &str,
        upload: F,
    ) -> Result<String, SendError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<String, SendError>>,
    {
        let slot = {
            // A poisoned map only means another send panicked mid-insert; the map is intact.
            let mut entries = self
                .entries
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = Instant::now();
            // Drop expired, idle entries so the map does not grow with every URL ever sent.
            entries.retain(|_, slot| {
                Arc::strong_count(slot) > 1
                    || slot
                        .try_lock()
                        .map(|e| e.as_ref().is_some_and(|u| u.use_until > now))
                        .unwrap_or(true)
            });
            entries
                .entry((kind.to_owned(), url.to_owned()))
                .or_default()
                .clone()
        };
        // Held across the upload: this is the single flight.
        let mut entry = slot.lock().await;
        if let Some(u) = entry.as_ref().filter(|u| u.use_until > Instant::now()) {
            debug!(kind, "media id from the cache");
            return Ok(u.media_id.clone());
        }
        let started = Instant::now();
        let media_id = upload().await?;
        *entry = Some(Uploaded {
            media_id: media_id.clone(),
            use_until: started + self.ttl,
        });
        Ok(media_id)
    }

    /// Forgets the id cached for (`kind`, `url`) if it is still `media_id`, the one the
    /// provider refused: the next [`Self::get_or_upload`] uploads again. A newer id (another
    /// send already uploaded again) is kept, so concurrent refusals cause one re-upload.
    pub async fn forget(&self, kind: &str, url: &str, media_id: &str) {
        let slot = {
            let entries = self
                .entries
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            entries.get(&(kind.to_owned(), url.to_owned())).cloned()
        };
        let Some(slot) = slot else {
            return;
        };
        // Waits for an upload in flight: it may be replacing this very id.
        let mut entry = slot.lock().await;
        if entry.as_ref().is_some_and(|u| u.media_id == media_id) {
            debug!(kind, "forgetting a media id the provider refused");
            *entry = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn concurrent_asks_for_one_url_upload_once() -> anyhow::Result<()> {
        let cache = Arc::new(UploadCache::new(Duration::from_secs(3600)));
        let uploads = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Notify::new());
        let mut handles = Vec::new();
        for _ in 0..5 {
            let (cache, uploads, gate) = (cache.clone(), uploads.clone(), gate.clone());
            handles.push(tokio::spawn(async move {
                cache
                    .get_or_upload("image", "https://x/a.png", || async move {
                        uploads.fetch_add(1, Ordering::SeqCst);
                        gate.notified().await;
                        Ok("m1".to_owned())
                    })
                    .await
            }));
        }
        // Let every task reach the slot, then finish the one upload.
        while uploads.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        gate.notify_one();
        for h in handles {
            assert_eq!(h.await??, "m1");
        }
        assert_eq!(uploads.load(Ordering::SeqCst), 1);
        Ok(())
    }

    #[tokio::test]
    async fn a_refused_id_is_forgotten_once_and_a_newer_one_kept() -> anyhow::Result<()> {
        let cache = UploadCache::new(Duration::from_secs(3600));
        let id = |s: &'static str| move || async move { Ok::<_, SendError>(s.to_owned()) };
        assert_eq!(cache.get_or_upload("image", "u", id("a")).await?, "a");
        cache.forget("image", "u", "a").await;
        assert_eq!(cache.get_or_upload("image", "u", id("b")).await?, "b");
        // A late refusal of the old id leaves the new one alone.
        cache.forget("image", "u", "a").await;
        assert_eq!(cache.get_or_upload("image", "u", id("c")).await?, "b");
        // Nothing cached for that URL: nothing to do.
        cache.forget("image", "other", "b").await;
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_id_is_uploaded_again_and_a_failure_is_not_cached() -> anyhow::Result<()> {
        let cache = UploadCache::new(Duration::from_secs(60));
        let id = |s: &'static str| move || async move { Ok::<_, SendError>(s.to_owned()) };
        assert_eq!(cache.get_or_upload("file", "u", id("a")).await?, "a");
        assert_eq!(cache.get_or_upload("file", "u", id("b")).await?, "a");
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(cache.get_or_upload("file", "u", id("c")).await?, "c");
        let failed = cache
            .get_or_upload("file", "v", || async { Err(SendError::transient("down")) })
            .await;
        assert!(failed.is_err());
        assert_eq!(cache.get_or_upload("file", "v", id("d")).await?, "d");
        Ok(())
    }
}
