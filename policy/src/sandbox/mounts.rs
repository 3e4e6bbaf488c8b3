//! The run's own root file system: what exists at all in the child's view
//! (Landlock then decides what it may do there). The runner builds it in
//! the run's mount namespace: a fresh, read-only tmpfs as `/`, the host
//! paths the file rules name bound at the same paths, a new `/proc` for the
//! run's PID namespace, and the run's scratch file system (a size-bounded
//! tmpfs) at its temp, artifact and delta dirs. Everything else of the host
//! (its `/tmp`, `/run`, `/home`, `/root`, the state dir, other runs) is not
//! there, and the daemon's own places inside a bound path are hidden (see
//! [`super::places`]).

use super::fs::{Access, FsRules};
use super::grants::Grants;
use super::places::Places;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Where a mount in the child's root comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Source {
    /// The same path of the host, bound (recursively for a directory).
    Host {
        /// Writable (else read-only).
        writable: bool,
        /// Files may be executed or mapped executable (else `noexec`).
        exec: bool,
        /// Device files work (else `nodev`).
        device: bool,
        /// Files owned by the path's owner appear owned by the run's uid
        /// (an idmapped mount), so a per-run uid reaches them as the
        /// owner would; files it creates belong to that owner on disk.
        as_owner: bool,
        /// A missing host path is an error (else it is left out).
        must_exist: bool,
        /// A symbolic link of the host is copied as the same link (system
        /// roots such as `/bin -> usr/bin`), not followed.
        keep_link: bool,
    },
    /// A directory of the run's scratch file system (created by the runner
    /// owned by the run's user, `noexec`, `nosuid`, `nodev`).
    Scratch {
        /// Its name in the scratch file system.
        dir: String,
    },
    /// A new procfs for the run's PID namespace.
    Proc,
    /// An empty directory of the root itself (the working directory of a
    /// run that may not read the project).
    Empty,
    /// An empty read-only tmpfs over what the host holds there (one of
    /// the daemon's own places inside a bound path): it holds nothing but
    /// the mount points of what is bound beneath it (the run's context,
    /// its worktree). Left out when the host has nothing there.
    Mask,
    /// A symbolic link.
    Symlink {
        /// What it points to.
        to: PathBuf,
    },
}

/// One mount (or link) of the child's root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    /// Where it appears in the child's view.
    pub target: PathBuf,
    /// What it is.
    pub source: Source,
    /// Why the child gets it.
    pub reason: String,
}

/// The child's root file system, in the order the runner mounts it
/// (parents before what lies beneath them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountPlan {
    /// The mounts.
    pub mounts: Vec<Mount>,
    /// Size of the scratch file system in bytes.
    pub scratch_bytes: u64,
    /// The scratch directories, in the order they are made.
    pub scratch_dirs: Vec<String>,
}

/// Directories of programs: `noexec` when the run may not run other
/// programs, so that the dynamic loader cannot map them either (Landlock
/// only governs `execve`). Libraries stay mappable; the agent program and
/// what it needs are bound executable on top.
pub const PROGRAM_DIRS: &[&str] = &[
    "/bin",
    "/sbin",
    "/usr/bin",
    "/usr/sbin",
    "/usr/local/bin",
    "/usr/local/sbin",
    "/usr/libexec",
    "/usr/games",
];

/// The scratch directory of the run's temp dir.
pub const SCRATCH_TEMP: &str = "temp";
/// The scratch directory of the run's artifact dir.
pub const SCRATCH_ARTIFACTS: &str = "artifacts";
/// The scratch directory of the run's delta dir.
pub const SCRATCH_DELTA: &str = "delta";
/// The scratch directory of the run's `/dev/shm`.
pub const SCRATCH_SHM: &str = "shm";

/// Links every `/dev` has.
const DEV_LINKS: &[(&str, &str)] = &[
    ("/dev/fd", "/proc/self/fd"),
    ("/dev/stdin", "/proc/self/fd/0"),
    ("/dev/stdout", "/proc/self/fd/1"),
    ("/dev/stderr", "/proc/self/fd/2"),
];

/// The run's own paths, as the file rules name them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootPaths<'a> {
    /// The temp dir.
    pub temp: &'a Path,
    /// The artifact dir.
    pub artifacts: &'a Path,
    /// The delta dir.
    pub delta: &'a Path,
    /// The run's context dir (reached as its owner, read-only).
    pub context: &'a Path,
    /// The project dir.
    pub project: &'a Path,
    /// The agent program and what it needs to start.
    pub programs: &'a [PathBuf],
    /// The daemon's own places, hidden wherever a bind holds one.
    pub places: &'a Places,
}

fn depth(p: &Path) -> usize {
    p.components().count()
}

fn host(target: &Path, reason: &str, source: Source) -> Mount {
    Mount {
        target: target.to_path_buf(),
        source,
        reason: reason.to_owned(),
    }
}

/// The mount of one file rule's path.
fn rule_mount(r: &super::fs::FsRule, paths: &RootPaths<'_>, grants: &Grants) -> Mount {
    let scratch = [
        (paths.temp, SCRATCH_TEMP),
        (paths.artifacts, SCRATCH_ARTIFACTS),
        (paths.delta, SCRATCH_DELTA),
        (Path::new("/dev/shm"), SCRATCH_SHM),
    ];
    if let Some((_, dir)) = scratch.iter().find(|(p, _)| *p == r.path) {
        let dir = (*dir).to_owned();
        return host(&r.path, &r.reason, Source::Scratch { dir });
    }
    if r.path == Path::new("/proc") {
        return host(&r.path, &r.reason, Source::Proc);
    }
    let is = |list: &[&str]| list.iter().any(|s| r.path == Path::new(s));
    let system = is(super::fs::SYSTEM_READ_EXEC);
    let device = is(super::fs::DEVICES);
    // The owner's files: the project (and a worktree in its place), the
    // context and the extra writable roots; never `/`.
    let as_owner = r.path != Path::new("/")
        && (r.path == paths.project
            || r.path == paths.context
            || (r.access == Access::ReadWrite && !device));
    let source = Source::Host {
        writable: r.access == Access::ReadWrite,
        // Libraries must stay mappable; execve itself is Landlock's.
        exec: (system && (grants.exec || !is(PROGRAM_DIRS))) || r.access == Access::ReadExec,
        device,
        as_owner,
        must_exist: r.must_exist,
        keep_link: system,
    };
    host(&r.path, &r.reason, source)
}

/// A mask over each of the daemon's places that a bind of the host holds,
/// but none inside another mask (the outer one hides it already).
fn masks(mounts: &[Mount], places: &Places) -> Vec<Mount> {
    let mut found = std::collections::BTreeMap::new();
    for m in mounts {
        if matches!(m.source, Source::Host { .. }) {
            found.extend(places.inside(&m.target));
        }
    }
    let targets: Vec<PathBuf> = found.keys().cloned().collect();
    found
        .into_iter()
        .filter(|(t, _)| !targets.iter().any(|o| o != t && t.starts_with(o)))
        .map(|(target, kind)| Mount {
            target,
            source: Source::Mask,
            reason: format!("{}: hidden", kind.as_str()),
        })
        .collect()
}

/// The child's root for file rules `rules`, the run's scratch paths and
/// its rights. Every path a rule names is there, and nothing else of the
/// host: the daemon's places inside a bound path are masked, after the
/// bind that holds them and before what is bound beneath them.
pub fn plan(
    rules: &FsRules,
    paths: &RootPaths<'_>,
    grants: &Grants,
    scratch_bytes: u64,
) -> MountPlan {
    let mut mounts: Vec<Mount> = rules
        .rules
        .iter()
        .map(|r| rule_mount(r, paths, grants))
        .collect();
    if !grants.exec {
        for d in PROGRAM_DIRS {
            if mounts.iter().any(|m| m.target == Path::new(d)) {
                continue;
            }
            let source = Source::Host {
                writable: false,
                exec: false,
                device: false,
                as_owner: false,
                must_exist: false,
                keep_link: true,
            };
            let why = "program directories: nothing here runs without the exec right";
            mounts.push(host(Path::new(d), why, source));
        }
    }
    if !rules.rules.iter().any(|r| r.path == paths.project) {
        let why = "the working directory, empty: the project is not readable";
        mounts.push(host(paths.project, why, Source::Empty));
    }
    for (link, to) in DEV_LINKS {
        let to = PathBuf::from(to);
        mounts.push(host(
            Path::new(link),
            "standard descriptors",
            Source::Symlink { to },
        ));
    }
    let masks = masks(&mounts, paths.places);
    // After a bind of the same path: the mask hides it.
    mounts.extend(masks);
    // Parents first; among equals, the order above.
    mounts.sort_by_key(|m| depth(&m.target));
    // The program files go last: on top of any noexec directory.
    let (programs, mut mounts): (Vec<Mount>, Vec<Mount>) = mounts
        .into_iter()
        .partition(|m| paths.programs.contains(&m.target));
    mounts.extend(programs);
    MountPlan {
        mounts,
        scratch_bytes,
        scratch_dirs: [SCRATCH_TEMP, SCRATCH_ARTIFACTS, SCRATCH_DELTA, SCRATCH_SHM]
            .map(str::to_owned)
            .to_vec(),
    }
}

/// The mount whose target is `path`, for tests and reports.
pub fn mount_at<'a>(plan: &'a MountPlan, path: &Path) -> Option<&'a Mount> {
    plan.mounts.iter().find(|m| m.target == path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::fs::{rules, RunPaths};
    use crate::sandbox::SandboxRequest;

    fn run_paths() -> RunPaths {
        crate::sandbox::tests::paths()
    }

    fn make(grants: Grants, request: &SandboxRequest) -> MountPlan {
        make_with(&run_paths(), grants, request, &Places::default())
    }

    fn make_with(
        p: &RunPaths,
        grants: Grants,
        request: &SandboxRequest,
        places: &Places,
    ) -> MountPlan {
        let r = rules(p, &grants, request);
        plan(
            &r,
            &RootPaths {
                temp: &p.temp_dir,
                artifacts: &p.artifact_dir,
                delta: &p.delta_dir,
                context: &p.context_dir,
                project: &p.project_dir,
                programs: &p.programs,
                places,
            },
            &grants,
            64 << 20,
        )
    }

    /// The test paths' daemon: state dir `/state`, temp base
    /// `/tmp/subagentd-0` (also the socket's dir), leases `/run/subagentd`.
    fn places() -> Places {
        use crate::sandbox::places::{DaemonPlace, PlaceKind};
        let place = |path: &str, kind| DaemonPlace {
            path: path.into(),
            kind,
        };
        Places {
            places: vec![
                place("/state", PlaceKind::StateDir),
                place("/tmp/subagentd-0", PlaceKind::TempBase),
                place("/run/subagentd", PlaceKind::UidLeases),
                place("/tmp/subagentd-0", PlaceKind::SocketDir),
            ],
            resolved: [("/link-to-root".into(), "/".into())].into(),
        }
    }

    fn position(m: &MountPlan, path: &str) -> usize {
        m.mounts
            .iter()
            .rposition(|x| x.target == Path::new(path))
            .unwrap_or_else(|| panic!("no mount at {path}"))
    }

    /// The masked paths, sorted.
    fn masked(m: &MountPlan) -> Vec<&Path> {
        let mut out: Vec<&Path> = m
            .mounts
            .iter()
            .filter(|x| x.source == Source::Mask)
            .map(|x| x.target.as_path())
            .collect();
        out.sort();
        out
    }

    #[test]
    fn nothing_is_masked_when_no_bind_holds_a_daemon_place() {
        let m = make_with(
            &run_paths(),
            reader(),
            &SandboxRequest::default(),
            &places(),
        );
        assert!(masked(&m).is_empty(), "{m:?}");
    }

    #[test]
    fn a_bind_holding_the_state_dir_gets_it_masked_before_the_runs_own_dirs() {
        let p = RunPaths {
            project_dir: "/".into(),
            ..run_paths()
        };
        let req = SandboxRequest {
            read_paths: vec!["/tmp".into(), "/run".into()],
            ..Default::default()
        };
        let m = make_with(&p, reader(), &req, &places());
        assert_eq!(
            masked(&m),
            [
                Path::new("/run/subagentd"),
                Path::new("/state"),
                Path::new("/tmp/subagentd-0")
            ]
        );
        let mask = position(&m, "/state");
        assert!(position(&m, "/") < mask);
        // The run's context (a bind) and its dirs (scratch) beneath the
        // mask come after it, so they stay in view.
        for own in [
            "/state/sessions/s/runs/r/context",
            "/state/sessions/s/runs/r/artifacts",
            "/state/sessions/s/runs/r/delta",
        ] {
            assert!(position(&m, own) > mask, "{own}");
        }
        assert!(position(&m, "/tmp/subagentd-0/s/c1") > position(&m, "/tmp/subagentd-0"));
        assert!(position(&m, "/tmp/subagentd-0") > position(&m, "/tmp"));
        assert_eq!(
            mount_at(&m, Path::new("/state")).unwrap().reason,
            "the daemon's state dir: hidden"
        );
    }

    #[test]
    fn a_worktree_inside_the_state_dir_stays_a_writable_bind_on_top_of_the_mask() {
        let worktree = "/state/sessions/s/worktrees/r";
        let p = RunPaths {
            project_dir: worktree.into(),
            ..run_paths()
        };
        let req = SandboxRequest {
            read_paths: vec!["/link-to-root".into()],
            ..Default::default()
        };
        let grants = Grants {
            write_project: true,
            ..reader()
        };
        let m = make_with(&p, grants, &req, &places());
        // Through the link, at the link's paths.
        assert_eq!(
            masked(&m),
            [
                Path::new("/link-to-root/run/subagentd"),
                Path::new("/link-to-root/state"),
                Path::new("/link-to-root/tmp/subagentd-0")
            ]
        );
        let mut g = make_with(&p, grants, &SandboxRequest::default(), &places());
        assert!(masked(&g).is_empty());
        let root = SandboxRequest {
            read_paths: vec!["/".into()],
            ..Default::default()
        };
        g = make_with(&p, grants, &root, &places());
        assert!(position(&g, worktree) > position(&g, "/state"));
        assert!(matches!(
            mount_at(&g, Path::new(worktree)).unwrap().source,
            Source::Host {
                writable: true,
                as_owner: true,
                ..
            }
        ));
    }

    #[test]
    fn a_bind_of_the_place_itself_is_masked_on_top_and_masks_do_not_nest() {
        let req = SandboxRequest {
            read_paths: vec!["/state".into(), "/tmp".into()],
            ..Default::default()
        };
        let mut with_nested = places();
        with_nested
            .places
            .push(crate::sandbox::places::DaemonPlace {
                path: "/tmp/subagentd-0/inner".into(),
                kind: crate::sandbox::places::PlaceKind::SocketDir,
            });
        let m = make_with(&run_paths(), reader(), &req, &with_nested);
        assert_eq!(
            masked(&m),
            [Path::new("/state"), Path::new("/tmp/subagentd-0")]
        );
        let binds: Vec<usize> = m
            .mounts
            .iter()
            .enumerate()
            .filter(|(_, x)| x.target == Path::new("/state"))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(binds.len(), 2);
        assert_eq!(m.mounts[binds[1]].source, Source::Mask);
    }

    fn reader() -> Grants {
        Grants {
            read_project: true,
            ..Default::default()
        }
    }

    #[test]
    fn the_runs_dirs_come_from_scratch_and_the_rest_of_the_host_is_absent() {
        let m = make(reader(), &SandboxRequest::default());
        let p = run_paths();
        for (path, dir) in [
            (&p.temp_dir, "temp"),
            (&p.artifact_dir, "artifacts"),
            (&p.delta_dir, "delta"),
        ] {
            assert_eq!(
                mount_at(&m, path).map(|x| &x.source),
                Some(&Source::Scratch { dir: dir.into() }),
                "{}",
                path.display()
            );
        }
        assert_eq!(
            mount_at(&m, Path::new("/proc")).unwrap().source,
            Source::Proc
        );
        for absent in ["/tmp", "/root", "/home", "/run", "/state", "/var"] {
            assert!(mount_at(&m, Path::new(absent)).is_none(), "{absent}");
        }
        assert_eq!(m.scratch_bytes, 64 << 20);
    }

    #[test]
    fn without_a_read_right_the_project_is_an_empty_working_dir() {
        let m = make(Grants::default(), &SandboxRequest::default());
        let p = run_paths();
        assert_eq!(mount_at(&m, &p.project_dir).unwrap().source, Source::Empty);
    }

    #[test]
    fn parents_are_mounted_before_what_lies_beneath_them() {
        let m = make(reader(), &SandboxRequest::default());
        for (i, a) in m.mounts.iter().enumerate() {
            for b in &m.mounts[..i] {
                assert!(
                    !b.target.starts_with(&a.target) || b.target == a.target,
                    "{} before its parent {}",
                    b.target.display(),
                    a.target.display()
                );
            }
        }
    }

    #[test]
    fn the_project_and_context_are_reached_as_their_owner_never_the_system() {
        let m = make(reader(), &SandboxRequest::default());
        let p = run_paths();
        let owner = |path: &Path| match &mount_at(&m, path).unwrap().source {
            Source::Host {
                as_owner, writable, ..
            } => (*as_owner, *writable),
            other => panic!("{other:?}"),
        };
        assert_eq!(owner(&p.project_dir), (true, false));
        assert_eq!(owner(&p.context_dir), (true, false));
        assert_eq!(owner(Path::new("/usr")), (false, false));
        assert_eq!(owner(Path::new("/etc")), (false, false));
        assert_eq!(owner(Path::new("/dev/null")), (false, true));
        let w = make(
            Grants {
                write_project: true,
                read_project: true,
                ..Default::default()
            },
            &SandboxRequest::default(),
        );
        match &mount_at(&w, &p.project_dir).unwrap().source {
            Source::Host {
                as_owner,
                writable,
                exec,
                ..
            } => {
                assert!(*as_owner && *writable && !*exec)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn without_the_exec_right_program_dirs_are_noexec_but_the_program_is_not() {
        let m = make(reader(), &SandboxRequest::default());
        let usr_bin = m
            .mounts
            .iter()
            .position(|x| x.target == Path::new("/usr/bin"))
            .unwrap();
        assert!(matches!(
            m.mounts[usr_bin].source,
            Source::Host { exec: false, .. }
        ));
        let program = m
            .mounts
            .iter()
            .position(|x| x.target == Path::new("/opt/agent/bin/agent"))
            .unwrap();
        assert!(matches!(
            m.mounts[program].source,
            Source::Host { exec: true, .. }
        ));
        assert!(
            program > usr_bin,
            "the program is bound after the noexec dirs"
        );
        let with_exec = make(
            Grants {
                exec: true,
                ..reader()
            },
            &SandboxRequest::default(),
        );
        assert!(mount_at(&with_exec, Path::new("/usr/bin")).is_none());
        assert!(matches!(
            mount_at(&with_exec, Path::new("/bin")).unwrap().source,
            Source::Host { exec: true, .. }
        ));
        assert!(matches!(
            mount_at(&m, Path::new("/bin")).unwrap().source,
            Source::Host { exec: false, .. }
        ));
        let bins = m.mounts.iter().filter(|x| x.target == Path::new("/bin"));
        assert_eq!(bins.count(), 1);
    }

    #[test]
    fn writable_roots_are_noexec_and_extra_read_roots_are_not_owned() {
        let req = SandboxRequest {
            read_paths: vec!["/data/ro".into()],
            write_paths: vec!["/data/rw".into(), "/".into()],
            ..Default::default()
        };
        let m = make(reader(), &req);
        match &mount_at(&m, Path::new("/data/ro")).unwrap().source {
            Source::Host {
                as_owner,
                writable,
                exec,
                ..
            } => {
                assert!(!*as_owner && !*writable && !*exec)
            }
            other => panic!("{other:?}"),
        }
        match &mount_at(&m, Path::new("/data/rw")).unwrap().source {
            Source::Host {
                as_owner,
                writable,
                exec,
                ..
            } => {
                assert!(*as_owner && *writable && !*exec)
            }
            other => panic!("{other:?}"),
        }
        match &mount_at(&m, Path::new("/")).unwrap().source {
            Source::Host { as_owner, .. } => assert!(!*as_owner, "never / as its owner"),
            other => panic!("{other:?}"),
        }
        assert_eq!(m.mounts[0].target, Path::new("/"));
    }
}
