//! Accepting a spawn: checking its params, then recording the run durably
//! (folder, temp dir, runner.json, run.json) before anyone is told its id.
//! A failure part-way removes what was made.

use super::draft::{create_file, RunDraft, Sync};
use super::error::{InternalError, SandboxCause, StorageError};
use super::launch::{start_runner, Launched, RunnerFiles};
use super::probe::HostProbe;
use super::workctx::Worktree;
use super::{EngineError, Inner};
use crate::ids::{check_session_id, RunId};
use crate::paths::RunFiles;
use crate::protocol::{SpawnParams, MAX_TASK};
use crate::record::{Phase, RunRecord, RECORD_FORMAT};
use crate::uids::UidLease;
use policy::rights::{OnBehalf, Requested, Requester};
use policy::sandbox::network::{self, AllowEntry, NetworkMode};
use policy::sandbox::places::Places;
use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use subagent_runner::spec::RunnerSpec;

/// Fails when a mechanism the run requires is missing on this host.
pub fn check_required(
    probe: &HostProbe,
    required: &[policy::sandbox::Mechanism],
) -> Result<(), EngineError> {
    for &m in required {
        if let Some(why) = probe.missing(m) {
            return Err(EngineError::Sandbox {
                mechanism: m.as_str(),
                why: SandboxCause::Missing(why),
            });
        }
    }
    Ok(())
}

/// Checks an argv (empty is allowed here: it is resolved later).
fn check_command(command: &[String], field: &str) -> Result<(), EngineError> {
    if command.first().is_some_and(|p| p.is_empty()) {
        return Err(EngineError::invalid(
            &format!("{field}[0]"),
            "must not be empty",
        ));
    }
    if let Some(i) = command.iter().position(|a| a.contains('\0')) {
        return Err(EngineError::invalid(
            &format!("{field}[{i}]"),
            "contains a NUL byte",
        ));
    }
    Ok(())
}

/// What a spawn resolves to: the definition, the tools, the rights, the
/// command and the limits.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The agent program's argv.
    pub command: Vec<String>,
    /// The limits (request, then definition, then the audience's config).
    pub limits: policy::Limits,
    /// The child's tools (None without session.tools).
    pub tools: Option<Vec<String>>,
    /// The OS rights.
    pub grants: policy::sandbox::Grants,
    /// The subagent definition, when `agent` was given.
    pub agent: Option<crate::agents::Agent>,
    /// How the run reaches the network.
    pub network: NetworkMode,
    /// Its allowlist: the config's, the definition's and the request's
    /// entries (empty unless `network` is the allowlist).
    pub network_allow: Vec<String>,
    /// What the run is told about its definition.
    pub notes: Vec<String>,
    /// How its agent starts.
    pub driver: policy::driver::Driver,
}

/// Refuses an entry of `list` (the request's or the definition's) that no
/// entry of the audience's cap holds.
fn check_cap(cap: Option<&[AllowEntry]>, list: &[String], field: &str) -> Result<(), EngineError> {
    let Some(cap) = cap else { return Ok(()) };
    for (i, text) in list.iter().enumerate() {
        let field = format!("{field}[{i}]");
        let entry =
            network::parse_entry(text).map_err(|e| EngineError::invalid(&field, e.to_string()))?;
        if !cap.iter().any(|c| entry.within(c)) {
            return Err(EngineError::invalid(
                &field,
                format!("{text} is outside what the audience may reach (its network_allow in the config)"),
            ));
        }
    }
    Ok(())
}

/// Refuses a driver's endpoint outside the audience's cap: the operator
/// chose it, so it passes the request's limits, but never the audience's.
fn check_endpoint(
    cap: Option<&[AllowEntry]>,
    endpoint: Option<&str>,
    audience: policy::Audience,
) -> Result<(), EngineError> {
    let (Some(cap), Some(ep)) = (cap, endpoint) else {
        return Ok(());
    };
    let within = network::parse_entry(ep).is_ok_and(|e| cap.iter().any(|c| e.within(c)));
    if within {
        return Ok(());
    }
    let a = audience.as_str();
    Err(EngineError::invalid(
        "driver",
        format!("the driver's endpoint {ep} is outside the audience's network cap ([audiences.{a}] network_allow in the config); add it there or use another audience"),
    ))
}

/// The entries of the definition's `network_allow` the run may add: a
/// project definition's only under an audience cap (which they must then
/// fall within), else none, said in `notes`.
fn definition_network<'a>(
    agent: Option<&'a crate::agents::Agent>,
    capped: bool,
    audience: policy::Audience,
    notes: &mut Vec<String>,
) -> &'a [String] {
    let Some(a) = agent else { return &[] };
    let list = a.definition.network_allow.as_slice();
    if list.is_empty() || !a.project || capped {
        return list;
    }
    notes.push(format!(
        "the definition's network_allow is ignored ({}): {} lies in a project folder and the audience {} has no network_allow cap in the config",
        list.join(", "),
        a.definition.source.display(),
        audience.as_str()
    ));
    &[]
}

/// The run's network mode and allowlist; a request or definition entry
/// outside the audience's cap is refused.
fn network_plan(
    settings: &policy::config::Config,
    p: &SpawnParams,
    agent: Option<&crate::agents::Agent>,
    switches: &policy::sandbox::SandboxRequest,
    granted: bool,
    endpoint: Option<String>,
    notes: &mut Vec<String>,
) -> Result<(NetworkMode, Vec<String>), EngineError> {
    let cap = settings.network_cap(p.session.audience);
    let audience = p.session.audience;
    let from_def = definition_network(agent, cap.is_some(), audience, notes);
    check_cap(
        cap.as_deref(),
        &p.sandbox.network_allow,
        "sandbox.network_allow",
    )?;
    check_cap(cap.as_deref(), from_def, "agent network_allow")?;
    check_endpoint(cap.as_deref(), endpoint.as_deref(), audience)?;
    let mut list: Vec<String> = Vec::new();
    for e in settings
        .network_allow
        .iter()
        .chain(from_def)
        .chain(&p.sandbox.network_allow)
    {
        if !list.contains(e) {
            list.push(e.clone());
        }
    }
    let mode = network::mode(
        granted,
        switches.network == Some(false),
        settings.network_tools,
        !list.is_empty(),
    );
    if mode != NetworkMode::Allowlist {
        list.clear();
    }
    Ok((mode, list))
}

fn merge_limits(first: policy::Limits, then: policy::Limits) -> policy::Limits {
    policy::Limits {
        wall_time_s: first.wall_time_s.or(then.wall_time_s),
        memory_mb: first.memory_mb.or(then.memory_mb),
        pids: first.pids.or(then.pids),
        output_mb: first.output_mb.or(then.output_mb),
        disk_mb: first.disk_mb.or(then.disk_mb),
    }
}

/// The definition named `name` among those found for `project_dir`; the
/// warnings of files read for the first time (or changed) are logged.
/// Blocking (reads definitions).
fn find_agent(
    tools: &policy::toolpolicy::ToolPolicy,
    settings: &policy::config::Config,
    project_dir: &Path,
    name: &str,
    notes: &mut Vec<String>,
) -> Result<crate::agents::Agent, EngineError> {
    let found = crate::agents::discover(project_dir, tools, settings.context.max_file_chars);
    found.log_new_warnings();
    // A malformed file of that name is an error even when another
    // directory has a valid one: never silently run a different
    // definition than the one that was meant.
    if let Some(e) = found.error_for(name) {
        return Err(EngineError::invalid(
            "agent",
            format!("the definition of {name:?} cannot be used: {e}"),
        ));
    }
    if let Some(d) = found.get(name) {
        // As in Claude Code the project's wins; the parent is told.
        if let Some(user) = found.shadowed_user_level(name) {
            notes.push(format!(
                "the project's definition {} shadows the user-level {}",
                d.definition.source.display(),
                user.display()
            ));
        }
        return Ok(d.clone());
    }
    let names = found.names();
    let why = if names.is_empty() {
        format!("no agent named {name:?}; no definitions were found")
    } else {
        format!("no agent named {name:?}; available: {}", names.join(", "))
    };
    Err(EngineError::invalid("agent", why))
}

/// The child's tools: the parent's, filtered by the audience and the
/// definition (None without session.tools). A definition's tool names were
/// resolved when it was read: one that names nothing was dropped then.
fn child_tools(
    tools: &policy::toolpolicy::ToolPolicy,
    p: &SpawnParams,
    agent: Option<&crate::agents::Agent>,
) -> Result<Option<Vec<String>>, EngineError> {
    use policy::toolpolicy::ToolError;
    let allow = agent.and_then(|a| a.tools.allow.as_deref());
    let deny = agent.map_or(&[][..], |a| &a.tools.deny[..]);
    let Some(parent) = &p.session.tools else {
        if allow.is_some() || !deny.is_empty() {
            return Err(EngineError::invalid(
                "session.tools",
                "required when the agent's definition lists tools (the child's tools are the parent's, filtered)",
            ));
        }
        return Ok(None);
    };
    let filtered = tools
        .child_tools_narrowed(p.session.audience, parent, allow, deny)
        .map_err(|e| match e {
            ToolError::Unknown { field, names } => {
                EngineError::invalid(&field, format!("unknown tools: {}", names.join(", ")))
            }
            other => EngineError::Unexpected(InternalError::ToolPolicy(other)),
        })?;
    Ok(Some(filtered))
}

/// The agent program's argv: the request's, else the definition's, else
/// the config's.
fn pick_command(
    p: &SpawnParams,
    agent: Option<&crate::agents::Agent>,
    settings: &policy::config::Config,
) -> Result<Vec<String>, EngineError> {
    let command = if !p.command.is_empty() {
        p.command.clone()
    } else if let Some(c) = agent.and_then(|a| a.definition.command.clone()) {
        c
    } else if let Some(c) = settings.command.clone() {
        c
    } else {
        return Err(EngineError::invalid(
            "command",
            "required: give a command, or an agent whose definition has one, or set `command` in the config",
        ));
    };
    check_command(&command, "command")?;
    Ok(command)
}

/// Resolves a spawn: finds the definition, filters the tools, derives the
/// rights, picks the command and the limits. Blocking (reads definitions).
pub fn plan(
    tools: &policy::toolpolicy::ToolPolicy,
    settings: &policy::config::Config,
    p: &SpawnParams,
) -> Result<Plan, EngineError> {
    let mut notes = Vec::new();
    let agent = match &p.agent {
        Some(name) => {
            let dir = &p.session.project_dir;
            Some(find_agent(tools, settings, dir, name, &mut notes)?)
        }
        None => None,
    };
    let child_tools = child_tools(tools, p, agent.as_ref())?;
    let switches = policy::sandbox::SandboxRequest {
        // A definition can ask for less network, never more.
        network: match agent.as_ref().and_then(|a| a.definition.network) {
            Some(false) => Some(false),
            _ => p.sandbox.network,
        },
        ..p.sandbox.clone()
    };
    let classes = child_tools.as_ref().map(|t| tools.classes(t));
    let mut grants = policy::sandbox::grants(classes.as_ref(), &switches);
    let driver = super::driving::pick(settings, p.driver, agent.as_ref(), &mut notes);
    if driver != policy::driver::Driver::Command && settings.drivers.get(driver).is_none() {
        let name = driver.as_str();
        return Err(EngineError::invalid(
            "driver",
            format!("the driver {name} is not set up: the config has no [drivers.{name}] table"),
        ));
    }
    let (network, network_allow) = network_plan(
        settings,
        p,
        agent.as_ref(),
        &switches,
        grants.network,
        super::driving::endpoint(settings, driver),
        &mut notes,
    )?;
    // The host's network only in full mode (a network tool may get the
    // allowlist instead).
    grants.network = network == NetworkMode::Full;
    if driver != policy::driver::Driver::Command && network == NetworkMode::Full {
        let name = driver.as_str();
        return Err(EngineError::invalid(
            "driver",
            format!("the driver {name} runs with network none or allowlist only: its model gateway listens in the run's own network namespace, which full network has not (a listener on the host's loopback would lend the key to any local user); set network_tools = \"allowlist\" in the config, or drop the run's network tools"),
        ));
    }
    let command = match driver {
        policy::driver::Driver::Command => pick_command(p, agent.as_ref(), settings)?,
        d => driver_command(p, settings, d)?,
    };
    // The parent's own limits win; a definition only lowers the defaults.
    let from_def = agent
        .as_ref()
        .map(|a| a.definition.limits)
        .unwrap_or_default();
    let limits = merge_limits(
        p.limits,
        settings
            .audience_limits(p.session.audience)
            .lowered_by(&from_def),
    );
    Ok(Plan {
        command,
        limits,
        tools: child_tools,
        grants,
        agent,
        network,
        network_allow,
        notes,
        driver,
    })
}

/// A driver run's program (its whole argv is made with the run's
/// context); a request may give neither a command nor stdin for it.
fn driver_command(
    p: &SpawnParams,
    settings: &policy::config::Config,
    driver: policy::driver::Driver,
) -> Result<Vec<String>, EngineError> {
    let name = driver.as_str();
    if !p.command.is_empty() {
        return Err(EngineError::invalid(
            "command",
            format!("not with the driver {name}: its program comes from the config ([drivers.{name}] command)"),
        ));
    }
    if p.stdin.is_some() {
        return Err(EngineError::invalid(
            "stdin",
            format!(
                "only for the command driver (the driver {name} reads first_message.md on stdin)"
            ),
        ));
    }
    let config = settings.drivers.get(driver).cloned().unwrap_or_default();
    let names = p.env.keys().map(String::as_str);
    if let Err(e) = policy::driver::check_request_env(driver, &config, names) {
        let field = match &e {
            policy::driver::DriverError::EnvNotAllowed { name, .. } => format!("env.{name}"),
            _ => "env".to_owned(),
        };
        return Err(EngineError::invalid(&field, e.to_string()));
    }
    let path = std::env::var_os("PATH");
    let program = super::driving::resolve_program(driver, &config, path.as_deref())
        .map_err(|e| EngineError::invalid("driver", e.to_string()))?;
    Ok(vec![program.display().to_string()])
}

/// Checks that session.project_dir is an absolute path to a directory.
/// Refuses a root that passes through a symbolic link.
fn check_unlinked(field: &str, path: &Path) -> Result<(), EngineError> {
    match crate::securedir::link_on_the_way(path) {
        None => Ok(()),
        Some((at, to)) => Err(EngineError::invalid(
            field,
            format!(
                "{} passes through the symbolic link {} -> {}; name the directory it leads to",
                path.display(),
                at.display(),
                to.display()
            ),
        )),
    }
}

fn check_project_dir(dir: &Path) -> Result<(), EngineError> {
    let field = "session.project_dir";
    if !dir.is_absolute() {
        return Err(EngineError::invalid(
            field,
            format!("{} is not an absolute path", dir.display()),
        ));
    }
    check_unlinked(field, dir)?;
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(EngineError::invalid(
            field,
            format!("{} is not a directory", dir.display()),
        )),
        Err(e) => Err(EngineError::invalid(
            field,
            format!("{}: {e}", dir.display()),
        )),
    }
}

/// Checks the task and the context: a task, neither over 64 KiB.
fn check_texts(p: &SpawnParams) -> Result<(), EngineError> {
    if p.task.trim().is_empty() {
        return Err(EngineError::invalid("task", "must not be empty"));
    }
    if p.task.len() > MAX_TASK {
        return Err(EngineError::invalid(
            "task",
            format!(
                "{} bytes is over the limit of {MAX_TASK} bytes (64 KiB)",
                p.task.len()
            ),
        ));
    }
    if p.context.as_ref().is_some_and(|c| c.len() > MAX_TASK) {
        return Err(EngineError::invalid(
            "context",
            format!("over the limit of {MAX_TASK} bytes (64 KiB)"),
        ));
    }
    Ok(())
}

/// Checks an agent name: as a definition may give it.
fn check_agent_name(a: &str) -> Result<(), EngineError> {
    if policy::definition::valid_name(a) {
        return Ok(());
    }
    Err(EngineError::invalid(
        "agent",
        format!(
            "{a:?} is not an agent name (1 to {} characters, no control or format character)",
            policy::definition::NAME_MAX
        ),
    ))
}

/// Checks the request's env: names, values, and no name the supervisor sets.
fn check_env(env: &BTreeMap<String, String>) -> Result<(), EngineError> {
    policy::env::validate_request_env(env).map_err(|e| match e {
        policy::EnvError::InvalidName(n) => {
            EngineError::invalid("env", format!("invalid variable name {n:?}"))
        }
        policy::EnvError::InvalidValue(n) => {
            EngineError::invalid(&format!("env.{n}"), "contains a NUL byte")
        }
        policy::EnvError::Reserved(n) => {
            EngineError::invalid(&format!("env.{n}"), "reserved: the supervisor sets it")
        }
    })
}

/// Checks the sandbox's allowlist entries: each `host:port`.
fn check_network_allow(sandbox: &policy::sandbox::SandboxRequest) -> Result<(), EngineError> {
    network::parse_list(&sandbox.network_allow)
        .map(|_| ())
        .map_err(|(i, e)| {
            EngineError::invalid(&format!("sandbox.network_allow[{i}]"), e.to_string())
        })
}

/// Checks the sandbox's read and write paths: absolute, and existing.
fn check_roots(sandbox: &policy::sandbox::SandboxRequest) -> Result<(), EngineError> {
    for (field, list) in [
        ("sandbox.read_paths", &sandbox.read_paths),
        ("sandbox.write_paths", &sandbox.write_paths),
    ] {
        for (i, path) in list.iter().enumerate() {
            if !path.is_absolute() {
                return Err(EngineError::invalid(
                    &format!("{field}[{i}]"),
                    format!("{} is not an absolute path", path.display()),
                ));
            }
            check_unlinked(&format!("{field}[{i}]"), path)?;
            if let Err(e) = std::fs::metadata(path) {
                return Err(EngineError::invalid(
                    &format!("{field}[{i}]"),
                    format!("{}: {e}", path.display()),
                ));
            }
        }
    }
    Ok(())
}

/// Before the daemon reads anything of the project for `who` (its
/// definitions, instructions, git status), and before the params are
/// checked against the host as root (which would tell what exists where
/// `who` cannot look): that `who` may reach the paths the spawn names. A
/// relative path is left to [`validate`], which refuses it. Blocking.
pub(crate) fn check_paths_for(who: &Requester, p: &SpawnParams) -> Result<(), EngineError> {
    let (project, sandbox) = (&p.session.project_dir, &p.sandbox);
    let all_absolute = project.is_absolute()
        && sandbox
            .read_paths
            .iter()
            .chain(&sandbox.write_paths)
            .all(|r| r.is_absolute());
    if !all_absolute {
        return Ok(());
    }
    let needs = policy::rights::needs(&Requested {
        project_dir: Some(project),
        read_paths: &sandbox.read_paths,
        write_paths: &sandbox.write_paths,
        ..Default::default()
    });
    Ok(crate::rights::check(who, &needs)?)
}

/// The rights a run asked for by `who` needs `who` to hold: every path
/// the spawn names, with the right the run gets on it, the request's or a
/// project definition's program, and the project definition read.
pub(crate) fn on_behalf(who: Requester, p: &SpawnParams, plan: &Plan) -> OnBehalf {
    let project_agent = plan.agent.as_ref().filter(|a| a.project);
    let chosen = !p.command.is_empty() || project_agent.is_some();
    let program = chosen
        .then(|| policy::rights::program_path(&plan.command, &p.session.project_dir))
        .flatten();
    let git = p.session.project_dir.join(".git");
    let needs = policy::rights::needs(&Requested {
        project_dir: Some(&p.session.project_dir),
        write_project: plan.grants.write_project,
        worktree: matches!(p.isolation, Some(crate::protocol::Isolation::Worktree)),
        git_dir: std::fs::symlink_metadata(&git)
            .is_ok()
            .then_some(git.as_path()),
        read_paths: &p.sandbox.read_paths,
        write_paths: &p.sandbox.write_paths,
        program: program.as_deref(),
        definition: project_agent.map(|a| a.definition.source.as_path()),
    });
    OnBehalf {
        requester: who,
        needs,
    }
}

/// The run's idmapped binds of what the requester named (the project in
/// place, the read and write paths) stay idmapped only where the
/// requester owns the path; the others become plain read-only binds.
fn limit_for_requester(
    spec: &mut policy::sandbox::SandboxSpec,
    p: &SpawnParams,
    place: &RunPlace,
    who: &Requester,
) {
    use std::os::unix::fs::MetadataExt;
    let mut roots: Vec<PathBuf> = Vec::new();
    if place.worktree.is_none() {
        roots.push(place.workdir.clone());
    }
    roots.extend(p.sandbox.read_paths.iter().cloned());
    roots.extend(p.sandbox.write_paths.iter().cloned());
    let owners = roots
        .iter()
        .filter_map(|r| {
            let m = std::fs::symlink_metadata(r).ok()?;
            Some((r.clone(), (m.uid(), m.gid())))
        })
        .collect();
    let changed = policy::rights::limit_idmaps(&mut spec.mounts, &roots, &owners, who);
    if !changed.is_empty() {
        tracing::info!(run_id = %place.id, ?changed, "bound read-only, not as their owner's: the requester does not own them");
    }
}

/// Checks a spawn's params; names the first offending field.
pub fn validate(p: &SpawnParams) -> Result<(), EngineError> {
    check_session_id(&p.session.id).map_err(|e| EngineError::invalid("session.id", e))?;
    p.session.audience.check_may_spawn()?;
    check_project_dir(&p.session.project_dir)?;
    check_texts(p)?;
    check_command(&p.command, "command")?;
    if p.max_restarts.is_some_and(|n| n > policy::MAX_RESTARTS) {
        return Err(EngineError::invalid(
            "max_restarts",
            format!("must be at most {}", policy::MAX_RESTARTS),
        ));
    }
    if let Some(a) = &p.agent {
        check_agent_name(a)?;
    }
    check_env(&p.env)?;
    p.limits
        .validate()
        .map_err(|(f, why)| EngineError::invalid(&format!("limits.{f}"), why))?;
    check_network_allow(&p.sandbox)?;
    check_roots(&p.sandbox)
}

/// Where a new run lives and works, fixed before anything is composed.
struct RunPlace {
    id: RunId,
    /// Its folder where it will live (the paths its records hold).
    files: RunFiles,
    temp_dir: PathBuf,
    worktree: Option<Worktree>,
    /// Where the child works: its worktree, else the project.
    workdir: PathBuf,
}

/// What the child is told of where it works.
struct WorkingContext {
    /// The `[working-context]` block of its first message.
    block: String,
    /// The git snapshot the block shows (kept in the record).
    git: policy::workctx::GitSnapshot,
    /// The status's paths and HEAD with it, for the first picture.
    status: crate::gitsnap::counts::Listing,
}

/// Records the spawn in the session's working context (refused when the
/// session is not `who`'s) and takes the git snapshot of where the child
/// will work. Blocking.
fn working_context(
    inner: &Inner,
    p: &SpawnParams,
    workdir: &Path,
    who: Option<&Requester>,
) -> Result<WorkingContext, EngineError> {
    let session_state = inner.sessions.on_spawn(
        &p.session.id,
        &p.session.project_dir,
        p.session.recent_files.as_deref(),
        who,
    )?;
    let (git, status) = crate::gitsnap::snapshot_with_paths(workdir, inner.cfg.git_budget, None);
    let block = policy::workctx::render_block(workdir, &session_state.recent_files, &git);
    Ok(WorkingContext { block, git, status })
}

/// What the composition of this run's context depends on (kept in
/// runner.json, so that a restart can compose it again with a handoff
/// note).
fn compose_input(
    inner: &Inner,
    p: &SpawnParams,
    plan: &Plan,
    place: &RunPlace,
    tools_json: String,
    working_context: String,
) -> policy::compose::ComposeInput {
    let settings = &inner.cfg.settings;
    let playbook = settings
        .rules_file
        .as_ref()
        .map(|path| policy::compose::Sourced {
            path: path.clone(),
            text: std::fs::read_to_string(path).unwrap_or_default(),
        });
    let tools = plan
        .tools
        .iter()
        .flatten()
        .filter_map(|n| inner.tools.tool(n))
        .map(|t| (t.name.clone(), t.description.clone()))
        .collect();
    let max_restarts = p
        .max_restarts
        .or(settings.max_restarts)
        .unwrap_or(policy::DEFAULT_MAX_RESTARTS);
    policy::compose::ComposeInput {
        playbook,
        project_instructions: super::instructions::project_instructions(&place.workdir),
        agent: plan.agent.as_ref().map(|a| policy::compose::Sourced {
            path: a.definition.source.clone(),
            text: a.definition.body.clone(),
        }),
        tools,
        tools_json,
        paths: policy::compose::SessionPaths {
            session_id: p.session.id.clone(),
            temp_dir: place.temp_dir.clone(),
            artifact_dir: place.files.artifacts(),
            worktree_dir: place.worktree.as_ref().map(|w| w.dir.clone()),
            log_path: place.files.log(),
            delta_path: place.files.delta(),
        },
        task: p.task.clone(),
        context: p.context.clone(),
        working_context,
        caps: settings.context,
        max_attempts: 1 + max_restarts,
    }
}

/// Composes the first attempt's context and writes it into `context_dir`:
/// system.md, first_message.md, tools.json, plan.json and plan-1.json.
fn write_context_files(
    context_dir: &Path,
    input: &policy::compose::ComposeInput,
) -> Result<String, EngineError> {
    let composed = policy::compose::compose(input, 1, None);
    for (name, bytes) in [
        ("system.md", composed.system_md.as_bytes()),
        ("first_message.md", composed.first_message_md.as_bytes()),
        ("tools.json", input.tools_json.as_bytes()),
        ("plan.json", composed.plan_json.as_bytes()),
    ] {
        // Composed again from runner.json's inputs: not fsynced.
        create_file(&context_dir.join(name), bytes)?;
    }
    // The first attempt's plan: a second name for plan.json's file (a
    // restart replaces plan.json and leaves this one).
    let plan_1 = context_dir.join("plan-1.json");
    std::fs::hard_link(context_dir.join("plan.json"), &plan_1)
        .map_err(|e| EngineError::StateDir(StorageError::io("link", &plan_1)(e)))?;
    Ok(composed.system_md)
}

/// The child's environment: the daemon's allowed variables, the request's,
/// and the run's paths.
fn child_env(
    inner: &Inner,
    p: &SpawnParams,
    place: &RunPlace,
) -> Result<BTreeMap<String, String>, EngineError> {
    let show = |p: &Path| p.display().to_string();
    let paths = policy::ChildPaths {
        run_id: place.id.to_string(),
        session_id: p.session.id.clone(),
        temp_dir: show(&place.temp_dir),
        artifact_dir: show(&place.files.artifacts()),
        log_path: show(&place.files.log()),
        context_dir: show(&place.files.context()),
        delta_path: show(&place.files.delta()),
    };
    policy::child_env(
        &inner.daemon_env,
        &inner.cfg.settings.env_allow,
        &p.env,
        &paths,
    )
    .map_err(|e| EngineError::invalid("env", e.to_string()))
}

/// `path` as the host resolves it now: its deepest existing ancestor made
/// canonical, the rest (not there yet) as it is.
fn host_path(path: &Path) -> PathBuf {
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut missing = Vec::new();
    let mut at = path.as_path();
    loop {
        if let Ok(found) = at.canonicalize() {
            return missing.iter().rev().fold(found, |p, c| p.join(c));
        }
        match (at.parent(), at.file_name()) {
            (Some(parent), Some(name)) => {
                missing.push(name.to_owned());
                at = parent;
            }
            _ => return path,
        }
    }
}

/// The daemon's own places (from its configuration) and how the host
/// resolves each path the run is given. Blocking.
fn daemon_places(inner: &Inner, roots: &[&Path]) -> Places {
    use policy::sandbox::places::{DaemonPlace, PlaceKind};
    let cfg = &inner.cfg;
    // `<dir>/uids`: the whole `/run/subagentd`.
    let leases = cfg.uid_lock_dir.parent().unwrap_or(&cfg.uid_lock_dir);
    let places = [
        (Some(cfg.state_dir.as_path()), PlaceKind::StateDir),
        (Some(cfg.temp_base.as_path()), PlaceKind::TempBase),
        (Some(leases), PlaceKind::UidLeases),
        (cfg.socket_dir.as_deref(), PlaceKind::SocketDir),
    ];
    Places {
        places: places
            .into_iter()
            .filter_map(|(path, kind)| {
                Some(DaemonPlace {
                    path: host_path(path?),
                    kind,
                })
            })
            .collect(),
        resolved: roots
            .iter()
            .map(|r| (r.to_path_buf(), host_path(r)))
            .collect(),
    }
}

/// Refuses a writable path that holds one of the daemon's places or lies
/// in one (see [`policy::sandbox::places`]): the project with the write
/// right, the request's and the config's write paths. A worktree is not
/// asked: the daemon makes it, new, in the state dir. Blocking.
fn check_writable_roots(inner: &Inner, p: &SpawnParams, plan: &Plan) -> Result<(), EngineError> {
    let project = &p.session.project_dir;
    let mut roots: Vec<(String, &Path)> = Vec::new();
    let worktree = matches!(p.isolation, Some(crate::protocol::Isolation::Worktree));
    if plan.grants.write_project && !worktree {
        roots.push(("session.project_dir".into(), project));
    }
    for (i, w) in p.sandbox.write_paths.iter().enumerate() {
        roots.push((format!("sandbox.write_paths[{i}]"), w));
    }
    for (i, w) in inner.cfg.settings.write_paths.iter().enumerate() {
        roots.push((format!("write_paths[{i}] of the config"), w));
    }
    let paths: Vec<&Path> = roots.iter().map(|(_, r)| *r).collect();
    let places = daemon_places(inner, &paths);
    for (field, root) in &roots {
        places
            .check_writable(root)
            .map_err(|e| EngineError::invalid(field, e))?;
    }
    Ok(())
}

/// The run's sandbox: its rights, the request's and the config's roots,
/// its paths and its limits.
fn sandbox_spec(
    inner: &Inner,
    p: &SpawnParams,
    plan: &Plan,
    place: &RunPlace,
    env: &BTreeMap<String, String>,
    own_uid: bool,
) -> policy::sandbox::SandboxSpec {
    let files = &place.files;
    let programs = super::program::for_run(
        inner,
        p,
        &plan.command[0],
        env,
        &place.workdir,
        &place.temp_dir,
        files,
    );
    let mut roots = p.sandbox.clone();
    let settings = &inner.cfg.settings;
    roots.read_paths.extend(settings.read_paths.iter().cloned());
    roots
        .write_paths
        .extend(settings.write_paths.iter().cloned());
    let context = files.context();
    let bound: Vec<&Path> = [place.workdir.as_path(), context.as_path()]
        .into_iter()
        .chain(roots.read_paths.iter().map(PathBuf::as_path))
        .chain(roots.write_paths.iter().map(PathBuf::as_path))
        .collect();
    let places = daemon_places(inner, &bound);
    policy::sandbox::sandbox_spec(&policy::sandbox::SandboxInputs {
        grants: plan.grants,
        request: roots,
        places,
        paths: policy::sandbox::fs::RunPaths {
            temp_dir: place.temp_dir.clone(),
            artifact_dir: files.artifacts(),
            context_dir: files.context(),
            delta_dir: files.delta_dir(),
            project_dir: place.workdir.clone(),
            programs,
        },
        memory_mb: plan
            .limits
            .memory_mb
            .unwrap_or(policy::sandbox::DEFAULT_MEMORY_MB),
        pids: plan.limits.pids.unwrap_or(policy::sandbox::DEFAULT_PIDS),
        fsize_bytes: policy::sandbox::DEFAULT_FSIZE_BYTES,
        disk_bytes: plan.limits.disk_bytes(),
        require: Some(inner.cfg.required(plan.grants.network)),
        own_uid,
        network_allow: (plan.network == NetworkMode::Allowlist).then(|| plan.network_allow.clone()),
        gateway: plan.driver != policy::driver::Driver::Command,
    })
}

/// runner.json: everything the run's runner needs. `uid` is the run's own
/// uid, when it has one.
fn runner_spec(
    inner: &Inner,
    p: &SpawnParams,
    plan: &Plan,
    place: &RunPlace,
    input: policy::compose::ComposeInput,
    uid: Option<u32>,
    delivered: &super::driving::Delivered,
) -> Result<RunnerSpec, EngineError> {
    let files = &place.files;
    let mut env = child_env(inner, p, place)?;
    if plan.network == NetworkMode::Allowlist {
        // Checked when the run was planned.
        let allow = network::parse_list(&plan.network_allow).unwrap_or_default();
        env.extend(network::proxy_env(network::PROXY_PORT, &allow));
    }
    // The driver's variables win over the request's and the proxy's.
    env.extend(delivered.env.clone());
    let sandbox = sandbox_spec(inner, p, plan, place, &env, uid.is_some());
    // The child's uid: its own, or the one `run_as` user. Its files
    // (project, context) are reached through idmapped mounts and its own
    // dirs live in its scratch file system: nothing on disk becomes its.
    let run_as = match uid {
        Some(u) => Some((u, u)),
        None => inner.cfg.run_as.map(|r| (r.uid, r.gid)),
    };
    Ok(RunnerSpec {
        run_id: place.id.to_string(),
        argv: plan.command.clone(),
        env,
        cwd: place.workdir.clone(),
        log_path: files.log(),
        exit_path: files.exit(),
        wall_time_s: plan.limits.wall_time_s(),
        output_bytes: plan.limits.output_bytes(),
        kill_grace_ms: inner.cfg.kill_grace_ms,
        sandbox,
        cgroup_plan: inner.probe.cgroups.clone(),
        run_as,
        keep_temp: p.keep_temp,
        egress_log: (plan.network == NetworkMode::Allowlist).then(|| files.egress_log()),
        stdin: delivered
            .stdin
            .then(|| files.context().join("first_message.md")),
        restart: Some(subagent_runner::spec::RestartSpec {
            max_attempts: input.max_attempts,
            // The inputs stay with the run (not in the child's context
            // dir), for a restart to compose again.
            compose: Some(input),
            compose_input: None,
            context_dir: files.context(),
            artifact_dir: files.artifacts(),
            attempt_file: files.dir.join("attempt.json"),
            share_gid: None,
        }),
    })
}

/// run.json of a run just accepted.
fn accepted_record(
    p: &SpawnParams,
    plan: &Plan,
    place: RunPlace,
    git: policy::workctx::GitSnapshot,
    max_attempts: u32,
    uid: Option<u32>,
    driver_run: super::driving::DriverRun,
) -> RunRecord {
    RunRecord {
        format: RECORD_FORMAT,
        run_id: place.id.clone(),
        session_id: p.session.id.clone(),
        audience: p.session.audience,
        project_dir: p.session.project_dir.clone(),
        task: p.task.clone(),
        context: p.context.clone(),
        command: plan.command.clone(),
        env: p.env.clone(),
        limits: plan.limits,
        keep_temp: p.keep_temp,
        reason: None,
        cancel_requested: false,
        created_at_ms: crate::timefmt::now_ms(),
        temp_dir: place.temp_dir,
        run_dir: place.files.dir,
        log_truncated: false,
        sandbox: p.sandbox.clone(),
        agent: plan.agent.as_ref().map(|a| a.definition.name.clone()),
        tools: plan.tools.clone(),
        rights: Some(plan.grants),
        git: Some(git),
        worktree: place.worktree,
        max_attempts,
        uid,
        on_behalf: None,
        network: Some(plan.network),
        network_allow: plan.network_allow.clone(),
        notes: plan.notes.clone(),
        driver_run: Some(driver_run),
        phase: Phase::Accepted,
    }
}

/// A uid of its own for the run (root daemons without `run_as`).
fn lease_uid(inner: &Inner) -> Result<Option<UidLease>, EngineError> {
    let Some(pool) = &inner.uids else {
        return Ok(None);
    };
    pool.lease().map(Some).map_err(|e| EngineError::Sandbox {
        mechanism: "per_run_uid",
        why: e.into(),
    })
}

/// A run just recorded.
pub(crate) struct Created {
    /// Its record, as accepted.
    pub rec: RunRecord,
    /// Its uid lease, while no runner holds it.
    pub lease: Option<UidLease>,
    /// Its runner, when it was started at once (gate open).
    pub runner: Option<Launched>,
}

/// Records a new run: leases its uid (root daemons), makes its temp dir
/// (and worktree), writes its folder (context files, runner.json, run.json)
/// under a draft name and renames it to the run id, durably. With
/// `start_now` the runner is started while the records are made durable,
/// and let go once they are. What was made is removed if any step fails.
/// Blocking.
pub(crate) fn create_run(
    inner: &Inner,
    p: &SpawnParams,
    plan: &Plan,
    start_now: bool,
    on_behalf: Option<&OnBehalf>,
) -> Result<Created, EngineError> {
    check_writable_roots(inner, p, plan)?;
    let session = &p.session.id;
    let mut draft = RunDraft::begin(
        inner.layout.runs_dir(session),
        RunId::new(),
        lease_uid(inner)?,
    )?;
    let temp_dir = draft.make_temp_dir(&inner.cfg.temp_base, session)?;
    let worktree = match p.isolation {
        Some(crate::protocol::Isolation::Worktree) => {
            Some(draft.make_worktree(&p.session.project_dir, &inner.layout.session_dir(session))?)
        }
        _ => None,
    };
    let place = RunPlace {
        id: draft.id().clone(),
        files: draft.files(),
        temp_dir,
        workdir: worktree
            .as_ref()
            .map_or(p.session.project_dir.clone(), |w| w.dir.clone()),
        worktree,
    };
    let mut work = working_context(inner, p, &place.workdir, on_behalf.map(|o| &o.requester))?;
    let writable = writes_into(plan, p, &place.workdir);
    let before = super::workctx::observe_before(
        inner,
        &place.workdir,
        writable,
        (&work.git, std::mem::take(&mut work.status)),
    );
    let tools_json = inner
        .tools
        .tools_json(plan.tools.as_deref().unwrap_or_default());
    let input = compose_input(inner, p, plan, &place, tools_json, work.block);
    let staged = draft.staged();
    let system_text = write_context_files(&staged.context(), &input)?;
    // Only an observation depends on it: not fsynced (a lost one says so).
    let before = serde_json::to_vec(&before)
        .map_err(|e| EngineError::Unexpected(InternalError::Encode(e)))?;
    draft.write(&staged.observed_before(), &before, Sync::Derived)?;
    let max_attempts = input.max_attempts;
    let (plan, mut delivered) = with_delivery(inner, p, plan, &place, draft.uid(), &system_text)?;
    delivered.run.writes_project = Some(writable);
    let plan = &plan;
    let mut spec = runner_spec(inner, p, plan, &place, input, draft.uid(), &delivered)?;
    if let Some(ob) = on_behalf {
        limit_for_requester(&mut spec.sandbox, p, &place, &ob.requester);
    }
    // Compact: only the runner reads it (about 15 KB pretty-printed).
    let bytes =
        serde_json::to_vec(&spec).map_err(|e| EngineError::Unexpected(InternalError::Encode(e)))?;
    draft.write(&staged.runner_spec(), &bytes, Sync::Durable)?;
    let mut rec = accepted_record(
        p,
        plan,
        place,
        work.git,
        max_attempts,
        draft.uid(),
        delivered.run,
    );
    rec.on_behalf = on_behalf.cloned();
    draft.write(&staged.record(), &rec.to_bytes(), Sync::Durable)?;
    let handed = start_now.then(|| handed_files(&draft)).flatten();
    let egress = plan.network == NetworkMode::Allowlist;
    // Checked by `deliver`: a key named and not set refused the spawn.
    let gateway =
        super::driving::gateway_setup(&inner.cfg.settings, &inner.daemon_env, plan.driver)
            .ok()
            .flatten();
    let (lease, runner) = publish(inner, draft, handed, egress, gateway)?;
    Ok(Created { rec, lease, runner })
}

/// The plan with the argv its delivery makes (a driver's, or a command's
/// placeholders expanded), and the delivery.
fn with_delivery(
    inner: &Inner,
    p: &SpawnParams,
    plan: &Plan,
    place: &RunPlace,
    uid: Option<u32>,
    system_text: &str,
) -> Result<(Plan, super::driving::Delivered), EngineError> {
    let run_id = place.id.to_string();
    let facts = super::driving::RunFacts {
        run_id: &run_id,
        context_dir: &place.files.context(),
        temp_dir: &place.temp_dir,
        system_text,
        uid0: child_is_root(inner, uid),
    };
    let delivered = super::driving::deliver(inner, plan, p.stdin.is_some(), &facts)?;
    let mut plan = plan.clone();
    plan.command.clone_from(&delivered.argv);
    Ok((plan, delivered))
}

/// Whether the agent runs as uid 0: with no uid of its own and no
/// `run_as` user, it runs as the daemon does.
fn child_is_root(inner: &Inner, uid: Option<u32>) -> bool {
    match (uid, inner.cfg.run_as) {
        (Some(u), _) => u == 0,
        (None, Some(r)) => r.uid == 0,
        // SAFETY: geteuid cannot fail and touches no memory.
        (None, None) => unsafe { libc::geteuid() == 0 },
    }
}

/// Whether the run may write in its work dir: the project with the write
/// right (a worktree is the project), or a write path inside it.
fn writes_into(plan: &Plan, p: &SpawnParams, workdir: &Path) -> bool {
    plan.grants.write_project || p.sandbox.write_paths.iter().any(|w| w.starts_with(workdir))
}

/// The files a runner started at once gets; `None` (the run is then queued
/// as usual) when they cannot be opened.
fn handed_files(draft: &RunDraft) -> Option<RunnerFiles> {
    RunnerFiles::open(&draft.staged())
        .map_err(
            |e| tracing::warn!(run_id = %draft.id(), "starting the runner: {e}; the run is queued"),
        )
        .ok()
}

/// Publishes the draft while, on another thread, a runner is started with
/// `handed` behind its gate; then opens the gate. The runner holds the uid
/// lease from then on. When publishing fails, the runner is called off
/// before the draft is undone. With `egress`, the runner gets a channel to
/// the proxy.
fn publish(
    inner: &Inner,
    mut draft: RunDraft,
    handed: Option<RunnerFiles>,
    egress: bool,
    gateway: Option<crate::gateway::Setup>,
) -> Result<(Option<UidLease>, Option<Launched>), EngineError> {
    // A runner started at once holds its own copy of the uid lease; without
    // one it is not started here, so a uid is never in use unleased.
    let uid_lock = match draft.lease().map(|l| l.lock().try_clone_to_owned()) {
        Some(Ok(fd)) => Some(fd),
        Some(Err(_)) => return publish(inner, draft, None, egress, gateway),
        None => None,
    };
    let id = draft.id().clone();
    let (published, runner) = std::thread::scope(|s| {
        let start = handed.as_ref().map(|h| {
            s.spawn(|| {
                start_runner(
                    &inner.cfg.runner,
                    h,
                    uid_lock.as_ref().map(|f| f.as_fd()),
                    true,
                    egress,
                    gateway.clone(),
                )
            })
        });
        let published = draft.publish();
        let runner = match start.map(|t| t.join()) {
            Some(Ok(Ok(l))) => Some(l),
            Some(Ok(Err(e))) => {
                tracing::warn!(run_id = %id, "starting the runner: {e}; the run is queued");
                None
            }
            _ => None,
        };
        (published, runner)
    });
    if let Err(e) = published {
        if let Some(r) = runner {
            let how = r.call_off();
            tracing::warn!(run_id = %id, "recording the run failed ({e}); its runner was called off and {how}");
        }
        return Err(e);
    }
    let lease = draft.take_lease();
    match runner {
        Some(mut r) => {
            r.open_gate();
            drop(lease);
            Ok((None, Some(r)))
        }
        None => Ok((lease, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::SessionParams;
    use policy::Audience;

    fn params() -> SpawnParams {
        SpawnParams {
            session: SessionParams {
                id: "s1".into(),
                audience: Audience::Team,
                project_dir: "/".into(),
                tools: None,
                recent_files: None,
            },
            task: "do it".into(),
            context: None,
            command: vec!["true".into()],
            env: Default::default(),
            limits: Default::default(),
            keep_temp: false,
            sandbox: Default::default(),
            agent: None,
            isolation: None,
            max_restarts: None,
            driver: None,
            stdin: None,
        }
    }

    fn field_of(p: &SpawnParams) -> String {
        match validate(p).unwrap_err() {
            EngineError::InvalidParams { field, .. } => field,
            other => panic!("{other}"),
        }
    }

    #[test]
    fn each_bad_field_is_named() {
        assert!(validate(&params()).is_ok());
        let mut p = params();
        p.session.id = "../x".into();
        assert_eq!(field_of(&p), "session.id");
        let mut p = params();
        p.session.project_dir = "relative/dir".into();
        assert_eq!(field_of(&p), "session.project_dir");
        let mut p = params();
        p.session.project_dir = "/nonexistent-xyz".into();
        assert_eq!(field_of(&p), "session.project_dir");
        let mut p = params();
        p.task = " ".into();
        assert_eq!(field_of(&p), "task");
        let mut p = params();
        p.task = "x".repeat(MAX_TASK + 1);
        assert_eq!(field_of(&p), "task");
        let mut p = params();
        p.command = vec![String::new()];
        assert_eq!(field_of(&p), "command[0]");
        let mut p = params();
        p.max_restarts = Some(11);
        assert_eq!(field_of(&p), "max_restarts");
        let mut p = params();
        p.agent = Some("Bad\u{1b}Name".into());
        assert_eq!(field_of(&p), "agent");
        let mut p = params();
        p.env.insert("SUBAGENT_RUN_ID".into(), "x".into());
        assert_eq!(field_of(&p), "env.SUBAGENT_RUN_ID");
        let mut p = params();
        p.limits.wall_time_s = Some(0);
        assert_eq!(field_of(&p), "limits.wall_time_s");
        let mut p = params();
        p.limits.wall_time_s = Some(u64::MAX);
        assert_eq!(field_of(&p), "limits.wall_time_s");
        let mut p = params();
        p.sandbox.read_paths = vec!["relative".into()];
        assert_eq!(field_of(&p), "sandbox.read_paths[0]");
        let mut p = params();
        p.sandbox.write_paths = vec!["/nonexistent-xyz".into()];
        assert_eq!(field_of(&p), "sandbox.write_paths[0]");
    }

    #[test]
    fn public_is_refused() {
        let mut p = params();
        p.session.audience = Audience::Public;
        let e = validate(&p).unwrap_err();
        assert!(matches!(e, EngineError::Audience(_)));
        assert_eq!(
            e.to_string(),
            "subagents are not available to Public sessions"
        );
    }

    #[test]
    fn host_paths_resolve_links_even_beneath_a_missing_tail() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().canonicalize().unwrap().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(host_path(&link), real);
        assert_eq!(host_path(&link.join("not/yet")), real.join("not/yet"));
        assert_eq!(host_path(&link.join("..").join("real")), real);
    }
}
