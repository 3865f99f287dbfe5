//! WeCom's `errcode` → outcome class (providers.md §2.5), shared by application messages,
//! `gettoken` and group robots. Branch on `errcode`, never on `errmsg` (WeCom may change it).

use std::time::Duration;

use crate::senders::{OutcomeClass, SendError};

/// 45009 is a per-minute or per-hour block; a per-minute block lasts 60 s (providers.md §2.4),
/// the shortest wait that can help.
pub const FREQUENCY_WAIT: Duration = Duration::from_secs(60);
/// 45033 (too many concurrent calls): a short pause is enough.
pub const CONCURRENCY_WAIT: Duration = Duration::from_secs(1);
/// 130101, a group robot over its 20 messages a minute: WeCom throttles it for about ten
/// minutes (providers-media.md §2.3), so trying sooner only fails again.
pub const ROBOT_THROTTLE_WAIT: Duration = Duration::from_secs(600);

/// 40007, invalid media_id: the id expired (3 days) or WeCom dropped it early. When the id
/// was uploaded from a link, uploading again and resending once can help
/// (providers-media.md §2.1); a second 40007 is PERMANENT.
pub const INVALID_MEDIA_ID: i64 = 40007;

/// The access token is invalid (40014) or expired (42001): refresh once and retry.
pub fn is_token_rejected(errcode: i64) -> bool {
    matches!(errcode, 40014 | 42001)
}

/// Classifies a non-zero `errcode`. `is_retry` decides codes not in the table: TRANSIENT the
/// first time (a new code may be temporary), PERMANENT when an earlier attempt already saw
/// the provider (a design choice; providers.md §2.5 "Other / unknown").
pub fn classify(errcode: i64, errmsg: &str, is_retry: bool) -> SendError {
    use OutcomeClass::*;
    let message = format!("wecom errcode {errcode}: {errmsg}");
    let (class, retry_after) = match errcode {
        // System busy: WeCom says retry later, at most 3 times (the task's budget bounds it).
        -1 => (Transient, None),
        45009 => (RateLimited, Some(FREQUENCY_WAIT)),
        45033 => (RateLimited, Some(CONCURRENCY_WAIT)),
        130101 => (RateLimited, Some(ROBOT_THROTTLE_WAIT)),
        // Token still rejected after the one refresh: the app's credentials are the problem.
        40014 | 42001 => (AccountUnavailable, None),
        // Secret, corp id, allow-listed IP, API permission, disabled app, agent id, seats
        // (45024: relevance to sends unverified): configuration, not the message.
        40001 | 40013 | 40091 | 60020 | 48002 | 48006 | 50003 | 40056 | 45024 => {
            (AccountUnavailable, None)
        }
        // Robot key invalid or removed (93000: the code is unverified).
        93000 => (AccountUnavailable, None),
        // 41001: access_token missing. We never send an empty token, so it is a bug.
        41001 | 81013 | 82001 | 82002 | 82003 | 40003 | 46004 | 60111 | 60011 | 60021 | 40008
        | 44004 | 45002 | 82004 | 40033 | 40035 | 40058 | 40007 | 40004 | 40006 | 45001 | 43004 => {
            (Permanent, None)
        }
        _ if is_retry => (Permanent, None),
        _ => (Transient, None),
    };
    SendError::new(class, message)
        .with_retry_after(retry_after)
        .with_code(errcode)
}

/// Classifies a non-2xx HTTP answer (WeCom reports errors with HTTP 200, so these come from
/// proxies and outages).
pub fn classify_http(status: http::StatusCode, what: &str) -> SendError {
    let message = format!("{what} answered HTTP {}", status.as_u16());
    match status.as_u16() {
        429 => SendError::new(OutcomeClass::RateLimited, message),
        408 | 500..=599 => SendError::transient(message),
        _ => SendError::permanent(message),
    }
}
