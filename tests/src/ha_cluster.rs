//! A highly available PostgreSQL that one test owns: pg_auto_failover (Debian's
//! `postgresql-15-auto-failover`) with a monitor, a primary and a synchronous standby, all on
//! loopback, in a temporary directory.
//!
//! Each of the three is a `pg_autoctl` supervisor started in a process group of its own, with
//! its PostgreSQL underneath, so a test can SIGKILL a whole node (keeper and server) the way a
//! machine dies, and the monitor promotes the standby. The standby is synchronous (the
//! formation's default: `synchronous_standby_names = 'ANY 1 (…)'` once it has caught up), so a
//! commit herald was told about survives the primary's death.
//!
//! The monitor's health checks are tightened (a check every second, a node unhealthy after 5 s
//! instead of 20 s, a dead primary given 3 s to demote itself instead of 30 s) so a failover
//! takes seconds, not the ~50 s of the defaults; docs/operations.md says what the defaults mean
//! in production.
//!
//! When `pg_autoctl` is missing the cluster cannot start: [`HaCluster::start`] returns `None`
//! and the test says it skipped, unless `HERALD_REQUIRE_HA` is set (`script/test` sets it
//! after installing the package), when a missing binary is a failure.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use chrono::{DateTime, Utc};
use nix::sys::signal::{self, killpg, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

/// The superuser every node is created with, and the database herald uses.
const USER: &str = "postgres";
const DATABASE: &str = "herald";
/// The package the cluster comes from, named in skip and failure messages.
const PACKAGE: &str = "postgresql-15-auto-failover";
/// Upper bound for the cluster to form, and for a failover or switchover to finish; only a
/// hang reaches it.
const FORM_WAIT: Duration = Duration::from_secs(120);

/// Monitor settings that make a failover take seconds (milliseconds, as the monitor reads
/// them). Not tighter: a standby the monitor wrongly finds unhealthy (a busy machine) makes the
/// primary drop synchronous replication, and a failover in that window loses commits.
const MONITOR_SETTINGS: &[(&str, &str)] = &[
    ("pgautofailover.health_check_period", "1000"),
    ("pgautofailover.health_check_timeout", "2000"),
    ("pgautofailover.health_check_max_retries", "1"),
    ("pgautofailover.health_check_retry_delay", "500"),
    ("pgautofailover.node_considered_unhealthy_timeout", "5000"),
    ("pgautofailover.primary_demote_timeout", "3000"),
];

/// One PostgreSQL node of the formation.
#[derive(Debug)]
struct Node {
    name: String,
    port: u16,
    /// The `pg_autoctl` supervisor, leading its process group; None once killed.
    keeper: Option<Child>,
}

/// A running monitor, primary and synchronous standby; killed and deleted when dropped.
#[derive(Debug)]
pub struct HaCluster {
    root: PathBuf,
    bin_dir: PathBuf,
    run_as: Option<String>,
    monitor_port: u16,
    monitor: Option<Child>,
    nodes: Vec<Node>,
}

impl HaCluster {
    /// Creates the monitor, then the primary, then the standby, and waits until the standby is
    /// a synchronous secondary. `None` (with a message on stderr) when pg_auto_failover is not
    /// installed and `HERALD_REQUIRE_HA` is unset.
    pub async fn start() -> Result<Option<Self>> {
        let Some(bin_dir) = failover_bin_dir() else {
            if std::env::var_os("HERALD_REQUIRE_HA").is_some() {
                bail!("pg_auto_failover is not installed (apt-get install {PACKAGE})");
            }
            eprintln!(
                "SKIPPED: pg_auto_failover is not installed; `apt-get install {PACKAGE}` \
                 (script/test does so as root) to run the failover tests"
            );
            return Ok(None);
        };
        let run_as = if nix::unistd::geteuid().is_root() {
            Some(std::env::var("HERALD_PG_USER").unwrap_or_else(|_| USER.to_owned()))
        } else {
            None
        };
        let root =
            std::env::temp_dir().join(format!("herald-test-ha-{}", uuid::Uuid::new_v4().simple()));
        let mut cluster = Self {
            root,
            bin_dir,
            run_as,
            monitor_port: free_port()?,
            monitor: None,
            nodes: Vec::new(),
        };
        cluster.make_owned_dir(&cluster.root)?;
        cluster.start_monitor().await?;
        cluster.start_node("node_a").await?;
        cluster.wait_for_states(&[("node_a", "single")]).await?;
        cluster.start_node("node_b").await?;
        cluster.wait_for_standby("node_a", "node_b").await?;
        Ok(Some(cluster))
    }

    /// herald's `DATABASE_URL`: both nodes, in creation order. herald's connection settings
    /// pick whichever takes writes.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("postgres://{USER}@{}/{DATABASE}", hosts.join(","))
    }

    /// A new client on the current primary's `herald` database, for assertions on stored rows.
    pub async fn connect(&self) -> Result<tokio_postgres::Client> {
        let url = format!(
            "{}?target_session_attrs=read-write&connect_timeout=2",
            self.url()
        );
        connect(&url).await
    }

    /// The name of the node the monitor holds to be primary now.
    pub async fn primary(&self) -> Result<String> {
        let monitor = self.monitor_client().await?;
        let row = monitor
            .query_opt(
                "SELECT nodename FROM pgautofailover.node
                 WHERE reportedstate IN ('single', 'primary', 'wait_primary')
                   AND goalstate = reportedstate",
                &[],
            )
            .await?
            .context("no node is primary")?;
        Ok(row.get("nodename"))
    }

    /// Asks the monitor for a planned switchover and waits until it is over (the former
    /// primary demoted, the former standby promoted). Returns the new primary's name.
    pub async fn switchover(&self) -> Result<String> {
        let old = self.primary().await?;
        let monitor_data = self.root.join("monitor");
        self.autoctl(&[
            "perform",
            "switchover",
            "--pgdata",
            path_str(&monitor_data)?,
        ])
        .await?;
        self.other(&old)
    }

    /// SIGKILLs the primary's whole node (its keeper, its postmaster and every backend), as a
    /// machine that dies. Returns the killed node's name.
    pub async fn kill_primary(&mut self) -> Result<String> {
        let name = self.primary().await?;
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.name == name)
            .context("primary not found")?;
        if let Some(mut keeper) = node.keeper.take() {
            kill_group(&keeper)?;
            keeper.wait().await?;
        }
        Ok(name)
    }

    /// Starts watching `node` for its promotion: the returned task ends with the moment it
    /// first took writes, on its own clock (the clock every herald timestamp comes from),
    /// observed within ~50 ms. Start it before the fault, so the moment is not missed.
    pub fn watch_promotion(&self, node: &str) -> Result<JoinHandle<Result<DateTime<Utc>>>> {
        let port = self
            .nodes
            .iter()
            .find(|n| n.name == node)
            .context("no such node")?
            .port;
        let node = node.to_owned();
        Ok(tokio::spawn(async move {
            let url = format!("postgres://{USER}@127.0.0.1:{port}/{DATABASE}?connect_timeout=2");
            let deadline = tokio::time::Instant::now() + FORM_WAIT;
            let mut client = None;
            loop {
                if client.is_none() {
                    client = connect(&url).await.ok();
                }
                if let Some(c) = &client {
                    match c
                        .query_one(
                            "SELECT current_setting('transaction_read_only') = 'off'
                                    AND NOT pg_is_in_recovery() AS writable,
                                    clock_timestamp() AS at",
                            &[],
                        )
                        .await
                    {
                        Ok(row) if row.get::<_, bool>("writable") => return Ok(row.get("at")),
                        Ok(_) => {}
                        // The connection dropped (the node restarted): open another.
                        Err(_) => client = None,
                    }
                }
                ensure!(
                    tokio::time::Instant::now() < deadline,
                    "{node} never took writes"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }))
    }

    /// The monitor's event log (time, node, reported and assigned state, why), to explain a
    /// failed run.
    pub async fn events(&self) -> Result<Vec<String>> {
        let monitor = self.monitor_client().await?;
        let rows = monitor
            .query(
                "SELECT format('%s %s %s -> %s: %s', eventtime, nodename, reportedstate,
                               goalstate, description) AS line
                 FROM pgautofailover.event ORDER BY eventid",
                &[],
            )
            .await?;
        Ok(rows.iter().map(|r| r.get("line")).collect())
    }

    /// Every promotion the monitor ordered, oldest first ("time node"): each time it told a
    /// standby that had stopped replicating to take writes. A fault test expects exactly one.
    /// A second is pg_auto_failover failing over again on its own (a busy machine's missed
    /// health checks), from a primary just promoted and still asynchronous (`wait_primary`,
    /// no standby yet): that loses the commits it acknowledged alone, whatever herald does.
    pub async fn promotions(&self) -> Result<Vec<String>> {
        let monitor = self.monitor_client().await?;
        let rows = monitor
            .query(
                "SELECT format('%s %s', eventtime, nodename) AS line FROM pgautofailover.event
                 WHERE reportedstate = 'stop_replication' AND goalstate = 'wait_primary'
                 ORDER BY eventid",
                &[],
            )
            .await?;
        Ok(rows.iter().map(|r| r.get("line")).collect())
    }

    /// The other node's name.
    pub fn other(&self, node: &str) -> Result<String> {
        self.nodes
            .iter()
            .find(|n| n.name != node)
            .map(|n| n.name.clone())
            .context("one node only")
    }

    async fn start_monitor(&mut self) -> Result<()> {
        let data = self.root.join("monitor");
        let port = self.monitor_port.to_string();
        let pg_ctl = self.bin_dir.join("pg_ctl");
        let mut child = self.spawn_keeper(
            "monitor",
            &[
                "create",
                "monitor",
                "--run",
                "--pgctl",
                path_str(&pg_ctl)?,
                "--pgdata",
                path_str(&data)?,
                "--pgport",
                &port,
                "--hostname",
                "127.0.0.1",
                "--auth",
                "trust",
                "--no-ssl",
            ],
        )?;
        let deadline = tokio::time::Instant::now() + FORM_WAIT;
        let monitor = loop {
            if let Ok(client) = self.monitor_client().await {
                if client
                    .query_one("SELECT count(*) FROM pgautofailover.formation", &[])
                    .await
                    .is_ok()
                {
                    break client;
                }
            }
            if let Some(status) = child.try_wait()? {
                bail!(
                    "the monitor exited ({status}): {}",
                    self.log_tail("monitor")
                );
            }
            ensure!(
                tokio::time::Instant::now() < deadline,
                "the monitor never started: {}",
                self.log_tail("monitor")
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        for (name, value) in MONITOR_SETTINGS {
            monitor
                .batch_execute(&format!("ALTER SYSTEM SET {name} = '{value}'"))
                .await
                .with_context(|| format!("setting {name}"))?;
        }
        monitor.batch_execute("SELECT pg_reload_conf()").await?;
        self.monitor = Some(child);
        Ok(())
    }

    async fn start_node(&mut self, name: &str) -> Result<()> {
        let data = self.root.join(name);
        let port = free_port()?;
        let port_arg = port.to_string();
        let pg_ctl = self.bin_dir.join("pg_ctl");
        let monitor = format!(
            "postgres://autoctl_node@127.0.0.1:{}/pg_auto_failover?sslmode=disable",
            self.monitor_port
        );
        let keeper = self.spawn_keeper(
            name,
            &[
                "create",
                "postgres",
                "--run",
                "--pgctl",
                path_str(&pg_ctl)?,
                "--pgdata",
                path_str(&data)?,
                "--pgport",
                &port_arg,
                "--hostname",
                "127.0.0.1",
                "--listen",
                "127.0.0.1",
                "--name",
                name,
                "--dbname",
                DATABASE,
                "--monitor",
                &monitor,
                "--auth",
                "trust",
                "--no-ssl",
            ],
        )?;
        self.nodes.push(Node {
            name: name.to_owned(),
            port,
            keeper: Some(keeper),
        });
        Ok(())
    }

    /// Waits until `standby` is a secondary of `primary`. The base backup that makes it waits
    /// for a checkpoint, which the primary spreads over minutes unless asked: it is asked.
    async fn wait_for_standby(&mut self, primary: &str, standby: &str) -> Result<()> {
        let port = self
            .nodes
            .iter()
            .find(|n| n.name == primary)
            .context("no such node")?
            .port;
        let url = format!("postgres://{USER}@127.0.0.1:{port}/postgres");
        let client = connect(&url).await?;
        let deadline = tokio::time::Instant::now() + FORM_WAIT;
        loop {
            if self
                .states_are(&[(primary, "primary"), (standby, "secondary")])
                .await?
            {
                // The standby counts as synchronous once the primary lists it.
                let sync: String = client
                    .query_one(
                        "SELECT current_setting('synchronous_standby_names') AS names",
                        &[],
                    )
                    .await?
                    .get("names");
                if !sync.is_empty() {
                    return Ok(());
                }
            }
            self.ensure_running()?;
            ensure!(
                tokio::time::Instant::now() < deadline,
                "{standby} never became a standby: {}",
                self.log_tail(standby)
            );
            client.batch_execute("CHECKPOINT").await?;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn wait_for_states(&mut self, want: &[(&str, &str)]) -> Result<()> {
        let deadline = tokio::time::Instant::now() + FORM_WAIT;
        while !self.states_are(want).await? {
            self.ensure_running()?;
            ensure!(
                tokio::time::Instant::now() < deadline,
                "the formation never reached {want:?}: {}",
                self.log_tail(want.first().map_or("monitor", |w| w.0))
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// True when every named node reports, and is assigned, the given state.
    async fn states_are(&self, want: &[(&str, &str)]) -> Result<bool> {
        let monitor = self.monitor_client().await?;
        for (node, state) in want {
            let row = monitor
                .query_opt(
                    "SELECT reportedstate::text = $2 AND goalstate::text = $2 AS reached
                     FROM pgautofailover.node WHERE nodename = $1",
                    &[node, state],
                )
                .await?;
            if !row.is_some_and(|r| r.get::<_, bool>("reached")) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Fails with the log of a keeper that exited while the cluster was forming.
    fn ensure_running(&mut self) -> Result<()> {
        let mut exited = None;
        for node in &mut self.nodes {
            if let Some(keeper) = node.keeper.as_mut() {
                if let Some(status) = keeper.try_wait()? {
                    exited = Some((node.name.clone(), status));
                }
            }
        }
        if let Some((name, status)) = exited {
            bail!("{name} exited ({status}): {}", self.log_tail(&name));
        }
        Ok(())
    }

    async fn monitor_client(&self) -> Result<tokio_postgres::Client> {
        connect(&format!(
            "postgres://{USER}@127.0.0.1:{}/pg_auto_failover?connect_timeout=2",
            self.monitor_port
        ))
        .await
    }

    /// Starts a `pg_autoctl` supervisor in a process group of its own, logging to
    /// `<root>/<name>.log`.
    fn spawn_keeper(&self, name: &str, args: &[&str]) -> Result<Child> {
        let log = std::fs::File::create(self.root.join(format!("{name}.log")))?;
        let mut command = self.command()?;
        command
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0);
        command
            .spawn()
            .with_context(|| format!("starting pg_autoctl for {name}"))
    }

    /// Runs one `pg_autoctl` command to completion, failing with its output when it fails.
    async fn autoctl(&self, args: &[&str]) -> Result<()> {
        let output = self
            .command()?
            .args(args)
            .output()
            .await
            .context("running pg_autoctl")?;
        if !output.status.success() {
            bail!(
                "pg_autoctl {args:?} failed ({}):\n{}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(())
    }

    /// `pg_autoctl` as the server's user (PostgreSQL refuses root), with its configuration and
    /// state kept under the cluster's folder. The user is switched in the child itself, not
    /// through `runuser`, so the keeper leads the process group the harness kills.
    fn command(&self) -> Result<Command> {
        let mut command = Command::new("pg_autoctl");
        if let Some(user) = &self.run_as {
            let user = nix::unistd::User::from_name(user)?
                .with_context(|| format!("user {user:?} does not exist (set HERALD_PG_USER)"))?;
            command.uid(user.uid.as_raw()).gid(user.gid.as_raw());
        }
        command
            .env("HOME", &self.root)
            .env("XDG_CONFIG_HOME", self.root.join("config"))
            .env("XDG_DATA_HOME", self.root.join("share"))
            .env("XDG_RUNTIME_DIR", self.root.join("run"))
            .env("PG_CONFIG", self.bin_dir.join("pg_config"));
        Ok(command)
    }

    fn log_tail(&self, name: &str) -> String {
        let log =
            std::fs::read_to_string(self.root.join(format!("{name}.log"))).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Creates `dir` owned by the user PostgreSQL runs as; others may traverse it.
    fn make_owned_dir(&self, dir: &Path) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
        if let Some(user) = &self.run_as {
            let user = nix::unistd::User::from_name(user)?
                .with_context(|| format!("user {user:?} does not exist (set HERALD_PG_USER)"))?;
            nix::unistd::chown(dir, Some(user.uid), Some(user.gid))
                .with_context(|| format!("chown {}", dir.display()))?;
        }
        Ok(())
    }
}

impl Drop for HaCluster {
    fn drop(&mut self) {
        // Everything is thrown away: no node needs a clean shutdown.
        for keeper in self
            .nodes
            .iter()
            .filter_map(|n| n.keeper.as_ref())
            .chain(self.monitor.as_ref())
        {
            let _ = kill_group(keeper);
        }
        kill_strays(&self.root);
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// SIGKILLs every process still working in a folder under `root`. A PostgreSQL server's
/// children leave its process group (each starts a session of its own) and exit when they find
/// the server gone; the monitor's health-check worker never looks, and keeps the logger alive
/// with it. Their working folder is the node's data folder, which names them.
fn kill_strays(root: &Path) {
    let Ok(root) = root.canonicalize() else {
        return;
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if std::fs::read_link(entry.path().join("cwd")).is_ok_and(|cwd| cwd.starts_with(&root)) {
            let _ = signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// SIGKILLs the process group `child` leads: the keeper, its PostgreSQL and every backend.
fn kill_group(child: &Child) -> Result<()> {
    let pid = child.id().context("the keeper has exited")?;
    let pid = i32::try_from(pid)?;
    killpg(Pid::from_raw(pid), Signal::SIGKILL).context("killing a node's process group")
}

/// The bin dir of the PostgreSQL version pg_auto_failover's extension is built for, if
/// `pg_autoctl` is installed at all.
fn failover_bin_dir() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| dir.join("pg_autoctl").is_file())
    });
    if !on_path {
        return None;
    }
    std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let installed = entry.path().join("lib/pgautofailover.so").exists()
                && entry.path().join("bin/pg_ctl").exists();
            installed.then(|| (version, entry.path().join("bin")))
        })
        .max_by_key(|(version, _)| *version)
        .map(|(_, bin)| bin)
}

fn free_port() -> Result<u16> {
    let probe = TcpListener::bind("127.0.0.1:0").context("probing for a free port")?;
    Ok(probe.local_addr()?.port())
}

async fn connect(url: &str) -> Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    tokio::spawn(async move {
        // Ends with the client, or with the server when the test kills it.
        let _ = connection.await;
    });
    Ok(client)
}

fn path_str(path: &Path) -> Result<&str> {
    path.to_str()
        .with_context(|| format!("non-UTF-8 path {}", path.display()))
}
