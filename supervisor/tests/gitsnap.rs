//! The git snapshot against repositories built here with the git CLI.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use policy::workctx::GitSnapshot;
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use subagentd::gitsnap::snapshot;

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "init.defaultBranch=main",
            "-c",
            "protocol.file.allow=always",
        ])
        .args(args)
        .current_dir(dir)
        .env_remove("GIT_DIR")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn repo() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    git(d.path(), &["init", "-q"]);
    std::fs::write(d.path().join("a.txt"), "a\n").unwrap();
    std::fs::write(d.path().join("b.txt"), "b\n").unwrap();
    git(d.path(), &["add", "."]);
    git(d.path(), &["commit", "-qm", "one"]);
    d
}

/// The snapshot's fields, in declaration order.
type Fields = (
    String,
    String,
    Option<String>,
    Option<usize>,
    Option<usize>,
    usize,
    usize,
    usize,
    std::path::PathBuf,
    std::path::PathBuf,
);

fn fields(s: GitSnapshot) -> Fields {
    match s {
        GitSnapshot::Available {
            worktree,
            common_dir,
            branch,
            head,
            upstream,
            ahead,
            behind,
            staged,
            modified,
            untracked,
        } => (
            branch, head, upstream, ahead, behind, staged, modified, untracked, worktree,
            common_dir,
        ),
        GitSnapshot::Unavailable { reason } => panic!("unavailable: {reason}"),
    }
}

#[test]
fn branch_head_and_counts() {
    let d = repo();
    std::fs::write(d.path().join("a.txt"), "changed\n").unwrap();
    std::fs::write(d.path().join("c.txt"), "new staged\n").unwrap();
    git(d.path(), &["add", "c.txt"]);
    std::fs::write(d.path().join("u1.txt"), "untracked\n").unwrap();
    std::fs::create_dir(d.path().join("dir")).unwrap();
    std::fs::write(d.path().join("dir/u2.txt"), "untracked\n").unwrap();
    let (branch, head, upstream, ahead, behind, staged, modified, untracked, worktree, common) =
        fields(snapshot(d.path(), Duration::from_secs(10)));
    assert_eq!(branch, "main");
    assert_eq!(head, git(d.path(), &["rev-parse", "--short=7", "HEAD"]));
    assert_eq!(
        (upstream, ahead, behind),
        (None, None, None),
        "no upstream, no ahead/behind"
    );
    assert_eq!((staged, modified, untracked), (1, 1, 2));
    assert_eq!(worktree, d.path().canonicalize().unwrap());
    assert_eq!(common, d.path().canonicalize().unwrap().join(".git"));
    // From a subdirectory too.
    assert_eq!(
        fields(snapshot(&d.path().join("dir"), Duration::from_secs(10))).0,
        "main"
    );
}

#[test]
fn detached_head() {
    let d = repo();
    let sha = git(d.path(), &["rev-parse", "HEAD"]);
    git(d.path(), &["checkout", "-q", &sha]);
    let (branch, head, upstream, ..) = fields(snapshot(d.path(), Duration::from_secs(10)));
    assert_eq!(branch, "(detached)");
    assert_eq!(head, sha[..7]);
    assert_eq!(upstream, None);
}

#[test]
fn upstream_with_ahead_and_behind() {
    let origin = repo();
    let clone_parent = tempfile::tempdir().unwrap();
    git(
        clone_parent.path(),
        &["clone", "-q", origin.path().to_str().unwrap(), "c"],
    );
    let c = clone_parent.path().join("c");
    // Two commits ahead locally, one behind after the origin moves on.
    for i in 0..2 {
        std::fs::write(c.join(format!("l{i}")), "x").unwrap();
        git(&c, &["add", "."]);
        git(&c, &["commit", "-qm", "local"]);
    }
    std::fs::write(origin.path().join("o"), "x").unwrap();
    git(origin.path(), &["add", "."]);
    git(origin.path(), &["commit", "-qm", "remote"]);
    git(&c, &["fetch", "-q"]);
    let (branch, _, upstream, ahead, behind, ..) = fields(snapshot(&c, Duration::from_secs(10)));
    assert_eq!(branch, "main");
    assert_eq!(upstream.as_deref(), Some("origin/main"));
    assert_eq!((ahead, behind), (Some(2), Some(1)));
}

#[test]
fn a_linked_worktree_and_a_submodule() {
    let d = repo();
    let wt_parent = tempfile::tempdir().unwrap();
    let wt = wt_parent.path().join("wt");
    git(
        d.path(),
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "feature",
            wt.to_str().unwrap(),
        ],
    );
    let (branch, _, _, _, _, _, _, _, worktree, common) =
        fields(snapshot(&wt, Duration::from_secs(10)));
    assert_eq!(branch, "feature");
    assert_eq!(worktree, wt.canonicalize().unwrap());
    assert_eq!(
        common,
        d.path().canonicalize().unwrap().join(".git"),
        "the common dir is the main repo's"
    );

    let sub = repo();
    git(
        d.path(),
        &[
            "submodule",
            "add",
            "-q",
            sub.path().to_str().unwrap(),
            "sub",
        ],
    );
    git(d.path(), &["commit", "-qm", "add sub"]);
    let (branch, _, _, _, _, staged, modified, untracked, ..) =
        fields(snapshot(d.path(), Duration::from_secs(10)));
    assert_eq!(branch, "main");
    assert_eq!((staged, modified, untracked), (0, 0, 0));
}

#[test]
fn not_a_repository_and_timeouts_are_unavailable_with_the_reason() {
    let d = tempfile::tempdir().unwrap();
    assert_eq!(
        snapshot(d.path(), Duration::from_secs(10)),
        GitSnapshot::Unavailable {
            reason: "not a git repository".into()
        }
    );
    let r = repo();
    assert_eq!(
        snapshot(r.path(), Duration::ZERO),
        GitSnapshot::Unavailable {
            reason: "timed out after 0 s".into()
        }
    );
    assert_eq!(subagentd::gitsnap::BUDGET, Duration::from_secs(2));
    // A broken repository.
    let b = tempfile::tempdir().unwrap();
    std::fs::create_dir(b.path().join(".git")).unwrap();
    std::fs::write(b.path().join(".git/HEAD"), "garbage").unwrap();
    match snapshot(b.path(), Duration::from_secs(10)) {
        GitSnapshot::Unavailable { reason } => assert!(!reason.is_empty()),
        other => panic!("{other:?}"),
    }
}
