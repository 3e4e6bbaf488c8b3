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

/// The scan's counts, checked against libgit2's status.
fn scan_agrees(p: &Path) -> subagentd::gitsnap::counts::Counts {
    use subagentd::gitsnap::counts::{by_libgit2, by_scan};
    let r = git2::Repository::open(p).unwrap();
    let fast = by_scan(&r).unwrap_or_else(|why| panic!("the scan refused: {why}"));
    let slow = by_libgit2(&r).unwrap();
    assert_eq!(fast, slow, "scan vs libgit2 status");
    fast
}

fn write(p: &Path, rel: &str, body: &str) {
    let f = p.join(rel);
    std::fs::create_dir_all(f.parent().unwrap()).unwrap();
    std::fs::write(f, body).unwrap();
}

#[test]
fn the_threaded_scan_counts_as_libgit2_does() {
    use std::os::unix::fs::{symlink, PermissionsExt};
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    git(p, &["init", "-q"]);
    // 1,500 files in 30 directories (threads from 1,000), a symlink, a
    // file beside a directory whose name sorts between its entries.
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
    let clean = scan_agrees(p);
    assert_eq!(
        (clean.staged, clean.modified, clean.untracked),
        (0, 0, 0),
        "a fresh commit, answered by the cached tree"
    );
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
    let c = scan_agrees(p);
    assert_eq!(c.staged, 0);
    assert!(c.modified >= 10 && c.untracked >= 3, "{c:?}");
    // Staged changes invalidate the cached tree: libgit2 diffs HEAD.
    git(p, &["add", "d00/f0.txt", "u.txt"]);
    git(p, &["rm", "-q", "--cached", "a0"]);
    let c = scan_agrees(p);
    assert_eq!(c.staged, 3, "{c:?}");
    // Touched, not changed, after the index was written: settled by content.
    std::fs::write(p.join("d06/f6.txt"), "file 6\n").unwrap();
    scan_agrees(p);
}

#[test]
fn the_scan_falls_back_to_libgit2_where_it_does_not_model_the_repository() {
    use subagentd::gitsnap::counts::{counts, Method};
    let d = repo();
    git(d.path(), &["update-index", "--skip-worktree", "a.txt"]);
    let r = git2::Repository::open(d.path()).unwrap();
    let (_, m) = counts(&r).unwrap();
    assert!(
        matches!(m, Method::Libgit2(ref w) if w.contains("skip-worktree")),
        "{m:?}"
    );
    let d = repo();
    git(d.path(), &["config", "core.ignorecase", "true"]);
    let r = git2::Repository::open(d.path()).unwrap();
    assert!(matches!(counts(&r).unwrap().1, Method::Libgit2(ref w) if w.contains("ignorecase")));
    let d = repo();
    let r = git2::Repository::open(d.path()).unwrap();
    assert_eq!(counts(&r).unwrap().1, Method::Scan);
}

#[test]
fn the_index_reader_agrees_with_libgit2_in_every_version() {
    use subagentd::gitsnap::index::{parse, IndexError};
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    git(p, &["init", "-q"]);
    // Paths of every length class around the 8-byte padding, a long one
    // and shared prefixes for v4.
    // (A path of 0xfff bytes or more, whose length field saturates, is
    // longer than PATH_MAX from here: index.rs's unit test builds one.)
    let long = (0..4)
        .map(|i| format!("{i}{}", "x".repeat(200)))
        .collect::<Vec<_>>()
        .join("/");
    for i in 0..40 {
        write(
            p,
            &format!("dir{}/{}", i % 3, "n".repeat(i + 1)),
            &format!("{i}\n"),
        );
    }
    write(p, &long, "long\n");
    std::os::unix::fs::symlink("dir0", p.join("link")).unwrap();
    write(p, "exec.sh", "#!/bin/sh\n");
    std::fs::set_permissions(
        p.join("exec.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    git(p, &["add", "."]);
    git(p, &["commit", "-qm", "one"]);
    let head_tree = git(p, &["rev-parse", "HEAD^{tree}"]);
    // Version 3 differs from 2 only in entries with extended flags (git
    // writes 2 when there are none); the intent-to-add entry at the end
    // gives one.
    for version in ["2", "4"] {
        git(p, &["update-index", "--index-version", version]);
        let buf = std::fs::read(p.join(".git/index")).unwrap();
        assert_eq!(&buf[4..8], &[0, 0, 0, version.parse::<u8>().unwrap()]);
        let ours = parse(&buf).unwrap();
        let theirs = git2::Index::open(&p.join(".git/index")).unwrap();
        assert_eq!(ours.entries.len(), theirs.len(), "v{version}");
        for (o, t) in ours.entries.iter().zip(theirs.iter()) {
            assert_eq!(o.path, t.path, "v{version}");
            assert_eq!(
                (o.mode, o.size, o.ino, o.uid, o.gid, o.mtime, o.ctime),
                (
                    t.mode,
                    t.file_size,
                    t.ino,
                    t.uid,
                    t.gid,
                    (t.mtime.seconds(), t.mtime.nanoseconds()),
                    (t.ctime.seconds(), t.ctime.nanoseconds())
                ),
                "v{version} {}",
                String::from_utf8_lossy(&o.path)
            );
        }
        assert!(ours.entries.iter().any(|e| e.path == long.as_bytes()));
        // `git status` may rewrite the index; the cached root is HEAD's tree
        // whenever it is there.
        let root = ours
            .root_tree
            .map(|t| git2::Oid::from_bytes(&t).unwrap().to_string());
        assert_eq!(root.as_deref(), Some(head_tree.as_str()), "v{version}");
    }
    // Staging a change invalidates the cached root.
    write(p, "dir0/n", "changed\n");
    git(p, &["add", "dir0/n"]);
    let buf = std::fs::read(p.join(".git/index")).unwrap();
    assert_eq!(parse(&buf).unwrap().root_tree, None);
    // A flipped byte fails the checksum; a truncated file is malformed.
    let mut bad = buf.clone();
    bad[20] ^= 1;
    assert_eq!(parse(&bad).unwrap_err(), IndexError::Checksum);
    assert!(matches!(
        parse(&buf[..10]).unwrap_err(),
        IndexError::Malformed { .. }
    ));
    // Intent-to-add (an extended flag, version 3) is refused.
    write(p, "ita", "x\n");
    git(p, &["add", "-N", "ita"]);
    git(p, &["update-index", "--index-version", "3"]);
    let buf = std::fs::read(p.join(".git/index")).unwrap();
    assert_eq!(&buf[4..8], &[0, 0, 0, 3]);
    assert_eq!(
        parse(&buf).unwrap_err(),
        IndexError::Unsupported("assume-unchanged, skip-worktree or intent-to-add entries")
    );
}

/// Waits, polling, until every directory of the work tree is old enough
/// for its listing to be kept (the clock-grain margin).
fn until_listings_keepable(p: &Path) {
    use subagentd::gitsnap::listing::{keepable, Stamp};
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let dirs: Vec<_> = walkdir(p);
    loop {
        let now = std::time::SystemTime::now();
        let ready = dirs
            .iter()
            .all(|d| keepable(&Stamp::of_metadata(&std::fs::metadata(d).unwrap()), now));
        if ready {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the directories never got older than the margin"
        );
        std::thread::yield_now();
    }
}

/// Every directory under `p` but `.git`'s, `p` included.
fn walkdir(p: &Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![p.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        for e in std::fs::read_dir(&out[i]).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() && e.file_name() != ".git" {
                out.push(e.path());
            }
        }
        i += 1;
    }
    out
}

#[test]
fn listings_kept_between_scans_give_the_same_counts_and_miss_on_any_change() {
    use std::os::unix::fs::PermissionsExt;
    use subagentd::gitsnap::counts::{by_libgit2, by_scan_with};
    use subagentd::gitsnap::listing::{local_clock, Listings};
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    if !local_clock(std::fs::File::open(p).unwrap()) {
        subagent_runner::testsupport::skip(
            "local-clock-fs",
            "the temp dir's file system is not stamped by this kernel's clock; listings are never kept there",
        );
        return;
    }
    git(p, &["init", "-q"]);
    for i in 0..60 {
        write(p, &format!("d{}/f{i}.txt", i % 6), &format!("file {i}\n"));
    }
    write(p, "d0/sub/x", "x\n");
    write(p, "tofile/x", "x\n");
    write(p, ".gitignore", "*.log\n");
    git(p, &["add", "."]);
    git(p, &["commit", "-qm", "base"]);
    until_listings_keepable(p);
    let r = git2::Repository::open(p).unwrap();
    let l = Listings::new();
    let agrees = |what: &str| {
        let fast = by_scan_with(&r, Some(&l)).unwrap();
        assert_eq!(fast, by_libgit2(&r).unwrap(), "{what}");
        fast
    };
    let dirs = walkdir(p).len() as u64;
    agrees("cold");
    assert_eq!((l.kept(), l.hits()), (dirs, 0), "every directory kept");
    agrees("warm");
    assert_eq!(l.hits(), dirs, "every directory answered by the cache");

    // Changes that leave the directories' names alone: still hits, and
    // the scan still sees them (each tracked file is stat'ed).
    write(p, "d1/f1.txt", "changed size\n");
    std::fs::set_permissions(p.join("d2/f2.txt"), PermissionsExt::from_mode(0o755)).unwrap();
    let hits = l.hits();
    let c = agrees("contents changed");
    assert_eq!(c.modified, 2, "{c:?}");
    assert_eq!(l.hits() - hits, dirs);

    // Changes to names: each changed directory misses.
    write(p, "d3/new.txt", "untracked\n");
    write(p, "d3/x.log", "ignored\n");
    std::fs::remove_file(p.join("d4/f4.txt")).unwrap();
    std::fs::remove_dir_all(p.join("tofile")).unwrap();
    write(p, "tofile", "now a file\n");
    write(p, "d0/sub/deeper/u", "untracked\n");
    let hits = l.hits();
    let c = agrees("names changed");
    assert_eq!((c.modified, c.untracked), (4, 3), "{c:?}");
    // Missed: d3, d4, the root (tofile), d0/sub; the rest hit
    // (d0/sub/deeper is untracked: never read by the scan).
    assert_eq!(
        l.hits() - hits,
        dirs - 1 - 4,
        "hits after the names changed"
    );

    // A name added and the directory's mtime set back: its ctime still
    // moved, so the listing is not reused.
    until_listings_keepable(p);
    agrees("settled");
    let d5 = p.join("d5");
    let before = nix::sys::stat::stat(&d5).unwrap();
    write(p, "d5/sneaky.txt", "untracked\n");
    nix::sys::stat::utimensat(
        nix::fcntl::AT_FDCWD,
        &d5,
        &nix::sys::time::TimeSpec::new(before.st_atime, before.st_atime_nsec),
        &nix::sys::time::TimeSpec::new(before.st_mtime, before.st_mtime_nsec),
        nix::sys::stat::UtimensatFlags::NoFollowSymlink,
    )
    .unwrap();
    let after = nix::sys::stat::stat(&d5).unwrap();
    assert_eq!(
        (after.st_mtime, after.st_mtime_nsec),
        (before.st_mtime, before.st_mtime_nsec)
    );
    let c = agrees("mtime set back");
    assert_eq!(c.untracked, 4, "the sneaky file is seen: {c:?}");
}

#[test]
fn no_listing_is_kept_under_a_mount_point_inside_the_work_tree() {
    use subagentd::gitsnap::counts::{by_libgit2, by_scan_with};
    use subagentd::gitsnap::listing::{local_clock, Listings};
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    if !local_clock(std::fs::File::open(p).unwrap()) {
        subagent_runner::testsupport::skip(
            "local-clock-fs",
            "the temp dir's file system is not stamped by this kernel's clock",
        );
        return;
    }
    std::fs::create_dir(p.join("mnt")).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(p.join("mnt"))
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        subagent_runner::testsupport::skip("mount", "mounting a tmpfs needs CAP_SYS_ADMIN");
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(p.join("mnt"));
    git(p, &["init", "-q"]);
    write(p, "top.txt", "t\n");
    write(p, "mnt/in.txt", "i\n");
    write(p, "mnt/deeper/x.txt", "x\n");
    git(p, &["add", "."]);
    git(p, &["commit", "-qm", "base"]);
    until_listings_keepable(p);
    let r = git2::Repository::open(p).unwrap();
    let l = Listings::new();
    assert_eq!(by_scan_with(&r, Some(&l)).unwrap(), by_libgit2(&r).unwrap());
    // The root is kept; mnt and mnt/deeper are on the tmpfs: not kept.
    assert_eq!(l.kept(), 1);
}
