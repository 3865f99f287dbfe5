//! The real `herald-scheduler` and `herald-executor` binaries as child processes.
//!
//! Each binary binds its listeners on `127.0.0.1:0` and prints one `READY ...` line on stdout
//! with the bound addresses; the harness awaits that line instead of sleeping or polling a port.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};

use crate::TestDb;

/// How long a binary may take to print its `READY` line (migrations included) before the
/// harness gives up and fails the test with the binary's stderr.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How many stderr lines are kept to explain a failed start.
const STDERR_TAIL_LINES: usize = 100;

/// A running `herald-scheduler serve`, killed when dropped.
#[derive(Debug)]
pub struct SchedulerProcess {
    process: ManagedProcess,
    grpc_addr: String,
    http_addr: String,
}

/// Configures a [`SchedulerProcess`] before spawning it.
#[derive(Debug)]
#[must_use = "a builder does nothing until spawn() is awaited"]
pub struct SchedulerBuilder {
    database_url: String,
    args: Vec<OsString>,
    env: BTreeMap<OsString, OsString>,
    name: String,
}

impl SchedulerProcess {
    /// Starts configuring a scheduler on `db`'s database, listening on ephemeral loopback ports.
    pub fn builder(db: &TestDb) -> SchedulerBuilder {
        SchedulerBuilder {
            database_url: db.url().to_owned(),
            args: Vec::new(),
            env: BTreeMap::new(),
            name: "scheduler".to_owned(),
        }
    }

    /// Spawns a scheduler on `db` with default settings.
    pub async fn spawn(db: &TestDb) -> Result<Self> {
        Self::builder(db).spawn().await
    }

    /// The gRPC endpoint, as `http://127.0.0.1:PORT`.
    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.grpc_addr)
    }

    /// The gRPC listener's address, as `127.0.0.1:PORT`.
    pub fn grpc_addr(&self) -> &str {
        &self.grpc_addr
    }

    /// The HTTP (metrics, health, dashboard) base URL, as `http://127.0.0.1:PORT`.
    pub fn http_url(&self) -> String {
        format!("http://{}", self.http_addr)
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.process.child.id()
    }

    /// Sends SIGKILL: a crash, with no chance to clean up.
    pub fn kill(&mut self) -> Result<()> {
        self.process.kill()
    }

    /// Sends SIGTERM: asks for a graceful shutdown; follow with [`Self::wait`].
    pub fn terminate(&mut self) -> Result<()> {
        self.process.terminate()
    }

    /// Waits for the process to exit and returns its status.
    pub async fn wait(&mut self) -> Result<ExitStatus> {
        self.process.wait().await
    }

    /// The last lines the process wrote to stderr.
    pub fn stderr_tail(&self) -> String {
        self.process.stderr_tail()
    }

    /// Everything the process has written to stderr so far.
    pub fn stderr_all(&self) -> String {
        self.process.stderr_all()
    }
}

impl SchedulerBuilder {
    /// Sets an environment variable for the process (for example `HERALD_LEASE_TTL=2s`).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Appends a command-line argument, after the `serve` subcommand.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Names the process in forwarded log lines (default `scheduler`), to tell replicas apart.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Spawns the scheduler and waits for its `READY grpc=... http=...` line.
    pub async fn spawn(self) -> Result<SchedulerProcess> {
        let mut command = base_command("herald-scheduler")?;
        command
            .arg("serve")
            .args(&self.args)
            .env("DATABASE_URL", &self.database_url)
            // The env twins of --grpc-addr/--http-addr are a fixed interface, so they work
            // whatever the flag layout of the subcommands.
            .env("HERALD_GRPC_ADDR", "127.0.0.1:0")
            .env("HERALD_HTTP_ADDR", "127.0.0.1:0")
            // Loopback tests run without TLS and tokens unless a test configures them; the
            // binaries refuse both unless told so explicitly. A test's own env wins.
            .env("HERALD_ALLOW_PLAINTEXT", "true")
            .env("HERALD_ALLOW_ANONYMOUS", "true")
            // Schedule tests fire every second or two to stay short.
            .env("HERALD_MIN_SCHEDULE_PERIOD", "1s")
            .envs(&self.env);
        let (process, ready) = ManagedProcess::spawn(self.name, command).await?;
        let grpc_addr = ready
            .get("grpc")
            .with_context(|| format!("READY line without grpc=: {ready:?}"))?
            .clone();
        let http_addr = ready.get("http").cloned().unwrap_or_default();
        Ok(SchedulerProcess {
            process,
            grpc_addr,
            http_addr,
        })
    }
}

/// A running `herald-executor`, killed when dropped.
#[derive(Debug)]
pub struct ExecutorProcess {
    process: ManagedProcess,
    http_addr: String,
    /// The WhatsApp webhook's address, when the config file has `[whatsapp_webhook]`.
    webhook_addr: Option<String>,
    // Kept alive so the config file outlives the process reading it.
    _config_dir: Option<TempDir>,
}

/// Configures an [`ExecutorProcess`] before spawning it.
#[derive(Debug)]
#[must_use = "a builder does nothing until spawn() is awaited"]
pub struct ExecutorBuilder {
    schedulers: Vec<String>,
    config_toml: Option<String>,
    args: Vec<OsString>,
    env: BTreeMap<OsString, OsString>,
    name: String,
}

impl ExecutorProcess {
    /// Starts configuring an executor connected to the given scheduler gRPC URLs (as
    /// [`SchedulerProcess::grpc_url`] gives them).
    pub fn builder(scheduler_urls: &[impl AsRef<str>]) -> ExecutorBuilder {
        ExecutorBuilder {
            schedulers: scheduler_urls
                .iter()
                .map(|url| url.as_ref().to_owned())
                .collect(),
            config_toml: None,
            args: Vec::new(),
            env: BTreeMap::new(),
            name: "executor".to_owned(),
        }
    }

    /// The HTTP (metrics, health) base URL, as `http://127.0.0.1:PORT`.
    pub fn http_url(&self) -> String {
        format!("http://{}", self.http_addr)
    }

    /// The WhatsApp webhook's base URL, `http://127.0.0.1:PORT` (the executor printed it as
    /// `whatsapp_webhook=` in its READY line); an error without `[whatsapp_webhook]`.
    pub fn whatsapp_webhook_url(&self) -> Result<String> {
        self.webhook_addr
            .as_ref()
            .map(|addr| format!("http://{addr}"))
            .context("the executor has no [whatsapp_webhook] table")
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.process.child.id()
    }

    /// Sends SIGKILL: a crash, leases left to expire.
    pub fn kill(&mut self) -> Result<()> {
        self.process.kill()
    }

    /// Sends SIGTERM: asks for a graceful drain; follow with [`Self::wait`].
    pub fn terminate(&mut self) -> Result<()> {
        self.process.terminate()
    }

    /// Waits for the process to exit and returns its status.
    pub async fn wait(&mut self) -> Result<ExitStatus> {
        self.process.wait().await
    }

    /// The last lines the process wrote to stderr.
    pub fn stderr_tail(&self) -> String {
        self.process.stderr_tail()
    }

    /// Everything the process has written to stderr so far.
    pub fn stderr_all(&self) -> String {
        self.process.stderr_all()
    }
}

impl ExecutorBuilder {
    /// The executor's configuration file (accounts, senders, credentials), as TOML. Written
    /// to a temporary file passed as `HERALD_EXECUTOR_CONFIG` (the env twin of `--config`).
    pub fn config_toml(mut self, toml: impl Into<String>) -> Self {
        self.config_toml = Some(toml.into());
        self
    }

    /// Sets an environment variable for the process.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Appends a command-line argument.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Names the process in forwarded log lines (default `executor`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Spawns the executor and waits for its `READY http=...` line.
    pub async fn spawn(self) -> Result<ExecutorProcess> {
        let mut command = base_command("herald-executor")?;
        let config_dir = match &self.config_toml {
            Some(toml) => {
                let dir = TempDir::new("executor")?;
                let path = dir.path.join("executor.toml");
                tokio::fs::write(&path, toml)
                    .await
                    .with_context(|| format!("writing {}", path.display()))?;
                // The env twin is the fixed interface, whatever the flag is called.
                command.env("HERALD_EXECUTOR_CONFIG", &path);
                Some(dir)
            }
            None => None,
        };
        command
            .args(&self.args)
            .env("HERALD_SCHEDULER", self.schedulers.join(","))
            .env("HERALD_HTTP_ADDR", "127.0.0.1:0")
            .env("HERALD_ALLOW_PLAINTEXT", "true")
            .envs(&self.env);
        let (process, ready) = ManagedProcess::spawn(self.name, command).await?;
        let http_addr = ready.get("http").cloned().unwrap_or_default();
        Ok(ExecutorProcess {
            process,
            http_addr,
            webhook_addr: ready.get("whatsapp_webhook").cloned(),
            _config_dir: config_dir,
        })
    }
}

/// The path of one herald binary (`herald-scheduler`, `herald-executor`), for tests that run
/// its other subcommands.
pub fn herald_binary(name: &str) -> Result<PathBuf> {
    Ok(bin_dir()?.join(name))
}

/// Where the herald binaries are: `HERALD_BIN_DIR`, else the profile folder above the test
/// binary (`target/debug/deps/<test>` → `target/debug`).
fn bin_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("HERALD_BIN_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let exe = std::env::current_exe().context("locating the test binary")?;
    exe.ancestors()
        .nth(2)
        .map(PathBuf::from)
        .with_context(|| format!("no profile dir above {}", exe.display()))
}

/// A command for one herald binary with an environment that cannot leak the developer's own
/// herald settings into the test.
fn base_command(binary: &str) -> Result<Command> {
    let path = bin_dir()?.join(binary);
    if !path.exists() {
        bail!(
            "{} not found: build it first (cargo build --bins) or set HERALD_BIN_DIR",
            path.display()
        );
    }
    let mut command = Command::new(&path);
    for (key, _) in std::env::vars_os() {
        let key_str = key.to_string_lossy();
        if key_str.starts_with("HERALD_") || key_str == "DATABASE_URL" {
            command.env_remove(&key);
        }
    }
    if std::env::var_os("RUST_LOG").is_none() {
        command.env("RUST_LOG", "info");
    }
    // nextest sets RUST_BACKTRACE=1, which makes an anyhow error from main print a backtrace
    // long enough to push the error itself out of the stderr tail; panics keep theirs.
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        command.env("RUST_LIB_BACKTRACE", "0");
    }
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // A panicking test must not leave binaries running.
        .kill_on_drop(true);
    Ok(command)
}

/// A child process whose stdout and stderr are forwarded to the test's stderr with a prefix.
#[derive(Debug)]
struct ManagedProcess {
    name: String,
    child: Child,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    /// Everything the process wrote to stderr, for tests that search a whole run's logs.
    stderr_all: Arc<Mutex<String>>,
    /// Ends when the process closes stderr; awaited to explain a failed start completely.
    stderr_task: Option<tokio::task::JoinHandle<()>>,
}

impl ManagedProcess {
    /// Spawns `command` and waits for its `READY key=value ...` line, returning the pairs.
    async fn spawn(name: String, mut command: Command) -> Result<(Self, BTreeMap<String, String>)> {
        let mut child = command
            .spawn()
            .with_context(|| format!("spawning {name}"))?;
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        let stderr_all = Arc::new(Mutex::new(String::new()));
        let stderr_task = child.stderr.take().map(|stderr| {
            let tail = Arc::clone(&stderr_tail);
            let all = Arc::clone(&stderr_all);
            let prefix = name.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    eprintln!("[{prefix}] {line}");
                    if let Ok(mut all) = all.lock() {
                        all.push_str(&line);
                        all.push('\n');
                    }
                    if let Ok(mut tail) = tail.lock() {
                        if tail.len() == STDERR_TAIL_LINES {
                            tail.pop_front();
                        }
                        tail.push_back(line);
                    }
                }
            })
        });
        let stdout = child.stdout.take().context("stdout was not piped")?;
        let mut process = Self {
            name,
            child,
            stderr_tail,
            stderr_all,
            stderr_task,
        };
        match tokio::time::timeout(READY_TIMEOUT, read_ready(&process.name, stdout)).await {
            Ok(Ok(ready)) => Ok((process, ready)),
            Ok(Err(error)) => {
                // stdout closed: the process is exiting; its status and stderr explain why.
                let status = match tokio::time::timeout(
                    Duration::from_secs(5),
                    process.child.wait(),
                )
                .await
                {
                    Ok(Ok(status)) => status.to_string(),
                    _ => "still running".to_owned(),
                };
                process.drain_stderr().await;
                bail!(
                    "{} exited before READY ({error}; {status}); stderr tail:\n{}",
                    process.name,
                    process.stderr_tail()
                )
            }
            Err(_) => {
                let _ = process.kill();
                process.drain_stderr().await;
                bail!(
                    "{} printed no READY line within {READY_TIMEOUT:?}; stderr tail:\n{}",
                    process.name,
                    process.stderr_tail()
                )
            }
        }
    }

    /// Waits (briefly) until every stderr line the process wrote has been forwarded.
    async fn drain_stderr(&mut self) {
        if let Some(task) = self.stderr_task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
    }

    fn pid(&self) -> Result<Pid> {
        let pid = self
            .child
            .id()
            .with_context(|| format!("{} has already exited", self.name))?;
        Ok(Pid::from_raw(i32::try_from(pid)?))
    }

    fn kill(&mut self) -> Result<()> {
        self.child
            .start_kill()
            .with_context(|| format!("killing {}", self.name))
    }

    fn terminate(&mut self) -> Result<()> {
        kill(self.pid()?, Signal::SIGTERM).with_context(|| format!("SIGTERM to {}", self.name))
    }

    async fn wait(&mut self) -> Result<ExitStatus> {
        let status = self
            .child
            .wait()
            .await
            .with_context(|| format!("waiting for {}", self.name))?;
        // Everything it wrote is in the logs once it has exited.
        self.drain_stderr().await;
        Ok(status)
    }

    fn stderr_all(&self) -> String {
        self.stderr_all
            .lock()
            .map(|all| all.clone())
            .unwrap_or_default()
    }

    fn stderr_tail(&self) -> String {
        self.stderr_tail
            .lock()
            .map(|tail| tail.iter().cloned().collect::<Vec<_>>().join("\n"))
            .unwrap_or_default()
    }
}

/// Reads stdout until the `READY` line, then keeps forwarding it in the background so the
/// child never blocks on a full pipe.
async fn read_ready(name: &str, stdout: ChildStdout) -> Result<BTreeMap<String, String>> {
    let mut lines = BufReader::new(stdout).lines();
    loop {
        let line = lines
            .next_line()
            .await?
            .context("stdout closed before the READY line")?;
        eprintln!("[{name}:stdout] {line}");
        if let Some(rest) = line.strip_prefix("READY") {
            let pairs = rest
                .split_whitespace()
                .filter_map(|pair| pair.split_once('='))
                .map(|(key, value)| (key.to_owned(), value.to_owned()))
                .collect();
            let prefix = name.to_owned();
            tokio::spawn(async move {
                while let Ok(Some(line)) = lines.next_line().await {
                    eprintln!("[{prefix}:stdout] {line}");
                }
            });
            return Ok(pairs);
        }
    }
}

/// A temporary directory removed on drop.
#[derive(Debug)]
struct TempDir {
    path: PathBuf,
}

impl TempDir {
    fn new(label: &str) -> Result<Self> {
        let path = std::env::temp_dir().join(format!(
            "herald-test-{label}-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self { path })
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
