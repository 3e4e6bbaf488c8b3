//! At a run's end, what the supervisor saw it change in its project
//! (against the first picture taken at spawn), merged on success. May use
//! the engine's state and config, the finish's delta, the record, observe
//! and policy.

use super::delta::{facts, merge_into_recent};
use crate::engine::config::daemon_skip;
use crate::engine::state::Inner;
use crate::run::record::RunRecord;
use policy::observed::ObservedReport;
use policy::workctx::{judge, Outcome};
use std::path::PathBuf;

/// Reads the first picture back: the daemon wrote it, in the run folder.
fn read_before(rec: &RunRecord) -> crate::observe::Before {
    let path = rec.files().observed_before();
    let bytes = match subagent_runner::safefile::read(&path, crate::observe::BEFORE_MAX_BYTES) {
        Ok(b) => b,
        Err(e) if e.is_missing() => {
            return crate::observe::Before::No {
                why: "not observed: no picture was taken at spawn".into(),
            }
        }
        Err(e) => {
            return crate::observe::Before::No {
                why: format!("not observed: the picture taken at spawn is unreadable: {e}"),
            }
        }
    };
    serde_json::from_slice(&bytes).unwrap_or_else(|e| crate::observe::Before::No {
        why: format!("not observed: the picture taken at spawn is unreadable: {e}"),
    })
}

/// What the run changed in its project, as the supervisor sees it; on
/// success the files it created or changed that still hold a regular file
/// inside the project merge into the session's recent files. Blocking.
pub(crate) fn observe_and_merge(inner: &Inner, rec: &RunRecord, merge: bool) -> ObservedReport {
    let (root, first) = match read_before(rec) {
        crate::observe::Before::Yes { root, picture } => (root, picture),
        crate::observe::Before::No { why } => return ObservedReport::none(why),
    };
    let skip = daemon_skip(&inner.cfg, &root);
    let (second, note) = match crate::observe::after(&first, &root, &skip, inner.cfg.git_budget) {
        Ok(p) => p,
        Err(e) => return ObservedReport::none(format!("not observed at the end: {e}")),
    };
    let changes = policy::observed::diff(&first, &second);
    let mut report = ObservedReport::of(first.source, &changes);
    for list in [
        &mut report.created,
        &mut report.modified,
        &mut report.deleted,
    ] {
        for p in list.iter_mut() {
            *p = crate::observe::shown(p);
        }
    }
    report.note = note;
    if !merge {
        return report;
    }
    let canonical = root.canonicalize().unwrap_or(root.clone());
    let merged: Vec<PathBuf> = changes
        .written_newest_first(&second)
        .iter()
        .filter(|rel| crate::observe::mergeable(rel) && !rel.starts_with(".git/"))
        .filter_map(|rel| {
            let v = judge(&facts(rel, &root), std::slice::from_ref(&canonical), 0);
            match v.outcome {
                Outcome::Accepted(p) => Some(p),
                Outcome::Rejected(_) => None,
            }
        })
        .take(policy::workctx::RECENT_CAP)
        .collect();
    match merge_into_recent(inner, rec, &merged) {
        Ok(()) => report.merged = merged,
        Err(e) => report.note = Some(format!("merging failed: {e}")),
    }
    report
}
