//! `subagentd`: the supervisor daemon. Runs in the foreground; serves the
//! control socket until SIGTERM or SIGINT, then removes the socket and exits.
//! Running children are left running: their runners do not need the daemon.

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use std::path::{Path, PathBuf};
use subagentd::engine::{Config, Supervisor};
use subagentd::server::socket::BoundSocket;
use tokio::signal::unix::{signal, SignalKind};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// The subagentd daemon.
#[derive(Debug, Parser)]
#[command(
    name = "subagentd",
    version,
    about = "Supervisor for sandboxed AI subagents"
)]
struct Args {
    /// The control socket.
    #[arg(long, env = "SUBAGENTD_SOCKET", value_name = "PATH")]
    socket: Option<PathBuf>,
    /// The config file (default: $XDG_CONFIG_HOME/subagentd/config.toml,
    /// used when it exists). See docs/config.md.
    #[arg(long, env = "SUBAGENTD_CONFIG", value_name = "PATH")]
    config: Option<PathBuf>,
    /// The state dir.
    #[arg(long, env = "SUBAGENTD_STATE_DIR", value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// At most this many children at once (default: 2 × CPU cores).
    #[arg(long, value_name = "N")]
    max_concurrent: Option<usize>,
    /// The subagent-runner binary (default: next to this executable, else
    /// the first on PATH in directories only root or this uid can write).
    #[arg(long, env = "SUBAGENTD_RUNNER", value_name = "PATH")]
    runner: Option<PathBuf>,
    /// Run every child as this one unprivileged user (`USER` or
    /// `UID:GID`) instead of a uid of its own per run; the daemon must run
    /// as root.
    #[arg(long, env = "SUBAGENTD_RUN_AS", value_name = "USER")]
    run_as: Option<String>,
    /// Log format on stderr.
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    /// The file stderr is appended to, to keep it capped: at 10 MiB it is
    /// moved to PATH.1 (replacing the older one) and a new one started;
    /// checked at start and every minute.
    #[arg(long, value_name = "PATH")]
    log_file: Option<PathBuf>,
    /// Serve the metrics over HTTP at /metrics: a PORT (on 127.0.0.1) or
    /// HOST:PORT (another address only when written out). Off by default;
    /// the config's `metrics_listen` is used when this is not given.
    #[arg(long, env = "SUBAGENTD_METRICS_LISTEN", value_name = "ADDR")]
    metrics_listen: Option<String>,
    /// Print what this host can enforce and exit: 0 when every default
    /// requirement (Landlock, seccomp, capability drop, network isolation)
    /// holds, 1 otherwise.
    #[arg(long)]
    check: bool,
}

/// `--check`: the host's facts, then one run to show what runs get, then
/// each required mechanism (the config's list, `namespaces` always).
fn check(config: Option<&std::path::Path>, runner: Option<PathBuf>) -> std::process::ExitCode {
    let (required, settings) = match subagentd::paths::load_config(config) {
        Ok((_, c)) => (c.required(false), c),
        Err(e) => {
            eprintln!("subagentd: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    say(&subagentd::engine::probe::probe().summary());
    let outcome = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
        .and_then(|rt| {
            rt.block_on(subagentd::selfcheck::probe_run(runner, settings))
                .map_err(|e| e.to_string())
        });
    let status = match outcome {
        Ok(o) => o.status,
        Err(e) => {
            say(&format!(
                "MISSING namespaces: the check run could not be made: {e}"
            ));
            return std::process::ExitCode::FAILURE;
        }
    };
    print_check_run(&status);
    let mut ok = true;
    let mechanisms = required
        .into_iter()
        .chain([policy::sandbox::Mechanism::Namespaces]);
    for m in mechanisms {
        match subagentd::selfcheck::missing(&status, m) {
            Some(why) => {
                ok = false;
                say(&format!("MISSING {}: {why}", m.as_str()));
            }
            None => say(&format!("ok      {}", m.as_str())),
        }
    }
    if ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

/// One line of `--check` to stdout; a reader that went away is no error
/// (the exit code still says whether the requirements hold).
fn say(line: &str) {
    let _ = subagentd::cli::stdout::line(line);
}

/// What the check run got, as its isolation report says.
fn print_check_run(status: &subagentd::status::RunStatus) {
    let reason = status.reason.as_deref().unwrap_or("");
    say(&format!("a run here: {} ({reason})", status.state.as_str()));
    let Some(iso) = &status.isolation else { return };
    for row in subagentd::isolation::rows(iso) {
        let (name, mark) = (row.name, row.mark());
        say(&format!("  {name}: {mark}: {}", row.state.detail));
    }
    say(&format!("  user: {}", iso.user));
    for n in &iso.notes {
        say(&format!("  note: {n}"));
    }
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Resolves on the first SIGTERM or SIGINT. The handlers are installed
/// when this is called, before the socket exists, so a signal never finds
/// the daemon without them.
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>> {
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
    })
}

async fn run(args: Args, activated: Option<BoundSocket>) -> Result<()> {
    let shutdown = shutdown_signal()?;
    // A passed socket is served where it is bound, whatever --socket says.
    let socket_path = match &activated {
        Some(b) => b.path().to_path_buf(),
        None => args.socket.unwrap_or_else(subagentd::paths::default_socket),
    };
    let state_dir = args
        .state_dir
        .unwrap_or_else(subagentd::paths::default_state_dir);
    let (config_path, file) =
        subagentd::paths::load_config(args.config.as_deref()).map_err(anyhow::Error::msg)?;
    subagentd::paths::check_config_roots(&config_path, &file)?;
    let mut cfg = Config::new(state_dir.clone());
    cfg.settings = file.clone();
    cfg.socket_dir = std::path::absolute(&socket_path)
        .with_context(|| format!("the socket {}", socket_path.display()))?
        .parent()
        .map(Path::to_path_buf);
    if let Some(n) = file.max_concurrent {
        cfg.max_concurrent = n;
    }
    if let Some(n) = args.max_concurrent {
        anyhow::ensure!(n > 0, "--max-concurrent must be at least 1");
        cfg.max_concurrent = n;
    }
    cfg.runner = runner_of(args.runner.as_deref())?;
    if let Some(user) = args.run_as.as_ref().or(file.run_as.as_ref()) {
        let r = subagentd::runas::parse(user).map_err(anyhow::Error::msg)?;
        subagentd::runas::check(&r).map_err(anyhow::Error::msg)?;
        cfg.run_as = Some(r);
    }
    let bound = match activated {
        Some(b) => b,
        None => subagentd::server::socket::bind_socket(&socket_path)
            .with_context(|| format!("setting up the socket {}", socket_path.display()))?,
    };
    let sup = Supervisor::start(cfg.clone())
        .await
        .with_context(|| format!("opening the state dir {}", state_dir.display()))?;
    trim_when_quiet(&sup);
    if config_path.exists() {
        tracing::info!(config = %config_path.display(), "config loaded");
    }
    tracing::info!("host: {}", sup.probe().summary());
    for m in cfg.required(false) {
        if let Some(why) = sup.probe().missing(m) {
            tracing::warn!(
                "{} cannot be enforced here ({why}): spawns that require it are refused",
                m.as_str()
            );
        }
    }
    tracing::info!(
        socket = %socket_path.display(),
        state_dir = %state_dir.display(),
        max_concurrent = cfg.max_concurrent,
        pid = std::process::id(),
        "subagentd listening"
    );
    let server_cfg = subagentd::server::ServerConfig::from_settings(&file);
    let metrics_at = args
        .metrics_listen
        .as_deref()
        .or(file.metrics_listen.as_deref());
    let metrics = metrics_at.map(|a| serve_metrics(&sup, a)).transpose()?;
    subagentd::server::notify::ready(&sup);
    let served = subagentd::server::serve(sup.clone(), &bound, server_cfg, shutdown).await;
    if let Some(task) = metrics {
        task.abort();
    }
    subagentd::server::notify::stopping();
    served.context("serving the socket")?;
    drop(bound);
    tracing::info!("stopped serving the socket; running children keep running");
    close_store(&sup).await
}

/// Starts serving the metrics over HTTP on `given` (`--metrics-listen` or
/// the config's `metrics_listen`).
fn serve_metrics(sup: &Supervisor, given: &str) -> Result<tokio::task::JoinHandle<()>> {
    use subagentd::server::metrics_http;
    let addr = metrics_http::parse_listen(given)?;
    let listener = metrics_http::bind(addr)?;
    let at = listener.local_addr().unwrap_or(addr);
    if !at.ip().is_loopback() {
        tracing::warn!(
            "metrics are served on {at}, not a loopback address: whoever reaches it reads \
             the daemon's counts (no run ids, sessions, paths or secrets)"
        );
    }
    tracing::info!("metrics served at http://{at}{}", metrics_http::PATH);
    Ok(tokio::spawn(metrics_http::serve(sup.clone(), listener)))
}

/// The last write: the next start knows this stop was clean (unless the
/// store met an I/O failure or damage, which the next start checks for).
async fn close_store(sup: &Supervisor) -> Result<()> {
    let marked = sup
        .close_store()
        .await
        .context("marking the state database as cleanly stopped")?;
    if marked {
        tracing::info!("state database marked as cleanly stopped");
    } else {
        tracing::warn!(
            "state database not marked as cleanly stopped: it met an I/O failure or damage \
             while running, so the next start checks its integrity"
        );
    }
    Ok(())
}

/// How long no run may finish before the heap is trimmed.
const TRIM_QUIET: std::time::Duration = std::time::Duration::from_secs(1);

/// Gives the heap glibc keeps free back to the kernel once runs have
/// stopped finishing for [`TRIM_QUIET`]: what a burst of runs freed would
/// otherwise stay in the daemon's RSS.
fn trim_when_quiet(sup: &Supervisor) {
    use tokio::sync::broadcast::error::RecvError;
    let mut notices = sup.subscribe();
    tokio::spawn(async move {
        loop {
            if let Err(RecvError::Closed) = notices.recv().await {
                return;
            }
            loop {
                match tokio::time::timeout(TRIM_QUIET, notices.recv()).await {
                    Err(_) => break,
                    Ok(Err(RecvError::Closed)) => return,
                    Ok(_) => {}
                }
            }
            let _ = tokio::task::spawn_blocking(trim_heap).await;
        }
    });
}

/// Returns the free memory at the top of each malloc arena to the kernel.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim_heap() {
    // SAFETY: malloc_trim only releases memory malloc holds free; it takes
    // malloc's own locks and touches no memory of ours.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim_heap() {}

/// Caps glibc's malloc arenas before any thread exists (arenas are made
/// per thread as threads start).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn cap_malloc_arenas() {
    // SAFETY: mallopt only sets one of malloc's parameters, here before
    // any other thread runs.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn cap_malloc_arenas() {}

/// How often the `--log-file` is checked against its cap.
const LOG_CHECK: std::time::Duration = std::time::Duration::from_secs(60);

/// Checks `log` now and every [`LOG_CHECK`] on a thread of its own.
fn keep_log_capped(log: PathBuf) {
    let shown = log.display().to_string();
    let spawned = std::thread::Builder::new()
        .name("log-cap".into())
        .spawn(move || loop {
            match cap_log(&log) {
                Ok(true) => tracing::info!(log = %log.display(), "log moved to .1 at its cap"),
                Ok(false) => {}
                Err(e) => tracing::warn!("capping the log {}: {e:#}", log.display()),
            }
            std::thread::sleep(LOG_CHECK);
        });
    if let Err(e) = spawned {
        tracing::warn!("capping the log {shown}: {e}");
    }
}

/// Moves `log` to `log.1` and points stderr at a new one, when stderr is
/// `log` and it has reached its cap; true then.
fn cap_log(log: &std::path::Path) -> Result<bool> {
    use std::os::fd::AsFd;
    let name = log
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| anyhow::anyhow!("not a file name"))?;
    let dir = log
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let dir = subagentd::securedir::open_owned_dir(dir)?;
    let stderr = std::io::stderr();
    let (file, moved) = dir.open_capped_log(
        name,
        subagentd::paths::uid(),
        subagentd::securedir::LOG_CAP,
        Some(stderr.as_fd()),
    )?;
    if moved {
        nix::unistd::dup2_stderr(&file)?;
    }
    Ok(moved)
}

/// Threads the runtime's blocking pool may have at once (tokio's default
/// is 512). Blocking work here is short (SQLite reads, commits waiting on
/// the writer, run folders), so a few threads keep up; each thread more
/// costs a stack and, with glibc, a malloc cache (tcache) and arena that
/// are never given back, which made the RSS grow with the runs made.
const BLOCKING_THREADS: usize = 8;

/// glibc malloc arenas (its default is 8 per core): threads share them
/// instead of each keeping freed memory of its own.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MALLOC_ARENAS: libc::c_int = 2;

/// The runner: `--runner` (made absolute: runners start from `/`), else
/// next to this executable or a trusted one on PATH.
fn runner_of(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    let Some(r) = given else {
        return Ok(subagentd::runnerpath::locate_for_self()?);
    };
    let abs = std::path::absolute(r).with_context(|| format!("the runner {}", r.display()))?;
    anyhow::ensure!(abs.is_file(), "the runner {} does not exist", abs.display());
    Ok(abs)
}

fn main() -> std::process::ExitCode {
    cap_malloc_arenas();
    // What the daemon inherited from whoever started it must not reach the
    // runners it spawns.
    let _ = subagent_runner::sys::cloexec_from(3);
    let args = Args::parse();
    if args.check {
        let runner = match runner_of(args.runner.as_deref()) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("subagentd: {e:#}");
                return std::process::ExitCode::from(2);
            }
        };
        say(&format!("runner: {}", runner.display()));
        return check(args.config.as_deref(), Some(runner));
    }
    // Before any thread starts: it edits the environment.
    let activated = subagentd::server::activation::take_activated();
    init_tracing(args.log_format);
    if let Some(log) = &args.log_file {
        keep_log_capped(log.clone());
    }
    // Descriptors are what runs' proxied connections cost the daemon.
    match subagentd::egress::budget::raise_nofile() {
        Ok(n) => tracing::info!(nofile = n, "descriptor limit"),
        Err(e) => tracing::warn!("raising the descriptor limit: {e}"),
    }
    subagentd::egress::start_runtime();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(BLOCKING_THREADS)
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("subagentd: starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        let activated = activated.context("taking the socket from the service manager")?;
        run(args, activated).await
    });
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("subagentd: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
