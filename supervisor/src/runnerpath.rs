//! Where the daemon finds `subagent-runner` when `--runner` is not given:
//! next to its own executable (a clone's `target/`, or `cargo install`'s
//! bin dir), else the first hit on PATH that only root or the daemon's uid
//! could have put there. A root daemon execs the runner for every run, so
//! a PATH entry that another user can write would hand that user root.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The runner's file name.
pub const RUNNER: &str = "subagent-runner";

/// No usable runner was found.
#[derive(Debug, thiserror::Error)]
#[error("no usable {RUNNER}: not next to {} and none on PATH{} (install it with `cargo install --locked --path child-runner`, or give --runner)", exe.display(), refused_list(refused))]
pub struct RunnerNotFound {
    /// The daemon's own executable.
    pub exe: PathBuf,
    /// PATH hits that were refused, with why.
    pub refused: Vec<(PathBuf, String)>,
}

fn refused_list(refused: &[(PathBuf, String)]) -> String {
    refused
        .iter()
        .map(|(p, why)| format!("; refused {}: {why}", p.display()))
        .collect()
}

/// The runner next to `exe`, else the first trusted one on `path_var`.
pub fn locate(exe: &Path, path_var: Option<&std::ffi::OsStr>) -> Result<PathBuf, RunnerNotFound> {
    let mut refused = Vec::new();
    let beside = exe.parent().map(|d| d.join(RUNNER));
    if let Some(b) = beside.filter(|b| is_executable(b)) {
        return Ok(b);
    }
    for dir in path_var.map(std::env::split_paths).into_iter().flatten() {
        // A relative PATH entry means "wherever the daemon was started".
        if !dir.is_absolute() {
            continue;
        }
        let candidate = dir.join(RUNNER);
        if !is_executable(&candidate) {
            continue;
        }
        match trusted(&candidate, nix::unistd::geteuid().as_raw()) {
            Ok(real) => return Ok(real),
            Err(why) => refused.push((candidate, why)),
        }
    }
    Err(RunnerNotFound {
        exe: exe.to_path_buf(),
        refused,
    })
}

/// The runner for this process: [`locate`] with its own executable and PATH.
pub fn locate_for_self() -> Result<PathBuf, RunnerNotFound> {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("subagentd"));
    locate(&exe, std::env::var_os("PATH").as_deref())
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `file`'s real path when it and every directory above it belong to root
/// or `uid` and no one else can write them (a sticky directory aside);
/// else why not.
pub fn trusted(file: &Path, uid: u32) -> Result<PathBuf, String> {
    let real = file
        .canonicalize()
        .map_err(|e| format!("cannot resolve it: {e}"))?;
    for p in real.ancestors() {
        let m = std::fs::symlink_metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
        if m.uid() != 0 && m.uid() != uid {
            return Err(format!("{} belongs to uid {}", p.display(), m.uid()));
        }
        // In a sticky directory no one else can replace what root or we own.
        let sticky = m.is_dir() && m.mode() & 0o1000 != 0;
        if m.mode() & 0o022 != 0 && !sticky {
            return Err(format!("{} is writable by others", p.display()));
        }
    }
    Ok(real)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn runner_in(dir: &Path, mode: u32) -> PathBuf {
        let p = dir.join(RUNNER);
        std::fs::write(&p, b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    fn private_dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    #[test]
    fn the_runner_beside_the_daemon_wins_over_path() {
        let here = private_dir();
        let there = private_dir();
        let beside = runner_in(here.path(), 0o755);
        runner_in(there.path(), 0o755);
        let path = OsString::from(there.path());
        let got = locate(&here.path().join("subagentd"), Some(&path)).unwrap();
        assert_eq!(got, beside);
    }

    #[test]
    fn a_trusted_path_hit_is_taken_and_a_non_executable_one_skipped() {
        let exe_dir = private_dir();
        let plain = private_dir();
        let good = private_dir();
        runner_in(plain.path(), 0o644);
        runner_in(good.path(), 0o755);
        let path =
            std::env::join_paths([plain.path(), Path::new("relative"), good.path()]).unwrap();
        let got = locate(&exe_dir.path().join("subagentd"), Some(&path)).unwrap();
        assert_eq!(got, good.path().canonicalize().unwrap().join(RUNNER));
    }

    #[test]
    fn a_path_dir_others_can_write_is_refused_and_named() {
        let exe_dir = private_dir();
        let open = tempfile::tempdir().unwrap();
        std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        runner_in(open.path(), 0o755);
        let path = OsString::from(open.path());
        let err = locate(&exe_dir.path().join("subagentd"), Some(&path)).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("writable by others"), "{text}");
        assert!(text.contains(&open.path().display().to_string()), "{text}");
        assert!(text.contains("--runner"), "{text}");
    }

    #[test]
    fn a_runner_others_can_write_is_refused() {
        let d = private_dir();
        let p = runner_in(d.path(), 0o757);
        let why = trusted(&p, nix::unistd::geteuid().as_raw()).unwrap_err();
        assert!(why.contains("writable by others"), "{why}");
    }

    #[test]
    fn a_file_of_another_uid_is_refused() {
        let d = private_dir();
        let p = runner_in(d.path(), 0o755);
        let me = nix::unistd::geteuid().as_raw();
        let daemon = if me == 0 {
            // Root owns what it makes: give the file away to see it refused.
            std::os::unix::fs::chown(&p, Some(4242), None).unwrap();
            0
        } else {
            me.wrapping_add(1)
        };
        let why = trusted(&p, daemon).unwrap_err();
        assert!(why.contains("belongs to uid"), "{why}");
    }
}
