//! The engine's prune phase: the store's finished runs as retention
//! candidates, the plan `policy::retention` makes of them, and its
//! crash-safe application: the runs are marked `pruning` in one commit
//! (from then on neither listed nor found), their folders go, then one
//! commit makes them tombstones. A daemon killed in between finishes the
//! marked ones at its next start ([`finish_pending`]). Each pass then
//! forgets the tombstones beyond their bounds. The daemon prunes every
//! `[retention] interval`, soon after a run's end crosses a count or
//! bytes limit ([`when_crossed`]), and `prune_runs` on demand.

use super::error::EngineError;
use super::finish::{dir_bytes, remove_tree, tidy_older};
use super::state::{blocking, Inner, Tally};
use crate::ids::RunId;
use crate::protocol::{KeptRun, PruneParams, PruneResult, PrunedRun};
use crate::store::Op;
use policy::retention::{Candidate, Filter, Limits, Plan};
use policy::rights::Requester;
use std::collections::{BTreeMap, BTreeSet};
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
    let _one = inner.retention.one_pass().await;
    let (inner, dry_run) = (inner.clone(), params.dry_run);
    blocking(move || prune(&inner, &filter, dry_run)).await
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
        let _one = strong.retention.one_pass().await;
        let pass = strong.clone();
        let done = blocking(move || prune(&pass, &Filter::default(), false)).await;
        if let Ok(r) = done {
            if !r.removed.is_empty() {
                tracing::info!(removed = r.removed.len(), "retention pruned runs");
            }
        }
    }
}

/// The least time from one pass a crossed limit starts to the next.
const CROSSED_GAP: std::time::Duration = std::time::Duration::from_secs(2);

/// Counts what the limits count, once at start, and prunes at once when
/// the history is past a limit already.
pub(crate) async fn count_at_start(inner: Weak<Inner>) {
    let Some(strong) = inner.upgrade() else {
        return;
    };
    let counted = blocking(move || {
        let mut t = Tally::default();
        for (session, runs, bytes) in strong.store.retention_tally()? {
            t.total = t.total.saturating_add(runs);
            t.bytes = t.bytes.saturating_add(bytes);
            t.sessions.insert(session, runs);
        }
        strong
            .retention
            .counted(t, &strong.cfg.settings.retention.limits());
        Ok(())
    })
    .await;
    if let Err(e) = counted {
        tracing::warn!("counting the finished runs for retention: {e}");
    }
}

/// Prunes by the limits each time a run's end crossed one, one pass at a
/// time and at most one per [`CROSSED_GAP`]; returns at once when the
/// daemon prunes only on demand (`interval = 0`).
pub(crate) async fn when_crossed(inner: Weak<Inner>) {
    let Some(soon) = inner
        .upgrade()
        .filter(|i| i.cfg.settings.retention.interval.is_some())
        .map(|i| i.retention.soon())
    else {
        return;
    };
    loop {
        soon.notified().await;
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let _one = strong.retention.one_pass().await;
        let pass = strong.clone();
        let done = blocking(move || prune(&pass, &Filter::default(), false)).await;
        match done {
            Ok(r) if !r.removed.is_empty() => {
                tracing::info!(
                    removed = r.removed.len(),
                    "a limit was crossed: pruned runs"
                );
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("pruning after a limit was crossed: {e}"),
        }
        tokio::time::sleep(CROSSED_GAP).await;
    }
}

/// Plans and (unless `dry_run`) applies a prune, and then forgets the
/// tombstones beyond their bounds. Its caller holds
/// `retention.one_pass()`. Blocking.
fn prune(inner: &Inner, filter: &Filter, dry_run: bool) -> Result<PruneResult, EngineError> {
    let candidates = candidates(inner)?;
    let limits = inner.cfg.settings.retention.limits();
    let plan = policy::retention::plan(crate::timefmt::now_ms(), &limits, filter, &candidates);
    let result = describe(&plan, &candidates, dry_run);
    if !dry_run {
        for batch in plan.remove.chunks(PRUNE_BATCH) {
            mark(inner, batch)?;
            finish_pending(inner)?;
        }
        recount(inner, &candidates, &plan);
        forget_tombstones(inner, &limits);
    }
    Ok(result)
}

/// The counts after a pass: the candidates it did not remove.
fn recount(inner: &Inner, candidates: &[Candidate], plan: &Plan) {
    let removed: BTreeSet<&str> = plan.remove.iter().map(|(id, _)| id.as_str()).collect();
    let mut t = Tally::default();
    for c in candidates
        .iter()
        .filter(|c| !removed.contains(c.run_id.as_str()))
    {
        t.total += 1;
        t.bytes = t.bytes.saturating_add(c.dir_bytes);
        *t.sessions.entry(c.session_id.clone()).or_default() += 1;
    }
    inner.retention.set(t);
}

/// Forgets the tombstones beyond their bounds (`max_age` after the prune,
/// at most `max_runs` of them): from then on their ids are not found. A
/// failure is logged, not answered: the prune itself is done, and the
/// next pass tries again.
fn forget_tombstones(inner: &Inner, limits: &Limits) {
    let bounds = limits.tombstones();
    let age_ms = u64::try_from(bounds.max_age.as_millis()).unwrap_or(u64::MAX);
    let op = Op::ForgetPruned {
        before_ms: crate::timefmt::now_ms().saturating_sub(age_ms),
        keep: bounds.max_count,
    };
    if let Err(e) = inner.store.commit_blocking(vec![op]) {
        tracing::warn!("forgetting pruned runs' tombstones: {e}");
    }
}

/// Runs marked in one transaction, and so removed in one pass.
const PRUNE_BATCH: usize = 100;

/// The store's ended, finalized runs as retention sees them. A folder
/// not yet measured is measured once and its size recorded.
fn candidates(inner: &Inner) -> Result<Vec<Candidate>, EngineError> {
    let stored = inner.store.retention_candidates()?;
    let mut measured = Vec::new();
    let out = stored
        .into_iter()
        .map(|c| {
            let mut bytes = c.dir_bytes;
            if bytes == 0 {
                bytes = unmeasured_bytes(inner, &c);
                measured.push(Op::DirBytes {
                    id: c.run_id.clone(),
                    bytes,
                });
            }
            Candidate {
                run_id: c.run_id.to_string(),
                session_id: c.session_id,
                owner_uid: c.owner_uid,
                ended_at_ms: c.ended_at_ms,
                dir_bytes: bytes,
                notice_pending: c.notice_pending,
                worktree: c.worktree_dir.filter(|d| d.symlink_metadata().is_ok()),
            }
        })
        .collect();
    if !measured.is_empty() {
        inner.store.commit_blocking(measured)?;
    }
    Ok(out)
}

/// The size of a run folder the store has no size for (its run's end
/// was committed by a daemon stopped before it measured): tidied first,
/// as that end would have. Blocking.
fn unmeasured_bytes(inner: &Inner, c: &crate::store::Candidate) -> u64 {
    let files = crate::paths::RunFiles {
        dir: inner.layout.run_dir(&c.session_id, &c.run_id),
    };
    tidy_older(&files);
    dir_bytes(&files.dir)
}

/// Commits that `batch` is being pruned, each with its reason: from now
/// on those runs are neither listed nor found, and a crash leaves them
/// marked for [`finish_pending`] at the next start.
fn mark(inner: &Inner, batch: &[(String, policy::retention::Reason)]) -> Result<(), EngineError> {
    let mut by_reason: BTreeMap<&str, Vec<RunId>> = BTreeMap::new();
    for (id, reason) in batch {
        if let Some(id) = RunId::parse(id) {
            by_reason.entry(reason.as_str()).or_default().push(id);
        }
    }
    let ops = by_reason
        .into_iter()
        .map(|(reason, ids)| Op::PruneMark {
            ids,
            reason: reason.to_owned(),
        })
        .collect();
    inner.store.commit_blocking(ops)?;
    for (id, reason) in batch {
        inner.metrics.pruned(*reason);
        tracing::info!(run_id = %id, reason = reason.as_str(), "run pruned");
    }
    Ok(())
}

/// Finishes the prunes a crash cut short (their runs marked, their
/// folders perhaps still there) before the daemon answers.
pub(crate) async fn finish_at_start(inner: &Arc<Inner>) {
    let strong = inner.clone();
    match blocking(move || finish_pending(&strong)).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(runs = n, "finished an interrupted prune"),
        Err(e) => tracing::warn!("finishing an interrupted prune: {e}"),
    }
}

/// Removes the folder of every run marked as being pruned, then commits
/// them as pruned (tombstones). Run at start for a prune a crash cut
/// short, and after each batch a prune marks. Blocking.
pub(crate) fn finish_pending(inner: &Inner) -> Result<usize, EngineError> {
    let pending = inner.store.pending_prunes()?;
    if pending.is_empty() {
        return Ok(0);
    }
    let mut gone = Vec::new();
    for p in pending {
        test_pause();
        // The folder the ids name, never a path a row holds.
        let dir = inner.layout.run_dir(&p.session_id, &p.run_id);
        remove_tree(&dir);
        if dir.symlink_metadata().is_ok() {
            tracing::warn!(dir = %dir.display(), "a pruned run's folder is still there; tried again later");
            continue;
        }
        gone.push(p.run_id);
    }
    let n = gone.len();
    if n > 0 {
        inner
            .store
            .commit_blocking(vec![Op::PruneDone { ids: gone }])?;
    }
    Ok(n)
}

/// A debug build's pause between two folders of a prune
/// (`SUBAGENTD_TEST_PRUNE_PAUSE_MS`), so a test can kill the daemon in
/// the middle of one.
fn test_pause() {
    #[cfg(debug_assertions)]
    if let Some(ms) = std::env::var("SUBAGENTD_TEST_PRUNE_PAUSE_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
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
