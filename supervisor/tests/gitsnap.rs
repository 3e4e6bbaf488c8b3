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

#[test]
fn counts_cover_every_kind_of_change() {
    let d = repo();
    let p = d.path();
    for i in 0..6 {
        std::fs::write(p.join(format!("t{i}.txt")), format!("{i}\n")).unwrap();
    }
    std::fs::write(p.join(".gitignore"), "*.log\n").unwrap();
    git(p, &["add", "."]);
    git(p, &["commit", "-qm", "more"]);
    // Staged new; staged and then modified again; staged deletion; deleted
    // in the work tree only; a type change (file to symlink); modified in
    // the work tree; untracked nested; ignored.
    std::fs::write(p.join("new.txt"), "n\n").unwrap();
    git(p, &["add", "new.txt"]);
    std::fs::write(p.join("t0.txt"), "staged\n").unwrap();
    git(p, &["add", "t0.txt"]);
    std::fs::write(p.join("t0.txt"), "and changed again\n").unwrap();
    git(p, &["rm", "-q", "t1.txt"]);
    std::fs::remove_file(p.join("t2.txt")).unwrap();
    std::fs::remove_file(p.join("t3.txt")).unwrap();
    std::os::unix::fs::symlink("a.txt", p.join("t3.txt")).unwrap();
    std::fs::write(p.join("t4.txt"), "modified\n").unwrap();
    std::fs::create_dir_all(p.join("deep/er")).unwrap();
    std::fs::write(p.join("deep/er/u.txt"), "u\n").unwrap();
    std::fs::write(p.join("deep/x.log"), "ignored\n").unwrap();
    let f = fields(snapshot(p, Duration::from_secs(10)));
    assert_eq!(
        (f.5, f.6, f.7),
        (3, 4, 1),
        "staged: new.txt, t0, t1; modified: t0, t2, t3 (now a symlink), t4; untracked: deep/er/u.txt"
    );
    // `git status` agrees.
    let porcelain = git(p, &["status", "--porcelain=v1"]);
    let (mut s, mut m, mut u) = (0, 0, 0);
    for l in porcelain.lines() {
        let b = l.as_bytes();
        if b[0] == b'?' {
            u += 1;
        } else {
            s += usize::from(b[0] != b' ');
            m += usize::from(b[1] != b' ');
        }
    }
    assert_eq!((s, m, u), (3, 4, 1), "{porcelain}");
    // An unborn branch: everything in the index is staged.
    let u = tempfile::tempdir().unwrap();
    git(u.path(), &["init", "-q"]);
    std::fs::write(u.path().join("a"), "a\n").unwrap();
    std::fs::write(u.path().join("b"), "b\n").unwrap();
    git(u.path(), &["add", "a"]);
    let f = fields(snapshot(u.path(), Duration::from_secs(10)));
    assert_eq!((f.5, f.6, f.7), (1, 0, 1));
}
