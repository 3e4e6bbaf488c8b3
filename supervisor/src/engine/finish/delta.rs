//! At a run's end, the delta a successful child hands back: read as a
//! regular file, judged on disk against its work dir and merged into its
//! session's recent files exactly once. May use the engine's state, the
//! record, the run's data, sessions and policy.

use crate::engine::state::Inner;
use crate::run::delta::DeltaReport;
use crate::run::record::RunRecord;
use policy::workctx::{claims, judge, parse_delta, FileFacts, Outcome, DELTA_MAX_BYTES};
use std::path::{Path, PathBuf};

pub(super) fn facts(claimed: &str, base: &Path) -> FileFacts {
    let p = Path::new(claimed);
    let full = if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    };
    let resolved = full.canonicalize().ok();
    let meta = resolved.as_ref().and_then(|r| std::fs::metadata(r).ok());
    FileFacts {
        claimed: claimed.to_owned(),
        resolved,
        regular: meta.as_ref().is_some_and(|m| m.is_file()),
        mtime_ms: meta
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as u64),
    }
}

/// Why delta.json was not read, named as the child knows it.
fn delta_error(e: &subagent_runner::safefile::SafeFileError) -> String {
    use subagent_runner::safefile::SafeFileError as E;
    match e {
        E::Symlink { .. } => "delta.json is a symbolic link, not a regular file".into(),
        E::NotRegular { kind, .. } => format!("delta.json is {kind}, not a regular file"),
        E::TooLarge { limit, .. } => {
            format!("delta.json is over the limit of {limit} bytes")
        }
        other => other.to_string(),
    }
}

/// Verifies the delta of a run that succeeded and merges what holds into
/// its session's recent files. Blocking.
pub(crate) fn merge_delta(inner: &Inner, rec: &RunRecord) -> DeltaReport {
    let mut report = DeltaReport::default();
    // The child wrote it: a regular file (no link, no FIFO), bounded.
    let path = rec.files().delta();
    let bytes = match subagent_runner::safefile::read(&path, DELTA_MAX_BYTES as u64) {
        Ok(b) => b,
        Err(e) if e.is_missing() => {
            // The runner keeps a delta only when it is a file within bounds.
            let left = rec.end().and_then(|e| e.kept.as_ref()).and_then(|k| {
                k.skipped
                    .iter()
                    .find(|s| s.dir == policy::sandbox::mounts::SCRATCH_DELTA)
            });
            report.note = Some(match left {
                Some(s) => format!("nothing merged: delta.json is {}", s.why),
                None => "no delta was written".into(),
            });
            return report;
        }
        Err(e) => {
            report.note = Some(format!("nothing merged: {}", delta_error(&e)));
            return report;
        }
    };
    let delta = match parse_delta(&bytes) {
        Ok(d) => d,
        Err(why) => {
            report.note = Some(format!("nothing merged: {why}"));
            return report;
        }
    };
    judge_and_merge(inner, rec, claims(&delta))
}

/// Judges each of `claimed` (in merge order) on disk against the run's
/// work dir (inside it, a regular file, changed during the run) and merges
/// those that hold into its session's recent files. Blocking.
pub(crate) fn judge_and_merge(
    inner: &Inner,
    rec: &RunRecord,
    claimed: impl IntoIterator<Item = String>,
) -> DeltaReport {
    let mut report = DeltaReport::default();
    let base = rec
        .worktree
        .as_ref()
        .map_or(rec.project_dir.clone(), |w| w.dir.clone());
    let root = base.canonicalize().unwrap_or(base.clone());
    let since = rec.started_at_ms().unwrap_or(rec.created_at_ms);
    let mut accepted = Vec::new();
    for c in claimed {
        let v = judge(&facts(&c, &base), std::slice::from_ref(&root), since);
        match &v.outcome {
            Outcome::Accepted(p) => {
                accepted.push(p.clone());
                report.accepted.push(v);
            }
            Outcome::Rejected(_) => report.rejected.push(v),
        }
    }
    if let Err(e) = merge_into_recent(inner, rec, &accepted) {
        report.note = Some(format!("merging failed: {e}"));
    }
    report
}

/// Puts `files` at the front of the recent files of `rec`'s session.
/// Blocking.
pub(super) fn merge_into_recent(
    inner: &Inner,
    rec: &RunRecord,
    files: &[PathBuf],
) -> Result<(), crate::store::StoreError> {
    if !files.is_empty() {
        let touch = crate::store::Op::Touch {
            session: rec.session_id.to_string(),
            files: files.to_vec(),
            owner_uid: crate::engine::state::run_owner(rec),
            // The daemon's own write, for a session the run joined.
            requester: None,
        };
        inner.store.commit_blocking(vec![touch])?;
    }
    Ok(())
}
