//! Planning a spawn: the definition, the child's tools, the rights, the
//! network, the driver, the command and the limits it resolves to, and
//! the rights its requester must hold. May use the engine's errors and
//! drivers, agents, protocol, rights and policy.

use super::validate::check_command;
use crate::engine::error::{EngineError, InternalError};
use crate::protocol::SpawnParams;
use policy::rights::{OnBehalf, Requested, Requester};
use policy::sandbox::network::{self, AllowEntry, NetworkMode};
use std::path::Path;

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
    /// The limits its agent enforces on itself (the claude-code driver's).
    pub budget: Option<crate::run::driver::Budget>,
}

/// Refuses an entry of `list` (the request's or the definition's) that no
/// entry of the audience's cap holds.
pub(super) fn check_cap(
    cap: Option<&[AllowEntry]>,
    list: &[String],
    field: &str,
) -> Result<(), EngineError> {
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
pub(super) fn check_endpoint(
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
pub(super) fn definition_network<'a>(
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
pub(super) fn network_plan(
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

pub(super) fn merge_limits(first: policy::Limits, then: policy::Limits) -> policy::Limits {
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
pub(super) fn find_agent(
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
pub(super) fn child_tools(
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
pub(super) fn pick_command(
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
    let driver = crate::engine::drivers::pick(settings, p.driver, agent.as_ref(), &mut notes);
    if driver != policy::driver::Driver::Command && settings.drivers.get(driver).is_none() {
        let name = driver.as_str();
        return Err(EngineError::invalid(
            "driver",
            format!("the driver {name} is not set up: the config has no [drivers.{name}] table"),
        ));
    }
    let budget = budget(p, agent.as_ref(), driver)?;
    let (network, network_allow) = network_plan(
        settings,
        p,
        agent.as_ref(),
        &switches,
        grants.network,
        crate::engine::drivers::endpoint(settings, driver),
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
        budget,
    })
}

/// The run's budget: the request's `max_turns` and `max_budget_usd`, the
/// turns lowered by the definition's `maxTurns`. Only Claude Code enforces
/// one; a budget for another driver is refused, never guessed at.
fn budget(
    p: &SpawnParams,
    agent: Option<&crate::agents::Agent>,
    driver: policy::driver::Driver,
) -> Result<Option<crate::run::driver::Budget>, EngineError> {
    use policy::driver::Driver;
    let asked = [
        ("max_turns", p.max_turns.is_some()),
        ("max_budget_usd", p.max_budget_usd.is_some()),
    ];
    if let Some((field, _)) = asked.iter().find(|(_, set)| *set) {
        let why = match driver {
            Driver::ClaudeCode => None,
            Driver::Codex => Some("not with the driver codex: Codex has no turn or spending limit of its own to pass it to, and subagentd does not enforce one by guessing from its output (the claude-code driver takes one)"),
            Driver::Command => Some("not with the driver command: a plain command reports no turns or cost, so there is nothing to hold it to (the claude-code driver takes one)"),
        };
        if let Some(why) = why {
            return Err(EngineError::invalid(field, why));
        }
    }
    if driver != Driver::ClaudeCode {
        return Ok(None);
    }
    let from_def = agent.and_then(|a| a.definition.max_turns);
    let max_turns = match (p.max_turns, from_def) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let b = crate::run::driver::Budget {
        max_turns,
        max_budget_usd: p.max_budget_usd,
    };
    Ok((b.max_turns.is_some() || b.max_budget_usd.is_some()).then_some(b))
}

/// A driver run's program (its whole argv is made with the run's
/// context); a request may give neither a command nor stdin for it.
pub(super) fn driver_command(
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
    let program = crate::engine::drivers::resolve_program(driver, &config, path.as_deref())
        .map_err(|e| EngineError::invalid("driver", e.to_string()))?;
    Ok(vec![program.display().to_string()])
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
