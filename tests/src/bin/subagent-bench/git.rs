//! The spawn-time git snapshot against `git status --porcelain=v2
//! --branch` on the same generated repository (ratio, lower is better).

use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn git(dir: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args([
            "-c",
            "user.name=b",
            "-c",
            "user.email=b@b",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A repository of `files` files in 100 directories, committed, with
/// `modified` of them changed.
fn generate_repo(files: usize, modified: usize) -> tempfile::TempDir {
    let d = tempfile::Builder::new()
        .prefix("sa-bench-git-")
        .tempdir_in("/tmp")
        .unwrap();
    for i in 0..files {
        let dir = d.path().join(format!("d{:03}", i % 100));
        if i < 100 {
            std::fs::create_dir_all(&dir).unwrap();
        }
        std::fs::write(dir.join(format!("f{i}.txt")), format!("file {i}\n")).unwrap();
    }
    git(d.path(), &["init", "-q"]);
    git(d.path(), &["add", "."]);
    git(d.path(), &["commit", "-qm", "generated"]);
    for i in 0..modified {
        let dir = d.path().join(format!("d{:03}", i % 100));
        std::fs::write(dir.join(format!("f{i}.txt")), format!("changed {i}\n")).unwrap();
    }
    d
}

/// Waits (polling, 5 s at most) until every directory of the work tree is
/// older than the listings' clock margin, as directories not changed in
/// the last moments are; returns how many there are.
fn until_keepable(root: &Path) -> usize {
    use subagentd::gitsnap::listing::{keepable, Stamp};
    let mut dirs = vec![root.to_path_buf()];
    let mut i = 0;
    while i < dirs.len() {
        for e in std::fs::read_dir(&dirs[i]).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() && e.file_name() != ".git" {
                dirs.push(e.path());
            }
        }
        i += 1;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let now = std::time::SystemTime::now();
        let stamp = |d: &Path| Stamp::of_metadata(&std::fs::metadata(d).unwrap());
        if dirs.iter().all(|d| keepable(&stamp(d), now)) {
            break;
        }
        std::thread::yield_now();
    }
    dirs.len()
}

pub fn bench_git(quick: bool) -> Value {
    let (files, modified, rounds) = if quick {
        (2_000, 100, 3)
    } else {
        (20_000, 1_000, 7)
    };
    let repo = generate_repo(files, modified);
    // Its 20,000 new files written back before anything is timed.
    crate::settle();
    let listings = subagentd::gitsnap::listing::shared();
    let dirs = until_keepable(repo.path());
    // Warm the page cache and the index once for both.
    subagentd::gitsnap::snapshot(repo.path(), Duration::from_secs(60));
    let snap = || {
        let t = Instant::now();
        let s = subagentd::gitsnap::snapshot(repo.path(), Duration::from_secs(60));
        let took = t.elapsed();
        assert!(
            matches!(s, policy::workctx::GitSnapshot::Available { .. }),
            "{s:?}"
        );
        took
    };
    let mut cold = Vec::new();
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    let mut hits = 0;
    for _ in 0..rounds {
        // The first snapshot of this work tree in a daemon: no listings.
        listings.clear();
        cold.push(snap());
        // The next ones: the listings kept by the one before.
        let before = listings.hits();
        ours.push(snap());
        hits += listings.hits() - before;
        let t = Instant::now();
        let out = Command::new("git")
            .args(["status", "--porcelain=v2", "--branch"])
            .current_dir(repo.path())
            .output()
            .unwrap();
        theirs.push(t.elapsed());
        assert!(out.status.success());
    }
    let (o, c, g) = (median(ours), median(cold), median(theirs));
    crate::retire(repo);
    json!({
        "files": files,
        "modified": modified,
        "rounds": rounds,
        "snapshot_ms": ms(o),
        "snapshot_cold_ms": ms(c),
        "git_status_ms": ms(g),
        "ratio": o.as_secs_f64() / g.as_secs_f64(),
        "ratio_cold": c.as_secs_f64() / g.as_secs_f64(),
        "directories": dirs,
        "listings_reused": hits as f64 / (rounds * dirs) as f64,
        "target_ratio": 1.0,
    })
}
