//! The run folder once the run's end is committed: what only the live run
//! needed goes, so a finished run keeps what people and agents read
//! (child.log, artifacts/, context/, result.md, exit.json, egress.log,
//! gateway.log) and nothing else.

use crate::paths::RunFiles;
use std::path::Path;

/// Removes runner.lock, observed-before.json, an empty runner.log and an
/// empty delta/ of a finalized run. Best effort: a crash in between leaves
/// only files nobody reads again, and retention takes the folder whole.
/// Never follows a link (unlink and rmdir act on the entry). Blocking.
pub fn tidy(files: &RunFiles) {
    remove_file(&files.runner_lock());
    remove_file(&files.observed_before());
    let log = files.runner_log();
    if std::fs::symlink_metadata(&log).is_ok_and(|m| m.is_file() && m.len() == 0) {
        remove_file(&log);
    }
    // rmdir: a delta/ with anything left in it stays, as the child left it.
    let _ = std::fs::remove_dir(files.delta_dir());
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
            "observed-before.json",
            "child.log",
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
        assert_eq!(names(&files), ["child.log", "result.md"]);
        tidy(&files);
        assert_eq!(
            names(&files),
            ["child.log", "result.md"],
            "twice is harmless"
        );
    }

    #[test]
    fn a_runner_log_with_words_and_a_delta_with_files_stay() {
        let (_d, files) = folder();
        std::fs::write(files.runner_log(), b"subagent-runner: oops\n").unwrap();
        std::fs::write(files.delta(), b"{}").unwrap();
        tidy(&files);
        assert_eq!(
            names(&files),
            ["child.log", "delta", "result.md", "runner.log"]
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
}
