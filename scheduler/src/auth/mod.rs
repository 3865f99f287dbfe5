//! Who is calling and what they may touch: bearer tokens with roles, namespaces bound to
//! tokens, the per-token request rate, and the HTTP listener's admin check.
//!
//! The gRPC side is one tower layer ([`layer::AuthLayer`]) in front of every service: it finds
//! the token, checks the role the RPC needs, spends the token's rate, resolves the namespace
//! the request acts in and leaves a [`Caller`] in the request's extensions. Handlers read the
//! namespace with [`namespace_of`], which fails closed when the layer did not run.

pub mod http_admin;
pub mod layer;
pub mod rate;
pub mod tokens;

use tonic::Request;

use crate::error::Error;

/// Metadata key a caller uses to pick one of its token's namespaces.
pub const NAMESPACE_HEADER: &str = "x-herald-namespace";

/// The namespace of anonymous callers and of `"*"` tokens that name none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// What a token lets its holder do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Tasks, templates, schedules and campaigns.
    Client,
    /// The lease stream only.
    Executor,
    /// Accounts, statistics and the dashboard.
    Admin,
    /// Reads the dashboard and the operator's console without acting (support staff).
    Viewer,
}

impl Role {
    /// The role named in a tokens file.
    pub fn parse(name: &str) -> Option<Role> {
        match name {
            "client" => Some(Role::Client),
            "executor" => Some(Role::Executor),
            "admin" => Some(Role::Admin),
            "viewer" => Some(Role::Viewer),
            _ => None,
        }
    }

    /// The role's name, as in the tokens file.
    pub fn name(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::Executor => "executor",
            Role::Admin => "admin",
            Role::Viewer => "viewer",
        }
    }

    fn bit(self) -> u8 {
        match self {
            Role::Client => 1,
            Role::Executor => 2,
            Role::Admin => 4,
            Role::Viewer => 8,
        }
    }
}

/// A set of roles.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoleSet(u8);

impl RoleSet {
    /// Every role: what anonymous callers get when anonymous access is allowed.
    pub const ALL: RoleSet = RoleSet(15);

    /// Adds a role.
    pub fn insert(&mut self, role: Role) {
        self.0 |= role.bit();
    }

    /// Whether the set holds `role`.
    pub fn contains(self, role: Role) -> bool {
        self.0 & role.bit() != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// The namespaces a token may act in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamespaceGrant {
    /// Every namespace (`"*"`); the default one is [`DEFAULT_NAMESPACE`].
    Any,
    /// These, the first being the default.
    Listed(Vec<String>),
}

impl NamespaceGrant {
    /// Whether `namespace` is granted.
    pub fn allows(&self, namespace: &str) -> bool {
        match self {
            NamespaceGrant::Any => true,
            NamespaceGrant::Listed(names) => names.iter().any(|n| n == namespace),
        }
    }

    /// The namespace a request acts in when it names none.
    pub fn default_namespace(&self) -> &str {
        match self {
            NamespaceGrant::Any => DEFAULT_NAMESPACE,
            NamespaceGrant::Listed(names) => names.first().map_or(DEFAULT_NAMESPACE, |n| n),
        }
    }
}

/// An authenticated caller: the token's name (never the token), roles and namespaces.
#[derive(Debug, Clone)]
pub struct Principal {
    /// The token's name from the tokens file, or `anonymous`.
    pub name: String,
    /// What it may do.
    pub roles: RoleSet,
    /// Where it may do it.
    pub namespaces: NamespaceGrant,
}

impl Principal {
    /// The caller when anonymous access is allowed: every role, every namespace.
    pub fn anonymous() -> Self {
        Principal {
            name: "anonymous".into(),
            roles: RoleSet::ALL,
            namespaces: NamespaceGrant::Any,
        }
    }
}

/// Left in a request's extensions by the auth layer: who called and in which namespace.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The authenticated caller.
    pub principal: Principal,
    /// The namespace this request acts in, already checked against the principal's grant.
    pub namespace: String,
}

/// The namespace a request acts in. Fails closed when no auth layer vetted the request.
pub fn namespace_of<T>(request: &Request<T>) -> Result<String, Error> {
    request
        .extensions()
        .get::<Caller>()
        .map(|c| c.namespace.clone())
        .ok_or_else(|| Error::Unauthenticated("request was not authenticated".into()))
}
