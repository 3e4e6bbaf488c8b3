//! `run_as`: the unprivileged user a root daemon runs children as.

use serde::{Deserialize, Serialize};

/// A user and group to run children as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunAs {
    /// The uid.
    pub uid: u32,
    /// The gid.
    pub gid: u32,
}

/// Parses `USER` (looked up in the user database, with its primary group)
/// or `UID:GID`.
pub fn parse(s: &str) -> Result<RunAs, String> {
    if let Some((u, g)) = s.split_once(':') {
        let uid = u
            .parse()
            .map_err(|_| format!("run_as {s:?}: {u:?} is not a uid"))?;
        let gid = g
            .parse()
            .map_err(|_| format!("run_as {s:?}: {g:?} is not a gid"))?;
        return Ok(RunAs { uid, gid });
    }
    match nix::unistd::User::from_name(s) {
        Ok(Some(u)) => Ok(RunAs {
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
        }),
        Ok(None) => Err(format!("run_as: no user named {s:?}")),
        Err(e) => Err(format!("run_as: looking up {s:?}: {e}")),
    }
}

/// Checks that `r` can be used by this daemon: it must run as root (to
/// switch users), and `r` must not be root itself.
pub fn check(r: &RunAs) -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("run_as needs a daemon running as root".into());
    }
    if r.uid == 0 || r.gid == 0 {
        return Err("run_as must name an unprivileged user and group, not root".into());
    }
    Ok(())
}

/// Checks that `r` can traverse every directory from `/` down to `dir`
/// (which must exist): a child run as `r` must reach its run's dirs inside.
pub fn check_reachable(dir: &std::path::Path, r: &RunAs) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    for d in dir.ancestors().collect::<Vec<_>>().into_iter().rev() {
        let meta = std::fs::metadata(d).map_err(|e| format!("{}: {e}", d.display()))?;
        let mode = meta.mode();
        let ok = if meta.uid() == r.uid {
            mode & 0o100 != 0
        } else if meta.gid() == r.gid {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        };
        if !ok {
            return Err(format!(
                "{} (mode {:o}, owner {}) cannot be traversed by the run_as user {}:{}, so its children could not reach their run folders under {}; use a state dir outside it (e.g. /var/lib/subagentd)",
                d.display(),
                mode & 0o7777,
                meta.uid(),
                r.uid,
                r.gid,
                dir.display()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_numbers() {
        assert_eq!(
            parse("65534:65533"),
            Ok(RunAs {
                uid: 65534,
                gid: 65533
            })
        );
        assert!(parse("x:1").is_err());
        assert!(parse("no-such-user-xyz").is_err());
        let root = parse("root").unwrap();
        assert_eq!(root, RunAs { uid: 0, gid: 0 });
        assert!(check(&root).is_err());
    }

    #[test]
    fn unreachable_dirs_are_named() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let closed = d.path().join("closed");
        let inner = closed.join("state");
        std::fs::create_dir_all(&inner).unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        let nobody = RunAs {
            uid: 65534,
            gid: 65534,
        };
        let e = check_reachable(&inner, &nobody).unwrap_err();
        assert!(e.starts_with(&closed.display().to_string()), "{e}");
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o711)).unwrap();
        assert!(check_reachable(&inner, &nobody).is_ok());
    }
}
