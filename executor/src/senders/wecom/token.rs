//! The access token of one WeCom application: fetched with `gettoken`, cached until shortly
//! before `expires_in`, refreshed single-flight.
//!
//! Single-flight: the cache sits behind one async mutex held across the `gettoken` call, so
//! when many sends find the token missing, expired or rejected at once, one of them fetches
//! and the others wait and reuse its result (WeCom blocks apps that call `gettoken` too often).

use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tracing::{debug, info};

use super::errcode;
use crate::credentials::Secret;
use crate::senders::SendError;

/// Refresh this long before WeCom's expiry (at most a tenth of the token's life), so a token
/// does not expire between our check and WeCom's.
const EXPIRY_MARGIN: Duration = Duration::from_secs(300);

/// The longest a token is kept, whatever `expires_in` says (WeCom documents 7,200 s): a token
/// is fetched again at least daily.
const LONGEST_TOKEN_LIFETIME: Duration = Duration::from_secs(86_400);

/// One `gettoken` call may not hold every waiting send for longer than this.
const GETTOKEN_TIMEOUT: Duration = Duration::from_secs(10);
/// After a failed `gettoken`, sends fail with the same error for this long instead of calling
/// again: failed calls are what gets an app frequency-blocked (about 2,000 an hour).
const FAILURE_HOLD: Duration = Duration::from_secs(5);

/// The application's cached token.
pub(crate) struct TokenCache {
    client: reqwest::Client,
    url: reqwest::Url,
    corp_id: String,
    corp_secret: Secret,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    token: Option<(Secret, Instant)>,
    failed: Option<(SendError, Instant)>,
}

impl fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenCache")
            .field("url", &self.url.as_str())
            .field("corp_id", &self.corp_id)
            .field("corp_secret", &self.corp_secret)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct TokenResponse {
    #[serde(default)]
    errcode: i64,
    #[serde(default)]
    errmsg: String,
    #[serde(default)]
    access_token: String,
    #[serde(default)]
    expires_in: u64,
}

impl TokenCache {
    /// A cache for the app whose `gettoken` endpoint is `url`.
    pub(crate) fn new(
        client: reqwest::Client,
        url: reqwest::Url,
        corp_id: String,
        corp_secret: Secret,
    ) -> Self {
        TokenCache {
            client,
            url,
            corp_id,
            corp_secret,
            state: Mutex::new(State::default()),
        }
    }

    /// The cached token, fetched first if there is none or it is about to expire.
    pub(crate) async fn get(&self) -> Result<Secret, SendError> {
        let mut state = self.state.lock().await;
        if let Some((token, refresh_at)) = &state.token {
            if Instant::now() < *refresh_at {
                return Ok(token.clone());
            }
        }
        self.fetch_into(&mut state).await
    }

    /// A token other than `rejected`, which WeCom just refused (40014/42001): fetched anew
    /// unless another send already replaced it while this one waited for the lock.
    pub(crate) async fn refresh(&self, rejected: &Secret) -> Result<Secret, SendError> {
        let mut state = self.state.lock().await;
        if let Some((token, refresh_at)) = &state.token {
            if token != rejected && Instant::now() < *refresh_at {
                return Ok(token.clone());
            }
        }
        state.token = None;
        // A refresh is forced: an earlier failure says nothing about a now-rejected token.
        state.failed = None;
        self.fetch_into(&mut state).await
    }

    async fn fetch_into(&self, state: &mut State) -> Result<Secret, SendError> {
        if let Some((error, until)) = &state.failed {
            if Instant::now() < *until {
                return Err(error.clone());
            }
        }
        match self.fetch().await {
            Ok((token, expires_in)) => {
                // The provider's figure is capped before it meets the clock: an absurd one
                // (u64::MAX seconds) overflowed `Instant` and panicked the send.
                let expires_in = expires_in.min(LONGEST_TOKEN_LIFETIME);
                let margin = EXPIRY_MARGIN.min(expires_in / 10);
                let refresh_at = Instant::now() + expires_in.saturating_sub(margin);
                state.token = Some((token.clone(), refresh_at));
                state.failed = None;
                info!(corp_id = %self.corp_id, expires_in = expires_in.as_secs(), "wecom access token fetched");
                Ok(token)
            }
            Err(error) => {
                state.token = None;
                state.failed = Some((error.clone(), Instant::now() + FAILURE_HOLD));
                Err(error)
            }
        }
    }

    async fn fetch(&self) -> Result<(Secret, Duration), SendError> {
        let mut url = self.url.clone();
        url.query_pairs_mut()
            .append_pair("corpid", &self.corp_id)
            .append_pair("corpsecret", self.corp_secret.expose());
        debug!(corp_id = %self.corp_id, "calling wecom gettoken");
        let body: TokenResponse = super::call(
            self.client.get(url).timeout(GETTOKEN_TIMEOUT),
            "wecom gettoken",
        )
        .await?;
        if body.errcode != 0 {
            // Classified like a send's errcode: a bad secret or IP is ACCOUNT_UNAVAILABLE, a
            // busy or throttled gettoken is TRANSIENT or RATE_LIMITED, not a dead account.
            let error = errcode::classify(body.errcode, &body.errmsg, false);
            return Err(SendError {
                message: format!("cannot get a wecom access token: {}", error.message),
                ..error
            });
        }
        if body.access_token.is_empty() {
            return Err(SendError::transient(
                "wecom gettoken answered errcode 0 without an access_token",
            ));
        }
        Ok((
            Secret::new(body.access_token),
            Duration::from_secs(body.expires_in),
        ))
    }
}
