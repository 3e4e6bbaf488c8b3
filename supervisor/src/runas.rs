//! `run_as`: the unprivileged user a root daemon runs children as.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// A user and group to run children as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunAs {
    /// The uid.
    pub uid: u32,
    /// The gid.
    pub gid: u32,
}

/// Why `run_as` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RunAsError {
    /// `UID:GID` with a part that is not a number.
    #[error("run_as {spec:?}: {part:?} is not a {what}")]
    NotANumber {
        /// What was given.
        spec: String,
        /// The part that is not a number.
        part: String,
        /// `uid` or `gid`.
        what: &'static str,
    },
    /// No user has this name.
    #[error("run_as: no user named {0:?}")]
    NoUser(String),
    /// The user database could not be read.
    #[error("run_as: looking up {name:?}: {source}")]
    Lookup {
        /// The name.
        name: String,
        /// The underlying error.
        source: nix::errno::Errno,
    },
    /// Only root can switch to another user.
    #[error("run_as needs a daemon running as root")]
    NotRoot,
    /// The user or the group is root.
    #[error("run_as must name an unprivileged user and group, not root")]
    Root,
    /// A directory on the way could not be examined.
    #[error("{}: {source}", path.display())]
    Stat {
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A directory on the way cannot be traversed by the user.
    #[error(
        "{} (mode {mode:o}, owner {owner}) cannot be traversed by the run_as user {}:{}, so its children could not reach their run folders under {}; use a state dir outside it (e.g. /var/lib/subagentd)",
        path.display(), user.uid, user.gid, dir.display()
    )]
    Untraversable {
        /// The directory that cannot be traversed.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// Its owner.
        owner: u32,
        /// The user.
        user: RunAs,
        /// The directory the user must reach.
        dir: PathBuf,
    },
}

/// Parses `USER` (looked up in the user database, with its primary group)
/// or `UID:GID`.
pub fn parse(s: &str) -> Result<RunAs, RunAsError> {
    if let Some((u, g)) = s.split_once(':') {
        let number = |part: &str, what| {
            part.parse().map_err(|_| RunAsError::NotANumber {
                spec: s.to_owned(),
                part: part.to_owned(),
                what,
            })
        };
        let uid = number(u, "uid")?;
        let gid = number(g, "gid")?;
        return Ok(RunAs { uid, gid });
    }
    match nix::unistd::User::from_name(s) {
        Ok(Some(u)) => Ok(RunAs {
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
        }),
        Ok(None) => Err(RunAsError::NoUser(s.to_owned())),
        Err(source) => Err(RunAsError::Lookup {
            name: s.to_owned(),
            source,
        }),
    }
}

/// Checks that `r` can be used by this daemon: it must run as root (to
/// switch users), and `r` must not be root itself.
pub fn check(r: &RunAs) -> Result<(), RunAsError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(RunAsError::NotRoot);
    }
    if r.uid == 0 || r.gid == 0 {
        return Err(RunAsError::Root);
    }
    Ok(())
}

/// Checks that `r` can traverse every directory from `/` down to `dir`
/// (which must exist): a child run as `r` must reach its run's dirs inside.
pub fn check_reachable(dir: &Path, r: &RunAs) -> Result<(), RunAsError> {
    use std::os::unix::fs::MetadataExt;
    for d in dir.ancestors().collect::<Vec<_>>().into_iter().rev() {
        let meta = std::fs::metadata(d).map_err(|source| RunAsError::Stat {
            path: d.to_path_buf(),
            source,
        })?;
        let mode = meta.mode();
        let ok = if meta.uid() == r.uid {
            mode & 0o100 != 0
        } else if meta.gid() == r.gid {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        };
        if !ok {
            return Err(RunAsError::Untraversable {
                path: d.to_path_buf(),
                mode: mode & 0o7777,
                owner: meta.uid(),
                user: *r,
                dir: dir.to_path_buf(),
            });
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
            parse("65534:65533").unwrap(),
            RunAs {
                uid: 65534,
                gid: 65533
            }
        );
        assert_eq!(
            parse("x:1").unwrap_err().to_string(),
            "run_as \"x:1\": \"x\" is not a uid"
        );
        assert_eq!(
            parse("1:y").unwrap_err().to_string(),
            "run_as \"1:y\": \"y\" is not a gid"
        );
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
        let e = check_reachable(&inner, &nobody).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("{} (mode 700, owner ", closed.display())),
            "{e}"
        );
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o711)).unwrap();
        assert!(check_reachable(&inner, &nobody).is_ok());
    }
}
