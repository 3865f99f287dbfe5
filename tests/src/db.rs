//! A fresh PostgreSQL database per test, on one private cluster shared by the whole test run.
//!
//! nextest runs every test in its own process, so "start the cluster once" cannot be a static in
//! one process: the first process to take the file lock under `target/herald-test-pg/` starts
//! the cluster and records its port; later processes find it alive and reuse it. When
//! `HERALD_TEST_PG_URL` is set (by `script/test`), that cluster is used and nothing is started.

use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use nix::fcntl::{Flock, FlockArg};
use tokio::sync::OnceCell;
use tokio_postgres::NoTls;

/// The admin URL of the run's cluster, resolved once per test process.
static ADMIN_URL: OnceCell<String> = OnceCell::const_new();

/// The role the private cluster is initialised with; it is the cluster's superuser.
const PG_SUPERUSER: &str = "herald";

/// One test's own database, created empty on the shared cluster.
///
/// Dropping it drops the database best-effort; the cluster is disposable, so a leftover
/// database costs nothing but disk.
#[derive(Debug)]
pub struct TestDb {
    admin_url: String,
    name: String,
    url: String,
}

impl TestDb {
    /// Creates a fresh, empty database `t_<random>` for the calling test, starting the shared
    /// cluster first if this is the first test of the run to need it.
    pub async fn new() -> Result<Self> {
        Self::created_with("").await
    }

    /// [`TestDb::new`] with the ICU locale `locale` (`en-US`, say) as the database's default
    /// collation: text sorts linguistically there, as on many production databases, not byte
    /// by byte as on the test cluster.
    pub async fn with_icu_collation(locale: &str) -> Result<Self> {
        // Locale names are letters, digits and dashes; nothing else is formatted in.
        if !locale
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            bail!("not a locale name: {locale}");
        }
        Self::created_with(&format!(
            " TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE '{locale}'"
        ))
        .await
    }

    /// A fresh database created with `options` after its name.
    async fn created_with(options: &str) -> Result<Self> {
        let admin_url = ADMIN_URL
            .get_or_try_init(|| async {
                if let Ok(url) = std::env::var("HERALD_TEST_PG_URL") {
                    return Ok(url);
                }
                tokio::task::spawn_blocking(ensure_local_cluster)
                    .await
                    .context("cluster start task panicked")?
            })
            .await?
            .clone();

        let name = format!("t_{}", uuid::Uuid::new_v4().simple());
        let admin = connect(&admin_url).await?;
        // The name is generated above from hex digits only, so formatting it in is safe.
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\"{options}"))
            .await
            .with_context(|| format!("creating test database {name}"))?;
        let url = replace_db_name(&admin_url, &name)?;
        Ok(Self {
            admin_url,
            name,
            url,
        })
    }

    /// The `DATABASE_URL` of this test's database.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The database's name (`t_<32 hex digits>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A new client connected to this test's database, for assertions on stored rows.
    pub async fn connect(&self) -> Result<tokio_postgres::Client> {
        connect(&self.url).await
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if std::env::var_os("HERALD_TEST_KEEP_DB").is_some() {
            eprintln!("[herald-tests] keeping database {}", self.url);
            return;
        }
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        // Drop cannot await, and the test's own runtime may be shutting down, so the
        // best-effort DROP runs on a short-lived runtime of its own.
        let dropper = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async {
                let drop_db = async {
                    let admin = connect(&admin_url).await?;
                    // FORCE ends connections a killed binary may have left behind.
                    admin
                        .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                        .await?;
                    anyhow::Ok(())
                };
                let _ = tokio::time::timeout(Duration::from_secs(10), drop_db).await;
            });
        });
        let _ = dropper.join();
    }
}

/// Connects with tokio-postgres and drives the connection on the current runtime.
async fn connect(url: &str) -> Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    tokio::spawn(async move {
        // The connection ends when the client is dropped; an error then is expected noise.
        let _ = connection.await;
    });
    Ok(client)
}

/// Replaces the database name (the URL path) of a `postgres://` URL.
fn replace_db_name(url: &str, db: &str) -> Result<String> {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let authority_start = base
        .find("://")
        .map(|i| i + 3)
        .with_context(|| format!("not a URL: {url}"))?;
    let base = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    Ok(match query {
        Some(query) => format!("{base}/{db}?{query}"),
        None => format!("{base}/{db}"),
    })
}

/// Starts (or finds running) the run's cluster under `target/herald-test-pg/` and returns its
/// admin URL. Blocking: runs under an exclusive file lock so concurrent test processes start it
/// once.
fn ensure_local_cluster() -> Result<String> {
    let root = target_dir()?.join("herald-test-pg");
    fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let lock_path = root.join("lock");
    let lock_file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("opening {}", lock_path.display()))?;
    // Held until this function returns; the lock is released when `_lock` is dropped, and by
    // the kernel if this process dies while starting the cluster.
    let _lock = Flock::lock(lock_file, FlockArg::LockExclusive)
        .map_err(|(_, errno)| errno)
        .with_context(|| format!("locking {}", lock_path.display()))?;

    let port_file = root.join("port");
    if let Ok(port) = fs::read_to_string(&port_file) {
        let url = admin_url(port.trim());
        if postmaster_alive(&url) {
            return Ok(url);
        }
    }

    let cluster = LocalCluster::new(root)?;
    let port = cluster.start()?;
    let mut file = fs::File::create(&port_file)?;
    writeln!(file, "{port}")?;
    Ok(admin_url(&port.to_string()))
}

fn admin_url(port: &str) -> String {
    format!("postgres://{PG_SUPERUSER}@127.0.0.1:{port}/postgres")
}

/// True when a server accepts connections at `url`. Checked on a throwaway runtime because
/// this runs on a blocking thread.
fn postmaster_alive(url: &str) -> bool {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return false;
    };
    runtime.block_on(async {
        matches!(
            tokio::time::timeout(Duration::from_secs(5), connect(url)).await,
            Ok(Ok(_))
        )
    })
}

/// The cargo target directory: test binaries live in `<target>/<profile>/deps/`.
pub(crate) fn target_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let exe = std::env::current_exe().context("locating the test binary")?;
    exe.ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .with_context(|| format!("no target dir above {}", exe.display()))
}

/// A cluster in `<root>/data`, with its socket and log in `<root>/run`.
struct LocalCluster {
    root: PathBuf,
    bin_dir: PathBuf,
    /// `Some(user)` when running as root: PostgreSQL refuses to run as root, so its tools run
    /// as this unprivileged user through `runuser`.
    run_as: Option<String>,
}

impl LocalCluster {
    fn new(root: PathBuf) -> Result<Self> {
        let run_as = if nix::unistd::geteuid().is_root() {
            Some(std::env::var("HERALD_PG_USER").unwrap_or_else(|_| "postgres".to_owned()))
        } else {
            None
        };
        Ok(Self {
            root,
            bin_dir: pg_bin_dir()?,
            run_as,
        })
    }

    fn start(&self) -> Result<u16> {
        let data = self.root.join("data");
        let run = self.root.join("run");
        // A data dir without a finished initdb (a crash mid-way) is useless: start over.
        if !data.join("PG_VERSION").exists() {
            let _ = fs::remove_dir_all(&data);
            self.make_owned_dir(&data)?;
            self.pg_tool(
                "initdb",
                &[
                    "-D",
                    path_str(&data)?,
                    "-U",
                    PG_SUPERUSER,
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--no-sync",
                ],
            )?;
        }
        self.make_owned_dir(&run)?;

        // Another program may take the free port between our probe and the postmaster's bind;
        // a few attempts make that race harmless.
        let mut last_error = None;
        for _ in 0..3 {
            let port = free_port()?;
            let options = format!(
                "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off \
                 -c synchronous_commit=off -c full_page_writes=off -c max_connections=500",
                path_str(&run)?
            );
            let log = run.join("postgres.log");
            match self.pg_tool(
                "pg_ctl",
                &[
                    "start",
                    "-w",
                    "-t",
                    "60",
                    "-D",
                    path_str(&data)?,
                    "-l",
                    path_str(&log)?,
                    "-o",
                    &options,
                ],
            ) {
                Ok(()) => return Ok(port),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("pg_ctl start failed")))
    }

    /// Creates `dir` owned by the user PostgreSQL runs as, mode 0700 as initdb requires.
    fn make_owned_dir(&self, dir: &Path) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
        if let Some(user) = &self.run_as {
            let user = nix::unistd::User::from_name(user)?.with_context(|| {
                format!(
                    "running as root and user {user:?} does not exist: create it \
                     (useradd --system {user}) or set HERALD_PG_USER"
                )
            })?;
            nix::unistd::chown(dir, Some(user.uid), Some(user.gid))
                .with_context(|| format!("chown {}", dir.display()))?;
        }
        Ok(())
    }

    /// Runs a PostgreSQL tool to completion, failing with its output when it fails.
    fn pg_tool(&self, tool: &str, args: &[&str]) -> Result<()> {
        let program = self.bin_dir.join(tool);
        let mut command = match &self.run_as {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(&program);
                command
            }
            None => Command::new(&program),
        };
        // output() captures stdout/stderr, so the daemonised postmaster (which logs to its own
        // file) never holds the test's output pipes open.
        let output = command
            .args(args)
            .output()
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

fn path_str(path: &Path) -> Result<&str> {
    path.to_str()
        .with_context(|| format!("non-UTF-8 path {}", path.display()))
}

/// Finds the PostgreSQL server binaries: `HERALD_PG_BIN`, else the newest
/// `/usr/lib/postgresql/<version>/bin`, else `pg_config --bindir`.
fn pg_bin_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("HERALD_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let newest = fs::read_dir("/usr/lib/postgresql")
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
    let output = Command::new("pg_config").arg("--bindir").output().context(
        "no PostgreSQL found: install it (apt-get install postgresql) or set HERALD_PG_BIN",
    )?;
    Ok(PathBuf::from(
        String::from_utf8_lossy(&output.stdout).trim().to_owned(),
    ))
}

/// A port that was free a moment ago on 127.0.0.1.
fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("probing for a free port")?;
    Ok(listener.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::replace_db_name;

    #[test]
    fn replaces_the_database_name() {
        assert_eq!(
            replace_db_name("postgres://herald@127.0.0.1:5432/postgres", "t_1").unwrap(),
            "postgres://herald@127.0.0.1:5432/t_1"
        );
        assert_eq!(
            replace_db_name("postgres://h@127.0.0.1:1/postgres?sslmode=disable", "x").unwrap(),
            "postgres://h@127.0.0.1:1/x?sslmode=disable"
        );
        assert_eq!(
            replace_db_name("postgres://h@127.0.0.1:1", "x").unwrap(),
            "postgres://h@127.0.0.1:1/x"
        );
    }
}
