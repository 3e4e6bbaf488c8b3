//! Rights follow the requester: what a run started for another uid than
//! the daemon's must be allowed to reach, as that uid itself, and which of
//! its binds may show the owner's files as the run's own (idmapped).
//!
//! Pure: the daemon checks each [`Need`] with the requester's credentials
//! (on a thread of its own), and [`limit_idmaps`] turns the idmapped binds
//! of paths the requester does not own into plain read-only ones.
//!
//! Runs and sessions are owned too: [`may_act_on`] decides whether a
//! caller may see and act on one, [`may_join`] which session a run may
//! join.

use crate::sandbox::mounts::{MountPlan, Source};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Who asked for a run: the connection's peer credentials.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requester {
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
    /// Its supplementary groups.
    #[serde(default)]
    pub groups: Vec<u32>,
}

impl Requester {
    /// Whether `gid` is one of the requester's groups.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    /// Whether a path of owner `uid` and group `gid` may be bound as its
    /// owner's for this requester: only its own, with one of its groups.
    pub fn owns(&self, uid: u32, gid: u32) -> bool {
        self.uid == uid && self.in_group(gid)
    }
}

/// One right on a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Right {
    /// Read it (for a directory: list it and enter it).
    Read,
    /// Write it (for a directory: create and remove in it, and enter it).
    Write,
    /// Execute it.
    Exec,
    /// Own it (and its group be one of the requester's): a writable root
    /// is bound idmapped, giving the run the owner's rights over the tree.
    Own,
}

impl Right {
    /// The word in an error.
    pub fn as_str(self) -> &'static str {
        match self {
            Right::Read => "read",
            Right::Write => "write",
            Right::Exec => "execute",
            Right::Own => "own",
        }
    }

    /// The `access(2)` mode bits to ask for (`R_OK` 4, `W_OK` 2, `X_OK` 1):
    /// a directory is also searched. `None` for [`Right::Own`].
    pub fn mode(self, is_dir: bool) -> Option<i32> {
        let search = if is_dir { 1 } else { 0 };
        match self {
            Right::Read => Some(4 | search),
            Right::Write => Some(2 | search),
            Right::Exec => Some(1),
            Right::Own => None,
        }
    }
}

/// A right the requester must hold on a path, and the spawn field that
/// named it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Need {
    /// The field (`session.project_dir`, `sandbox.write_paths[0]`).
    pub field: String,
    /// The path.
    pub path: PathBuf,
    /// The right.
    pub right: Right,
}

/// A run asked for by a uid other than the daemon's: who, and the rights
/// it was found to hold at spawn (checked again before a runner starts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OnBehalf {
    /// Who asked.
    pub requester: Requester,
    /// What it must hold.
    pub needs: Vec<Need>,
}

/// The paths a spawn names, and how the run will use them.
#[derive(Debug, Clone, Default)]
pub struct Requested<'a> {
    /// session.project_dir.
    pub project_dir: Option<&'a Path>,
    /// The run may write the project itself (no worktree).
    pub write_project: bool,
    /// The run works in a worktree the daemon checks out of the project.
    pub worktree: bool,
    /// The repository the worktree is checked out of, when it lies in the
    /// project (`<project>/.git`).
    pub git_dir: Option<&'a Path>,
    /// sandbox.read_paths.
    pub read_paths: &'a [PathBuf],
    /// sandbox.write_paths.
    pub write_paths: &'a [PathBuf],
    /// The request's program, when it names a path (`command[0]`).
    pub program: Option<&'a Path>,
    /// A definition file the daemon read from the project.
    pub definition: Option<&'a Path>,
}

fn need(out: &mut Vec<Need>, field: &str, path: &Path, right: Right) {
    out.push(Need {
        field: field.to_owned(),
        path: path.to_path_buf(),
        right,
    });
}

/// Every right the requester must hold for a spawn, in the order they are
/// checked (the first that fails is reported).
pub fn needs(r: &Requested<'_>) -> Vec<Need> {
    let mut out = Vec::new();
    if let Some(p) = r.project_dir {
        let field = "session.project_dir";
        // The daemon reads it (instructions, git status, definitions)
        // whatever the run may do.
        need(&mut out, field, p, Right::Read);
        if let Some(git) = r.git_dir.filter(|_| r.worktree) {
            // The checkout copies what the repository holds.
            need(&mut out, field, git, Right::Read);
        }
        if r.write_project && !r.worktree {
            need(&mut out, field, p, Right::Write);
            need(&mut out, field, p, Right::Own);
        }
    }
    for (i, p) in r.read_paths.iter().enumerate() {
        need(
            &mut out,
            &format!("sandbox.read_paths[{i}]"),
            p,
            Right::Read,
        );
    }
    for (i, p) in r.write_paths.iter().enumerate() {
        let field = format!("sandbox.write_paths[{i}]");
        need(&mut out, &field, p, Right::Read);
        need(&mut out, &field, p, Right::Write);
        need(&mut out, &field, p, Right::Own);
    }
    if let Some(p) = r.program {
        need(&mut out, "command[0]", p, Right::Exec);
    }
    if let Some(p) = r.definition {
        need(&mut out, "agent", p, Right::Read);
    }
    out
}

/// The request's program as a path to check: `command[0]` when it names
/// one (holds a `/`; a relative one is taken from the project), else
/// `None` (a bare name is looked up in the system's program dirs).
pub fn program_path(command: &[String], project_dir: &Path) -> Option<PathBuf> {
    let first = command.first()?;
    if !first.contains('/') {
        return None;
    }
    let p = Path::new(first);
    Some(if p.is_absolute() {
        p.to_path_buf()
    } else {
        project_dir.join(p)
    })
}

/// Turns the idmapped binds at `roots` (the paths the requester named)
/// whose host owner (from `owners`; unknown counts as not owned) is not
/// the requester into plain read-only binds: the run then meets those files
/// with their real owners, never with the owner's rights. Returns the
/// targets changed.
pub fn limit_idmaps(
    plan: &mut MountPlan,
    roots: &[PathBuf],
    owners: &BTreeMap<PathBuf, (u32, u32)>,
    who: &Requester,
) -> Vec<PathBuf> {
    let mut changed = Vec::new();
    for m in &mut plan.mounts {
        let Source::Host {
            as_owner, writable, ..
        } = &mut m.source
        else {
            continue;
        };
        if !*as_owner || !roots.contains(&m.target) {
            continue;
        }
        let owned = owners
            .get(&m.target)
            .is_some_and(|&(uid, gid)| who.owns(uid, gid));
        if !owned {
            *as_owner = false;
            *writable = false;
            changed.push(m.target.clone());
        }
    }
    changed
}

/// Whose a new run or session is: the requester's uid when another uid
/// asked for it, else the daemon's.
pub fn owner_for(requester: Option<&Requester>, daemon: u32) -> u32 {
    requester.map_or(daemon, |r| r.uid)
}

/// Whose a recorded run or session is: the uid it records, else (made by
/// the daemon's uid or root, or before owners were recorded) the daemon's.
pub fn recorded_owner(recorded: Option<u32>, daemon: u32) -> u32 {
    recorded.unwrap_or(daemon)
}

/// Whether a caller may see and act on a run or session of `owner`: the
/// daemon's uid and root (no requester) on everything, any other uid on
/// its own only.
pub fn may_act_on(requester: Option<&Requester>, owner: u32) -> bool {
    requester.is_none_or(|r| r.uid == owner)
}

/// Whether a run made for the caller may join a session of
/// `session_owner` (`None`: the session is new, and becomes the caller's).
/// Only its owner's runs, whoever asks: a session's context and notices
/// never mix two users' runs.
pub fn may_join(requester: Option<&Requester>, daemon: u32, session_owner: Option<u32>) -> bool {
    session_owner.is_none_or(|o| o == owner_for(requester, daemon))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::mounts::Mount;

    fn who() -> Requester {
        Requester {
            uid: 1001,
            gid: 1001,
            groups: vec![27],
        }
    }

    fn rights_of<'a>(n: &'a [Need], field: &str) -> Vec<(&'a Path, Right)> {
        n.iter()
            .filter(|x| x.field == field)
            .map(|x| (x.path.as_path(), x.right))
            .collect()
    }

    #[test]
    fn a_read_only_project_needs_read_alone() {
        let p = Path::new("/srv/p");
        let n = needs(&Requested {
            project_dir: Some(p),
            ..Default::default()
        });
        assert_eq!(rights_of(&n, "session.project_dir"), [(p, Right::Read)]);
    }

    #[test]
    fn a_writable_project_needs_write_and_ownership() {
        let p = Path::new("/srv/p");
        let n = needs(&Requested {
            project_dir: Some(p),
            write_project: true,
            ..Default::default()
        });
        assert_eq!(
            rights_of(&n, "session.project_dir"),
            [(p, Right::Read), (p, Right::Write), (p, Right::Own)]
        );
    }

    #[test]
    fn a_worktree_needs_the_repository_read_not_the_project_written() {
        let p = Path::new("/srv/p");
        let git = p.join(".git");
        let n = needs(&Requested {
            project_dir: Some(p),
            write_project: true,
            worktree: true,
            git_dir: Some(&git),
            ..Default::default()
        });
        assert_eq!(
            rights_of(&n, "session.project_dir"),
            [(p, Right::Read), (git.as_path(), Right::Read)]
        );
    }

    #[test]
    fn each_path_field_is_named_with_its_index() {
        let (r, w) = (
            vec![PathBuf::from("/a"), PathBuf::from("/b")],
            vec![PathBuf::from("/c")],
        );
        let n = needs(&Requested {
            read_paths: &r,
            write_paths: &w,
            program: Some(Path::new("/opt/tool")),
            definition: Some(Path::new("/srv/p/.subagents/x.md")),
            ..Default::default()
        });
        assert_eq!(
            rights_of(&n, "sandbox.read_paths[1]"),
            [(Path::new("/b"), Right::Read)]
        );
        assert_eq!(
            rights_of(&n, "sandbox.write_paths[0]"),
            [
                (Path::new("/c"), Right::Read),
                (Path::new("/c"), Right::Write),
                (Path::new("/c"), Right::Own)
            ]
        );
        assert_eq!(
            rights_of(&n, "command[0]"),
            [(Path::new("/opt/tool"), Right::Exec)]
        );
        assert_eq!(
            rights_of(&n, "agent"),
            [(Path::new("/srv/p/.subagents/x.md"), Right::Read)]
        );
    }

    #[test]
    fn modes_search_directories() {
        assert_eq!(Right::Read.mode(true), Some(5));
        assert_eq!(Right::Read.mode(false), Some(4));
        assert_eq!(Right::Write.mode(true), Some(3));
        assert_eq!(Right::Exec.mode(false), Some(1));
        assert_eq!(Right::Own.mode(true), None);
    }

    #[test]
    fn only_a_path_is_a_program_to_check() {
        let p = Path::new("/srv/p");
        assert_eq!(program_path(&["python3".into()], p), None);
        assert_eq!(program_path(&[], p), None);
        assert_eq!(
            program_path(&["/opt/t".into()], p),
            Some(PathBuf::from("/opt/t"))
        );
        assert_eq!(
            program_path(&["./run.sh".into()], p),
            Some(PathBuf::from("/srv/p/./run.sh"))
        );
    }

    #[test]
    fn ownership_needs_the_uid_and_one_of_the_groups() {
        let w = who();
        assert!(w.owns(1001, 1001));
        assert!(w.owns(1001, 27));
        assert!(!w.owns(1001, 0), "a group the requester is not in");
        assert!(!w.owns(0, 1001));
    }

    fn host(target: &str, writable: bool, as_owner: bool) -> Mount {
        Mount {
            target: PathBuf::from(target),
            source: Source::Host {
                writable,
                exec: false,
                device: false,
                as_owner,
                must_exist: true,
                keep_link: false,
            },
            reason: String::new(),
        }
    }

    fn source_of(plan: &MountPlan, target: &str) -> (bool, bool) {
        match &plan
            .mounts
            .iter()
            .find(|m| m.target == Path::new(target))
            .unwrap()
            .source
        {
            Source::Host {
                writable, as_owner, ..
            } => (*writable, *as_owner),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_the_requesters_own_roots_stay_idmapped() {
        let mut plan = MountPlan {
            mounts: vec![
                host("/srv/mine", true, true),
                host("/srv/roots", false, true),
                host("/srv/unknown", true, true),
                host("/state/run/context", false, true),
                host("/usr", false, false),
            ],
            ..Default::default()
        };
        let roots: Vec<PathBuf> = ["/srv/mine", "/srv/roots", "/srv/unknown"]
            .into_iter()
            .map(PathBuf::from)
            .collect();
        let owners = BTreeMap::from([
            (PathBuf::from("/srv/mine"), (1001, 27)),
            (PathBuf::from("/srv/roots"), (0, 0)),
        ]);
        let changed = limit_idmaps(&mut plan, &roots, &owners, &who());
        assert_eq!(
            changed,
            [PathBuf::from("/srv/roots"), "/srv/unknown".into()]
        );
        assert_eq!(source_of(&plan, "/srv/mine"), (true, true));
        assert_eq!(source_of(&plan, "/srv/roots"), (false, false));
        assert_eq!(source_of(&plan, "/srv/unknown"), (false, false));
        // The daemon's own places are not the requester's to limit.
        assert_eq!(source_of(&plan, "/state/run/context"), (false, true));
        assert_eq!(source_of(&plan, "/usr"), (false, false));
    }

    #[test]
    fn a_foreign_uid_acts_on_its_own_only() {
        let (daemon, w) = (0, who());
        assert_eq!(owner_for(Some(&w), daemon), 1001);
        assert_eq!(owner_for(None, daemon), daemon);
        assert_eq!(recorded_owner(None, 990), 990, "made before owners");
        assert_eq!(recorded_owner(Some(1001), 990), 1001);
        assert!(may_act_on(Some(&w), 1001));
        assert!(!may_act_on(Some(&w), daemon), "the daemon's run");
        assert!(!may_act_on(Some(&w), 1002), "another user's run");
        // The daemon's uid and root see everything.
        assert!(may_act_on(None, 1001));
        assert!(may_act_on(None, daemon));
    }

    #[test]
    fn a_session_takes_only_its_owners_runs() {
        let (daemon, w) = (990, who());
        assert!(may_join(Some(&w), daemon, None), "a new session");
        assert!(may_join(Some(&w), daemon, Some(1001)));
        assert!(!may_join(Some(&w), daemon, Some(daemon)));
        assert!(!may_join(Some(&w), daemon, Some(1002)));
        assert!(may_join(None, daemon, Some(daemon)));
        assert!(may_join(None, daemon, None));
        // Not even root's runs join another user's session.
        assert!(!may_join(None, daemon, Some(1001)));
    }
}
