//! The run's sandbox and runner spec: the child's environment, the
//! daemon's places kept from it, its mounts and limits. May use the
//! engine's state, errors and program, paths, protocol and policy.

use super::deliver::Delivered;
use super::place::RunPlace;
use super::plan::Plan;
use crate::engine::error::EngineError;
use crate::engine::state::Inner;
use crate::protocol::SpawnParams;
use policy::rights::Requester;
use policy::sandbox::network::{self, NetworkMode};
use policy::sandbox::places::Places;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use subagent_runner::spec::RunnerSpec;

/// The child's environment: the daemon's allowed variables, the request's,
/// and the run's paths.
pub(super) fn child_env(
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
pub(super) fn host_path(path: &Path) -> PathBuf {
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
pub(super) fn daemon_places(inner: &Inner, roots: &[&Path]) -> Places {
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
pub(super) fn check_writable_roots(
    inner: &Inner,
    p: &SpawnParams,
    plan: &Plan,
) -> Result<(), EngineError> {
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
pub(super) fn sandbox_spec(
    inner: &Inner,
    p: &SpawnParams,
    plan: &Plan,
    place: &RunPlace,
    env: &BTreeMap<String, String>,
    own_uid: bool,
) -> policy::sandbox::SandboxSpec {
    let files = &place.files;
    let programs = crate::engine::program::for_run(
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

/// The runner spec: everything the run's runner needs. `uid` is the run's own
/// uid, when it has one.
pub(super) fn runner_spec(
    inner: &Inner,
    p: &SpawnParams,
    plan: &Plan,
    place: &RunPlace,
    input: policy::compose::ComposeInput,
    uid: Option<u32>,
    delivered: &Delivered,
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
        // A Slurm job's, set when it is submitted.
        remote_services: None,
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

/// The run's idmapped binds of what the requester named (the project in
/// place, the read and write paths) stay idmapped only where the
/// requester owns the path; the others become plain read-only binds.
pub(super) fn limit_for_requester(
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

#[cfg(test)]
mod tests {
    use super::*;

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
