//! File-system rules (applied with Landlock): the system is readable and
//! executable, the run's own temp and artifact dirs are writable, the
//! project is readable (writable only when granted), and nothing else is
//! reachable: not the state dir, not $HOME, not other runs' dirs.

use super::grants::{Grants, SandboxRequest};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What a rule grants beneath its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// Read files and list directories.
    Read,
    /// Read, list and execute.
    ReadExec,
    /// Every right except execute: read, write, create, remove, rename.
    ReadWrite,
}

/// One Landlock rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsRule {
    /// The file or directory.
    pub path: PathBuf,
    /// What it grants.
    pub access: Access,
    /// A missing path is an error (true) or skipped (false, for system
    /// paths some hosts lack, such as /lib32).
    pub must_exist: bool,
    /// Why the child gets it.
    pub reason: String,
    /// The path must be a regular file reached with no symlink on the way
    /// (a program of the chain, resolved to a canonical path by the
    /// daemon): a link or a directory there now was put there since, and
    /// the rule fails rather than follow it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub file_only: bool,
}

/// The file-system rules of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsRules {
    /// The rules, in a fixed order.
    pub rules: Vec<FsRule>,
    /// Also grant read access to the child's own `/proc/<pid>` (resolved
    /// after fork, so it is the child's and no one else's).
    pub proc_self: bool,
}

/// The run's paths that the rules are made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPaths {
    pub temp_dir: PathBuf,
    pub artifact_dir: PathBuf,
    /// The composed context (read only).
    pub context_dir: PathBuf,
    /// Where the child writes delta.json.
    pub delta_dir: PathBuf,
    /// The project dir (the child's working directory).
    pub project_dir: PathBuf,
    /// The agent program and what it needs to start (its `#!`
    /// interpreter, the program `env` runs, the dynamic loaders), each a
    /// regular file at a canonical path (see [`super::program`]).
    pub programs: Vec<PathBuf>,
}

/// System roots readable and executable by every child.
pub const SYSTEM_READ_EXEC: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
];
/// Device files every child may read and write.
pub const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];
/// Read-only host facts programs commonly look up.
pub const HOST_FACTS: &[&str] = &["/sys/devices/system/cpu"];

fn rule(path: &Path, access: Access, must_exist: bool, reason: &str) -> FsRule {
    FsRule {
        path: path.to_path_buf(),
        access,
        must_exist,
        reason: reason.to_owned(),
        file_only: false,
    }
}

/// The rules for `paths` with `grants`, plus the request's extra roots.
pub fn rules(paths: &RunPaths, grants: &Grants, request: &SandboxRequest) -> FsRules {
    let mut rules = host_rules(grants);
    rules.extend(program_rules(&paths.programs));
    rules.extend(project_rule(&paths.project_dir, grants));
    rules.extend(run_dir_rules(paths));
    rules.extend(extra_rules(request));
    FsRules {
        rules,
        proc_self: false,
    }
}

/// What every run reaches of the host; a path the host lacks is skipped,
/// but /dev/shm must be there.
fn host_rules(grants: &Grants) -> Vec<FsRule> {
    // Without an exec tool the system is readable but only the agent
    // program and what it needs to start may be executed.
    let system = if grants.exec {
        Access::ReadExec
    } else {
        Access::Read
    };
    let mut rules: Vec<FsRule> = SYSTEM_READ_EXEC
        .iter()
        .map(|p| rule(Path::new(p), system, false, "the system"))
        .collect();
    rules.extend(
        DEVICES
            .iter()
            .map(|p| rule(Path::new(p), Access::ReadWrite, false, "standard devices")),
    );
    rules.extend(
        HOST_FACTS
            .iter()
            .map(|p| rule(Path::new(p), Access::Read, false, "host facts (CPU count)")),
    );
    rules.push(rule(
        Path::new("/dev/shm"),
        Access::ReadWrite,
        true,
        "POSIX shared memory (the run's own)",
    ));
    rules.push(rule(
        Path::new("/proc"),
        Access::Read,
        false,
        "process information (environ and mem of processes outside the run stay closed: Landlock scopes ptrace access)",
    ));
    rules
}

fn program_rules(programs: &[PathBuf]) -> impl Iterator<Item = FsRule> + '_ {
    programs.iter().map(|program| FsRule {
        file_only: true,
        ..rule(program, Access::ReadExec, true, "the agent program")
    })
}

fn project_rule(project_dir: &Path, grants: &Grants) -> Option<FsRule> {
    if grants.write_project {
        Some(rule(
            project_dir,
            Access::ReadWrite,
            true,
            "the project (writable)",
        ))
    } else if grants.read_project {
        Some(rule(
            project_dir,
            Access::Read,
            true,
            "the project (read only)",
        ))
    } else {
        None
    }
}

/// The run's own directories.
fn run_dir_rules(paths: &RunPaths) -> [FsRule; 4] {
    [
        rule(
            &paths.context_dir,
            Access::Read,
            true,
            "the composed context",
        ),
        rule(
            &paths.temp_dir,
            Access::ReadWrite,
            true,
            "the run's temp dir",
        ),
        rule(
            &paths.artifact_dir,
            Access::ReadWrite,
            true,
            "the run's artifact dir",
        ),
        rule(
            &paths.delta_dir,
            Access::ReadWrite,
            true,
            "where the delta is written",
        ),
    ]
}

/// The roots the request adds (`sandbox.read_paths`, `sandbox.write_paths`).
fn extra_rules(request: &SandboxRequest) -> impl Iterator<Item = FsRule> + '_ {
    let read = request
        .read_paths
        .iter()
        .map(|p| rule(p, Access::Read, true, "sandbox.read_paths"));
    let write = request
        .write_paths
        .iter()
        .map(|p| rule(p, Access::ReadWrite, true, "sandbox.write_paths"));
    read.chain(write)
}

/// The strongest access `rules` grant on `path` (the union of every rule
/// whose path is `path` or one of its ancestors), for tests and reports.
pub fn access_to(rules: &FsRules, path: &Path) -> Option<Access> {
    rules
        .rules
        .iter()
        .filter(|r| path.starts_with(&r.path))
        .map(|r| r.access)
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::tests::paths;

    fn without_tools(req: &SandboxRequest) -> Grants {
        crate::sandbox::grants(None, req)
    }

    #[test]
    fn the_child_reaches_only_its_own_dirs_and_the_system() {
        let r = rules(
            &paths(),
            &without_tools(&SandboxRequest::default()),
            &SandboxRequest::default(),
        );
        let p = paths();
        assert_eq!(
            access_to(&r, &p.temp_dir.join("x")),
            Some(Access::ReadWrite)
        );
        assert_eq!(access_to(&r, &p.artifact_dir), Some(Access::ReadWrite));
        assert_eq!(
            access_to(&r, &p.project_dir.join("src/a.rs")),
            Some(Access::Read)
        );
        assert_eq!(access_to(&r, &p.context_dir), Some(Access::Read));
        assert_eq!(
            access_to(&r, Path::new("/usr/bin/sh")),
            Some(Access::ReadExec)
        );
        assert_eq!(
            access_to(&r, Path::new("/opt/agent/bin/agent")),
            Some(Access::ReadExec)
        );
        for denied in [
            "/state/sessions/s/runs/r/run.json",
            "/state/sessions/other/runs/q/artifacts",
            "/root/.ssh/id_ed25519",
            "/home/user",
            "/tmp",
            "/tmp/subagentd-0/s/c2",
            "/var/lib",
        ] {
            assert_eq!(access_to(&r, Path::new(denied)), None, "{denied}");
        }
    }

    #[test]
    fn write_project_and_extra_roots_widen_only_what_they_name() {
        let req = SandboxRequest {
            write_project: Some(true),
            read_paths: vec!["/data/ro".into()],
            write_paths: vec!["/data/rw".into()],
            ..Default::default()
        };
        let r = rules(&paths(), &without_tools(&req), &req);
        assert_eq!(
            access_to(&r, Path::new("/work/project/a")),
            Some(Access::ReadWrite)
        );
        assert_eq!(access_to(&r, Path::new("/data/ro/x")), Some(Access::Read));
        assert_eq!(
            access_to(&r, Path::new("/data/rw/x")),
            Some(Access::ReadWrite)
        );
        assert_eq!(access_to(&r, Path::new("/data")), None);
    }

    #[test]
    fn proc_is_readable_but_never_writable() {
        let r = rules(
            &paths(),
            &without_tools(&SandboxRequest::default()),
            &SandboxRequest::default(),
        );
        assert_eq!(
            access_to(&r, Path::new("/proc/1/environ")),
            Some(Access::Read)
        );
    }

    #[test]
    fn run_paths_must_exist_but_system_paths_may_be_missing() {
        let r = rules(
            &paths(),
            &without_tools(&SandboxRequest::default()),
            &SandboxRequest::default(),
        );
        for rule in &r.rules {
            let system = SYSTEM_READ_EXEC
                .iter()
                .chain(DEVICES)
                .chain(HOST_FACTS)
                .chain(&["/proc"])
                .any(|p| rule.path == Path::new(p));
            assert_eq!(rule.must_exist, !system, "{rule:?}");
        }
    }
}
