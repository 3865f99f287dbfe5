//! A private PostgreSQL cluster that one test owns and may stop and start at will.
//!
//! The shared cluster of [`crate::TestDb`] serves every test of the run in parallel, so it must
//! never be restarted; a test that needs a database outage gets a cluster of its own here
//! (initdb in a temporary directory, a free loopback port, fsync off). Stopping it is a real
//! outage: the postmaster ends every connection and refuses new ones until it starts again on
//! the same port.

use std::net::TcpListener;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use tokio::process::Command;

/// The cluster's superuser and the database it creates.
const USER: &str = "herald";
const DATABASE: &str = "herald";

/// A running private cluster; stopped and deleted when dropped.
#[derive(Debug)]
pub struct PgCluster {
    root: PathBuf,
    bin_dir: PathBuf,
    /// PostgreSQL refuses to run as root: as root, its tools run as this user.
    run_as: Option<String>,
    port: u16,
}

impl PgCluster {
    /// Initialises and starts a new cluster with one database, `herald`.
    pub async fn start() -> Result<Self> {
        let run_as = if nix::unistd::geteuid().is_root() {
            Some(std::env::var("HERALD_PG_USER").unwrap_or_else(|_| "postgres".to_owned()))
        } else {
            None
        };
        let root = std::env::temp_dir().join(format!(
            "herald-test-pg-private-{}",
            uuid::Uuid::new_v4().simple()
        ));
        let port = {
            let probe = TcpListener::bind("127.0.0.1:0").context("probing for a free port")?;
            probe.local_addr()?.port()
        };
        let cluster = Self {
            root,
            bin_dir: pg_bin_dir().await?,
            run_as,
            port,
        };
        cluster.make_owned_dir(&cluster.root)?;
        cluster.make_owned_dir(&cluster.data())?;
        cluster.make_owned_dir(&cluster.run())?;
        cluster
            .pg_tool(
                "initdb",
                &[
                    "-D",
                    path_str(&cluster.data())?,
                    "-U",
                    USER,
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--no-sync",
                ],
            )
            .await?;
        cluster.resume().await?;
        let admin = cluster.connect_to("postgres").await?;
        admin
            .batch_execute(&format!("CREATE DATABASE {DATABASE}"))
            .await
            .context("creating the private cluster's database")?;
        Ok(cluster)
    }

    /// A cluster that also speaks TLS, with a certificate for `127.0.0.1` from a throwaway CA;
    /// returns it and the CA's PEM file (in the cluster's directory). Plaintext is still
    /// allowed, for the test's own sessions.
    pub async fn start_with_tls() -> Result<(Self, PathBuf)> {
        use rcgen::{CertificateParams, IsCa, Issuer, KeyPair};
        let cluster = Self::start().await?;
        cluster.stop().await?;
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "herald test database CA");
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate()?;
        let cert = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?
            .signed_by(&key, &issuer)?;
        let ca_file = cluster.root.join("ca.pem");
        std::fs::write(&ca_file, ca_cert.pem())?;
        cluster.write_owned(&cluster.data().join("server.crt"), &cert.pem())?;
        cluster.write_owned(&cluster.data().join("server.key"), &key.serialize_pem())?;
        let conf = cluster.data().join("postgresql.conf");
        let mut settings = std::fs::read_to_string(&conf)?;
        settings
            .push_str("\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n");
        std::fs::write(&conf, settings)?;
        cluster.resume().await?;
        Ok((cluster, ca_file))
    }

    /// Writes `contents` to `path`, mode 0600, owned by the user PostgreSQL runs as (it
    /// refuses a key file others can read).
    fn write_owned(&self, path: &Path, contents: &str) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        self.give_to_server(path)
    }

    /// Makes `path` the property of the user PostgreSQL runs as, when that is not this one.
    fn give_to_server(&self, path: &Path) -> Result<()> {
        if let Some(user) = &self.run_as {
            let user = nix::unistd::User::from_name(user)?
                .with_context(|| format!("user {user:?} does not exist (set HERALD_PG_USER)"))?;
            nix::unistd::chown(path, Some(user.uid), Some(user.gid))
                .with_context(|| format!("chown {}", path.display()))?;
        }
        Ok(())
    }

    /// The `DATABASE_URL` of the cluster's `herald` database.
    pub fn url(&self) -> String {
        format!("postgres://{USER}@127.0.0.1:{}/{DATABASE}", self.port)
    }

    /// A new client on the `herald` database, for assertions on stored rows.
    pub async fn connect(&self) -> Result<tokio_postgres::Client> {
        self.connect_to(DATABASE).await
    }

    /// Stops the postmaster (fast mode: sessions are ended at once, as in a failover) and waits
    /// until it is gone. Until [`Self::resume`], connecting is refused.
    pub async fn stop(&self) -> Result<()> {
        self.pg_tool(
            "pg_ctl",
            &["stop", "-w", "-m", "fast", "-D", path_str(&self.data())?],
        )
        .await
    }

    /// Starts the postmaster again on the same port and waits until it accepts connections.
    pub async fn resume(&self) -> Result<()> {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off \
             -c synchronous_commit=off -c full_page_writes=off -c max_connections=300",
            self.port,
            path_str(&self.run())?
        );
        let log = self.run().join("postgres.log");
        self.pg_tool(
            "pg_ctl",
            &[
                "start",
                "-w",
                "-t",
                "60",
                "-D",
                path_str(&self.data())?,
                "-l",
                path_str(&log)?,
                "-o",
                &options,
            ],
        )
        .await
    }

    fn data(&self) -> PathBuf {
        self.root.join("data")
    }

    fn run(&self) -> PathBuf {
        self.root.join("run")
    }

    async fn connect_to(&self, database: &str) -> Result<tokio_postgres::Client> {
        let url = format!("postgres://{USER}@127.0.0.1:{}/{database}", self.port);
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .with_context(|| format!("connecting to {url}"))?;
        tokio::spawn(async move {
            // Ends with the client, or with the server when the test stops it.
            let _ = connection.await;
        });
        Ok(client)
    }

    /// Creates `dir` owned by the user PostgreSQL runs as, mode 0700 as initdb requires.
    fn make_owned_dir(&self, dir: &Path) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        self.give_to_server(dir)
    }

    /// Runs a PostgreSQL tool to completion, failing with its output when it fails.
    async fn pg_tool(&self, tool: &str, args: &[&str]) -> Result<()> {
        let program = self.bin_dir.join(tool);
        let mut command = match &self.run_as {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(&program);
                command
            }
            None => Command::new(&program),
        };
        // output() captures the tool's pipes, so the daemonised postmaster (which logs to its
        // own file) never holds the test's output open.
        let output = command
            .args(args)
            .output()
            .await
            .with_context(|| format!("running {}", program.display()))?;
        if !output.status.success() {
            bail!(
                "{tool} {args:?} failed ({}):\n{}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(())
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        // Immediate: the cluster is thrown away, nothing in it needs a clean shutdown.
        let program = self.bin_dir.join("pg_ctl");
        let data = self.data();
        let mut command = match &self.run_as {
            Some(user) => {
                let mut command = std::process::Command::new("runuser");
                command.args(["-u", user, "--"]).arg(&program);
                command
            }
            None => std::process::Command::new(&program),
        };
        let _ = command
            .args(["stop", "-w", "-m", "immediate", "-D"])
            .arg(&data)
            .output();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn path_str(path: &Path) -> Result<&str> {
    path.to_str()
        .with_context(|| format!("non-UTF-8 path {}", path.display()))
}

/// The PostgreSQL server binaries: `HERALD_PG_BIN`, else the newest
/// `/usr/lib/postgresql/<version>/bin`, else `pg_config --bindir` (as the shared cluster).
async fn pg_bin_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("HERALD_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .max_by_key(|(version, _)| *version);
    if let Some((_, bin)) = newest {
        return Ok(bin);
    }
    let output = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .await
        .context("no PostgreSQL found: install it or set HERALD_PG_BIN")?;
    Ok(PathBuf::from(
        String::from_utf8_lossy(&output.stdout).trim().to_owned(),
    ))
}
