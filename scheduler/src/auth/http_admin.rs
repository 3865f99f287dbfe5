//! Auth on the HTTP listener: the dashboard (and, when asked, `/metrics`) require an admin
//! token, as `Authorization: Bearer <token>` (Prometheus, scripts) or as the password of HTTP
//! Basic auth (a browser's own login prompt; the user name is ignored).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;

use super::layer::{bearer_token, namespace_for, AuthPolicy};
use super::{Caller, Role};

/// What the HTTP listener protects.
#[derive(Debug, Clone)]
pub struct HttpAuth {
    /// Who may call.
    pub policy: Arc<AuthPolicy>,
    /// Whether `/metrics` requires an admin token too.
    pub protect_metrics: bool,
}

/// Middleware: lets probes through, requires an admin token for the rest, and leaves the
/// [`Caller`] in the request's extensions for the dashboard's handlers.
pub async fn require_admin(
    State(auth): State<HttpAuth>,
    mut request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
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
    if !principal.roles.contains(Role::Admin) {
        return (
            StatusCode::FORBIDDEN,
            format!("token {:?} lacks the admin role", principal.name),
        )
            .into_response();
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
}
