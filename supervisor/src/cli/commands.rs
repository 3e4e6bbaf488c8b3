//! The commands that talk to the daemon, and `logs`.

use super::args::{Command, RunArgs, WorktreeAction, EXIT_STILL_RUNNING};
use super::{follow, show, stdout};
use crate::client::{Client, ClientError};
use crate::ids::RunId;
use crate::paths::StateLayout;
use crate::protocol::{SessionParams, SpawnParams};
use crate::sanitize::{for_terminal, json_text, one_line};
use crate::status::RunStatus;
use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;

/// Where the client looks.
pub struct Ctx {
    /// The daemon's socket.
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    /// Print JSON instead of text.
    pub json: bool,
    /// The state dir was given explicitly.
    pub explicit_state_dir: bool,
    /// Whom the client takes for the daemon.
    pub trust: crate::trust::Trust,
}

impl Ctx {
    /// A new connection to the daemon.
    pub fn client(&self) -> Result<Client> {
        Ok(Client::connect(&self.socket, &self.trust)?)
    }

    fn call(&self, method: &str, params: Value) -> Result<Value> {
        Ok(self.client()?.call(method, params)?)
    }
}

/// The spawn params for `args` (the session defaults to `default_session`).
pub fn spawn_params(args: &RunArgs, default_session: &str) -> Result<SpawnParams> {
    let project_dir = match &args.project_dir {
        Some(d) => {
            std::path::absolute(d).with_context(|| format!("project dir {}", d.display()))?
        }
        None => std::env::current_dir().context("current directory")?,
    };
    let audience = serde_json::from_value(json!(args.audience)).map_err(|_| {
        anyhow!(
            "--audience must be personal or team, not {:?}",
            args.audience
        )
    })?;
    let mut env = BTreeMap::new();
    for kv in &args.env {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow!("--env {kv:?}: expected NAME=VALUE"))?;
        env.insert(k.to_owned(), v.to_owned());
    }
    let driver =
        match &args.driver {
            Some(d) => Some(policy::driver::Driver::parse(d).ok_or_else(|| {
                anyhow!("--driver must be command, claude-code or codex, not {d:?}")
            })?),
            None => None,
        };
    Ok(SpawnParams {
        driver,
        stdin: args
            .stdin_first_message
            .then_some(crate::protocol::StdinSource::FirstMessage),
        session: SessionParams {
            id: args
                .session
                .clone()
                .unwrap_or_else(|| default_session.to_owned()),
            audience,
            project_dir,
            tools: args.tools.as_ref().map(|t| {
                t.split(',')
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect()
            }),
            recent_files: None,
        },
        task: args.task.clone(),
        context: args.context.clone(),
        command: args.command.clone(),
        env,
        limits: policy::Limits {
            wall_time_s: args.wall_time,
            output_mb: args.output_mb,
            memory_mb: args.memory_mb,
            pids: args.pids,
            disk_mb: args.disk_mb,
        },
        keep_temp: args.keep_temp,
        agent: args.agent.clone(),
        isolation: args
            .worktree
            .then_some(crate::protocol::Isolation::Worktree),
        max_restarts: args.max_restarts,
        max_turns: args.max_turns,
        max_budget_usd: args.max_budget_usd,
        sandbox: policy::sandbox::SandboxRequest {
            write_project: args.write_project.then_some(true),
            network: args.network.then_some(true),
            read_paths: args.read_path.clone(),
            write_paths: args.write_path.clone(),
            network_allow: args.network_allow.clone(),
        },
    })
}

/// Prints JSON with the characters a terminal could act on escaped (the
/// same JSON value; see [`crate::sanitize::json_text`]).
fn print_json(v: &Value, pretty: bool) -> Result<()> {
    let text = if pretty {
        serde_json::to_string_pretty(v)?
    } else {
        serde_json::to_string(v)?
    };
    stdout::line(&json_text(&text))
}

/// Multi-line text for stdout: made visible on a terminal (as `logs`
/// does), unchanged to a pipe or file.
fn for_stdout(text: &str) -> String {
    if std::io::stdout().is_terminal() {
        for_terminal(text)
    } else {
        text.to_owned()
    }
}

fn print_status(ctx: &Ctx, v: &Value) -> Result<RunStatus> {
    let status: RunStatus =
        serde_json::from_value(v.clone()).context("bad status from the daemon")?;
    if ctx.json {
        print_json(v, true)?;
    } else {
        stdout::write(&show::status_block(&status))?;
    }
    Ok(status)
}

/// The exit code for a status `wait` returned.
pub fn wait_exit_code(s: &RunStatus) -> u8 {
    if !s.state.is_terminal() {
        return EXIT_STILL_RUNNING;
    }
    (s.state.cli_exit_code(s.exit_code, s.signal) & 0xff) as u8
}

fn wait(ctx: &Ctx, run: &str, timeout: Option<f64>) -> Result<u8> {
    let mut params = json!({ "run_id": run });
    if let Some(t) = timeout {
        if !(t.is_finite() && t >= 0.0) {
            bail!("--timeout must be a number of seconds");
        }
        params["timeout_ms"] = json!((t * 1000.0) as u64);
    }
    let v = ctx.call("wait_agent_run", params)?;
    let status = print_status(ctx, &v)?;
    Ok(wait_exit_code(&status))
}

/// The run's record in the state dir's database, opened read-only (the
/// daemon may be down); `None` when it has no such run.
fn stored_record(
    layout: &StateLayout,
    id: &RunId,
) -> Result<Option<crate::run::record::RunRecord>> {
    let store = crate::store::Store::open_read_only(&layout.db())?;
    Ok(match store.get(id)? {
        Some(crate::store::Stored::Live(r)) => Some(*r),
        _ => None,
    })
}

/// The record of the run in folder `dir`, from its state dir's database.
fn record_of_dir(dir: &std::path::Path, run: &str) -> Result<crate::run::record::RunRecord> {
    let id = RunId::parse(run).ok_or_else(|| anyhow!("{run:?} is not a run id"))?;
    let layout = StateLayout::of_run_dir(dir)
        .ok_or_else(|| anyhow!("{} is not in a state dir", dir.display()))?;
    stored_record(&layout, &id)?
        .ok_or_else(|| anyhow!("run {run} is not in {}", layout.db().display()))
}

/// Finds a run's folder: from the daemon when it answers, else from the
/// state dir's database.
fn run_dir(ctx: &Ctx, run: &str) -> Result<PathBuf> {
    let id = RunId::parse(run).ok_or_else(|| anyhow!("{run:?} is not a run id"))?;
    match ctx.call("check_agent_run", json!({ "run_id": run })) {
        Ok(v) => {
            let status: RunStatus = serde_json::from_value(v)?;
            if let Some(dir) = status.log_path.parent() {
                return Ok(dir.to_path_buf());
            }
        }
        Err(e) => {
            if let Some(ClientError::Rpc(r)) = e.downcast_ref::<ClientError>() {
                if r.code != crate::protocol::codes::RUN_NOT_FOUND {
                    bail!("{e}");
                }
            }
        }
    }
    let layout = StateLayout::new(ctx.state_dir.clone());
    stored_record(&layout, &id)?
        .map(|r| r.run_dir)
        .ok_or_else(|| {
            anyhow!(
                "run {run} not found (asked the daemon at {}, looked in {})",
                ctx.socket.display(),
                ctx.state_dir.display()
            )
        })
}

/// Runs one of the socket commands (or `logs`); returns the exit code.
pub fn execute(ctx: &Ctx, cmd: Command) -> Result<u8> {
    match cmd {
        Command::Spawn { run, wait } => spawn(ctx, &run, wait),
        Command::Check { run } => status_of(ctx, "check_agent_run", &run),
        Command::Wait { run, timeout } => wait(ctx, &run, timeout),
        Command::Cancel { run } => status_of(ctx, "cancel_agent_run", &run),
        Command::Ls(args) if args.watch => super::list::watch(&|| ctx.client(), ctx.json, &args),
        Command::Ls(args) => super::list::list(ctx.client()?, ctx.json, &args),
        Command::Top(args) => super::top::main(&|| ctx.client(), &args),
        Command::Notices { session } => notices(ctx, &session),
        Command::Logs {
            run,
            follow,
            tail,
            timestamps,
            since,
            raw,
        } => {
            let since_ms = since
                .map(|w| super::linetimes::since_ms(&w, crate::timefmt::now_ms()))
                .transpose()?;
            let how = super::linetimes::Stamping {
                timestamps,
                since_ms,
            };
            logs(ctx, &run, follow, tail, how, raw)
        }
        Command::Context { run, detail, show } => context(ctx, &run, detail, show),
        Command::ContextOf { session } => working_context(ctx, &session),
        Command::Worktree {
            action: WorktreeAction::Rm { run },
        } => remove_worktree(ctx, &run),
        Command::Agents { project_dir } => agents(ctx, project_dir),
        Command::Prune {
            dry_run,
            session,
            older_than,
        } => {
            let params = crate::protocol::PruneParams {
                session_id: session,
                older_than,
                dry_run,
            };
            prune(ctx, &params)
        }
        Command::Usage(args) => usage(ctx, &args),
        Command::Ping => ping(ctx),
        Command::Metrics { openmetrics } => {
            let v = ctx.call("metrics", super::metrics::params(openmetrics))?;
            super::metrics::print(&v, ctx.json)
        }
        Command::Completions { shell } => completions(shell),
        Command::Man => man(),
        Command::Run { .. } | Command::Mcp(_) => bail!("run and mcp are handled separately"),
    }
}

/// Prints the new run's id; with `then_wait`, waits and exits as `wait`.
fn spawn(ctx: &Ctx, run: &RunArgs, then_wait: bool) -> Result<u8> {
    let params = spawn_params(run, "default")?;
    let v = ctx.call("spawn_agent", serde_json::to_value(&params)?)?;
    let id = v["run_id"]
        .as_str()
        .ok_or_else(|| anyhow!("no run_id in {v}"))?
        .to_owned();
    // With --json --wait the one JSON document is the final status.
    match (ctx.json, then_wait) {
        (true, false) => print_json(&v, false)?,
        (true, true) => {}
        (false, _) => stdout::line(&id)?,
    }
    if then_wait {
        return wait(ctx, &id, None);
    }
    Ok(0)
}

/// Calls `method` on `run` and prints the status it returns.
fn status_of(ctx: &Ctx, method: &str, run: &str) -> Result<u8> {
    let v = ctx.call(method, json!({ "run_id": run }))?;
    print_status(ctx, &v)?;
    Ok(0)
}

fn notices(ctx: &Ctx, session: &str) -> Result<u8> {
    let v = ctx.call("take_notices", json!({ "session_id": session }))?;
    if ctx.json {
        print_json(&v, true)?;
        return Ok(0);
    }
    let notices: Vec<crate::protocol::Notice> = serde_json::from_value(v["notices"].clone())?;
    for n in notices {
        stdout::line(&format!(
            "{}  {:<9}  {}  {}",
            one_line(&n.ended_at),
            n.state.as_str(),
            one_line(&n.run_id),
            one_line(&n.result_path.to_string_lossy())
        ))?;
    }
    Ok(0)
}

/// Prints child.log (from the last `tail` lines, or the first line since
/// `how.since_ms`; to its end with `follow`; with each line's time when
/// `how.timestamps`); a reader that goes away is not an error.
fn logs(
    ctx: &Ctx,
    run: &str,
    follow: bool,
    tail: Option<usize>,
    how: super::linetimes::Stamping,
    raw: bool,
) -> Result<u8> {
    let dir = run_dir(ctx, run)?;
    let log = dir.join("child.log");
    let mut from = match tail {
        // The user asked for these lines and reads them all: no byte bound.
        Some(n) => crate::view::logtail::tail_offset(&log, n, u64::MAX).unwrap_or(0),
        None => 0,
    };
    let times = how.any().then(|| super::linetimes::LineTimes::of_log(&log));
    if let (Some(t), Some(since)) = (&times, how.since_ms) {
        from = from.max(t.since_offset(since, log.exists())?);
    }
    let db = StateLayout::new(ctx.state_dir.clone()).db();
    let at = follow::RunLog {
        dir: &dir,
        db: Some(&db),
    };
    match follow::print_log_stamped(at, from, follow, raw, times.map(|t| (t, how))) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(0),
        other => other
            .map(|_| 0)
            .with_context(|| format!("reading {}", log.display())),
    }
}

/// A run's context folder: the files its child was given.
struct ContextDir(PathBuf);

impl ContextDir {
    fn read(&self, name: &str) -> Result<String> {
        let path = self.0.join(name);
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    }

    /// Each tool schema's name and size in characters, largest first.
    fn tool_sizes(&self) -> Result<Vec<(String, usize)>> {
        let tools: Value = serde_json::from_str(&self.read("tools.json")?)?;
        let mut sizes: Vec<(String, usize)> = tools
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                (
                    t["name"].as_str().unwrap_or("?").to_owned(),
                    serde_json::to_string(t).map_or(0, |s| s.chars().count()),
                )
            })
            .collect();
        sizes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        Ok(sizes)
    }
}

/// Prints the context plan (with `detail`, the tool schemas' sizes; with
/// `show`, the composed texts).
fn context(ctx: &Ctx, run: &str, detail: bool, show: bool) -> Result<u8> {
    let run_dir = run_dir(ctx, run)?;
    let dir = ContextDir(run_dir.join("context"));
    let plan: policy::compose::Plan = serde_json::from_str(&dir.read("plan.json")?)?;
    let sizes = dir.tool_sizes()?;
    // A record from before drivers delivered through files alone.
    let delivery = record_of_dir(&run_dir, run)
        .ok()
        .and_then(|r| r.driver_run)
        .map(|d| d.delivered)
        .unwrap_or_default();
    if ctx.json {
        let mut v = serde_json::to_value(&plan)?;
        v["delivered"] = serde_json::to_value(&delivery)?;
        if detail {
            v["tool_schemas"] = json!(sizes
                .iter()
                .map(|(n, c)| json!({"name": n, "chars": c, "approx_tokens": c / 4}))
                .collect::<Vec<_>>());
        }
        print_json(&v, true)?;
    } else {
        let table = show::context_table(&plan, &delivery.describe(), detail.then_some(&sizes[..]));
        stdout::write(&table)?;
    }
    if show {
        // Both hold project files a child may have written.
        let system = for_stdout(&dir.read("system.md")?);
        let first = for_stdout(&dir.read("first_message.md")?);
        stdout::line(&format!("\n===== system.md =====\n{system}"))?;
        stdout::line(&format!("===== first_message.md =====\n{first}"))?;
    }
    Ok(0)
}

fn working_context(ctx: &Ctx, session: &str) -> Result<u8> {
    let v = ctx.call("working_context", json!({ "session_id": session }))?;
    if ctx.json {
        print_json(&v, true)?;
    } else {
        stdout::write(&for_stdout(v["block"].as_str().unwrap_or("")))?;
    }
    Ok(0)
}

fn remove_worktree(ctx: &Ctx, run: &str) -> Result<u8> {
    let dir = run_dir(ctx, run)?;
    let rec = record_of_dir(&dir, run)?;
    let wt = rec
        .worktree
        .as_ref()
        .ok_or_else(|| anyhow!("run {run} has no worktree"))?;
    crate::engine::worktree::remove_worktree(&rec.project_dir, wt, rec.run_id.as_str())
        .map_err(anyhow::Error::msg)?;
    stdout::line(&format!(
        "removed {} and branch {}",
        one_line(&wt.dir.to_string_lossy()),
        one_line(&wt.branch)
    ))?;
    Ok(0)
}

/// Lists the definitions found for `project_dir`, their tools resolved
/// against the config's catalog (`SUBAGENTD_CONFIG`, else the default
/// file); exits 1 when a file could not be used.
fn agents(ctx: &Ctx, project_dir: Option<PathBuf>) -> Result<u8> {
    let dir = match project_dir {
        Some(d) => std::path::absolute(&d)?,
        None => std::env::current_dir()?,
    };
    let explicit = std::env::var_os("SUBAGENTD_CONFIG").map(PathBuf::from);
    let (_, settings) =
        crate::paths::load_config(explicit.as_deref()).map_err(anyhow::Error::msg)?;
    let tools = settings.tool_policy().map_err(anyhow::Error::msg)?;
    let found = crate::agents::discover(&dir, &tools, settings.context.max_file_chars);
    if ctx.json {
        print_json(&crate::view::agents::agents_json(&found, &tools), true)?;
    } else {
        stdout::write(&show::agents_table(&found, &tools))?;
    }
    Ok(if found.errors.is_empty() { 0 } else { 1 })
}

/// Asks the daemon to prune now and prints what it did.
fn prune(ctx: &Ctx, params: &crate::protocol::PruneParams) -> Result<u8> {
    let v = ctx.call("prune_runs", serde_json::to_value(params)?)?;
    if ctx.json {
        print_json(&v, true)?;
    } else {
        let result: crate::protocol::PruneResult =
            serde_json::from_value(v).context("bad prune result from the daemon")?;
        stdout::write(&super::prune::lines(&result))?;
    }
    Ok(0)
}

/// `subagent usage`: the daemon's sums, as a table or as JSON.
fn usage(ctx: &Ctx, args: &super::args::UsageArgs) -> Result<u8> {
    let now = crate::timefmt::now_ms();
    let at = |flag: &str, w: &Option<String>| {
        w.as_deref()
            .map(|w| super::list::when(flag, w, now))
            .transpose()
    };
    let params = crate::protocol::UsageParams {
        session_id: args.session.clone(),
        since: at("--since", &args.since)?,
        until: at("--until", &args.until)?,
    };
    let v = ctx.call("usage", serde_json::to_value(&params)?)?;
    if ctx.json {
        print_json(&v, true)?;
    } else {
        let sum: crate::usage::UsageSummary =
            serde_json::from_value(v).context("bad usage result from the daemon")?;
        stdout::write(&crate::view::usage::table(&sum))?;
    }
    Ok(0)
}

fn ping(ctx: &Ctx) -> Result<u8> {
    let v = ctx.call("ping", json!({}))?;
    if ctx.json {
        print_json(&v, false)?;
    } else {
        stdout::line(&format!(
            "subagentd {} (pid {}) at {}",
            v["version"].as_str().unwrap_or("?"),
            v["pid"],
            ctx.socket.display()
        ))?;
    }
    Ok(0)
}

/// `subagent completions SHELL`: the script for SHELL on stdout.
fn completions(shell: clap_complete::Shell) -> Result<u8> {
    use clap::CommandFactory;
    let mut out = Vec::new();
    clap_complete::generate(
        shell,
        &mut super::args::Cli::command(),
        "subagent",
        &mut out,
    );
    stdout::write(&String::from_utf8(out)?)?;
    Ok(0)
}

/// `subagent man`: the manual page (its options and each subcommand with
/// what it does) on stdout.
fn man() -> Result<u8> {
    use clap::CommandFactory;
    let mut out = Vec::new();
    clap_mangen::Man::new(super::args::Cli::command()).render(&mut out)?;
    stdout::write(&String::from_utf8(out)?)?;
    Ok(0)
}
