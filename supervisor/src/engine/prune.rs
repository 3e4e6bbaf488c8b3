//! The engine's prune phase: the finished runs as retention candidates,
//! the plan `policy::retention` makes of them, and its application (the
//! run leaves the table, then its folder and notice files go). The daemon
//! prunes every `[retention] interval`, and `prune_runs` on demand.
//!
//! The source of candidates ([`finished`], [`candidates`]) and the steps
//! that apply a plan ([`unlist`], [`remove_files`]) are kept apart, so
//! that each can move to the records' store on its own.

use super::error::EngineError;
use super::finish::remove_tree;
use super::state::{blocking, Inner};
use crate::paths::StateLayout;
use crate::protocol::{KeptRun, PruneParams, PruneResult, PrunedRun};
use crate::run::record::RunRecord;
use policy::retention::{Candidate, Filter, Plan};
use policy::rights::Requester;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Weak};

/// Applies the retention limits now (narrowed, and with `older_than`
/// widened, by `params` and `who`), or with `dry_run` only says what that
/// would remove.
pub(crate) async fn prune_runs(
    inner: &Arc<Inner>,
    params: PruneParams,
    who: Option<Requester>,
) -> Result<PruneResult, EngineError> {
    if let Some(s) = &params.session_id {
        crate::ids::check_session_id(s).map_err(|p| EngineError::invalid("session_id", p))?;
    }
    let older_than = match &params.older_than {
        Some(d) => Some(
            policy::retention::parse_duration(d)
                .map_err(|e| EngineError::invalid("older_than", e))?,
        ),
        None => None,
    };
    let filter = Filter {
        session: params.session_id,
        older_than,
        requester: who,
    };
    let (inner, dry_run) = (inner.clone(), params.dry_run);
    blocking(move || Ok(prune(&inner, &filter, dry_run))).await
}

/// Prunes by the limits alone every `interval` while the engine lives;
/// returns at once when the interval is off.
pub(crate) async fn every_interval(inner: Weak<Inner>) {
    let Some(interval) = inner
        .upgrade()
        .and_then(|i| i.cfg.settings.retention.interval)
    else {
        return;
    };
    loop {
        tokio::time::sleep(interval).await;
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let done = blocking(move || Ok(prune(&strong, &Filter::default(), false))).await;
        if let Ok(r) = done {
            if !r.removed.is_empty() {
                tracing::info!(removed = r.removed.len(), "retention pruned runs");
            }
        }
    }
}

/// Plans and (unless `dry_run`) applies a prune. Blocking.
fn prune(inner: &Inner, filter: &Filter, dry_run: bool) -> PruneResult {
    let runs = finished(inner);
    let candidates = candidates(&inner.layout, &runs);
    let limits = inner.cfg.settings.retention.limits();
    let plan = policy::retention::plan(crate::timefmt::now_ms(), &limits, filter, &candidates);
    let result = describe(&plan, &candidates, dry_run);
    if !dry_run {
        for (id, reason) in &plan.remove {
            let Some(rec) = runs.get(id.as_str()) else {
                continue;
            };
            unlist(inner, rec);
            remove_files(&inner.layout, rec);
            tracing::info!(run_id = %id, reason = reason.as_str(), "run pruned");
        }
    }
    result
}

/// Every run that has ended and been finalized, by id: today, the
/// engine's table.
fn finished(inner: &Inner) -> BTreeMap<String, RunRecord> {
    let slots: Vec<_> = inner
        .runs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .cloned()
        .collect();
    slots
        .iter()
        .map(|s| s.snapshot())
        .filter(|r| r.state().is_terminal() && r.finalized())
        .map(|r| (r.run_id.to_string(), r))
        .collect()
}

/// The runs as retention sees them: whose, when they ended, their
/// folder's size, whether their notice waits, whether their worktree is
/// still there.
fn candidates(layout: &StateLayout, runs: &BTreeMap<String, RunRecord>) -> Vec<Candidate> {
    let mut pending: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for rec in runs.values() {
        let session = rec.session_id.as_str();
        if !pending.contains_key(session) {
            pending.insert(session, pending_notices(layout, session));
        }
    }
    runs.values()
        .map(|rec| {
            let session = rec.session_id.as_str();
            let owner = rec.on_behalf.as_ref().map(|ob| ob.requester.uid);
            Candidate {
                run_id: rec.run_id.to_string(),
                session_id: session.to_owned(),
                owner_uid: policy::rights::recorded_owner(owner, crate::paths::uid()),
                ended_at_ms: rec.ended_at_ms().unwrap_or(rec.created_at_ms),
                dir_bytes: dir_bytes(&rec.run_dir),
                notice_pending: pending
                    .get(session)
                    .is_some_and(|p| p.contains(rec.run_id.as_str())),
                worktree: rec
                    .worktree
                    .as_ref()
                    .map(|w| w.dir.clone())
                    .filter(|d| d.symlink_metadata().is_ok()),
            }
        })
        .collect()
}

/// The run ids with a notice in the session's `pending/`
/// (`<ended_ms>-<run_id>.json`).
fn pending_notices(layout: &StateLayout, session: &str) -> BTreeSet<String> {
    let dir = layout.notices_dir(session).join("pending");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeSet::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let id = name.strip_suffix(".json")?.split_once('-')?.1;
            Some(id.to_owned())
        })
        .collect()
}

/// The bytes a folder's tree takes on disk; no link is followed, and an
/// entry that cannot be read counts nothing.
fn dir_bytes(dir: &Path) -> u64 {
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

/// The plan as `prune_runs` answers it.
fn describe(plan: &Plan, candidates: &[Candidate], dry_run: bool) -> PruneResult {
    let by_id: BTreeMap<&str, &Candidate> =
        candidates.iter().map(|c| (c.run_id.as_str(), c)).collect();
    let removed = plan
        .remove
        .iter()
        .filter_map(|(id, reason)| {
            let c = by_id.get(id.as_str())?;
            Some(PrunedRun {
                run_id: id.clone(),
                session_id: c.session_id.clone(),
                ended_at: crate::timefmt::rfc3339_ms(c.ended_at_ms),
                bytes: c.dir_bytes,
                reason: *reason,
            })
        })
        .collect();
    let kept = plan
        .keep
        .iter()
        .map(|(id, why)| KeptRun {
            run_id: id.clone(),
            why: why.to_string(),
        })
        .collect();
    PruneResult {
        removed,
        kept,
        dry_run,
    }
}

/// The run leaves the engine's table: from now on it is neither listed
/// nor found.
fn unlist(inner: &Inner, rec: &RunRecord) {
    inner
        .runs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&rec.run_id);
}

/// Removes the run's folder and its notice files (pending or taken).
fn remove_files(layout: &StateLayout, rec: &RunRecord) {
    remove_tree(&rec.run_dir);
    let notices = layout.notices_dir(rec.session_id.as_str());
    let id = rec.run_id.as_str();
    let mut files = vec![notices.join("taken").join(format!("{id}.json"))];
    if let Some(ended) = rec.ended_at_ms() {
        let name = format!("{ended:013}-{id}.json");
        files.push(notices.join("pending").join(name));
    }
    for f in files {
        match std::fs::remove_file(&f) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(path = %f.display(), "removing a pruned run's notice: {e}");
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn pending_notices_are_read_from_their_names() {
        let dir = tempfile::tempdir().unwrap();
        let layout = StateLayout {
            root: dir.path().to_path_buf(),
        };
        let pending = layout.notices_dir("s").join("pending");
        std::fs::create_dir_all(&pending).unwrap();
        let id = "20261201T070317.792757Z-5fe54002";
        std::fs::write(pending.join(format!("0001764572597123-{id}.json")), "{}").unwrap();
        std::fs::write(pending.join(".tmp-x"), "").unwrap();
        let found = pending_notices(&layout, "s");
        assert_eq!(found.into_iter().collect::<Vec<_>>(), [id]);
        assert!(pending_notices(&layout, "other").is_empty());
    }
}
