//! File-system rules (applied with Landlock): the system is readable and
//! executable, the run's own temp and artifact dirs are writable, the
//! project is readable (writable only when granted), and nothing else is
//! reachable: not the state dir, not $HOME, not other runs' dirs.

use super::{Grants, SandboxRequest};
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
}

/// The file-system rules of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsRules {
    /// The rules, in a fixed order.
    pub rules: Vec<FsRule>,
    /// Also grant read access to the child's own /proc/<pid> (resolved
    /// after fork, so it is the child's and no one else's).
    pub proc_self: bool,
}

/// The run's paths that the rules are made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPaths {
    /// The child's temp dir.
    pub temp_dir: PathBuf,
    /// The child's artifact dir.
    pub artifact_dir: PathBuf,
    /// The composed context (read only).
    pub context_dir: PathBuf,
    /// Where the child writes delta.json.
    pub delta_dir: PathBuf,
    /// The project dir (the child's working directory).
    pub project_dir: PathBuf,
    /// The agent program, resolved to an absolute path, and the
    /// interpreter its `#!` line names (what it needs to start).
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
    }
}

/// The rules for `paths` with `grants`, plus the request's extra roots.
pub fn rules(paths: &RunPaths, grants: &Grants, request: &SandboxRequest) -> FsRules {
    let mut rules = Vec::new();
    // Without an exec tool the system is readable but only the agent
    // program and what it needs to start may be executed.
    let system = if grants.exec {
        Access::ReadExec
    } else {
        Access::Read
    };
    for p in SYSTEM_READ_EXEC {
        rules.push(rule(Path::new(p), system, false, "the system"));
    }
    for p in DEVICES {
        rules.push(rule(
            Path::new(p),
            Access::ReadWrite,
            false,
            "standard devices",
        ));
    }
    for p in HOST_FACTS {
        rules.push(rule(
            Path::new(p),
            Access::Read,
            false,
            "host facts (CPU count)",
        ));
    }
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
    for program in &paths.programs {
        rules.push(rule(program, Access::ReadExec, true, "the agent program"));
    }
    if grants.write_project {
        rules.push(rule(
            &paths.project_dir,
            Access::ReadWrite,
            true,
            "the project (writable)",
        ));
    } else if grants.read_project {
        rules.push(rule(
            &paths.project_dir,
            Access::Read,
            true,
            "the project (read only)",
        ));
    }
    rules.push(rule(
        &paths.context_dir,
        Access::Read,
        true,
        "the composed context",
    ));
    rules.push(rule(
        &paths.temp_dir,
        Access::ReadWrite,
        true,
        "the run's temp dir",
    ));
    rules.push(rule(
        &paths.artifact_dir,
        Access::ReadWrite,
        true,
        "the run's artifact dir",
    ));
    rules.push(rule(
        &paths.delta_dir,
        Access::ReadWrite,
        true,
        "where the delta is written",
    ));
    for p in &request.read_paths {
        rules.push(rule(p, Access::Read, true, "sandbox.read_paths"));
    }
    for p in &request.write_paths {
        rules.push(rule(p, Access::ReadWrite, true, "sandbox.write_paths"));
    }
    FsRules {
        rules,
        proc_self: false,
    }
}

/// What a `#!` line asks to run: the interpreter path and, when the
/// interpreter is `env`, the program `env` will look up in PATH.
pub fn shebang(head: &[u8]) -> Option<(PathBuf, Option<String>)> {
    let line = head.strip_prefix(b"#!")?;
    let end = line.iter().position(|&b| b == b'\n').unwrap_or(line.len());
    let text = std::str::from_utf8(&line[..end]).ok()?;
    let mut words = text.split_whitespace();
    let interp = PathBuf::from(words.next()?);
    let target = if interp.file_name().is_some_and(|n| n == "env") {
        words.find(|w| !w.starts_with('-')).map(str::to_owned)
    } else {
        None
    };
    Some((interp, target))
}

/// The program interpreter (PT_INTERP, the dynamic loader) an ELF file
/// names, from its first bytes (64-bit little-endian ELF only; the
/// interpreter's path must lie within `head`).
pub fn elf_interpreter(head: &[u8]) -> Option<PathBuf> {
    let u16_at = |o: usize| {
        head.get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
    };
    let u32_at = |o: usize| {
        head.get(o..o + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |o: usize| {
        head.get(o..o + 8)
            .map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as usize)
    };
    // \x7fELF, 64-bit, little-endian.
    if head.get(0..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) {
        return None;
    }
    let (phoff, phentsize, phnum) = (u64_at(0x20)?, u16_at(0x36)?, u16_at(0x38)?);
    for i in 0..phnum.min(64) {
        let ph = phoff.checked_add(i.checked_mul(phentsize)?)?;
        const PT_INTERP: u32 = 3;
        if u32_at(ph)? == PT_INTERP {
            let (off, size) = (u64_at(ph + 8)?, u64_at(ph + 32)?);
            let bytes = head.get(off..off.checked_add(size)?)?;
            let text = std::str::from_utf8(bytes.split(|&b| b == 0).next()?).ok()?;
            return Some(PathBuf::from(text));
        }
    }
    None
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

    fn legacy(req: &SandboxRequest) -> Grants {
        crate::sandbox::grants(None, req)
    }

    #[test]
    fn the_child_reaches_only_its_own_dirs_and_the_system() {
        let r = rules(
            &paths(),
            &legacy(&SandboxRequest::default()),
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
        let r = rules(&paths(), &legacy(&req), &req);
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
    fn elf_interpreter_of_a_real_binary() {
        let head = std::fs::read("/bin/sh").unwrap_or_default();
        let head = &head[..head.len().min(4096)];
        // Every dynamically linked system binary names a loader.
        if let Some(i) = elf_interpreter(head) {
            assert!(i.to_string_lossy().contains("ld-linux"), "{}", i.display());
        }
        assert_eq!(elf_interpreter(b"#!/bin/sh\n"), None);
        assert_eq!(elf_interpreter(&[0x7f, b'E', b'L', b'F', 2, 1, 0, 0]), None);
    }

    #[test]
    fn shebang_lines() {
        assert_eq!(shebang(b"#!/bin/sh\necho"), Some(("/bin/sh".into(), None)));
        assert_eq!(
            shebang(b"#! /usr/bin/env -S python3 -u\n"),
            Some(("/usr/bin/env".into(), Some("python3".into())))
        );
        assert_eq!(shebang(b"\x7fELF"), None);
    }

    #[test]
    fn proc_is_readable_but_never_writable() {
        let r = rules(
            &paths(),
            &legacy(&SandboxRequest::default()),
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
            &legacy(&SandboxRequest::default()),
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
