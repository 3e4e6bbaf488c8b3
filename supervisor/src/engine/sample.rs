//! `sample_agent_runs`: the runs in memory (accepted, running, ending) and
//! those let go in the last minute, each with a sample of its processes
//! (running runs only) and its log's last line. Reads the host per call;
//! the cost grows with the live runs, never with the history. Blocking.

use super::error::EngineError;
use super::state::{run_owner, Inner};
use crate::livesample;
use crate::protocol::SampleParams;
use crate::run::record::{RunRecord, RunState};
use crate::status::{RunStatus, SampledRun};
use crate::store::Stored;

/// The runs `q` selects that `who` may see, oldest first, sampled.
pub(super) fn sample(
    inner: &Inner,
    q: &SampleParams,
    who: Option<&policy::rights::Requester>,
) -> Result<Vec<SampledRun>, EngineError> {
    let mut recs: Vec<RunRecord> = {
        let runs = inner.runs.lock().unwrap_or_else(|p| p.into_inner());
        runs.values().map(|s| s.snapshot()).collect()
    };
    let ended = inner
        .recent_ends
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .since(crate::timefmt::now_ms());
    for id in ended {
        if recs.iter().any(|r| r.run_id == id) {
            continue;
        }
        if let Some(Stored::Live(rec)) = inner.store.get(&id)? {
            recs.push(*rec);
        }
    }
    recs.retain(|r| {
        q.session_id
            .as_deref()
            .is_none_or(|s| r.session_id.as_str() == s)
            && q.state.is_none_or(|s| r.state() == s)
            && policy::rights::may_act_on(who, run_owner(r))
    });
    recs.sort_by(|a, b| a.run_id.cmp(&b.run_id));
    Ok(recs.iter().map(|r| sampled(inner, r)).collect())
}

/// One run's status, sample and last line.
fn sampled(inner: &Inner, rec: &RunRecord) -> SampledRun {
    let sample = match (rec.state(), rec.runner_pid()) {
        // A Slurm run's runner is on a node (pid 0 here): nothing to walk.
        (RunState::Running, Some(pid)) if pid > 0 => processes(inner, rec, pid),
        _ => None,
    };
    SampledRun {
        status: RunStatus::from(rec),
        sample,
        last_line: livesample::last_line(&rec.files().log()),
    }
}

/// The running run's processes under its runner `pid`, walked within its
/// process limit (and the runner and its init over it); the memory from
/// its memory cgroup where it has one.
fn processes(inner: &Inner, rec: &RunRecord, pid: i32) -> Option<livesample::Sample> {
    let pids = rec.limits.pids.unwrap_or(policy::sandbox::DEFAULT_PIDS);
    let bound = usize::try_from(pids)
        .unwrap_or(usize::MAX)
        .saturating_add(8);
    let mut s = livesample::sample(pid, rec.runner_start_ticks(), bound)?;
    let cg = subagent_runner::sandbox::cgroup::RunCgroups::existing(
        &inner.probe.cgroups,
        rec.run_id.as_str(),
    );
    if let Some(bytes) = cg
        .memory
        .as_ref()
        .and_then(|(dir, v2)| livesample::procs::cgroup_memory(dir, *v2))
    {
        s.memory_bytes = bytes;
    }
    Some(s)
}
