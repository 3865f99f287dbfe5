//! The tower layer in front of every gRPC service: authentication, the role check, the
//! per-token rate and the namespace binding, answered with a gRPC status before any handler or
//! database work runs.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http_body_util::BodyExt;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tower::{Layer, Service};

use super::rate::TokenRates;
use super::tokens::TokenSet;
use super::{Caller, Principal, Role, NAMESPACE_HEADER};
use crate::error::Error;
use crate::rules::valid_namespace;

/// What an RPC path requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Health checks and reflection: probes and tools reach them without a token, and they
    /// reveal nothing but the public .proto files.
    Public,
    /// A token holding this role.
    Role(Role),
    /// Any valid token (paths no service serves: the caller learns UNIMPLEMENTED only once
    /// authenticated).
    Authenticated,
}

/// The access rule of a gRPC path (`/package.Service/Method`).
pub fn access_for(path: &str) -> Access {
    let service = path
        .strip_prefix('/')
        .and_then(|p| p.split('/').next())
        .unwrap_or("");
    match service {
        "herald.v1.TaskService"
        | "herald.v1.TemplateService"
        | "herald.v1.ScheduleService"
        | "herald.v1.CampaignService"
        | "herald.v1.SuppressionService" => Access::Role(Role::Client),
        "herald.v1.AudienceService" => Access::Role(Role::Client),
        "herald.v1.LeaseService" => Access::Role(Role::Executor),
        "herald.v1.AccountService" | "herald.v1.StatsService" => Access::Role(Role::Admin),
        "grpc.health.v1.Health"
        | "grpc.reflection.v1.ServerReflection"
        | "grpc.reflection.v1alpha.ServerReflection" => Access::Public,
        _ => Access::Authenticated,
    }
}

/// Everything the layer decides with.
#[derive(Debug)]
pub struct AuthPolicy {
    /// Configured tokens.
    pub tokens: TokenSet,
    /// Whether a request without a token acts as [`Principal::anonymous`].
    pub allow_anonymous: bool,
    /// Per-token buckets.
    pub rates: TokenRates,
    /// Whether the lease stream requires a client certificate (mutual TLS for executors).
    pub executor_cert_required: bool,
}

impl AuthPolicy {
    /// Checks one request's headers and connection; the caller to record, or the refusal.
    pub fn authorize<B>(&self, request: &::http::Request<B>) -> Result<Option<Caller>, Error> {
        let access = access_for(request.uri().path());
        if access == Access::Public {
            return Ok(None);
        }
        let principal = self.principal(request.headers())?;
        if let Access::Role(role) = access {
            if !principal.roles.contains(role) {
                metrics::counter!(crate::telemetry::metrics::AUTH_REFUSED, "reason" => "role")
                    .increment(1);
                return Err(Error::PermissionDenied(format!(
                    "token {:?} lacks the {} role this RPC needs",
                    principal.name,
                    role.name()
                )));
            }
            if role == Role::Executor && self.executor_cert_required && !has_client_cert(request) {
                metrics::counter!(crate::telemetry::metrics::AUTH_REFUSED, "reason" => "client_cert")
                    .increment(1);
                return Err(Error::Unauthenticated(
                    "the lease stream requires a client certificate (mutual TLS)".into(),
                ));
            }
        }
        if let Err(wait) = self.rates.check(&principal.name) {
            metrics::counter!(crate::telemetry::metrics::AUTH_REFUSED, "reason" => "rate")
                .increment(1);
            return Err(Error::ResourceExhausted(format!(
                "token {:?} is over its request rate; retry in {} ms",
                principal.name,
                wait.as_millis().max(1)
            )));
        }
        let namespace = namespace_for(&principal, request.headers())?;
        Ok(Some(Caller {
            principal,
            namespace,
        }))
    }

    /// The caller the `authorization: Bearer` header names.
    pub fn principal(&self, headers: &::http::HeaderMap) -> Result<Principal, Error> {
        let token = match headers.get(::http::header::AUTHORIZATION) {
            None => None,
            Some(value) => Some(value.to_str().ok().and_then(bearer_token).ok_or_else(|| {
                Error::Unauthenticated("authorization must be `Bearer <token>`".into())
            })?),
        };
        self.principal_for(token)
    }

    /// The caller holding `token`, or the anonymous caller when none is presented and that is
    /// allowed.
    pub fn principal_for(&self, token: Option<&str>) -> Result<Principal, Error> {
        let Some(token) = token else {
            if self.allow_anonymous {
                return Ok(Principal::anonymous());
            }
            metrics::counter!(crate::telemetry::metrics::AUTH_REFUSED, "reason" => "missing")
                .increment(1);
            return Err(Error::Unauthenticated(
                "missing token: send the metadata `authorization: Bearer <token>`".into(),
            ));
        };
        match self.tokens.find(token) {
            Some(record) => Ok(record.principal.clone()),
            None => {
                metrics::counter!(crate::telemetry::metrics::AUTH_REFUSED, "reason" => "unknown")
                    .increment(1);
                Err(Error::Unauthenticated("unknown token".into()))
            }
        }
    }
}

/// The namespace a request acts in: the one its `x-herald-namespace` header names, which must
/// be a valid name the principal is granted, or else the principal's default. Shared by the gRPC
/// layer and the HTTP listener so both apply the same rule.
pub fn namespace_for(principal: &Principal, headers: &::http::HeaderMap) -> Result<String, Error> {
    let Some(value) = headers.get(NAMESPACE_HEADER) else {
        return Ok(principal.namespaces.default_namespace().to_owned());
    };
    let name = value.to_str().unwrap_or("");
    if !valid_namespace(name) {
        return Err(Error::invalid(
            NAMESPACE_HEADER,
            "not a namespace name (1 to 64 of a-z, 0-9, '-', '_', '.')",
        ));
    }
    if !principal.namespaces.allows(name) {
        metrics::counter!(crate::telemetry::metrics::AUTH_REFUSED, "reason" => "namespace")
            .increment(1);
        return Err(Error::PermissionDenied(format!(
            "token {:?} may not act in namespace {name:?}",
            principal.name
        )));
    }
    Ok(name.to_owned())
}

/// The token of a `Bearer <token>` header value (scheme case-insensitive).
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Whether the connection presented a client certificate. rustls has already verified it
/// against the configured client CA; a connection with an unverifiable one never gets here.
fn has_client_cert<B>(request: &::http::Request<B>) -> bool {
    request
        .extensions()
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|info| info.peer_certs())
        .is_some_and(|certs| !certs.is_empty())
}

/// tonic refuses a message over the decoding limit with OUT_OF_RANGE; gRPC's status code
/// table names RESOURCE_EXHAUSTED for "message larger than the configured maximum", which is
/// what clients classify retries on. The status is rewritten wherever it travels: in the
/// response headers or in the trailers.
fn oversize_is_resource_exhausted(
    mut response: ::http::Response<tonic::body::Body>,
) -> ::http::Response<tonic::body::Body> {
    rewrite_oversize_status(response.headers_mut());
    response.map(|body| {
        tonic::body::Body::new(body.map_frame(|frame| match frame.into_trailers() {
            Ok(mut trailers) => {
                rewrite_oversize_status(&mut trailers);
                http_body::Frame::trailers(trailers)
            }
            Err(frame) => frame,
        }))
    })
}

fn rewrite_oversize_status(headers: &mut ::http::HeaderMap) {
    let is_oversize = headers.get("grpc-status").and_then(|v| v.to_str().ok()) == Some("11")
        && headers
            .get("grpc-message")
            .and_then(|v| v.to_str().ok())
            // tonic percent-encodes spaces in grpc-message.
            .is_some_and(|m| m.replace("%20", " ").contains("message length too large"));
    if is_oversize {
        headers.insert("grpc-status", ::http::HeaderValue::from_static("8"));
    }
}

/// Applies an [`AuthPolicy`] to every request of the wrapped service.
#[derive(Debug, Clone)]
pub struct AuthLayer {
    policy: Arc<AuthPolicy>,
}

impl AuthLayer {
    /// A layer enforcing `policy`.
    pub fn new(policy: AuthPolicy) -> Self {
        Self::shared(Arc::new(policy))
    }

    /// A layer enforcing a policy shared with the HTTP listener.
    pub fn shared(policy: Arc<AuthPolicy>) -> Self {
        AuthLayer { policy }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            inner,
            policy: self.policy.clone(),
        }
    }
}

/// The service [`AuthLayer`] wraps around the gRPC routes.
#[derive(Debug, Clone)]
pub struct AuthService<S> {
    inner: S,
    policy: Arc<AuthPolicy>,
}

impl<S, B> Service<::http::Request<B>> for AuthService<S>
where
    S: Service<::http::Request<B>, Response = ::http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = ::http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: ::http::Request<B>) -> Self::Future {
        match self.policy.authorize(&request) {
            Ok(caller) => {
                if let Some(caller) = caller {
                    // For the client streams' per-message pacing (`rate::paced`): one `Arc`.
                    request.extensions_mut().insert(self.policy.rates.clone());
                    request.extensions_mut().insert(caller);
                }
                // The clone is not driven to readiness; the ready one is used for this call.
                let clone = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, clone);
                let call = inner.call(request);
                Box::pin(async move { Ok(oversize_is_resource_exhausted(call.await?)) })
            }
            Err(e) => {
                let status = tonic::Status::from(e);
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_herald_service_needs_a_role_and_probes_do_not() {
        assert_eq!(
            access_for("/herald.v1.TaskService/CreateTask"),
            Access::Role(Role::Client)
        );
        assert_eq!(
            access_for("/herald.v1.LeaseService/Lease"),
            Access::Role(Role::Executor)
        );
        assert_eq!(
            access_for("/herald.v1.StatsService/CountTasks"),
            Access::Role(Role::Admin)
        );
        assert_eq!(access_for("/grpc.health.v1.Health/Check"), Access::Public);
        assert_eq!(access_for("/herald.v2.Anything/X"), Access::Authenticated);
        assert_eq!(access_for("garbage"), Access::Authenticated);
    }

    #[test]
    fn bearer_tokens_are_parsed_strictly() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("abc"), None);
    }
}
