//! The daemon's own places: its state dir (every session's records, every
//! live run's runner spec), the base of its runs' temp dirs, the uid leases and
//! the control socket's dir. None of them is ever in a child's view, even
//! when a path the child is given holds one: the mount plan hides each
//! under an empty read-only tmpfs ([`Places::inside`]), and a writable
//! path that holds one, or lies in one, is refused
//! ([`Places::check_writable`]): a child that may rename the place's
//! parent could move the daemon's place away and put one of its own there.
//!
//! The places come from the daemon's configuration, resolved on the host
//! by the daemon; nothing here reads the file system.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Which of the daemon's places.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlaceKind {
    /// The state dir.
    StateDir,
    /// The base of the runs' temp dirs (`/tmp/subagentd-<uid>`).
    TempBase,
    /// Where per-run uids are leased (`/run/subagentd`).
    UidLeases,
    /// The directory of the control socket.
    SocketDir,
}

impl PlaceKind {
    /// How an error or a reason names it.
    pub fn as_str(self) -> &'static str {
        match self {
            PlaceKind::StateDir => "the daemon's state dir",
            PlaceKind::TempBase => "the base of the daemon's temp dirs",
            PlaceKind::UidLeases => "the daemon's uid leases",
            PlaceKind::SocketDir => "the control socket's dir",
        }
    }

    /// Everything beneath it is the daemon's, so a writable path inside
    /// it reaches the daemon's files (a socket's dir may be shared, such
    /// as `/tmp`: only the socket itself is the daemon's).
    fn owns_beneath(self) -> bool {
        self != PlaceKind::SocketDir
    }
}

/// One of the daemon's places.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonPlace {
    /// Where it is, as the host resolves it (absolute, no symbolic link).
    pub path: PathBuf,
    /// Which place it is.
    pub kind: PlaceKind,
}

/// The daemon's places, and how the host resolves the paths a child is
/// given (so that a path given through a symbolic link is compared as
/// what it is).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Places {
    /// The places.
    pub places: Vec<DaemonPlace>,
    /// A path as given → as the host resolves it; a path missing here is
    /// taken as it is.
    pub resolved: BTreeMap<PathBuf, PathBuf>,
}

/// A writable path that would reach one of the daemon's places.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaceError {
    /// It holds the place (or is it).
    #[error("{} holds {} {}: a writable path must not hold it (grant a directory beside it, or read access only)", root.display(), kind.as_str(), place.display())]
    Holds {
        /// The writable path, as given.
        root: PathBuf,
        /// The place.
        place: PathBuf,
        /// Which place.
        kind: PlaceKind,
    },
    /// It lies inside the place.
    #[error("{} lies inside {} {}: a writable path must not", root.display(), kind.as_str(), place.display())]
    Inside {
        /// The writable path, as given.
        root: PathBuf,
        /// The place.
        place: PathBuf,
        /// Which place.
        kind: PlaceKind,
    },
}

impl Places {
    fn resolve<'a>(&'a self, path: &'a Path) -> &'a Path {
        self.resolved.get(path).map_or(path, PathBuf::as_path)
    }

    /// The daemon's places in a bind of the host's `target` (itself
    /// included), at the paths the child would see them, with what they
    /// are. `/` is never one (here or in [`Places::check_writable`]): a
    /// place there would hide the whole root, and hold every path.
    pub fn inside(&self, target: &Path) -> Vec<(PathBuf, PlaceKind)> {
        let host = self.resolve(target);
        self.places
            .iter()
            .filter(|p| p.path != Path::new("/"))
            .filter_map(|p| {
                let rest = p.path.strip_prefix(host).ok()?;
                Some((target.join(rest), p.kind))
            })
            .collect()
    }

    /// Refuses the writable `root` when it holds one of the daemon's
    /// places, or lies inside one that is the daemon's throughout. (A
    /// run's own worktree lies in the state dir: the daemon makes it, and
    /// does not ask.)
    pub fn check_writable(&self, root: &Path) -> Result<(), PlaceError> {
        let host = self.resolve(root);
        for p in self.places.iter().filter(|p| p.path != Path::new("/")) {
            let err = |inside: bool| {
                let (root, place, kind) = (root.to_path_buf(), p.path.clone(), p.kind);
                Err(if inside {
                    PlaceError::Inside { root, place, kind }
                } else {
                    PlaceError::Holds { root, place, kind }
                })
            };
            if p.path.starts_with(host) {
                return err(false);
            }
            if host.starts_with(&p.path) && p.kind.owns_beneath() {
                return err(true);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn places() -> Places {
        let place = |path: &str, kind| DaemonPlace {
            path: path.into(),
            kind,
        };
        Places {
            places: vec![
                place("/root/.local/state/subagentd", PlaceKind::StateDir),
                place("/tmp/subagentd-0", PlaceKind::TempBase),
                place("/run/subagentd", PlaceKind::UidLeases),
                place("/tmp/subagentd-0", PlaceKind::SocketDir),
            ],
            resolved: [("/home/link".into(), "/root".into())].into(),
        }
    }

    #[test]
    fn a_bind_holding_a_place_shows_it_at_the_childs_path() {
        let p = places();
        assert_eq!(
            p.inside(Path::new("/root")),
            [(
                PathBuf::from("/root/.local/state/subagentd"),
                PlaceKind::StateDir
            )]
        );
        // Given through a link: at the link's path, as the child sees it.
        assert_eq!(
            p.inside(Path::new("/home/link"))[0].0,
            Path::new("/home/link/.local/state/subagentd")
        );
        assert_eq!(p.inside(Path::new("/tmp")).len(), 2);
        assert_eq!(p.inside(Path::new("/")).len(), 4);
        assert_eq!(p.inside(Path::new("/tmp/subagentd-0")).len(), 2);
        for none in [
            "/tmp/project",
            "/usr",
            "/root/.local/state/subagentd/x",
            "/ro",
        ] {
            assert!(p.inside(Path::new(none)).is_empty(), "{none}");
        }
    }

    #[test]
    fn a_place_at_the_root_hides_and_holds_nothing() {
        let p = Places {
            places: vec![DaemonPlace {
                path: "/".into(),
                kind: PlaceKind::UidLeases,
            }],
            resolved: BTreeMap::new(),
        };
        assert!(p.inside(Path::new("/")).is_empty());
        assert_eq!(p.check_writable(Path::new("/tmp/project")), Ok(()));
    }

    #[test]
    fn writable_paths_holding_or_inside_a_place_are_refused() {
        let p = places();
        let holds = |r: &str| {
            matches!(
                p.check_writable(Path::new(r)),
                Err(PlaceError::Holds { .. })
            )
        };
        let inside = |r: &str| {
            matches!(
                p.check_writable(Path::new(r)),
                Err(PlaceError::Inside { .. })
            )
        };
        for r in [
            "/",
            "/root",
            "/home/link",
            "/tmp",
            "/run",
            "/tmp/subagentd-0",
        ] {
            assert!(holds(r), "{r}");
        }
        assert!(inside("/root/.local/state/subagentd/sessions/s/runs/r"));
        assert!(inside(
            "/root/.local/state/subagentd/sessions/s/worktrees/r"
        ));
        assert!(inside("/tmp/subagentd-0/s/c1"));
        for ok in [
            "/work/project",
            "/root-other",
            "/tmp/sa-proj",
            "/run/user/0",
        ] {
            assert_eq!(p.check_writable(Path::new(ok)), Ok(()), "{ok}");
        }
    }

    #[test]
    fn inside_a_shared_socket_dir_is_writable() {
        let p = Places {
            places: vec![DaemonPlace {
                path: "/tmp".into(),
                kind: PlaceKind::SocketDir,
            }],
            resolved: BTreeMap::new(),
        };
        assert_eq!(p.check_writable(Path::new("/tmp/project")), Ok(()));
        assert!(p.check_writable(Path::new("/tmp")).is_err());
        let message = p.check_writable(Path::new("/")).unwrap_err();
        assert_eq!(
            message.to_string(),
            "/ holds the control socket's dir /tmp: a writable path must not hold it (grant a directory beside it, or read access only)"
        );
    }
}
