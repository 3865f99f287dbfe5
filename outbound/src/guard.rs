//! The outbound address guard: fetching a URL a client gave (a media link, later a variables
//! source) without letting the client reach herald's own network (SSRF).
//!
//! - https only (a plain `http://` URL is refused before any connection);
//! - the host's addresses are checked **after** DNS resolution, by the client's own resolver
//!   ([`GuardedResolver`]), so the address checked is the address connected to and a DNS
//!   rebinding answer cannot slip in between; an IP-literal host is checked before the request
//!   and on every redirect (the resolver never sees it);
//! - refused unless the operator allows them ([`AddressPolicy`]): loopback, private (RFC 1918),
//!   link-local (169.254/16, which holds the cloud metadata service at 169.254.169.254, and
//!   fe80::/10), CGNAT (100.64/10), unique-local v6 (fc00::/7), unspecified, broadcast,
//!   multicast, documentation and benchmarking ranges, IPv4-mapped v6 forms of all of these,
//!   and the metadata addresses of the large clouds (`fd00:ec2::254`);
//! - no proxy from the environment (a proxy would resolve the host itself);
//! - a cap on the size of the body and on the time of the whole fetch.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::Url;

/// Which addresses fetches may reach beyond the public internet.
#[derive(Clone, Debug, Default)]
pub struct AddressPolicy {
    /// Allow every non-public address (a private deployment whose media store is internal).
    pub allow_private_networks: bool,
    /// Networks allowed although non-public, e.g. `10.1.2.0/24` for one internal store.
    pub allowed_networks: Vec<IpNet>,
}

impl AddressPolicy {
    /// Whether a fetch may connect to `ip`.
    pub fn permits(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        !is_non_public(ip)
            || self.allow_private_networks
            || self.allowed_networks.iter().any(|n| n.contains(&ip))
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// Whether `ip` is anything but a public unicast address.
pub fn is_non_public(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(ip) => {
            let [a, b, c, _] = ip.octets();
            ip.is_loopback()
                || ip.is_private()
                || ip.is_link_local()
                || ip.is_unspecified()
                || ip.is_broadcast()
                || ip.is_multicast()
                || ip.is_documentation()
                || a == 0
                // CGNAT, 100.64.0.0/10.
                || (a == 100 && (64..128).contains(&b))
                // IETF protocol assignments, 192.0.0.0/24.
                || (a == 192 && b == 0 && c == 0)
                // Benchmarking, 198.18.0.0/15.
                || (a == 198 && (18..20).contains(&b))
                // Reserved, 240.0.0.0/4.
                || a >= 240
        }
        IpAddr::V6(ip) => {
            let first = ip.segments()[0];
            ip.is_loopback()
                || ip.is_unspecified()
                || ip.is_multicast()
                // Unique local, fc00::/7 (AWS metadata fd00:ec2::254 is in it).
                || (first & 0xfe00) == 0xfc00
                // Link-local, fe80::/10.
                || (first & 0xffc0) == 0xfe80
                // Documentation, 2001:db8::/32.
                || (first == 0x2001 && ip.segments()[1] == 0x0db8)
                // NAT64 and 6to4 can embed any IPv4 address: refuse them rather than decode.
                || (first == 0x0064 && ip.segments()[1] == 0xff9b)
                || first == 0x2002
        }
    }
}

/// Why a fetch was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The URL or an address it resolves to is not allowed (SSRF guard). Never worth retrying.
    #[error("refused to fetch {url}: {reason}")]
    Refused {
        /// The URL (without its query, which may hold a token).
        url: String,
        /// Why.
        reason: String,
    },
    /// The body is larger than the cap.
    #[error("{url} is larger than {max} bytes")]
    TooLarge {
        /// The URL.
        url: String,
        /// The cap.
        max: u64,
    },
    /// The server answered with an error status.
    #[error("{url} answered HTTP {status}")]
    Status {
        /// The URL.
        url: String,
        /// The status.
        status: u16,
    },
    /// Connecting, TLS, timeout or a cut connection.
    #[error("fetching {url}: {source}")]
    Network {
        /// The URL.
        url: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
}

impl FetchError {
    /// Whether the same fetch may succeed later (network trouble, a 5xx or 429); a refusal, an
    /// oversized body or another status will not.
    pub fn is_retryable(&self) -> bool {
        match self {
            FetchError::Network { source, .. } => !is_guard_refusal(source),
            FetchError::Status { status, .. } => *status >= 500 || *status == 429,
            FetchError::Refused { .. } | FetchError::TooLarge { .. } => false,
        }
    }
}

/// Whether a transport error is the resolver's or the redirect policy's refusal.
fn is_guard_refusal(e: &reqwest::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<Refusal>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// The resolver's and redirect policy's error: which address or URL was refused.
#[derive(Debug)]
struct Refusal(String);

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refusal {}

/// The error type of reqwest's resolvers.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A DNS resolver that drops the addresses the policy refuses, and fails when none is left:
/// what it returns is what the client connects to.
#[derive(Clone, Debug)]
pub struct GuardedResolver {
    policy: Arc<AddressPolicy>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map_err(|e| Box::new(e) as BoxError)?
                .collect();
            let allowed: Vec<SocketAddr> = addrs
                .iter()
                .copied()
                .filter(|a| policy.permits(a.ip()))
                .collect();
            if allowed.is_empty() {
                // The addresses go to the operator's log only: the refusal reaches the client
                // (a run's or a task's error), and naming them would map the internal network
                // for anyone who can create a schedule or a media task.
                let shown: Vec<String> = addrs.iter().map(|a| a.ip().to_string()).collect();
                tracing::warn!(
                    host = %host,
                    addresses = %shown.join(", "),
                    "refused a fetch: the name resolves only to non-public addresses"
                );
                return Err(Box::new(Refusal(format!(
                    "{host} resolves only to non-public addresses"
                ))) as BoxError);
            }
            Ok::<Addrs, BoxError>(Box::new(allowed.into_iter()))
        })
    }
}

/// Checks a URL before it is requested (and each redirect's target): https, and an IP-literal
/// host the policy permits.
pub fn check_url(url: &Url, policy: &AddressPolicy) -> Result<(), String> {
    if url.scheme() != "https" {
        return Err(format!("only https URLs are fetched, not {}", url.scheme()));
    }
    let Some(host) = url.host_str() else {
        return Err("the URL has no host".into());
    };
    // An IPv6 literal comes bracketed; a name does not parse as an address.
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = literal.parse::<IpAddr>() {
        if !policy.permits(ip) {
            return Err(format!("{ip} is not a public address"));
        }
    }
    Ok(())
}

/// The URL without its credentials, query and fragment (where presigned URLs and sources keep
/// their tokens), for errors and logs.
pub fn shown(url: &Url) -> String {
    let mut u = url.clone();
    u.set_query(None);
    u.set_fragment(None);
    // Both fail only for URLs that cannot have credentials, which then have none to hide.
    let _ = u.set_password(None);
    let _ = u.set_username("");
    u.to_string()
}

/// Limits of one fetch.
#[derive(Clone, Copy, Debug)]
pub struct FetchLimits {
    /// Largest body, in bytes.
    pub max_bytes: u64,
    /// The whole fetch, redirects and body included.
    pub timeout: Duration,
}

/// A fetched body.
#[derive(Clone, Debug)]
pub struct Fetched {
    /// The bytes.
    pub bytes: bytes::Bytes,
    /// The `Content-Type` the server gave, without parameters, lower-cased; empty when none.
    pub content_type: String,
    /// The last path segment of the final URL, for a file name; empty when none.
    pub file_name: String,
}

/// Fetches URLs for clients, through the guard.
#[derive(Clone, Debug)]
pub struct GuardedClient {
    client: reqwest::Client,
    policy: Arc<AddressPolicy>,
}

/// Building the client failed (the TLS backend or a CA certificate).
#[derive(Debug, thiserror::Error)]
#[error("cannot build the guarded HTTP client: {0}")]
pub struct BuildError(#[source] reqwest::Error);

impl GuardedClient {
    /// A client for `policy`, trusting the system's roots plus `extra_roots` (PEM
    /// certificates, e.g. a private CA of an internal media store). `connect_timeout` bounds
    /// each connection.
    pub fn new(
        policy: AddressPolicy,
        extra_roots: Vec<reqwest::Certificate>,
        connect_timeout: Duration,
    ) -> Result<Self, BuildError> {
        let policy = Arc::new(policy);
        let redirect_policy = policy.clone();
        let mut builder = reqwest::Client::builder()
            .https_only(true)
            // A proxy would resolve the host itself, past the resolver.
            .no_proxy()
            .dns_resolver(Arc::new(GuardedResolver {
                policy: policy.clone(),
            }))
            .connect_timeout(connect_timeout)
            .redirect(reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.previous().len() >= 5 {
                    return attempt.error(Refusal("more than 5 redirects".into()));
                }
                match check_url(attempt.url(), &redirect_policy) {
                    Ok(()) => attempt.follow(),
                    Err(reason) => {
                        let reason = format!("redirect to {}: {reason}", shown(attempt.url()));
                        attempt.error(Refusal(reason))
                    }
                }
            }));
        for root in extra_roots {
            builder = builder.add_root_certificate(root);
        }
        Ok(GuardedClient {
            client: builder.build().map_err(BuildError)?,
            policy,
        })
    }

    /// Fetches `url` within `limits`.
    pub async fn fetch(&self, url: &str, limits: FetchLimits) -> Result<Fetched, FetchError> {
        self.send(url, limits, |client, url| client.get(url)).await
    }

    /// POSTs `body` to `url` with `headers` (a webhook-style call such as a variables
    /// source), within `limits`, and returns the answer's body.
    pub async fn post(
        &self,
        url: &str,
        headers: reqwest::header::HeaderMap,
        body: Vec<u8>,
        limits: FetchLimits,
    ) -> Result<Fetched, FetchError> {
        self.send(url, limits, move |client, url| {
            client.post(url).headers(headers).body(body)
        })
        .await
    }

    /// Checks `url`, sends the request `build` makes of it and reads the answer's body within
    /// `limits`.
    async fn send(
        &self,
        url: &str,
        limits: FetchLimits,
        build: impl FnOnce(&reqwest::Client, Url) -> reqwest::RequestBuilder,
    ) -> Result<Fetched, FetchError> {
        let parsed = Url::parse(url).map_err(|e| FetchError::Refused {
            url: url.chars().take(200).collect(),
            reason: format!("not a URL: {e}"),
        })?;
        let name = shown(&parsed);
        check_url(&parsed, &self.policy).map_err(|reason| FetchError::Refused {
            url: name.clone(),
            reason,
        })?;
        let network = |source: reqwest::Error| {
            if is_guard_refusal(&source) {
                let mut reason = String::new();
                let mut s: Option<&(dyn std::error::Error + 'static)> = Some(&source);
                while let Some(e) = s {
                    if let Some(r) = e.downcast_ref::<Refusal>() {
                        reason = r.0.clone();
                    }
                    s = e.source();
                }
                FetchError::Refused {
                    url: name.clone(),
                    reason,
                }
            } else {
                // reqwest's text names the whole URL, query and all.
                FetchError::Network {
                    url: name.clone(),
                    source: source.without_url(),
                }
            }
        };
        let request = build(&self.client, parsed);
        let work = async {
            let mut response = request.send().await.map_err(network)?;
            let status = response.status();
            if !status.is_success() {
                return Err(FetchError::Status {
                    url: name.clone(),
                    status: status.as_u16(),
                });
            }
            let too_large = || FetchError::TooLarge {
                url: name.clone(),
                max: limits.max_bytes,
            };
            if response
                .content_length()
                .is_some_and(|n| n > limits.max_bytes)
            {
                return Err(too_large());
            }
            let content_type = response
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split(';').next())
                .map(|v| v.trim().to_ascii_lowercase())
                .unwrap_or_default();
            let file_name = response
                .url()
                .path_segments()
                .and_then(|mut s| s.next_back())
                .unwrap_or_default()
                .to_owned();
            // Read in chunks so a server that lies about (or omits) its length is cut at the cap.
            let mut body = Vec::new();
            while let Some(chunk) = response.chunk().await.map_err(network)? {
                if body.len() as u64 + chunk.len() as u64 > limits.max_bytes {
                    return Err(too_large());
                }
                body.extend_from_slice(&chunk);
            }
            Ok(Fetched {
                bytes: body.into(),
                content_type,
                file_name,
            })
        };
        match tokio::time::timeout(limits.timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(FetchError::Status {
                url: name.clone(),
                // 504: the fetch as a whole timed out; retryable like a gateway timeout.
                status: 504,
            }),
        }
    }
}

/// Parses a CIDR (`10.0.0.0/8`) or a single address (`10.0.0.5`).
pub fn parse_network(s: &str) -> Result<IpNet, String> {
    let s = s.trim();
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("{s:?} is neither a CIDR network nor an IP address"))
}

/// The IPv4 metadata address most clouds use, refused as link-local; named for tests and docs.
pub const METADATA_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);
/// AWS's IPv6 metadata address, refused as unique-local.
pub const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);

#[cfg(test)]
mod tests {
    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    #[test]
    fn non_public_addresses_are_refused_by_default() -> TestResult {
        let policy = AddressPolicy::default();
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00:ec2::254",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
        ] {
            assert!(!policy.permits(ip.parse()?), "{ip}");
        }
        for ip in ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"] {
            assert!(policy.permits(ip.parse()?), "{ip}");
        }
        assert!(!policy.permits(IpAddr::V4(METADATA_V4)));
        assert!(!policy.permits(IpAddr::V6(METADATA_V6)));
        Ok(())
    }

    #[test]
    fn the_operator_can_allow_a_network() -> TestResult {
        let policy = AddressPolicy {
            allow_private_networks: false,
            allowed_networks: vec![parse_network("10.1.2.0/24")?],
        };
        assert!(policy.permits("10.1.2.9".parse()?));
        assert!(!policy.permits("10.1.3.9".parse()?));
        assert!(parse_network("127.0.0.1")?.contains(&"127.0.0.1".parse::<IpAddr>()?));
        Ok(())
    }

    #[test]
    fn plain_http_and_literal_private_hosts_are_refused_before_connecting() -> TestResult {
        let policy = AddressPolicy::default();
        let url = |s: &str| Url::parse(s);
        assert!(check_url(&url("http://example.com/a.png")?, &policy).is_err());
        assert!(check_url(&url("https://127.0.0.1/a.png")?, &policy).is_err());
        assert!(check_url(&url("https://[::1]/a.png")?, &policy).is_err());
        assert!(check_url(&url("https://example.com/a.png")?, &policy).is_ok());
        Ok(())
    }

    /// Errors reach clients (a run's or a task's error) and logs: a presigned URL's or a
    /// source's token must reach neither, nor the addresses an internal name resolves to.
    #[tokio::test]
    async fn errors_name_neither_a_urls_secrets_nor_the_addresses_refused() -> TestResult {
        assert_eq!(
            shown(&Url::parse(
                "https://user:pw@example.com/v?access_token=SEKRIT#f"
            )?),
            "https://example.com/v"
        );
        let limits = FetchLimits {
            max_bytes: 1024,
            timeout: Duration::from_secs(10),
        };
        let open = AddressPolicy {
            allow_private_networks: true,
            allowed_networks: Vec::new(),
        };
        // Nothing listens on port 1: the connection is refused.
        let refused_connection = GuardedClient::new(open, Vec::new(), Duration::from_secs(5))?
            .fetch("https://127.0.0.1:1/v?access_token=SEKRIT", limits)
            .await
            .err()
            .ok_or("fetched from a closed port")?;
        assert!(
            matches!(refused_connection, FetchError::Network { .. }),
            "{refused_connection:?}"
        );
        assert!(
            !format!("{refused_connection} {refused_connection:?}").contains("SEKRIT"),
            "{refused_connection:?}"
        );
        let guarded =
            GuardedClient::new(AddressPolicy::default(), Vec::new(), Duration::from_secs(5))?;
        let internal = guarded
            .fetch("https://localhost/v?access_token=SEKRIT", limits)
            .await
            .err()
            .ok_or("fetched from localhost")?
            .to_string();
        assert!(internal.contains("non-public"), "{internal}");
        assert!(
            !internal.contains("127.0.0.1") && !internal.contains("SEKRIT"),
            "{internal}"
        );
        Ok(())
    }
}
