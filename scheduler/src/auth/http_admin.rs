//! Auth on the HTTP listener: the dashboard and the console (and, when asked, `/metrics`)
//! require an admin or viewer token, as `Authorization: Bearer <token>` (Prometheus, scripts)
//! or as the password of HTTP Basic auth (a browser's own login prompt; the user name is
//! ignored). Reading needs either role; anything else (a POST) needs admin and must come from
//! the page's own origin (see [`same_origin`]).
//!
//! The namespace is the `x-herald-namespace` header's, else the `ns` query parameter's (a page
//! picks it in a form, so every link and form of the console carries it), else the token's
//! default, checked against the token's grant exactly as on the gRPC side.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;

use super::layer::{bearer_token, namespace_for, AuthPolicy};
use super::{Caller, Role, NAMESPACE_HEADER};

/// What the HTTP listener protects.
#[derive(Debug, Clone)]
pub struct HttpAuth {
    /// Who may call.
    pub policy: Arc<AuthPolicy>,
    /// Whether `/metrics` requires an admin token too.
    pub protect_metrics: bool,
}

/// Middleware: lets probes through, requires an admin or viewer token for reads and an admin
/// token for writes, and leaves the [`Caller`] in the request's extensions for the dashboard's
/// and console's handlers.
pub async fn require_admin(
    State(auth): State<HttpAuth>,
    mut request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path().to_owned();
    let public =
        path == "/healthz" || path == "/readyz" || (path == "/metrics" && !auth.protect_metrics);
    if public {
        return next.run(request).await;
    }
    let token = match request.headers().get(header::AUTHORIZATION) {
        None => None,
        Some(value) => match value.to_str().ok().and_then(token_of_header) {
            Some(token) => Some(token),
            None => return challenge("authorization must be Bearer or Basic"),
        },
    };
    let principal = match auth.policy.principal_for(token.as_deref()) {
        Ok(p) => p,
        Err(e) => return challenge(&e.to_string()),
    };
    // Without a token, any page the operator's browser opens could reach a listener on their
    // machine by a name of its own that it points at 127.0.0.1 (DNS rebinding): the browser
    // would count the page as same-origin and send its reads and actions. Such a request names
    // the attacker's host, so anonymous callers are served only under names no other site can
    // own. A token's caller is safe without this: the browser holds the credentials for the
    // listener's own origin only.
    if token.is_none() && !rebinding_safe_host(request.headers()) {
        metrics::counter!(crate::telemetry::metrics::AUTH_REFUSED, "reason" => "host").increment(1);
        return (
            StatusCode::FORBIDDEN,
            "anonymous access is served only under an IP address or localhost; \
             send a token to use another host name",
        )
            .into_response();
    }
    let reads = matches!(*request.method(), Method::GET | Method::HEAD);
    let allowed = principal.roles.contains(Role::Admin)
        || (reads && principal.roles.contains(Role::Viewer) && path != "/metrics");
    if !allowed {
        let needs = if reads { "admin or viewer" } else { "admin" };
        return (
            StatusCode::FORBIDDEN,
            format!("token {:?} lacks the {needs} role", principal.name),
        )
            .into_response();
    }
    // The metrics span every namespace (account ids, their counts, schedule ids): a token
    // bound to some namespaces would read the others' there.
    if path == "/metrics" && !matches!(principal.namespaces, super::NamespaceGrant::Any) {
        return (
            StatusCode::FORBIDDEN,
            format!(
                "token {:?} is bound to some namespaces; /metrics spans every namespace, so it \
                 needs a token for all of them (\"*\")",
                principal.name
            ),
        )
            .into_response();
    }
    // The same per-token rate as the gRPC listener's: a console page or CSV export reads far
    // more than one RPC, so a token limited there is limited here too.
    if let Err(wait) = auth.policy.rates.check(&principal.name) {
        metrics::counter!(crate::telemetry::metrics::AUTH_REFUSED, "reason" => "rate").increment(1);
        let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, seconds.max(1).to_string())],
            format!(
                "token {:?} is over its request rate; retry in {} ms",
                principal.name,
                wait.as_millis().max(1)
            ),
        )
            .into_response();
    }
    if !reads && !same_origin(request.headers()) {
        return (
            StatusCode::FORBIDDEN,
            "cross-origin request refused: actions must come from the console's own pages",
        )
            .into_response();
    }
    if !request.headers().contains_key(NAMESPACE_HEADER) {
        if let Some(ns) = query_namespace(request.uri().query()) {
            match HeaderValue::from_str(&ns) {
                Ok(value) => {
                    request.headers_mut().insert(NAMESPACE_HEADER, value);
                }
                Err(_) => {
                    return (StatusCode::BAD_REQUEST, "ns is not a namespace name").into_response()
                }
            }
        }
    }
    let namespace = match namespace_for(&principal, request.headers()) {
        Ok(namespace) => namespace,
        Err(e) => {
            let code = if matches!(e, crate::error::Error::InvalidArgument(_)) {
                StatusCode::BAD_REQUEST
            } else {
                StatusCode::FORBIDDEN
            };
            return (code, e.to_string()).into_response();
        }
    };
    request.extensions_mut().insert(Caller {
        principal,
        namespace,
    });
    next.run(request).await
}

/// Whether a state-changing request comes from this listener's own pages. Browsers tell with
/// `Sec-Fetch-Site` (every current one sends it); older ones send `Origin` on a POST, which
/// must then name the host the request was sent to. A request with neither is not from a
/// browser (a script with its own token), which a cross-site page cannot make. This is the
/// rule of Go's `http.CrossOriginProtection`: no token to store, and safe across replicas.
pub fn same_origin(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        return matches!(site.to_str(), Ok("same-origin" | "none"));
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, rest)| rest);
    matches!((origin_host, host), (Some(o), Some(h)) if o.eq_ignore_ascii_case(h))
}

/// Whether the request's `Host` is one that no other site can point at this listener: an IP
/// address, `localhost` or a name under `.localhost` (which browsers resolve to loopback
/// themselves, RFC 6761). A request without one is not from a browser.
pub fn rebinding_safe_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST) else {
        return true;
    };
    let Ok(host) = host.to_str() else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(bracketed) => match bracketed.split_once(']') {
            Some((v6, _)) => return v6.parse::<std::net::Ipv6Addr>().is_ok(),
            None => return false,
        },
        None => match host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => host,
        },
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name.parse::<std::net::Ipv4Addr>().is_ok()
        || name == "localhost"
        || name.ends_with(".localhost")
}

/// The `ns` parameter of a query string, if present and not empty.
fn query_namespace(query: Option<&str>) -> Option<String> {
    query?.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (key == "ns" && !value.is_empty()).then(|| value.to_owned())
    })
}

/// The token of a Bearer header, or the password of a Basic one.
fn token_of_header(value: &str) -> Option<String> {
    if let Some(token) = bearer_token(value) {
        return Some(token.to_owned());
    }
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (_, password) = text.split_once(':')?;
    (!password.is_empty()).then(|| password.to_owned())
}

fn challenge(message: &str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Basic realm=\"herald\"")],
        message.to_owned(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_bearer_and_basic_passwords() {
        assert_eq!(token_of_header("Bearer t1").as_deref(), Some("t1"));
        let basic = base64::engine::general_purpose::STANDARD.encode("admin:t2");
        assert_eq!(
            token_of_header(&format!("Basic {basic}")).as_deref(),
            Some("t2")
        );
        let empty = base64::engine::general_purpose::STANDARD.encode("admin:");
        assert_eq!(token_of_header(&format!("Basic {empty}")), None);
        assert_eq!(token_of_header("Digest x"), None);
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn refuses_cross_origin_writes() {
        assert!(same_origin(&headers(&[("sec-fetch-site", "same-origin")])));
        assert!(!same_origin(&headers(&[("sec-fetch-site", "cross-site")])));
        assert!(!same_origin(&headers(&[("sec-fetch-site", "same-site")])));
        assert!(same_origin(&headers(&[
            ("origin", "http://127.0.0.1:8080"),
            ("host", "127.0.0.1:8080")
        ])));
        assert!(!same_origin(&headers(&[
            ("origin", "https://evil.example"),
            ("host", "127.0.0.1:8080")
        ])));
        assert!(same_origin(&headers(&[])));
    }

    #[test]
    fn serves_anonymous_callers_only_under_names_no_site_can_own() {
        for host in [
            "127.0.0.1:8080",
            "10.1.2.3",
            "[::1]:8080",
            "localhost:8080",
            "LOCALHOST.",
            "console.localhost:80",
        ] {
            assert!(rebinding_safe_host(&headers(&[("host", host)])), "{host}");
        }
        for host in [
            "evil.example:8080",
            "127.0.0.1.nip.io",
            "localhost.evil.example",
            "[::1",
        ] {
            assert!(!rebinding_safe_host(&headers(&[("host", host)])), "{host}");
        }
        assert!(rebinding_safe_host(&headers(&[])));
    }

    #[test]
    fn reads_the_namespace_parameter() {
        assert_eq!(
            query_namespace(Some("a=1&ns=shop")).as_deref(),
            Some("shop")
        );
        assert_eq!(query_namespace(Some("ns=")), None);
        assert_eq!(query_namespace(None), None);
    }
}
