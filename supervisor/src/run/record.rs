//! The record of one run, kept as its row of state.db (the store). It
//! holds what every run has and its [`Phase`], which carries the data of
//! that phase; [`RecordV1`] is the flat form a per-file state dir's
//! run.json holds, read by the store's import and its rows' JSON. Uses ids, the run folder's paths and the types its
//! fields hold; never the engine's logic, the protocol or the servers.

mod phase;
mod state;
mod wire;

pub use phase::{Ended, Phase, Runner, Started};
pub use state::{EndState, RunState};
pub use wire::RecordV1;

use crate::ids::{RunId, SessionId};
use policy::{Audience, Limits};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use subagent_runner::exit_record::ExitRecord;

/// The version of run.json this code writes.
pub const RECORD_FORMAT: u32 = 1;

/// Everything known about a run; the body of run.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RecordV1", into = "RecordV1")]
pub struct RunRecord {
    /// run.json's format version.
    pub format: u32,
    /// The run's id.
    pub run_id: RunId,
    /// The parent's session.
    pub session_id: SessionId,
    /// The parent's audience.
    pub audience: Audience,
    /// The child's working directory.
    pub project_dir: PathBuf,
    /// What the child is asked to do.
    pub task: String,
    /// What the parent added to the task.
    pub context: Option<String>,
    /// The agent program's argv.
    pub command: Vec<String>,
    /// The request's extra environment.
    pub env: BTreeMap<String, String>,
    /// The requested limits.
    pub limits: Limits,
    /// Keep temp_dir after the run.
    pub keep_temp: bool,
    /// Why the run is in its state.
    pub reason: Option<String>,
    /// A cancel was asked for.
    pub cancel_requested: bool,
    /// When the run was accepted (ms since the epoch).
    pub created_at_ms: u64,
    /// The child's temp dir (removed at the end unless `keep_temp`).
    pub temp_dir: PathBuf,
    /// The run folder.
    pub run_dir: PathBuf,
    /// child.log was cut at the output cap.
    pub log_truncated: bool,
    /// The sandbox switches asked for.
    pub sandbox: policy::sandbox::SandboxRequest,
    /// The subagent definition run, by name.
    pub agent: Option<String>,
    /// The child's tools (None: no tool policy was given).
    pub tools: Option<Vec<String>>,
    /// The OS rights the run got (a record may lack them).
    pub rights: Option<policy::sandbox::Grants>,
    /// The git snapshot taken at spawn.
    pub git: Option<policy::workctx::GitSnapshot>,
    /// The child's worktree, with `isolation: worktree`.
    pub worktree: Option<crate::run::worktree::Worktree>,
    /// Attempts allowed (1 + max_restarts).
    pub max_attempts: u32,
    /// The uid (and gid) the run's child runs as, leased for it (root
    /// daemons).
    pub uid: Option<u32>,
    /// Asked for by a uid other than the daemon's: who, and the rights it
    /// must hold, checked again before a runner starts.
    pub on_behalf: Option<policy::rights::OnBehalf>,
    /// How the run reaches the network (a record may lack it).
    pub network: Option<policy::sandbox::network::NetworkMode>,
    /// Its allowlist, in allowlist mode.
    pub network_allow: Vec<String>,
    /// What the spawn said about its definition (a project one over the
    /// user's, a network_allow ignored).
    pub notes: Vec<String>,
    /// Its driver, how its context was delivered, and what the agent's
    /// event stream reported.
    pub driver_run: Option<crate::run::driver::DriverRun>,
    /// Where it was placed: its backend and job (none in records made
    /// before it was kept).
    pub backend: Option<crate::run::placement::Placement>,
    /// Where it is in its lifecycle, with that phase's data.
    pub phase: Phase,
}

/// run.json could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Reading or writing failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The step (`read`).
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The atomic write failed.
    #[error(transparent)]
    Atomic(#[from] subagent_runner::atomic::AtomicError),
    /// The file is corrupt or truncated, names a malformed run or session
    /// id, or lacks what its state implies (the [`Inconsistent`] text,
    /// carried through the parser).
    ///
    /// [`Inconsistent`]: RecordError::Inconsistent
    #[error("parse {path}: {source}")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    /// The record lacks what its state implies (a running run's runner).
    #[error("a {} record without its {missing}", state.as_str())]
    Inconsistent {
        /// The state recorded.
        state: RunState,
        /// What it lacks.
        missing: &'static str,
    },
}

impl RunRecord {
    /// The run's state, from its phase.
    pub fn state(&self) -> RunState {
        self.phase.state()
    }

    /// How the run ended, once it has.
    pub fn end(&self) -> Option<&Ended> {
        match &self.phase {
            Phase::Ended(e) => Some(e),
            _ => None,
        }
    }

    /// How the run ended, to add what finalizing produced.
    pub fn end_mut(&mut self) -> Option<&mut Ended> {
        match &mut self.phase {
            Phase::Ended(e) => Some(e),
            _ => None,
        }
    }

    /// The agent's exit code, when it exited.
    pub fn exit_code(&self) -> Option<i32> {
        self.end().and_then(|e| e.exit_code)
    }

    /// The signal that ended the agent, when one did.
    pub fn signal(&self) -> Option<i32> {
        self.end().and_then(|e| e.signal)
    }

    /// When the agent started, once it has.
    pub fn started_at_ms(&self) -> Option<u64> {
        match &self.phase {
            Phase::Accepted => None,
            Phase::Running(s) => Some(s.at_ms),
            Phase::Ended(e) => e.started_at_ms,
        }
    }

    /// When the run ended, once it has.
    pub fn ended_at_ms(&self) -> Option<u64> {
        self.end().map(|e| e.at_ms)
    }

    /// The runner it has (or had).
    pub fn runner(&self) -> Option<Runner> {
        match &self.phase {
            Phase::Accepted => None,
            Phase::Running(s) => Some(s.runner),
            Phase::Ended(e) => e.runner,
        }
    }

    /// The runner's pid, when it has (or had) one.
    pub fn runner_pid(&self) -> Option<i32> {
        self.runner().map(|r| r.pid)
    }

    /// The runner's start time in clock ticks, when known.
    pub fn runner_start_ticks(&self) -> Option<u64> {
        self.runner().and_then(|r| r.start_ticks)
    }

    /// The end has been fully handled.
    pub fn finalized(&self) -> bool {
        self.end().is_some_and(|e| e.finalized)
    }

    /// Why finalizing failed, when it did.
    pub fn finalize_error(&self) -> Option<&str> {
        self.end().and_then(|e| e.finalize_error.as_deref())
    }

    /// Whether waiters may stop waiting: the run ended and its end was
    /// handled (or handling it failed and says why).
    pub fn settled(&self) -> bool {
        self.end()
            .is_some_and(|e| e.finalized || e.finalize_error.is_some())
    }

    /// Running with runner `pid` (started at `start_ticks`) from `now_ms`.
    pub fn started(&mut self, pid: i32, start_ticks: u64, now_ms: u64) {
        let runner = Runner {
            pid,
            start_ticks: Some(start_ticks),
        };
        self.phase = Phase::Running(Started {
            at_ms: now_ms,
            runner,
        });
    }

    /// Running with runner `pid`, found alive after a restart: the start
    /// time and ticks it had stay.
    pub fn adopted(&mut self, pid: i32, now_ms: u64) {
        let runner = Runner {
            pid,
            start_ticks: self.runner_start_ticks(),
        };
        let at_ms = self.started_at_ms().unwrap_or(now_ms);
        self.phase = Phase::Running(Started { at_ms, runner });
    }

    /// Queued again: its runner stopped at its gate, having started nothing.
    pub fn requeued(&mut self) {
        self.phase = Phase::Accepted;
    }

    /// Ended at `now_ms` as `state`, for `reason`, with nothing from an
    /// exit.json (cancelled before it started, never started, lost).
    pub fn ended(&mut self, state: EndState, reason: String, now_ms: u64) {
        self.reason = Some(reason);
        let end = Ended::bare(state, self.started_at_ms(), now_ms, self.runner());
        self.phase = Phase::Ended(Box::new(end));
    }

    /// Ended as `state` as the runner's exit.json `x` says, for `reason`;
    /// `egress` is its egress.log's summary (allowlist mode).
    pub fn exited(
        &mut self,
        x: &ExitRecord,
        state: EndState,
        reason: String,
        egress: Option<crate::run::egress::EgressSummary>,
    ) {
        // The daemon's launch time stays: it is what status showed.
        let started_at_ms = self.started_at_ms().or(Some(x.started_at_ms));
        self.log_truncated = x.log_truncated;
        self.reason = Some(reason);
        let end = Ended {
            exit_code: x.exit_code,
            signal: x.signal,
            isolation: x.isolation.clone(),
            attempts: Some(x.attempts),
            resources: Some(x.resources.clone()),
            kept: x.kept.clone(),
            egress,
            ..Ended::bare(state, started_at_ms, x.ended_at_ms, self.runner())
        };
        self.phase = Phase::Ended(Box::new(end));
    }

    /// An ended run's state told again (the agent's report changes the
    /// verdict its exit gave); nothing for a run that has not ended.
    pub fn end_as(&mut self, state: EndState) {
        debug_assert!(self.end().is_some(), "end_as on a run that has not ended");
        if let Some(e) = self.end_mut() {
            e.state = state;
        }
    }

    /// What finalizing found of the run's delta and its changes (once).
    pub fn reported(
        &mut self,
        delta: crate::run::delta::DeltaReport,
        observed: policy::observed::ObservedReport,
    ) {
        debug_assert!(self.end().is_some(), "reported on a run that has not ended");
        if let Some(e) = self.end_mut() {
            e.delta = Some(delta);
            e.observed = Some(observed);
        }
    }

    /// Finalizing is done (`None`) or failed for the reason given.
    pub fn finalize_done(&mut self, failure: Option<String>) {
        debug_assert!(self.end().is_some(), "finalized a run that has not ended");
        let Some(e) = self.end_mut() else { return };
        match failure {
            None => {
                e.finalized = true;
                e.finalize_error = None;
            }
            Some(why) => e.finalize_error = Some(why),
        }
    }

    /// Finalizing failed for `why` (tried again at the next start).
    pub fn finalize_failed(&mut self, why: String) {
        self.finalize_done(Some(why));
    }

    /// The run folder's files.
    pub fn files(&self) -> crate::paths::RunFiles {
        crate::paths::RunFiles {
            dir: self.run_dir.clone(),
        }
    }

    /// run.json's bytes (tests of the per-file format).
    #[cfg(test)]
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(self).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    /// Reads a run.json (tests of the per-file format).
    #[cfg(test)]
    pub fn load(path: &std::path::Path) -> Result<RunRecord, RecordError> {
        let bytes = std::fs::read(path).map_err(|source| RecordError::Io {
            op: "read",
            path: path.to_path_buf(),
            source,
        })?;
        serde_json::from_slice(&bytes).map_err(|source| RecordError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }
}

impl TryFrom<RecordV1> for RunRecord {
    type Error = RecordError;

    fn try_from(w: RecordV1) -> Result<RunRecord, RecordError> {
        let missing = |missing| RecordError::Inconsistent {
            state: w.state,
            missing,
        };
        let runner = w.runner_pid.map(|pid| Runner {
            pid,
            start_ticks: w.runner_start_ticks,
        });
        let phase = match EndState::of(w.state) {
            None if w.state == RunState::Accepted => Phase::Accepted,
            None => Phase::Running(Started {
                at_ms: w.started_at_ms.ok_or_else(|| missing("start time"))?,
                runner: runner.ok_or_else(|| missing("runner pid"))?,
            }),
            Some(state) => Phase::Ended(Box::new(Ended {
                state,
                exit_code: w.exit_code,
                signal: w.signal,
                started_at_ms: w.started_at_ms,
                at_ms: w.ended_at_ms.ok_or_else(|| missing("end time"))?,
                runner,
                isolation: w.isolation,
                resources: w.resources,
                kept: w.kept,
                attempts: w.attempts,
                egress: w.egress,
                delta: w.delta,
                observed: w.observed,
                finalized: w.finalized,
                finalize_error: w.finalize_error,
            })),
        };
        Ok(RunRecord {
            format: w.format,
            run_id: w.run_id,
            session_id: w.session_id,
            audience: w.audience,
            project_dir: w.project_dir,
            task: w.task,
            context: w.context,
            command: w.command,
            env: w.env,
            limits: w.limits,
            keep_temp: w.keep_temp,
            reason: w.reason,
            cancel_requested: w.cancel_requested,
            created_at_ms: w.created_at_ms,
            temp_dir: w.temp_dir,
            run_dir: w.run_dir,
            log_truncated: w.log_truncated,
            sandbox: w.sandbox,
            agent: w.agent,
            tools: w.tools,
            rights: w.rights,
            git: w.git,
            worktree: w.worktree,
            max_attempts: w.max_attempts,
            uid: w.uid,
            on_behalf: w.on_behalf,
            network: w.network,
            network_allow: w.network_allow,
            notes: w.notes,
            driver_run: w.driver_run,
            backend: w.backend,
            phase,
        })
    }
}

impl From<RunRecord> for RecordV1 {
    fn from(r: RunRecord) -> RecordV1 {
        let state = r.state();
        let (started_at_ms, runner) = (r.started_at_ms(), r.runner());
        let end = match r.phase {
            Phase::Ended(e) => *e,
            // A run that has not ended has none of an end's fields.
            _ => Ended::bare(EndState::Lost, None, 0, None),
        };
        let ended = state.is_terminal();
        RecordV1 {
            format: r.format,
            run_id: r.run_id,
            session_id: r.session_id,
            audience: r.audience,
            project_dir: r.project_dir,
            task: r.task,
            context: r.context,
            command: r.command,
            env: r.env,
            limits: r.limits,
            keep_temp: r.keep_temp,
            state,
            exit_code: end.exit_code,
            signal: end.signal,
            reason: r.reason,
            cancel_requested: r.cancel_requested,
            created_at_ms: r.created_at_ms,
            started_at_ms,
            ended_at_ms: ended.then_some(end.at_ms),
            temp_dir: r.temp_dir,
            run_dir: r.run_dir,
            runner_pid: runner.map(|x| x.pid),
            runner_start_ticks: runner.and_then(|x| x.start_ticks),
            log_truncated: r.log_truncated,
            finalized: end.finalized,
            finalize_error: end.finalize_error,
            sandbox: r.sandbox,
            isolation: end.isolation,
            resources: end.resources,
            agent: r.agent,
            tools: r.tools,
            rights: r.rights,
            git: r.git,
            worktree: r.worktree,
            delta: end.delta,
            observed: end.observed,
            max_attempts: r.max_attempts,
            attempts: end.attempts,
            kept: end.kept,
            uid: r.uid,
            on_behalf: r.on_behalf,
            network: r.network,
            network_allow: r.network_allow,
            egress: end.egress,
            notes: r.notes,
            driver_run: r.driver_run,
            backend: r.backend,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use subagent_runner::sandbox::report::{Enforcement, IsolationReport};

    /// run.json as today's daemon writes a freshly accepted run.
    fn accepted() -> RecordV1 {
        serde_json::from_value(serde_json::json!({
            "format": 1, "run_id": "20261130T055552.123456Z-a1b2c3d4", "session_id": "s",
            "audience": "team", "project_dir": "/p", "task": "t", "context": null,
            "command": ["sh", "-c", "true"], "env": {"A": "1"}, "limits": {},
            "keep_temp": false, "state": "accepted", "exit_code": null, "signal": null,
            "reason": null, "cancel_requested": false, "created_at_ms": 1,
            "started_at_ms": null, "ended_at_ms": null, "temp_dir": "/tmp/x",
            "run_dir": "/state/s/r", "runner_pid": null, "runner_start_ticks": null,
            "log_truncated": false, "finalized": false, "max_attempts": 2,
            "network": "allowlist", "network_allow": ["example.com"], "uid": 70001,
            "tools": ["Read"], "notes": ["a note"]
        }))
        .unwrap()
    }

    fn running() -> RecordV1 {
        RecordV1 {
            state: RunState::Running,
            started_at_ms: Some(2),
            runner_pid: Some(4242),
            runner_start_ticks: Some(99),
            ..accepted()
        }
    }

    fn succeeded() -> RecordV1 {
        use policy::workctx::{Outcome, Verdict};
        let verdict = |o| Verdict {
            path: "a.txt".into(),
            outcome: o,
        };
        RecordV1 {
            state: RunState::Succeeded,
            exit_code: Some(0),
            reason: Some("exited with code 0".into()),
            ended_at_ms: Some(3),
            finalized: true,
            isolation: Some(IsolationReport {
                landlock: Enforcement::on("abi 6"),
                seccomp: Enforcement::off("not asked for"),
                rlimits: vec!["nofile=1024".into()],
                ..Default::default()
            }),
            resources: Some(subagent_runner::exit_record::Resources {
                cpu_user_ms: 5,
                peak_memory_bytes: Some(1 << 20),
                ..Default::default()
            }),
            kept: Some(Default::default()),
            attempts: Some(1),
            delta: Some(crate::run::delta::DeltaReport {
                accepted: vec![verdict(Outcome::Accepted("/p/a.txt".into()))],
                rejected: vec![verdict(Outcome::Rejected("outside".into()))],
                note: None,
            }),
            observed: Some(Default::default()),
            egress: Some(Default::default()),
            ..running()
        }
    }

    /// A run whose runner died without an exit.json, its finalizing failed.
    fn lost() -> RecordV1 {
        RecordV1 {
            state: RunState::Lost,
            reason: Some("the runner was killed by signal 9 and left no exit.json".into()),
            ended_at_ms: Some(7),
            finalize_error: Some("writing result.md: disk full".into()),
            ..running()
        }
    }

    #[test]
    fn todays_run_json_loads_and_is_written_back_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        for (v1, state) in [
            (accepted(), RunState::Accepted),
            (running(), RunState::Running),
            (succeeded(), RunState::Succeeded),
            (lost(), RunState::Lost),
        ] {
            let mut today = serde_json::to_vec_pretty(&v1).unwrap();
            today.push(b'\n');
            let path = dir.path().join("run.json");
            std::fs::write(&path, &today).unwrap();
            let rec = RunRecord::load(&path).unwrap();
            assert_eq!(rec.state(), state);
            assert_eq!(
                String::from_utf8(rec.to_bytes()).unwrap(),
                String::from_utf8(today).unwrap()
            );
            assert_eq!(RecordV1::from(rec), v1);
        }
    }

    #[test]
    fn each_phase_holds_its_own_data() {
        let rec = RunRecord::try_from(accepted()).unwrap();
        assert_eq!(rec.phase, Phase::Accepted);
        assert_eq!((rec.runner_pid(), rec.started_at_ms()), (None, None));
        let rec = RunRecord::try_from(running()).unwrap();
        let runner = Runner {
            pid: 4242,
            start_ticks: Some(99),
        };
        assert_eq!(rec.phase, Phase::Running(Started { at_ms: 2, runner }));
        let rec = RunRecord::try_from(succeeded()).unwrap();
        let end = rec.end().unwrap();
        assert_eq!(end.state, EndState::Succeeded);
        assert_eq!(
            (end.exit_code, end.at_ms, end.started_at_ms),
            (Some(0), 3, Some(2))
        );
        assert!(end.isolation.is_some() && end.delta.is_some());
        assert!(rec.settled());
        let rec = RunRecord::try_from(lost()).unwrap();
        assert_eq!(rec.finalize_error(), Some("writing result.md: disk full"));
        assert!(rec.settled() && !rec.finalized());
    }

    #[test]
    fn transitions_move_the_data_with_the_phase() {
        let mut rec = RunRecord::try_from(accepted()).unwrap();
        rec.started(10, 20, 5);
        assert_eq!(
            (rec.state(), rec.runner_pid(), rec.started_at_ms()),
            (RunState::Running, Some(10), Some(5))
        );
        rec.requeued();
        assert_eq!(
            (rec.state(), rec.runner_pid(), rec.started_at_ms()),
            (RunState::Accepted, None, None)
        );
        rec.adopted(11, 6);
        assert_eq!(
            (
                rec.runner_pid(),
                rec.runner_start_ticks(),
                rec.started_at_ms()
            ),
            (Some(11), None, Some(6))
        );
        rec.adopted(12, 9);
        assert_eq!(
            rec.started_at_ms(),
            Some(6),
            "an adopted run keeps its start time"
        );
        rec.ended(EndState::Failed, "why".into(), 8);
        assert_eq!(
            (rec.state(), rec.ended_at_ms(), rec.started_at_ms()),
            (RunState::Failed, Some(8), Some(6))
        );
        assert_eq!(rec.reason.as_deref(), Some("why"));
        assert!(!rec.settled());
        rec.end_as(EndState::Succeeded);
        rec.finalize_done(None);
        assert!(rec.finalized() && rec.settled() && rec.state() == RunState::Succeeded);
    }

    #[test]
    fn a_bad_id_or_a_running_run_without_its_runner_fails_to_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.json");
        let mut bad = serde_json::to_value(accepted()).unwrap();
        bad["run_id"] = "../../etc".into();
        std::fs::write(&path, bad.to_string()).unwrap();
        let err = RunRecord::load(&path).unwrap_err().to_string();
        assert!(
            err.contains("run.json") && err.contains("malformed run id"),
            "{err}"
        );
        let mut pidless = serde_json::to_value(running()).unwrap();
        pidless["runner_pid"] = serde_json::Value::Null;
        std::fs::write(&path, pidless.to_string()).unwrap();
        let err = RunRecord::load(&path).unwrap_err().to_string();
        assert!(
            err.contains("a running record without its runner pid"),
            "{err}"
        );
    }
}
