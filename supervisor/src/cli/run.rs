//! `subagent run`: one run to its end, for CI. It uses the daemon when one
//! answers on the socket, otherwise the same engine in-process with a state
//! dir of its own. The child's log streams to stdout as it is written
//! (made visible on a terminal unless `--raw`, as `logs` does);
//! result.md's path goes to stderr; the exit code is the run's:
//! 0 succeeded, the child's code or 128+signal when failed, 124 timed_out,
//! 130 cancelled, 125 lost (and 125 when `subagent run` itself fails).

use super::args::RunArgs;
use super::commands::{spawn_params, wait_exit_code, Ctx};
use super::follow;
use crate::client::{Client, ClientError};
use crate::engine::{Config, Supervisor};
use crate::ids::RunId;
use crate::sanitize::{for_terminal, one_line};
use crate::status::RunStatus;
use anyhow::{anyhow, bail, Context, Result};
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;
use tokio::signal::unix::{signal, SignalKind};

/// Exit code when `subagent run` itself failed.
pub const EXIT_RUN_ERROR: u8 = 125;

enum Backend {
    Daemon(PathBuf, crate::trust::Trust),
    Embedded(Supervisor),
}

impl Backend {
    async fn call(
        &self,
        method: &'static str,
        params: serde_json::Value,
    ) -> Result<serde_json::Value> {
        let Backend::Daemon(socket, trust) = self else {
            return Err(anyhow!("not connected to a daemon"));
        };
        let (socket, trust) = (socket.clone(), trust.clone());
        tokio::task::spawn_blocking(move || {
            Ok(Client::connect(&socket, &trust)?.call(method, params)?)
        })
        .await?
    }

    async fn spawn(&self, params: crate::protocol::SpawnParams) -> Result<RunId> {
        match self {
            Backend::Embedded(sup) => Ok(sup.spawn(params).await?),
            Backend::Daemon(..) => {
                let v = self
                    .call("spawn_agent", serde_json::to_value(&params)?)
                    .await?;
                let id = v["run_id"].as_str().unwrap_or_default();
                RunId::parse(id).ok_or_else(|| anyhow!("bad run id from the daemon: {v}"))
            }
        }
    }

    async fn wait(&self, id: &RunId) -> Result<RunStatus> {
        match self {
            Backend::Embedded(sup) => Ok(sup.wait(id, None).await?),
            Backend::Daemon(..) => {
                let v = self
                    .call("wait_agent_run", json!({ "run_id": id.as_str() }))
                    .await?;
                Ok(serde_json::from_value(v)?)
            }
        }
    }

    async fn status(&self, id: &RunId) -> Result<RunStatus> {
        match self {
            Backend::Embedded(sup) => Ok(sup.status(id)?),
            Backend::Daemon(..) => {
                let v = self
                    .call("check_agent_run", json!({ "run_id": id.as_str() }))
                    .await?;
                Ok(serde_json::from_value(v)?)
            }
        }
    }

    async fn cancel(&self, id: &RunId) -> Result<()> {
        match self {
            Backend::Embedded(sup) => {
                sup.cancel(id).await?;
            }
            Backend::Daemon(..) => {
                self.call("cancel_agent_run", json!({ "run_id": id.as_str() }))
                    .await?;
            }
        }
        Ok(())
    }
}

/// The daemon when a trusted one answers; the engine in-process when
/// nothing listens. Anything else at the socket path is refused: falling
/// back would hide a planted socket, and talking to it would hand it the task.
async fn backend(ctx: &Ctx) -> Result<Backend> {
    match Client::connect(&ctx.socket, &ctx.trust) {
        Ok(_) => return Ok(Backend::Daemon(ctx.socket.clone(), ctx.trust.clone())),
        Err(ClientError::Connect(e)) if e.nobody_listens() => {}
        Err(e) => bail!(
            "{e}; not running in-process instead while that holds the socket path: remove it, or name another with --socket"
        ),
    }
    let state_dir = if ctx.explicit_state_dir {
        ctx.state_dir.clone()
    } else {
        tempfile::Builder::new()
            .prefix("subagent-run-")
            .tempdir_in(std::env::temp_dir())
            .context("creating a state dir for the embedded supervisor")?
            .keep()
    };
    eprintln!(
        "subagent: no daemon at {}; running in-process with state dir {}",
        ctx.socket.display(),
        state_dir.display()
    );
    // The same config as the daemon's (SUBAGENTD_CONFIG, else the default
    // file when it exists): its requirements and run_as hold here too.
    let explicit = std::env::var_os("SUBAGENTD_CONFIG").map(PathBuf::from);
    let (path, file) =
        crate::paths::load_config(explicit.as_deref()).map_err(anyhow::Error::msg)?;
    crate::paths::check_config_roots(&path, &file)?;
    let mut cfg = Config::new(state_dir);
    if let Some(user) = &file.run_as {
        cfg.run_as = Some(crate::runas::parse(user).map_err(anyhow::Error::msg)?);
    }
    cfg.settings = file;
    let sup = Supervisor::start(cfg).await?;
    Ok(Backend::Embedded(sup))
}

async fn run(ctx: &Ctx, args: RunArgs, raw: bool) -> Result<u8> {
    // Listening before the spawn: an interrupt that comes while the run
    // starts cancels it too.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let params = spawn_params(&args, "ci")?;
    let backend = backend(ctx).await?;
    let id = backend.spawn(params).await?;
    eprintln!("subagent: run {id} accepted");
    let status = backend.status(&id).await?;
    let dir = status
        .log_path
        .parent()
        .ok_or_else(|| anyhow!("bad log path {}", status.log_path.display()))?
        .to_path_buf();
    let db = crate::paths::StateLayout::new(ctx.state_dir.clone()).db();
    let mut streamer = tokio::task::spawn_blocking(move || {
        let at = follow::RunLog {
            dir: &dir,
            db: Some(&db),
        };
        follow::print_log_to_stdout(at, 0, true, raw)
    });
    let mut cancelled = false;
    loop {
        tokio::select! {
            r = &mut streamer => {
                match r {
                    Ok(Err(e)) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                        eprintln!("subagent: streaming the log: {e}");
                    }
                    _ => {}
                }
                break;
            }
            _ = term.recv(), if !cancelled => cancelled = true,
            _ = int.recv(), if !cancelled => cancelled = true,
        }
        if cancelled {
            eprintln!("subagent: cancelling run {id}");
            backend.cancel(&id).await?;
        }
    }
    let status = backend.wait(&id).await?;
    let reason = one_line(status.reason.as_deref().unwrap_or(""));
    eprintln!(
        "subagent: run {id} {} ({reason}); result: {}",
        status.state.as_str(),
        one_line(&status.result_path.to_string_lossy())
    );
    Ok(wait_exit_code(&status))
}

/// Entry point of `subagent run`.
pub fn main(ctx: &Ctx, args: RunArgs, raw: bool) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("subagent: starting the runtime: {e}");
            return ExitCode::from(EXIT_RUN_ERROR);
        }
    };
    let code = match rt.block_on(run(ctx, args, raw)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("subagent: {}", for_terminal(&format!("{e:#}")));
            EXIT_RUN_ERROR
        }
    };
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    ExitCode::from(code)
}
