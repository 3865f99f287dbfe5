//! `herald-scheduler`: `serve` (the default) runs the scheduler; `migrate` applies the database
//! migrations and exits (for a deployment's pre-upgrade hook).

use std::io::Write;

use anyhow::Context;
use clap::{Parser, Subcommand};
use herald_scheduler::{store, telemetry, Config, Listeners};

#[derive(Parser)]
#[command(
    name = "herald-scheduler",
    version,
    about = "herald's scheduler: owns task state and leases due tasks to executors"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the gRPC API and lease stream (the default).
    Serve(Box<Config>),
    /// Apply database migrations and exit.
    Migrate {
        /// PostgreSQL connection string.
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
        /// Log format: text or json.
        #[arg(long, env = "HERALD_LOG_FORMAT", default_value = "text")]
        log_format: String,
    },
    /// Print a new random token and the tokens-file entry holding its hash.
    Token {
        /// The entry's name (shown in logs and metrics instead of the token).
        #[arg(long, default_value = "my-app")]
        name: String,
        /// Roles: client, executor, admin, viewer (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "client")]
        roles: Vec<String>,
        /// Namespaces, the first being the default (comma-separated; "*" for all).
        #[arg(long, value_delimiter = ',', default_value = "default")]
        namespaces: Vec<String>,
    },
}

/// The executor's allocator (see executor/src/main.rs): the scheduler also builds and drops a
/// message per lease and per report on tokio's worker threads.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    // `serve` is the default subcommand: insert it when the first argument is a flag.
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let first = args.get(1).and_then(|a| a.to_str()).unwrap_or("");
    if !matches!(
        first,
        "serve" | "migrate" | "token" | "help" | "-h" | "--help" | "-V" | "--version"
    ) {
        args.insert(1, "serve".into());
    }
    let cli = Cli::parse_from(args);
    if let Command::Token {
        name,
        roles,
        namespaces,
    } = &cli.command
    {
        return print_token(name, roles, namespaces);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        match cli.command {
            Command::Migrate {
                database_url,
                log_format,
            } => {
                let _telemetry = telemetry::init(&log_format, "herald-scheduler");
                let store = store::Store::connect(&database_url, 1)?;
                let applied = store::migrate::run(&store)
                    .await
                    .context("cannot apply migrations")?;
                tracing::info!(applied, "migrations up to date");
                Ok(())
            }
            Command::Serve(config) => serve(*config).await,
            Command::Token { .. } => Ok(()),
        }
    })
}

async fn serve(config: Config) -> anyhow::Result<()> {
    // Held to the end of serve: dropping it flushes the spans not yet exported.
    let _telemetry = telemetry::init(&config.log_format, "herald-scheduler");
    herald_process::memory::turn_off_transparent_huge_pages();
    let listeners = Listeners::bind(&config)
        .await
        .with_context(|| format!("cannot bind {} / {}", config.grpc_addr, config.http_addr))?;
    let grpc = listeners.grpc.local_addr()?;
    let http = listeners.http.local_addr()?;
    // Before READY is printed, so a signal sent right after start-up is caught.
    let shutdown = herald_process::shutdown::on_signal().context("cannot handle SIGTERM/SIGINT")?;
    herald_scheduler::run(config, listeners, shutdown, move || {
        // One machine-readable line on stdout: launchers and test harnesses wait for it.
        let mut out = std::io::stdout();
        let _ = writeln!(out, "READY grpc={grpc} http={http}");
        let _ = out.flush();
    })
    .await?;
    Ok(())
}

/// Prints a fresh token (stdout, first line: give it to the client) and its entry for the
/// tokens file, after checking the entry parses as the scheduler will parse it.
fn print_token(name: &str, roles: &[String], namespaces: &[String]) -> anyhow::Result<()> {
    use herald_scheduler::auth::tokens::{generate, TokenSet};
    let (token, hash) = generate();
    let list = |items: &[String]| {
        items
            .iter()
            .map(|i| format!("{i:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let entry = format!(
        "[[token]]\nname = {name:?}\nsha256 = \"{hash}\"\nroles = [{}]\nnamespaces = [{}]\n",
        list(roles),
        list(namespaces)
    );
    TokenSet::parse(&entry, "the new entry").context("invalid --roles or --namespaces")?;
    let mut out = std::io::stdout();
    writeln!(out, "{token}")?;
    writeln!(
        out,
        "\n# Add to the tokens file (HERALD_AUTH_TOKENS_FILE); the token above is not stored:"
    )?;
    write!(out, "{entry}")?;
    Ok(())
}
