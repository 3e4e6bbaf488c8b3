//! Accepting a spawn: checking its params, then recording the run durably
//! (folder, temp dir, runner.json, run.json) before anyone is told its id.
//! A failure part-way removes what was made.

use super::probe::HostProbe;
use super::{EngineError, Inner};
use crate::ids::{check_session_id, RunId};
use crate::paths::RunFiles;
use crate::protocol::{SpawnParams, MAX_TASK};
use crate::record::{RunRecord, RunState, RECORD_FORMAT};
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use subagent_runner::atomic::fsync_dir;
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
                why,
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
    pub agent: Option<policy::definition::Definition>,
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

/// Resolves a spawn: finds the definition, filters the tools, derives the
/// rights, picks the command and the limits. Blocking (reads definitions).
pub fn plan(
    tools: &policy::toolpolicy::ToolPolicy,
    settings: &policy::config::Config,
    p: &SpawnParams,
) -> Result<Plan, EngineError> {
    let agent = match &p.agent {
        None => None,
        Some(name) => {
            let found = crate::agents::discover(&p.session.project_dir);
            // A malformed file of that name is an error even when another
            // directory has a valid one: never silently run a different
            // definition than the one that was meant.
            if let Some(e) = found.error_for(name) {
                return Err(EngineError::invalid(
                    "agent",
                    format!("the definition of {name:?} cannot be used: {e}"),
                ));
            }
            match found.get(name) {
                Some(d) => Some(d.clone()),
                None => {
                    let names = found.names();
                    let why = if names.is_empty() {
                        format!("no agent named {name:?}; no definitions were found")
                    } else {
                        format!("no agent named {name:?}; available: {}", names.join(", "))
                    };
                    return Err(EngineError::invalid("agent", why));
                }
            }
        }
    };
    let def_tools = agent.as_ref().and_then(|d| d.tools.clone());
    let child_tools = match (&p.session.tools, &def_tools) {
        (Some(parent), _) => Some(
            tools
                .child_tools(p.session.audience, parent, def_tools.as_deref())
                .map_err(|e| match e {
                    policy::toolpolicy::ToolError::Unknown { field, names } if field == "agent tools" => {
                        let file = agent.as_ref().map(|d| d.source.display().to_string()).unwrap_or_default();
                        EngineError::invalid("agent", format!("{file}: unknown tools: {}", names.join(", ")))
                    }
                    policy::toolpolicy::ToolError::Unknown { field, names } => {
                        EngineError::invalid(&field, format!("unknown tools: {}", names.join(", ")))
                    }
                    other => EngineError::Internal(other.to_string()),
                })?,
        ),
        (None, Some(_)) => {
            return Err(EngineError::invalid(
                "session.tools",
                "required when the agent's definition lists tools (the child's tools are the parent's, filtered)",
            ))
        }
        (None, None) => None,
    };
    let switches = policy::sandbox::SandboxRequest {
        // A definition can ask for less network, never more.
        network: match agent.as_ref().and_then(|d| d.network) {
            Some(false) => Some(false),
            _ => p.sandbox.network,
        },
        ..p.sandbox.clone()
    };
    let classes = child_tools.as_ref().map(|t| tools.classes(t));
    let grants = policy::sandbox::grants(classes.as_ref(), &switches);
    let command = if !p.command.is_empty() {
        p.command.clone()
    } else if let Some(c) = agent.as_ref().and_then(|d| d.command.clone()) {
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
    // The parent's own limits win; a definition only lowers the defaults.
    let from_def = agent.as_ref().map(|d| d.limits).unwrap_or_default();
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
    })
}

/// Checks a spawn's params; names the first offending field.
pub fn validate(p: &SpawnParams) -> Result<(), EngineError> {
    check_session_id(&p.session.id).map_err(|e| EngineError::invalid("session.id", e))?;
    p.session.audience.check_may_spawn()?;
    let dir = &p.session.project_dir;
    if !dir.is_absolute() {
        return Err(EngineError::invalid(
            "session.project_dir",
            format!("{} is not an absolute path", dir.display()),
        ));
    }
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(EngineError::invalid(
                "session.project_dir",
                format!("{} is not a directory", dir.display()),
            ))
        }
        Err(e) => {
            return Err(EngineError::invalid(
                "session.project_dir",
                format!("{}: {e}", dir.display()),
            ))
        }
    }
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
    check_command(&p.command, "command")?;
    if p.max_restarts.is_some_and(|n| n > policy::MAX_RESTARTS) {
        return Err(EngineError::invalid(
            "max_restarts",
            format!("must be at most {}", policy::MAX_RESTARTS),
        ));
    }
    if let Some(a) = &p.agent {
        if !a
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            || a.is_empty()
        {
            return Err(EngineError::invalid(
                "agent",
                format!("{a:?} is not an agent name ([a-z0-9-]+)"),
            ));
        }
    }
    policy::env::validate_request_env(&p.env).map_err(|e| match e {
        policy::EnvError::InvalidName(n) => {
            EngineError::invalid("env", format!("invalid variable name {n:?}"))
        }
        policy::EnvError::InvalidValue(n) => {
            EngineError::invalid(&format!("env.{n}"), "contains a NUL byte")
        }
        policy::EnvError::Reserved(n) => {
            EngineError::invalid(&format!("env.{n}"), "reserved: the supervisor sets it")
        }
    })?;
    p.limits
        .validate()
        .map_err(|(f, why)| EngineError::invalid(&format!("limits.{f}"), why))?;
    for (field, list) in [
        ("sandbox.read_paths", &p.sandbox.read_paths),
        ("sandbox.write_paths", &p.sandbox.write_paths),
    ] {
        for (i, path) in list.iter().enumerate() {
            if !path.is_absolute() {
                return Err(EngineError::invalid(
                    &format!("{field}[{i}]"),
                    format!("{} is not an absolute path", path.display()),
                ));
            }
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

fn storage(op: &str, path: &Path, e: impl std::fmt::Display) -> EngineError {
    EngineError::Storage(format!("{op} {}: {e}", path.display()))
}

fn mkdir_private(path: &Path, recursive: bool) -> Result<(), EngineError> {
    std::fs::DirBuilder::new()
        .recursive(recursive)
        .mode(0o700)
        .create(path)
        .map_err(|e| storage("create", path, e))
}

/// What the composition of this run depends on.
#[allow(clippy::too_many_arguments)]
fn compose_input(
    inner: &Inner,
    p: &SpawnParams,
    plan: &Plan,
    workdir: &Path,
    files: &RunFiles,
    temp_dir: &Path,
    worktree: Option<&super::workctx::Worktree>,
    tools_json: &str,
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
        project_instructions: super::instructions::project_instructions(workdir),
        agent: plan.agent.as_ref().map(|d| policy::compose::Sourced {
            path: d.source.clone(),
            text: d.body.clone(),
        }),
        tools,
        tools_json: tools_json.to_owned(),
        paths: policy::compose::SessionPaths {
            session_id: p.session.id.clone(),
            temp_dir: temp_dir.to_path_buf(),
            artifact_dir: files.artifacts(),
            worktree_dir: worktree.map(|w| w.dir.clone()),
            log_path: files.log(),
            delta_path: files.delta(),
        },
        task: p.task.clone(),
        context: p.context.clone(),
        working_context,
        caps: settings.context,
        max_attempts: 1 + max_restarts,
    }
}

/// The text of context/first_message.md.
pub fn first_message(context: Option<&str>, task: &str) -> String {
    let context = context.filter(|c| !c.trim().is_empty()).unwrap_or("(none)");
    format!("Context: {context}\nTask: {task}\n")
}

/// Records a new run: leases its uid (root daemons), fills a spare run
/// folder (see [`super::spare`]) with its context files, runner.json and
/// run.json, makes its temp dir, and publishes the folder under its run
/// id, durably. Blocking.
pub(crate) fn create_run(
    inner: &Inner,
    p: &SpawnParams,
    plan: &Plan,
) -> Result<(RunRecord, Option<crate::uids::UidLease>), EngineError> {
    let id = RunId::new();
    let session = &p.session.id;
    let runs_dir = inner.layout.runs_dir(session);
    mkdir_private(&runs_dir, true)?;
    // `files` is where the run will live (its paths go into every record);
    // `stage` is the spare folder filled until it is renamed there.
    let files = RunFiles {
        dir: runs_dir.join(id.as_str()),
    };
    let stage = RunFiles {
        dir: inner
            .spare
            .take()
            .map_err(|e| EngineError::Storage(e.to_string()))?,
    };
    let fill = |path: &Path, bytes: &[u8], sync: bool| {
        super::spare::fill(path, bytes, sync).map_err(|e| EngineError::Storage(e.to_string()))
    };
    let mut temp_dir = None;
    let mut made_worktree: Option<super::workctx::Worktree> = None;
    let lease = match &inner.uids {
        Some(pool) => Some(pool.lease().map_err(|e| EngineError::Sandbox {
            mechanism: "per_run_uid",
            why: e.to_string(),
        })?),
        None => None,
    };
    let result = (|| {
        // The child's uid: its own, or the one `run_as` user. Its files
        // (project, context) are reached through idmapped mounts and its
        // own dirs live in its scratch file system: nothing on disk needs
        // to become its.
        let child = match &lease {
            Some(l) => Some((l.uid, l.uid)),
            None => inner.cfg.run_as.map(|r| (r.uid, r.gid)),
        };
        let t = crate::securedir::make_temp_dir(
            &inner.cfg.temp_base,
            session,
            None,
            inner.spare.take_temp(),
        )
        .map_err(|e| EngineError::Workspace(e.to_string()))?;
        temp_dir = Some(t.clone());
        // The working context: the session's recent files, an optional
        // worktree, and the git snapshot of where the child will work.
        let worktree = match p.isolation {
            Some(crate::protocol::Isolation::Worktree) => {
                let w = super::workctx::create_worktree(
                    &p.session.project_dir,
                    &inner.layout.session_dir(session),
                    id.as_str(),
                )?;
                made_worktree = Some(w.clone());
                Some(w)
            }
            _ => None,
        };
        let session_state = inner
            .sessions
            .on_spawn(
                session,
                &p.session.project_dir,
                p.session.recent_files.as_deref(),
            )
            .map_err(EngineError::Storage)?;
        let workdir = worktree
            .as_ref()
            .map_or(p.session.project_dir.clone(), |w| w.dir.clone());
        let git = crate::gitsnap::snapshot(&workdir, inner.cfg.git_budget);
        // The child's context: composed from recorded inputs (kept in
        // runner.json),
        // so a restart can compose it again with a handoff note.
        let listed = plan.tools.clone().unwrap_or_default();
        let tools_json = inner.tools.tools_json(&listed);
        let input = compose_input(
            inner,
            p,
            plan,
            &workdir,
            &files,
            &t,
            worktree.as_ref(),
            &tools_json,
            policy::workctx::render_block(&workdir, &session_state.recent_files, &git),
        );
        let composed = policy::compose::compose(&input, 1, None);
        let ctx = stage.context();
        for (name, bytes) in [
            ("system.md", composed.system_md.as_bytes()),
            ("first_message.md", composed.first_message_md.as_bytes()),
            ("tools.json", tools_json.as_bytes()),
            ("plan.json", composed.plan_json.as_bytes()),
        ] {
            let path = ctx.join(name);
            // Derived from the inputs in runner.json, which is durable: not
            // fsynced.
            fill(&path, bytes, false)?;
        }
        // The first attempt's plan: a second name for plan.json's file, no
        // new inode (a restart replaces plan.json and leaves this one).
        let plan_1 = ctx.join("plan-1.json");
        std::fs::hard_link(ctx.join("plan.json"), &plan_1)
            .map_err(|e| storage("link", &plan_1, e))?;
        let show = |p: &Path| p.display().to_string();
        let paths = policy::ChildPaths {
            run_id: id.to_string(),
            session_id: session.clone(),
            temp_dir: show(&t),
            artifact_dir: show(&files.artifacts()),
            log_path: show(&files.log()),
            context_dir: show(&files.context()),
            delta_path: show(&files.delta()),
        };
        let env = policy::child_env(
            &inner.daemon_env,
            &inner.cfg.settings.env_allow,
            &p.env,
            &paths,
        )
        .map_err(|e| EngineError::invalid("env", e.to_string()))?;
        let programs =
            super::program::for_run(inner, p, &plan.command[0], &env, &workdir, &t, &files);
        let mut roots = p.sandbox.clone();
        roots
            .read_paths
            .extend(inner.cfg.settings.read_paths.iter().cloned());
        roots
            .write_paths
            .extend(inner.cfg.settings.write_paths.iter().cloned());
        let sandbox = policy::sandbox::sandbox_spec(&policy::sandbox::SandboxInputs {
            grants: plan.grants,
            request: roots,
            paths: policy::sandbox::fs::RunPaths {
                temp_dir: t.clone(),
                artifact_dir: files.artifacts(),
                context_dir: files.context(),
                delta_dir: files.delta_dir(),
                project_dir: workdir.clone(),
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
            own_uid: lease.is_some(),
        });
        let spec = RunnerSpec {
            run_id: id.to_string(),
            argv: plan.command.clone(),
            env,
            cwd: workdir.clone(),
            log_path: files.log(),
            exit_path: files.exit(),
            wall_time_s: plan.limits.wall_time_s(),
            output_bytes: plan.limits.output_bytes(),
            kill_grace_ms: inner.cfg.kill_grace_ms,
            sandbox,
            cgroup_plan: inner.probe.cgroups.clone(),
            run_as: child,
            keep_temp: p.keep_temp,
            restart: Some(subagent_runner::spec::RestartSpec {
                max_attempts: input.max_attempts,
                // The inputs stay with the run (not in the child's context
                // dir), for a restart to compose again.
                compose: Some(input.clone()),
                compose_input: None,
                context_dir: files.context(),
                artifact_dir: files.artifacts(),
                attempt_file: files.dir.join("attempt.json"),
                share_gid: None,
            }),
        };
        // Compact: only the runner reads it (about 15 KB pretty-printed).
        let bytes = serde_json::to_vec(&spec).map_err(|e| EngineError::Internal(e.to_string()))?;
        fill(&stage.runner_spec(), &bytes, true)?;
        let rec = RunRecord {
            format: RECORD_FORMAT,
            run_id: id.to_string(),
            session_id: session.clone(),
            audience: p.session.audience,
            project_dir: p.session.project_dir.clone(),
            task: p.task.clone(),
            context: p.context.clone(),
            command: plan.command.clone(),
            env: p.env.clone(),
            limits: plan.limits,
            keep_temp: p.keep_temp,
            state: RunState::Accepted,
            exit_code: None,
            signal: None,
            reason: None,
            cancel_requested: false,
            created_at_ms: crate::timefmt::now_ms(),
            started_at_ms: None,
            ended_at_ms: None,
            temp_dir: t,
            run_dir: files.dir.clone(),
            runner_pid: None,
            runner_start_ticks: None,
            log_truncated: false,
            finalized: false,
            finalize_error: None,
            sandbox: p.sandbox.clone(),
            isolation: None,
            resources: None,
            agent: plan.agent.as_ref().map(|d| d.name.clone()),
            tools: plan.tools.clone(),
            rights: Some(plan.grants),
            git: Some(git),
            worktree,
            delta: None,
            max_attempts: input.max_attempts,
            attempts: None,
            kept: None,
            uid: lease.as_ref().map(|l| l.uid),
        };
        fill(&stage.record(), &rec.to_bytes(), true)?;
        // Published whole: the folder's files and their names are durable
        // (the spare was fsynced when made); one rename gives it its name.
        std::fs::rename(&stage.dir, &files.dir)
            .map_err(|e| storage("rename into place", &files.dir, e))?;
        fsync_dir(&runs_dir).map_err(|e| EngineError::Storage(e.to_string()))?;
        Ok(rec)
    })();
    if result.is_err() {
        if let Some(w) = &made_worktree {
            let _ = super::workctx::remove_worktree(&p.session.project_dir, w, id.as_str());
        }
        let _ = std::fs::remove_dir_all(&stage.dir);
        let _ = std::fs::remove_dir_all(&files.dir);
        if let Some(t) = temp_dir {
            let _ = std::fs::remove_dir_all(&t);
            crate::securedir::remove_empty_session_dir(&t);
        }
    }
    result.map(|rec| (rec, lease))
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
        p.agent = Some("Bad Name".into());
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
    fn first_message_format() {
        assert_eq!(first_message(Some("bg"), "t"), "Context: bg\nTask: t\n");
        assert_eq!(first_message(None, "t"), "Context: (none)\nTask: t\n");
    }
}
