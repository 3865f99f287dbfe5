//! The per-token request rate: one GCRA bucket per configured token, so a flood from one token
//! is answered RESOURCE_EXHAUSTED at the edge while every other token keeps its own room.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use super::tokens::TokenSet;

/// The rate a token gets when its entry sets none.
#[derive(Debug, Clone, Copy)]
pub struct DefaultRate {
    /// Requests per second.
    pub per_second: NonZeroU32,
    /// Requests allowed at once above the steady rate.
    pub burst: NonZeroU32,
}

/// One bucket per token name.
#[derive(Debug, Clone, Default)]
pub struct TokenRates {
    buckets: Arc<HashMap<String, DefaultDirectRateLimiter>>,
}

impl TokenRates {
    /// A bucket for every token in `tokens`, with its own rate or `default`.
    pub fn new(tokens: &TokenSet, default: DefaultRate) -> Self {
        let buckets = tokens
            .records()
            .iter()
            .map(|record| {
                let per_second = record.rate.unwrap_or(default.per_second);
                let burst = record.burst.unwrap_or(default.burst.max(per_second));
                let quota = Quota::per_second(per_second).allow_burst(burst);
                (record.principal.name.clone(), RateLimiter::direct(quota))
            })
            .collect();
        TokenRates {
            buckets: Arc::new(buckets),
        }
    }

    /// Spends one request of `token_name`'s bucket; on refusal, how long until one is free.
    /// Names without a bucket (the anonymous caller) are not limited.
    pub fn check(&self, token_name: &str) -> Result<(), Duration> {
        match self.buckets.get(token_name) {
            None => Ok(()),
            Some(bucket) => bucket
                .check()
                .map_err(|not_until| not_until.wait_time_from(DefaultClock::default().now())),
        }
    }
}

/// A client stream whose every message after the first spends one request of the caller's
/// token, as a unary call would (the auth layer spent one for the call itself): a token's rate
/// bounds its imports and recipient streams too, not only how many it opens. Over the rate,
/// the next message waits for room instead of failing the stream, so the client is slowed
/// (HTTP/2 flow control pushes back once the window fills) and nothing it sent is lost.
#[derive(Debug)]
pub struct PacedStream<T> {
    inbound: tonic::Streaming<T>,
    /// The buckets (left in the request's extensions by the auth layer) and the caller's
    /// token name; None without an auth layer.
    rate: Option<(TokenRates, String)>,
    started: bool,
}

/// The request's stream, paced by its caller's token.
pub fn paced<T>(request: tonic::Request<tonic::Streaming<T>>) -> PacedStream<T> {
    let extensions = request.extensions();
    let rate = extensions.get::<TokenRates>().cloned().zip(
        extensions
            .get::<super::Caller>()
            .map(|c| c.principal.name.clone()),
    );
    PacedStream {
        inbound: request.into_inner(),
        rate,
        started: false,
    }
}

impl<T> PacedStream<T> {
    /// The next message, once the token has room for it; None at the stream's end.
    pub async fn message(&mut self) -> Result<Option<T>, tonic::Status> {
        let Some(message) = self.inbound.message().await? else {
            return Ok(None);
        };
        if std::mem::replace(&mut self.started, true) {
            if let Some((rates, token_name)) = &self.rate {
                if let Some(bucket) = rates.buckets.get(token_name) {
                    bucket.until_ready().await;
                }
            }
        }
        Ok(Some(message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::tokens::hash_hex;

    #[test]
    fn a_token_past_its_burst_is_refused_and_others_are_not() {
        let text = format!(
            "[[token]]\nname = \"a\"\nsha256 = \"{}\"\nroles = [\"client\"]\nnamespaces = [\"x\"]\nrate = 1\nburst = 3\n\
             [[token]]\nname = \"b\"\nsha256 = \"{}\"\nroles = [\"client\"]\nnamespaces = [\"x\"]\n",
            hash_hex("ta"),
            hash_hex("tb")
        );
        let tokens = TokenSet::parse(&text, "t").unwrap();
        let rates = TokenRates::new(
            &tokens,
            DefaultRate {
                per_second: NonZeroU32::new(1000).unwrap(),
                burst: NonZeroU32::new(1000).unwrap(),
            },
        );
        for _ in 0..3 {
            rates.check("a").unwrap();
        }
        assert!(rates.check("a").is_err());
        for _ in 0..100 {
            rates.check("b").unwrap();
        }
        assert!(rates.check("anonymous").is_ok());
    }
}
