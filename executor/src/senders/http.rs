//! What every HTTP sender shares: one client (one connection pool, no redirects), the
//! classifier of transport failures, `Retry-After` parsing and error-body excerpts. How a
//! provider's *answers* map to outcome classes stays in each sender's module.

use std::time::{Duration, SystemTime};

use http::HeaderMap;

use super::SendError;

/// How much of an error response body goes into an error message.
pub const BODY_EXCERPT: usize = 512;

/// The HTTP client shared by every sender built from one config file: rustls, and no
/// redirects (a 3xx is an answer to classify, not an instruction to follow with credentials).
pub fn client() -> Result<reqwest::Client, reqwest::Error> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("herald-executor/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// Classifies a failed HTTP exchange (`what` names it, e.g. `"wecom message/send"`): a request
/// that could not be built is PERMANENT; anything else (refused or reset connection, timeout,
/// a body cut short) is TRANSIENT, since it may pass; past the connect, the provider may have
/// seen the message, so its outcome is unknown. The URL is left out of the text, since some carry credentials (WeCom's
/// access_token, a robot's key, a webhook URL given as a secret); the error's causes are kept,
/// as reqwest's own message alone says little.
pub fn transport_error(what: &str, e: reqwest::Error) -> SendError {
    let e = e.without_url();
    let failure = if e.is_builder() {
        "could not be built"
    } else if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not connect"
    } else {
        "failed"
    };
    let mut message = format!("{what} {failure}: {e}");
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    if e.is_builder() {
        SendError::permanent(message)
    } else if e.is_connect() {
        // No connection, so no request: the provider cannot have seen it.
        SendError::transient(message)
    } else {
        SendError::transient(message).with_outcome_unknown()
    }
}

/// Parses `Retry-After`: delay seconds or an HTTP-date (a date in the past means now).
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// The first [`BODY_EXCERPT`] bytes of `body`, as lossy UTF-8.
pub fn excerpt(body: &[u8]) -> String {
    String::from_utf8_lossy(body.get(..BODY_EXCERPT).unwrap_or(body)).into_owned()
}

/// The first [`BODY_EXCERPT`] bytes of a response's body, read no further, as lossy UTF-8.
pub async fn body_excerpt(mut response: reqwest::Response) -> String {
    let mut buf = Vec::with_capacity(BODY_EXCERPT);
    while buf.len() < BODY_EXCERPT {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let take = (BODY_EXCERPT - buf.len()).min(chunk.len());
                buf.extend_from_slice(&chunk[..take]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::OutcomeClass;

    #[test]
    fn retry_after_parsing() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let headers = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(http::header::RETRY_AFTER, v.parse().unwrap());
            h
        };
        assert_eq!(
            retry_after(&headers("120"), now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(retry_after(&headers(" 0 "), now), Some(Duration::ZERO));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(
            retry_after(&headers(&later), now),
            Some(Duration::from_secs(90))
        );
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(90));
        assert_eq!(retry_after(&headers(&earlier), now), Some(Duration::ZERO));
        assert_eq!(retry_after(&headers("soon"), now), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }

    #[test]
    fn excerpt_is_cut_at_512_bytes() {
        assert_eq!(excerpt(b"short"), "short");
        assert_eq!(excerpt(&[b'x'; 5000]).len(), BODY_EXCERPT);
    }

    #[tokio::test]
    async fn refused_connection_is_transient_and_keeps_the_url_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let e = client()
            .unwrap()
            .get(format!("http://{addr}/send?access_token=s3cret"))
            .send()
            .await
            .unwrap_err();
        let err = transport_error("provider call", e);
        assert_eq!(err.class, OutcomeClass::Transient);
        assert!(
            err.message.starts_with("provider call could not connect: "),
            "{}",
            err.message
        );
        assert!(!err.message.contains("s3cret"), "{}", err.message);
        assert!(!err.outcome_unknown, "nothing was sent: {}", err.message);
    }

    #[tokio::test]
    async fn a_connection_dropped_after_the_request_leaves_the_outcome_unknown() {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // A provider that takes the request, then drops the connection without answering.
        let provider = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = socket.read(&mut buf).await;
        });
        let e = client()
            .unwrap()
            .post(format!("http://{addr}/messages"))
            .body("{}")
            .send()
            .await
            .unwrap_err();
        provider.await.unwrap();
        let err = transport_error("provider call", e);
        assert_eq!(err.class, OutcomeClass::Transient);
        assert!(err.outcome_unknown, "{}", err.message);
    }

    #[tokio::test]
    async fn a_request_that_cannot_be_built_is_permanent() {
        let e = client()
            .unwrap()
            .get("http://127.0.0.1:1/")
            .header("bad header name", "x")
            .send()
            .await
            .unwrap_err();
        let err = transport_error("provider call", e);
        assert_eq!(err.class, OutcomeClass::Permanent, "{}", err.message);
    }
}
