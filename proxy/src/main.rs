//! `tollgate`: parse flags, load the configuration before binding anything,
//! then run the library until SIGTERM/SIGINT; SIGHUP reloads the file.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tokio::signal::unix::{signal, SignalKind};
use tollgate::logging::LogFlags;
use tollgate::tls::serving::FILE_POLL;
use tollgate::workers::{self, Workers};
use tollgate::{Config, Flags, Gateway};

/// `--version`: the crate version and the git commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (revision ",
    env!("TOLLGATE_REVISION"),
    ")"
);

/// A streaming reverse proxy for kube-apiserver that learns what heavy LISTs cost and admits them against a byte quota.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version = VERSION)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    flags: Flags,
    #[command(flatten)]
    log: LogFlags,
    /// Threads serving client connections, each with its own event loop and upstream connections; a connection stays on one [default: TOKIO_WORKER_THREADS when set, else the CPUs this process may use]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=workers::MAX_WORKERS as i64))]
    workers: Option<u16>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check the configuration (same file and flags as a real start) without starting
    CheckConfig {
        #[command(flatten)]
        flags: Flags,
    },
}

// jemalloc instead of glibc's malloc. Every request allocates a little (its classification,
// pattern key, client name), and open loop, with each request waking alone on cold caches,
// glibc's malloc/free cost more instructions and CPU per request; jemalloc keeps RSS inside
// the memory targets, mimalloc did not (figures: bench/RESULTS.md, "tollgate: the figures
// behind choices in proxy/").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// When the configuration file was last modified, if there is one.
fn modified(flags: &Flags) -> Option<std::time::SystemTime> {
    let path = flags.config.as_ref()?;
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Exit code for a configuration that cannot be used (EX_CONFIG-like, as linkerd uses 64).
const EXIT_CONFIG: u8 = 64;

fn main() -> ExitCode {
    let cli = Cli::parse();
    tollgate::logging::init(&cli.log);
    match cli.command {
        Some(Command::CheckConfig { flags }) => match check(&flags) {
            Ok(summary) => {
                println!("{summary}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(EXIT_CONFIG)
            }
        },
        None => {
            let config = match Config::load(&cli.flags) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            let n = match cli
                .workers
                .map_or_else(workers::default_count, |n| Ok(usize::from(n)))
            {
                Ok(n) => n,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            match run(config, cli.flags, n) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Everything a start checks before serving, short of binding: the file and flags
/// (`Config::load`: the line and field at fault), the listener addresses, and the
/// certificates, keys and upstream URLs (`Gateway::new`). Binding is left out on purpose:
/// the check runs beside a live tollgate (systemd's `ExecStartPre`, before a rollout),
/// whose ports are taken.
fn check(flags: &Flags) -> anyhow::Result<String> {
    let config = Config::load(flags)?;
    check_address("listen (--listen)", &config.listen)?;
    if let Some(admin) = &config.admin_listen {
        check_address("adminListen (--admin-listen)", admin)?;
    }
    let summary = format!(
        "configuration OK: mode {}, listen {}, admin {}, upstreams {}",
        config.mode.as_str(),
        config.listen,
        config.admin_listen.as_deref().unwrap_or("off"),
        config.upstream.urls.join(", ")
    );
    Gateway::new(config).context("loading certificates and upstreams")?;
    Ok(summary)
}

/// A listener address must be `IP:PORT` (or `host:PORT` that resolves), as binding needs.
fn check_address(setting: &str, addr: &str) -> anyhow::Result<()> {
    use std::net::ToSocketAddrs;
    let resolved = addr
        .to_socket_addrs()
        .with_context(|| format!("invalid setting {setting}: {addr:?} is not an address:port"))?;
    anyhow::ensure!(
        resolved.count() > 0,
        "invalid setting {setting}: {addr:?} resolves to no address"
    );
    Ok(())
}

/// The workers first (the upstream clients are made per worker), then the accept loop, the admin
/// listener and the background loops on this thread's runtime until a signal to stop.
fn run(config: Config, flags: Flags, workers: usize) -> anyhow::Result<()> {
    let workers = Workers::start(workers).context("starting the workers")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let served = runtime.block_on(serve(config, flags, workers.clone()));
    workers.shutdown();
    served
}

async fn serve(config: Config, flags: Flags, workers: Workers) -> anyhow::Result<()> {
    tollgate::install_crypto_provider();
    let gateway = Gateway::new(config.clone())?;
    gateway.learn_identity_headers().await?;
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    let admin = match &config.admin_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding admin {addr}"))?,
        ),
        None => None,
    };
    let admin_addr = admin.as_ref().and_then(|a| a.local_addr().ok());
    tracing::info!(
        listen = %listener.local_addr()?,
        admin = ?admin_addr,
        upstreams = ?config.upstream.urls,
        mode = config.mode.as_str(),
        "tollgate started"
    );
    // One stdout line with the bound addresses (port 0 picks a free one), for harnesses.
    let scheme = if config.tls.cert_file.is_some() {
        "https"
    } else {
        "http"
    };
    let admin_scheme = if config.admin.tls.cert_file.is_some() {
        "https"
    } else {
        "http"
    };
    let admin_url =
        admin_addr.map_or_else(|| "off".to_string(), |a| format!("{admin_scheme}://{a}"));
    println!(
        "tollgate serving at {scheme}://{} (admin {admin_url})",
        listener.local_addr()?
    );

    // SIGHUP, or a change of the file, reloads; a bad file keeps the running config.
    let mut hup = signal(SignalKind::hangup())?;
    let reloader = gateway.clone();
    tokio::spawn(async move {
        let mut seen = modified(&flags);
        let mut tick = tokio::time::interval(FILE_POLL);
        loop {
            tokio::select! {
                s = hup.recv() => if s.is_none() { return },
                _ = tick.tick() => {
                    let now = modified(&flags);
                    if now == seen {
                        continue;
                    }
                    seen = now;
                    tracing::info!("configuration file changed");
                }
            }
            reloader.reload_from(Config::load(&flags));
        }
    });
    let mut term = signal(SignalKind::terminate())?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    tollgate::server::serve(gateway, listener, admin, shutdown, workers).await;
    Ok(())
}
