//! How herald connects to PostgreSQL: the settings it adds to `DATABASE_URL` so that every
//! connection follows the primary through a failover and notices a dead peer in seconds.
//!
//! - **The primary, always** (`target_session_attrs=read-write`): every connection herald opens
//!   writes (the pool, the notification listener, the materialiser's leader lock, the database
//!   watch), so a server that only reads is no use to it. `DATABASE_URL` may list several hosts
//!   (`postgres://herald@db-a:5432,db-b:5432/herald`); each new connection tries them in order
//!   and keeps the first that accepts writes, so after a failover new connections reach the
//!   promoted standby and skip the old primary even if it is still up as a standby.
//! - **A connect timeout** per host ([`CONNECT_TIMEOUT`]), so a host that drops packets (a dead
//!   node) costs seconds, not the kernel's two minutes, before the next host is tried.
//! - **TCP keepalives** ([`KEEPALIVE_IDLE`], [`KEEPALIVE_INTERVAL`], [`KEEPALIVE_RETRIES`]), so
//!   an idle connection to a vanished server (the LISTEN connection, the leader's lock, pooled
//!   connections) is found dead in about 25 s instead of the kernel's two hours.
//! - **A TCP user timeout** ([`TCP_USER_TIMEOUT`]): a connection whose sent bytes stay
//!   unacknowledged that long is dropped, so a query to a server that vanished mid-request
//!   fails instead of hanging for the kernel's fifteen minutes of retransmissions. It bounds
//!   only unacknowledged data, never a slow query: a server that does not even acknowledge
//!   TCP segments for 10 s is gone.
//!
//! - **No JIT compilation** (`options=-c jit=off`): herald's statements are short, and a
//!   planner estimate inflated by a per-row subplan (the claim's suppression probe) crosses
//!   PostgreSQL's JIT thresholds and compiles for seconds a statement that runs in
//!   milliseconds: the routed claim spent 3.7 s of its 3.7 s in JIT, and the drain through
//!   accounts fell to 1 % of the drain by queue (docs/performance.md).
//!
//! A value the URL sets itself (`connect_timeout=10`, `keepalives_idle=30`, `keepalives=0`,
//! `tcp_user_timeout=…`) is kept.

use std::time::Duration;

use tokio_postgres::config::{Config, TargetSessionAttrs};
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Socket};

use super::tls::DbTls;

/// A dedicated connection's driver, to be polled (or spawned) for the client to work.
pub type Connection = tokio_postgres::Connection<Socket, <DbTls as MakeTlsConnect<Socket>>::Stream>;

/// Where herald's database is and how to reach it: the parsed URL with herald's settings and
/// the TLS its `sslmode` asks for, together. The pool is built from it, and every dedicated
/// connection (the notification listener, the materialiser's leader lock, the database watch)
/// opens through it, so a change to how herald reaches PostgreSQL lands here.
#[derive(Clone)]
pub struct Target {
    config: Config,
    tls: DbTls,
}

impl Target {
    /// `config` (already carrying herald's settings, from [`settings`]) reached with `tls`.
    pub fn new(config: Config, tls: DbTls) -> Self {
        Target { config, tls }
    }

    /// The connection settings.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The TLS connector, for the pool's manager.
    pub fn tls(&self) -> DbTls {
        self.tls.clone()
    }

    /// The same target, with connections named `application_name` in `pg_stat_activity`
    /// unless the URL names them itself.
    pub fn named(&self, application_name: &str) -> Target {
        let mut named = self.clone();
        if named.config.get_application_name().is_none() {
            named.config.application_name(application_name);
        }
        named
    }

    /// Opens one connection (to the first of the hosts that takes writes).
    pub async fn connect(&self) -> Result<(Client, Connection), tokio_postgres::Error> {
        self.config.connect(self.tls.clone()).await
    }

    /// How long opening one connection may take as a whole ([`open_timeout`]).
    pub fn open_timeout(&self) -> Duration {
        open_timeout(&self.config)
    }
}

/// How long connecting to one host may take before the next host is tried.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a connection may be idle before the first keepalive probe.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// Time between unanswered keepalive probes.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Unanswered probes after which the connection is dropped.
pub const KEEPALIVE_RETRIES: u32 = 3;
/// How long sent data may stay unacknowledged before the connection is dropped.
pub const TCP_USER_TIMEOUT: Duration = Duration::from_secs(10);
/// The server option turning JIT off, added to the URL's own `options`.
pub const NO_JIT: &str = "-c jit=off";
/// tokio-postgres's own keepalive idle time: a URL that leaves it at this did not set it.
const DRIVER_KEEPALIVE_IDLE: Duration = Duration::from_secs(2 * 60 * 60);

/// Parses `database_url` and adds herald's connection settings to it.
pub fn settings(database_url: &str) -> Result<Config, tokio_postgres::Error> {
    let mut config: Config = database_url.parse()?;
    apply_defaults(&mut config);
    Ok(config)
}

/// Adds herald's settings to `config`, keeping the ones it already has.
fn apply_defaults(config: &mut Config) {
    config.target_session_attrs(TargetSessionAttrs::ReadWrite);
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(TCP_USER_TIMEOUT);
    }
    match config.get_options() {
        None => {
            config.options(NO_JIT);
        }
        // Options naming any JIT setting (jit, jit_above_cost, …) are the operator's choice.
        Some(own) if !own.contains("jit") => {
            let both = format!("{own} {NO_JIT}");
            config.options(&both);
        }
        Some(_) => {}
    }
    if config.get_keepalives() {
        if config.get_keepalives_idle() == DRIVER_KEEPALIVE_IDLE {
            config.keepalives_idle(KEEPALIVE_IDLE);
        }
        if config.get_keepalives_interval().is_none() {
            config.keepalives_interval(KEEPALIVE_INTERVAL);
        }
        if config.get_keepalives_retries().is_none() {
            config.keepalives_retries(KEEPALIVE_RETRIES);
        }
    }
}

/// How long opening one connection may take as a whole: every host's connect timeout, plus
/// time for authentication and the read-write check.
pub fn open_timeout(config: &Config) -> Duration {
    let hosts = u32::try_from(config.get_hosts().len().max(1)).unwrap_or(u32::MAX);
    config
        .get_connect_timeout()
        .copied()
        .unwrap_or(CONNECT_TIMEOUT)
        .saturating_mul(hosts)
        + Duration::from_secs(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(url: &str) -> Config {
        settings(url).unwrap_or_else(|e| panic!("{url}: {e}"))
    }

    #[test]
    fn a_plain_url_gets_every_setting() {
        let c = parsed("postgres://herald@db/herald");
        assert_eq!(c.get_target_session_attrs(), TargetSessionAttrs::ReadWrite);
        assert_eq!(c.get_connect_timeout(), Some(&CONNECT_TIMEOUT));
        assert_eq!(c.get_tcp_user_timeout(), Some(&TCP_USER_TIMEOUT));
        assert!(c.get_keepalives());
        assert_eq!(c.get_keepalives_idle(), KEEPALIVE_IDLE);
        assert_eq!(c.get_keepalives_interval(), Some(KEEPALIVE_INTERVAL));
        assert_eq!(c.get_keepalives_retries(), Some(KEEPALIVE_RETRIES));
        assert_eq!(open_timeout(&c), CONNECT_TIMEOUT + Duration::from_secs(2));
        assert_eq!(c.get_options(), Some(NO_JIT));
    }

    #[test]
    fn jit_is_off_beside_the_urls_own_options_unless_it_sets_jit() {
        let own = parsed("postgres://herald@db/herald?options=-c%20statement_timeout%3D5s");
        assert_eq!(
            own.get_options(),
            Some("-c statement_timeout=5s -c jit=off")
        );
        let on = parsed("postgres://herald@db/herald?options=-c%20jit%3Don");
        assert_eq!(on.get_options(), Some("-c jit=on"));
    }

    #[test]
    fn the_urls_own_values_are_kept() {
        let c = parsed(
            "postgres://herald@db/herald?connect_timeout=10&keepalives_idle=30\
             &keepalives_interval=2&keepalives_retries=9&tcp_user_timeout=60",
        );
        assert_eq!(c.get_connect_timeout(), Some(&Duration::from_secs(10)));
        assert_eq!(c.get_keepalives_idle(), Duration::from_secs(30));
        assert_eq!(c.get_keepalives_interval(), Some(Duration::from_secs(2)));
        assert_eq!(c.get_keepalives_retries(), Some(9));
        assert_eq!(c.get_tcp_user_timeout(), Some(&Duration::from_secs(60)));
        let off = parsed("postgres://herald@db/herald?keepalives=0");
        assert!(!off.get_keepalives());
        assert_eq!(off.get_keepalives_interval(), None);
    }

    #[test]
    fn several_hosts_are_tried_for_a_writable_one_within_a_bounded_time() {
        // Even a URL asking for any server gets the primary: herald writes on every connection.
        let c = parsed(
            "postgres://herald@db-a:5432,db-b:5433/herald?target_session_attrs=any\
             &connect_timeout=4",
        );
        assert_eq!(c.get_hosts().len(), 2);
        assert_eq!(c.get_ports(), &[5432, 5433]);
        assert_eq!(c.get_target_session_attrs(), TargetSessionAttrs::ReadWrite);
        assert_eq!(open_timeout(&c), Duration::from_secs(10));
    }

    #[test]
    fn a_bad_url_is_an_error() {
        assert!(settings("postgres://herald@db/herald?connect_timeout=soon").is_err());
        assert!(settings("postgres://herald@db/herald?target_session_attrs=primary").is_err());
    }
}
