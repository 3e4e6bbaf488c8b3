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

/// The counts `git status --porcelain=v2 -uall --no-renames` gives:
/// staged where the index column shows a change, modified where the work
/// tree column does, untracked per `?` line (unmerged entries in neither).
fn git_counts(p: &Path) -> (usize, usize, usize) {
    let out = git(p, &["status", "--porcelain=v2", "-uall", "--no-renames"]);
    let (mut s, mut m, mut u) = (0, 0, 0);
    for l in out.lines() {
        let b = l.as_bytes();
        match b[0] {
            b'?' => u += 1,
            b'1' => {
                s += usize::from(b[2] != b'.');
                m += usize::from(b[3] != b'.');
            }
            b'u' => {}
            _ => panic!("unexpected porcelain line: {l}"),
        }
    }
    (s, m, u)
}

/// The index file's identity and content, to show a snapshot leaves it
/// alone.
fn index_state(p: &Path) -> (u64, i64, i64, Vec<u8>) {
    use std::os::unix::fs::MetadataExt;
    let f = p.join(".git/index");
    let m = std::fs::metadata(&f).unwrap();
    (
        m.ino(),
        m.mtime(),
        m.mtime_nsec(),
        std::fs::read(f).unwrap(),
    )
}

/// The snapshot's counts, checked against `git status` (taken after it:
/// `git status` may rewrite the index) and shown to leave the index as it
/// was.
fn agrees_with_git(p: &Path) -> (usize, usize, usize) {
    let before = index_state(p);
    let f = fields(snapshot(p, Duration::from_secs(10)));
    assert_eq!(index_state(p), before, "the snapshot wrote the index");
    let ours = (f.5, f.6, f.7);
    assert_eq!(ours, git_counts(p), "snapshot vs git status");
    ours
}

fn write(p: &Path, rel: &str, body: &str) {
    let f = p.join(rel);
    std::fs::create_dir_all(f.parent().unwrap()).unwrap();
    std::fs::write(f, body).unwrap();
}

#[test]
fn counts_agree_with_git_status_on_a_varied_tree() {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    git(p, &["init", "-q"]);
    // 1,500 files in 30 directories, a symlink, a file beside a directory
    // whose name sorts between its entries.
    for i in 0..1_500 {
        write(
            p,
            &format!("d{:02}/f{i}.txt", i % 30),
            &format!("file {i}\n"),
        );
    }
    write(p, "a-b", "x\n");
    write(p, "a/c", "x\n");
    write(p, "a0", "x\n");
    write(p, "gone/one", "1\n");
    write(p, "gone/two", "2\n");
    write(p, "tofile/x", "x\n");
    write(p, "tolink/x", "x\n");
    write(p, "todir", "x\n");
    write(p, "tofifo", "x\n");
    write(p, "nested/ignore-me/.gitignore", "*.tmp\n!keep.tmp\n");
    write(p, ".gitignore", "*.log\nbuild/\n");
    symlink("a0", p.join("link")).unwrap();
    git(p, &["add", "."]);
    git(p, &["commit", "-qm", "base"]);
    assert_eq!(agrees_with_git(p), (0, 0, 0), "a fresh commit");
    // Work tree changes of every kind.
    write(p, "d00/f0.txt", "changed size\n");
    write(p, "d01/f1.txt", "FILE 1\n"); // same size, new content
    write(p, "d02/f2.txt", "file 2\n"); // same content rewritten
    std::fs::set_permissions(p.join("d03/f3.txt"), PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::remove_file(p.join("d04/f4.txt")).unwrap();
    std::fs::remove_dir_all(p.join("gone")).unwrap();
    std::fs::remove_dir_all(p.join("tofile")).unwrap();
    write(p, "tofile", "now a file\n");
    std::fs::remove_dir_all(p.join("tolink")).unwrap();
    std::fs::create_dir(p.join("elsewhere")).unwrap();
    write(p, "elsewhere/x", "x\n");
    symlink("elsewhere", p.join("tolink")).unwrap();
    std::fs::remove_file(p.join("todir")).unwrap();
    write(p, "todir/inside", "u\n");
    std::fs::remove_file(p.join("tofifo")).unwrap();
    nix::unistd::mkfifo(
        &p.join("tofifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    std::fs::remove_file(p.join("link")).unwrap();
    symlink("a-b", p.join("link")).unwrap();
    // Untracked: plain, deep, ignored by pattern and by directory, negated,
    // a directory of ignored files only, an empty one, a nested repository
    // and a FIFO.
    write(p, "u.txt", "u\n");
    write(p, "new/deep/er/u.txt", "u\n");
    write(p, "d05/x.log", "ignored\n");
    write(p, "build/out.txt", "ignored\n");
    write(p, "nested/ignore-me/a.tmp", "ignored\n");
    write(p, "nested/ignore-me/keep.tmp", "kept\n");
    write(p, "logs/only.log", "ignored\n");
    std::fs::create_dir_all(p.join("empty/dir")).unwrap();
    git(&p.join("new/deep"), &["init", "-q"]);
    nix::unistd::mkfifo(
        &p.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let (staged, modified, untracked) = agrees_with_git(p);
    assert_eq!(staged, 0);
    assert!(modified >= 10 && untracked >= 3, "{modified} {untracked}");
    // Staged changes, one of them modified again after staging.
    git(p, &["add", "d00/f0.txt", "u.txt"]);
    git(p, &["rm", "-q", "--cached", "a0"]);
    write(p, "d00/f0.txt", "changed again after staging\n");
    let (staged, ..) = agrees_with_git(p);
    assert_eq!(staged, 3);
    // Touched, not changed, after the index was written: settled by content.
    std::fs::write(p.join("d06/f6.txt"), "file 6\n").unwrap();
    agrees_with_git(p);
}

#[test]
fn counts_agree_with_git_status_in_unusual_repositories() {
    // Skip-worktree and assume-unchanged entries, an intent-to-add entry.
    let d = repo();
    let p = d.path();
    write(p, "c.txt", "c\n");
    git(p, &["add", "c.txt"]);
    git(p, &["commit", "-qm", "c"]);
    git(p, &["update-index", "--skip-worktree", "a.txt"]);
    git(p, &["update-index", "--assume-unchanged", "b.txt"]);
    write(p, "a.txt", "changed\n");
    write(p, "b.txt", "changed\n");
    write(p, "c.txt", "changed\n");
    write(p, "ita.txt", "x\n");
    write(p, "ita-empty.txt", "");
    write(p, "ita-gone.txt", "x\n");
    git(
        p,
        &["add", "-N", "ita.txt", "ita-empty.txt", "ita-gone.txt"],
    );
    std::fs::remove_file(p.join("ita-gone.txt")).unwrap();
    assert_eq!(agrees_with_git(p), (0, 4, 0));
    // A merge conflict: the unmerged path counts in neither, the merged
    // one is staged.
    let d = repo();
    let p = d.path();
    git(p, &["checkout", "-qb", "other"]);
    write(p, "a.txt", "theirs\n");
    write(p, "b.txt", "theirs\n");
    git(p, &["commit", "-qam", "theirs"]);
    git(p, &["checkout", "-q", "main"]);
    write(p, "a.txt", "ours\n");
    git(p, &["commit", "-qam", "ours"]);
    let merge = Command::new("git")
        .args(["merge", "-q", "other"])
        .current_dir(p)
        .output()
        .unwrap();
    assert!(!merge.status.success(), "the merge conflicts");
    assert_eq!(agrees_with_git(p), (1, 0, 0));
    // A submodule with new content and a new commit.
    let d = repo();
    let p = d.path();
    let sub = repo();
    git(
        p,
        &[
            "submodule",
            "add",
            "-q",
            sub.path().to_str().unwrap(),
            "sub",
        ],
    );
    git(p, &["commit", "-qm", "add sub"]);
    assert_eq!(agrees_with_git(p), (0, 0, 0));
    write(p, "sub/a.txt", "changed\n");
    write(p, "sub/new.txt", "n\n");
    assert_eq!(agrees_with_git(p), (0, 1, 0));
    git(&p.join("sub"), &["commit", "-qam", "sub change"]);
    assert_eq!(agrees_with_git(p), (0, 1, 0));
    // core.ignorecase, core.filemode=false, core.symlinks=false.
    for (key, value) in [
        ("core.ignorecase", "true"),
        ("core.filemode", "false"),
        ("core.symlinks", "false"),
    ] {
        let d = repo();
        let p = d.path();
        git(p, &["config", key, value]);
        std::fs::set_permissions(
            p.join("a.txt"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        write(p, "b.txt", "changed\n");
        write(p, "New.txt", "n\n");
        let c = agrees_with_git(p);
        assert_eq!(c.2, 1, "{key}={value}: {c:?}");
    }
    // Index versions 2 to 4.
    for version in ["2", "3", "4"] {
        let d = repo();
        let p = d.path();
        git(p, &["update-index", "--index-version", version]);
        write(p, "a.txt", "changed\n");
        write(p, "dir/new.txt", "n\n");
        assert_eq!(agrees_with_git(p), (0, 1, 1), "index v{version}");
    }
}
