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

/// The snapshot's target: at most this many times `git status`.
pub const TARGET_RATIO: f64 = 1.5;

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

pub fn bench_git(quick: bool) -> Value {
    let (files, modified, rounds) = if quick {
        (2_000, 100, 3)
    } else {
        (20_000, 1_000, 7)
    };
    let repo = generate_repo(files, modified);
    // Its 20,000 new files written back before anything is timed.
    crate::settle();
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
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for _ in 0..rounds {
        ours.push(snap());
        let t = Instant::now();
        let out = Command::new("git")
            .args(["status", "--porcelain=v2", "--branch"])
            .current_dir(repo.path())
            .output()
            .unwrap();
        theirs.push(t.elapsed());
        assert!(out.status.success());
    }
    let (o, g) = (median(ours), median(theirs));
    crate::retire(repo);
    json!({
        "files": files,
        "modified": modified,
        "rounds": rounds,
        "snapshot_ms": ms(o),
        "git_status_ms": ms(g),
        "ratio": o.as_secs_f64() / g.as_secs_f64(),
        "target_ratio": TARGET_RATIO,
    })
}
