//! The run folder once the run's end is committed: what only the live run
//! needed goes, so a finished run keeps what people and agents read
//! (child.log and child.log.times, artifacts/, context/, result.md,
//! exit.json, egress.log, gateway.log) and nothing else; and what the folder then takes on
//! disk, for retention's `max_bytes`.

use crate::paths::RunFiles;
use std::path::Path;

/// Removes runner.lock, runner.spec (a Slurm run's spec, for its job),
/// observed-before.json, attempt.json (a live run's
/// attempt, for its status), an empty runner.log and an empty delta/ of a
/// finalized run. Best effort: a crash in between leaves
/// only files nobody reads again, and retention takes the folder whole.
/// Never follows a link (unlink and rmdir act on the entry). Blocking.
pub fn tidy(files: &RunFiles) {
    remove_file(&files.runner_lock());
    remove_file(&files.dir.join(subagent_runner::jobdir::SPEC_FILE));
    remove_file(&files.observed_before());
    remove_file(&files.dir.join("attempt.json"));
    let log = files.runner_log();
    if std::fs::symlink_metadata(&log).is_ok_and(|m| m.is_file() && m.len() == 0) {
        remove_file(&log);
    }
    // rmdir: a delta/ with anything left in it stays, as the child left it.
    let _ = std::fs::remove_dir(files.delta_dir());
}

/// [`tidy`] for a folder retention finds without a size (a run an older
/// release ended, or one whose end a stop cut short): also its runner.json,
/// the 23 KB spec older releases kept there.
pub fn tidy_older(files: &RunFiles) {
    tidy(files);
    remove_file(&files.dir.join("runner.json"));
}

/// The bytes a folder's tree takes on disk; no link is followed, and an
/// entry that cannot be read counts nothing. Blocking.
pub fn dir_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(meta) = d.symlink_metadata() else {
            continue;
        };
        total = total.saturating_add(meta.blocks().saturating_mul(512));
        if !meta.is_dir() {
            continue;
        }
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            stack.push(e.path());
        }
    }
    total
}

/// Unlinks `path`; one that is already gone is fine.
fn remove_file(path: &Path) {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(path = %path.display(), "tidying the run folder: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder() -> (tempfile::TempDir, RunFiles) {
        let d = tempfile::tempdir().unwrap();
        let files = RunFiles {
            dir: d.path().to_path_buf(),
        };
        for f in [
            "runner.lock",
            "runner.json",
            "attempt.json",
            "observed-before.json",
            "child.log",
            "child.log.times",
            "result.md",
        ] {
            std::fs::write(d.path().join(f), b"x").unwrap();
        }
        std::fs::write(files.runner_log(), b"").unwrap();
        std::fs::create_dir(files.delta_dir()).unwrap();
        (d, files)
    }

    fn names(files: &RunFiles) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&files.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn only_what_people_read_is_left() {
        let (_d, files) = folder();
        tidy(&files);
        assert_eq!(
            names(&files),
            ["child.log", "child.log.times", "result.md", "runner.json"]
        );
        tidy_older(&files);
        assert_eq!(names(&files), ["child.log", "child.log.times", "result.md"]);
        tidy_older(&files);
        assert_eq!(
            names(&files),
            ["child.log", "child.log.times", "result.md"],
            "twice is harmless"
        );
    }

    #[test]
    fn a_runner_log_with_words_and_a_delta_with_files_stay() {
        let (_d, files) = folder();
        std::fs::write(files.runner_log(), b"subagent-runner: oops\n").unwrap();
        std::fs::write(files.delta(), b"{}").unwrap();
        tidy_older(&files);
        assert_eq!(
            names(&files),
            [
                "child.log",
                "child.log.times",
                "delta",
                "result.md",
                "runner.log"
            ]
        );
    }

    #[test]
    fn a_link_is_removed_not_followed() {
        let (_d, files) = folder();
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("keep");
        std::fs::create_dir(&target).unwrap();
        std::fs::remove_dir(files.delta_dir()).unwrap();
        std::os::unix::fs::symlink(&target, files.delta_dir()).unwrap();
        std::fs::remove_file(files.runner_log()).unwrap();
        std::os::unix::fs::symlink(outside.path().join("empty"), files.runner_log()).unwrap();
        std::fs::write(outside.path().join("empty"), b"").unwrap();
        tidy(&files);
        assert!(target.is_dir(), "the link's target stays");
        assert!(outside.path().join("empty").exists());
    }

    #[test]
    fn a_folder_is_measured_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        std::fs::create_dir_all(run.join("artifacts")).unwrap();
        std::fs::write(run.join("artifacts/a"), vec![1u8; 64 * 1024]).unwrap();
        let empty = dir_bytes(&run);
        assert!(empty >= 64 * 1024, "{empty}");
        let big = dir.path().join("big");
        std::fs::write(&big, vec![1u8; 1 << 20]).unwrap();
        std::os::unix::fs::symlink(&big, run.join("link")).unwrap();
        std::os::unix::fs::symlink(dir.path(), run.join("up")).unwrap();
        assert!(
            dir_bytes(&run) < empty + 64 * 1024,
            "a link counts only itself"
        );
        assert_eq!(dir_bytes(&dir.path().join("missing")), 0);
    }
}
