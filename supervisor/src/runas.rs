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
}
