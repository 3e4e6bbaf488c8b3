//! Checking a spawn's params before anything is read or made: each bad
//! field is named. May use the engine's errors and probe, ids, protocol,
//! securedir, rights and policy.

use crate::engine::error::{EngineError, SandboxCause};
use crate::engine::probe::HostProbe;
use crate::ids::check_session_id;
use crate::protocol::{SpawnParams, MAX_TASK};
use policy::rights::{Requested, Requester};
use policy::sandbox::network;
use std::collections::BTreeMap;
use std::path::Path;

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

/// Refuses what the backend cannot give a run. A Slurm job runs on a node
/// with no socket pair to the daemon: it reaches the egress proxy
/// (allowlist mode) and the model gateway (a driver run, whose key stays
/// with the daemon) only through the daemon's job services port
/// (`services`), and without one such runs are refused rather than run
/// without them.
pub fn check_backend(
    kind: policy::backend::BackendKind,
    services: bool,
    network: network::NetworkMode,
    driver: policy::driver::Driver,
) -> Result<(), EngineError> {
    if kind != policy::backend::BackendKind::Slurm || services {
        return Ok(());
    }
    let (mechanism, why) = if network == network::NetworkMode::Allowlist {
        (
            "egress_proxy",
            "the run's network is an allowlist, served by the daemon's egress proxy, \
             which a Slurm job on another node reaches only through the daemon's job \
             services port ([backend] services_listen, not set); give it no network or \
             the full network, or set services_listen",
        )
    } else if driver != policy::driver::Driver::Command {
        (
            "model_gateway",
            "a driver run reaches its model through the daemon's model gateway, which \
             holds the key and which a Slurm job on another node reaches only through \
             the daemon's job services port ([backend] services_listen, not set)",
        )
    } else {
        return Ok(());
    };
    Err(EngineError::Sandbox {
        mechanism,
        why: SandboxCause::Missing(why.into()),
    })
}

/// Checks an argv (empty is allowed here: it is resolved later).
pub(super) fn check_command(command: &[String], field: &str) -> Result<(), EngineError> {
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

/// Checks that session.project_dir is an absolute path to a directory.
/// Refuses a root that passes through a symbolic link.
pub(super) fn check_unlinked(field: &str, path: &Path) -> Result<(), EngineError> {
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

pub(super) fn check_project_dir(dir: &Path) -> Result<(), EngineError> {
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
pub(super) fn check_texts(p: &SpawnParams) -> Result<(), EngineError> {
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
pub(super) fn check_agent_name(a: &str) -> Result<(), EngineError> {
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

/// The most turns a budget allows.
pub const MAX_TURNS: u32 = 100_000;
/// The largest spending limit a budget takes, in US dollars.
pub const MAX_BUDGET_USD: f64 = 1_000_000.0;

/// Checks the budget's values (which driver may take one is the plan's).
pub(super) fn check_budget(p: &SpawnParams) -> Result<(), EngineError> {
    if p.max_turns.is_some_and(|n| !(1..=MAX_TURNS).contains(&n)) {
        return Err(EngineError::invalid(
            "max_turns",
            format!("must be 1 to {MAX_TURNS}"),
        ));
    }
    let usd_ok = |usd: f64| usd > 0.0 && usd <= MAX_BUDGET_USD;
    if p.max_budget_usd.is_some_and(|usd| !usd_ok(usd)) {
        return Err(EngineError::invalid(
            "max_budget_usd",
            format!("must be more than 0 and at most {MAX_BUDGET_USD}"),
        ));
    }
    Ok(())
}

/// Checks the request's env: names, values, and no name the supervisor sets.
pub(super) fn check_env(env: &BTreeMap<String, String>) -> Result<(), EngineError> {
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
pub(super) fn check_network_allow(
    sandbox: &policy::sandbox::SandboxRequest,
) -> Result<(), EngineError> {
    network::parse_list(&sandbox.network_allow)
        .map(|_| ())
        .map_err(|(i, e)| {
            EngineError::invalid(&format!("sandbox.network_allow[{i}]"), e.to_string())
        })
}

/// Checks the sandbox's read and write paths: absolute, and existing.
pub(super) fn check_roots(sandbox: &policy::sandbox::SandboxRequest) -> Result<(), EngineError> {
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
    check_budget(p)?;
    p.limits
        .validate()
        .map_err(|(f, why)| EngineError::invalid(&format!("limits.{f}"), why))?;
    check_network_allow(&p.sandbox)?;
    check_roots(&p.sandbox)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slurm_job_gets_no_proxy_and_no_gateway() {
        use policy::backend::BackendKind::{Local, Slurm};
        use policy::driver::Driver;
        use policy::sandbox::network::NetworkMode;
        let refused = |kind, net, driver| match check_backend(kind, false, net, driver) {
            Err(EngineError::Sandbox { mechanism, .. }) => Some(mechanism),
            Err(e) => panic!("{e}"),
            Ok(()) => None,
        };
        assert_eq!(
            refused(Slurm, NetworkMode::Allowlist, Driver::Command),
            Some("egress_proxy")
        );
        assert_eq!(
            refused(Slurm, NetworkMode::None, Driver::ClaudeCode),
            Some("model_gateway")
        );
        assert_eq!(refused(Slurm, NetworkMode::Full, Driver::Command), None);
        assert_eq!(refused(Slurm, NetworkMode::None, Driver::Command), None);
        assert_eq!(refused(Local, NetworkMode::Allowlist, Driver::Codex), None);
        assert!(check_backend(Slurm, true, NetworkMode::Allowlist, Driver::ClaudeCode).is_ok());
    }
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
            max_turns: None,
            max_budget_usd: None,
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
        for turns in [0, MAX_TURNS + 1] {
            let mut p = params();
            p.max_turns = Some(turns);
            assert_eq!(field_of(&p), "max_turns");
        }
        for usd in [0.0, -1.0, f64::NAN, f64::INFINITY, MAX_BUDGET_USD * 2.0] {
            let mut p = params();
            p.max_budget_usd = Some(usd);
            assert_eq!(field_of(&p), "max_budget_usd", "{usd}");
        }
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
}
