//! `squeue --json`'s answer, read for the few fields a run needs. Only
//! those are kept of each job (the rest of its ~3 KiB is skipped while
//! parsing), and both shapes Slurm has used are read: 22.05's plain
//! values (`"job_state": "RUNNING"`, `"exit_code": 768`, times as
//! integers) and the later ones (`["RUNNING"]`, `{"return_code":
//! {"number": 3}, "signal": {"id": ...}}`, `{"set": true, "number": N}`).
//! An answer with errors is an error: squeue says so with exit code 0
//! and no jobs when the controller does not answer, which must never read
//! as "every job is gone".

use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;

/// What the daemon reads of one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobInfo {
    /// Its id.
    pub job_id: u64,
    /// Its name (the run id, for the daemon's jobs).
    pub name: String,
    /// Slurm's state: `PENDING`, `RUNNING`, `COMPLETED`, ...
    pub state: String,
    /// Slurm's reason code (`None` when there is none).
    pub reason: String,
    /// Slurm's sentence for the reason, when it has one.
    pub description: String,
    /// Its batch script's wait status (exit code << 8, or the signal).
    pub exit_status: i64,
    /// When it started, in seconds since the epoch (0: not yet).
    pub start_time: u64,
}

#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    errors: Vec<Value>,
    #[serde(default)]
    jobs: Vec<RawJob>,
}

#[derive(Deserialize)]
struct RawJob {
    job_id: Option<u64>,
    #[serde(default)]
    name: Value,
    #[serde(default)]
    job_state: Value,
    #[serde(default)]
    state_reason: Value,
    #[serde(default)]
    state_description: Value,
    #[serde(default)]
    exit_code: Value,
    #[serde(default)]
    start_time: Value,
}

/// The most characters kept of a name, reason or description.
const MAX_TEXT: usize = 500;

/// The flags later Slurm versions list after a job's base state that mean
/// it is not over yet (its processes are still being signalled or
/// reaped, or its files staged out).
const STILL_GOING: &[&str] = &[
    "COMPLETING",
    "SIGNALING",
    "STAGE_OUT",
    "CONFIGURING",
    "RESIZING",
];

/// A job's state: the string, or of a list (later Slurm versions list the
/// base state with its flags, `["CANCELLED", "COMPLETING"]`) the first,
/// unless a flag says the job is still going: then that flag.
fn state(v: &Value) -> String {
    if let Value::Array(a) = v {
        let going = a
            .iter()
            .filter_map(Value::as_str)
            .find(|s| STILL_GOING.contains(s));
        if let Some(flag) = going {
            return (*flag).to_owned();
        }
    }
    text(v)
}

/// A string, or the first of a list of strings.
fn text(v: &Value) -> String {
    let s = match v {
        Value::String(s) => s.as_str(),
        Value::Array(a) => a.first().and_then(Value::as_str).unwrap_or(""),
        _ => "",
    };
    crate::sanitize::one_line(&s.chars().take(MAX_TEXT).collect::<String>())
}

/// A number, or `{"set": true, "number": N}`.
fn number(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::Object(o) if o.get("set") != Some(&Value::Bool(false)) => {
            o.get("number").and_then(Value::as_i64)
        }
        _ => None,
    }
}

/// A wait status: 22.05's raw integer, or later versions' object of a
/// return code and a signal.
fn wait_status(v: &Value) -> i64 {
    if let Some(n) = v.as_i64() {
        return n;
    }
    let signal = number(&v["signal"]["id"]).unwrap_or(0);
    if signal > 0 {
        return signal & 0x7f;
    }
    (number(&v["return_code"]).unwrap_or(0) & 0xff) << 8
}

/// Parses squeue's answer into the jobs it lists, by id.
pub fn parse(bytes: &[u8]) -> Result<HashMap<u64, JobInfo>, String> {
    let answer: Answer =
        serde_json::from_slice(bytes).map_err(|e| format!("its JSON answer: {e}"))?;
    if let Some(e) = answer.errors.first() {
        let why = ["description", "error"]
            .iter()
            .map(|k| text(&e[*k]))
            .find(|s| !s.is_empty())
            .unwrap_or_else(|| "an error without a description".into());
        return Err(format!("Slurm answered with an error: {why}"));
    }
    let mut jobs = HashMap::with_capacity(answer.jobs.len());
    for j in answer.jobs {
        let Some(job_id) = j.job_id else { continue };
        let info = JobInfo {
            job_id,
            name: text(&j.name),
            state: state(&j.job_state),
            reason: text(&j.state_reason),
            description: text(&j.state_description),
            exit_status: wait_status(&j.exit_code),
            start_time: number(&j.start_time)
                .and_then(|n| u64::try_from(n).ok())
                .unwrap_or(0),
        };
        jobs.insert(job_id, info);
    }
    Ok(jobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_22_05s_shape_is_read() {
        let json = br#"{"meta": {"Slurm": {"release": "22.05.8"}}, "errors": [], "jobs": [
            {"job_id": 7, "name": "20261206T101010.123456Z-0a1b2c3d", "job_state": "FAILED",
             "state_reason": "NonZeroExitCode", "state_description": "", "exit_code": 768,
             "start_time": 1765000000, "end_time": 1765000001, "other": {"deep": [1, 2]}},
            {"job_id": 8, "name": "x", "job_state": "PENDING", "state_reason": "Resources",
             "state_description": "Nodes required for job are DOWN", "exit_code": 0,
             "start_time": 0}]}"#;
        let jobs = parse(json).unwrap();
        let j = &jobs[&7];
        assert_eq!(j.name, "20261206T101010.123456Z-0a1b2c3d");
        assert_eq!(
            (j.state.as_str(), j.reason.as_str()),
            ("FAILED", "NonZeroExitCode")
        );
        assert_eq!((j.exit_status, j.start_time), (768, 1_765_000_000));
        assert_eq!(jobs[&8].description, "Nodes required for job are DOWN");
    }

    #[test]
    fn later_versions_shape_is_read() {
        let json = br#"{"errors": [], "jobs": [
            {"job_id": 9, "name": "r", "job_state": ["CANCELLED", "REQUEUED"],
             "state_reason": "None", "exit_code": {"status": ["SIGNALED"],
             "return_code": {"set": true, "infinite": false, "number": 0},
             "signal": {"id": {"set": true, "infinite": false, "number": 15}, "name": "TERM"}},
             "start_time": {"set": true, "infinite": false, "number": 1765000000}},
            {"job_id": 10, "job_state": ["COMPLETED"], "exit_code": {"status": ["EXITED"],
             "return_code": {"set": true, "number": 3}, "signal": {"id": {"set": false, "number": 0}}},
             "start_time": {"set": false, "number": 0}}]}"#;
        let jobs = parse(json).unwrap();
        assert_eq!(jobs[&9].state, "CANCELLED");
        assert_eq!(jobs[&9].exit_status, 15);
        assert_eq!(jobs[&9].start_time, 1_765_000_000);
        assert_eq!((jobs[&10].exit_status, jobs[&10].start_time), (768, 0));
    }

    #[test]
    fn a_job_still_completing_is_not_over() {
        let json = br#"{"jobs": [
            {"job_id": 1, "job_state": ["CANCELLED", "COMPLETING"]},
            {"job_id": 2, "job_state": ["TIMEOUT", "SIGNALING"]},
            {"job_id": 3, "job_state": ["COMPLETED"]},
            {"job_id": 4, "job_state": "COMPLETING"}]}"#;
        let jobs = parse(json).unwrap();
        assert_eq!(jobs[&1].state, "COMPLETING");
        assert_eq!(jobs[&2].state, "SIGNALING");
        assert_eq!(jobs[&3].state, "COMPLETED");
        assert_eq!(jobs[&4].state, "COMPLETING");
        for s in ["COMPLETING", "SIGNALING"] {
            assert_eq!(
                policy::backend::phase(s),
                policy::backend::JobPhase::Running
            );
        }
    }

    #[test]
    fn an_answer_with_errors_is_no_answer() {
        let json = br#"{"errors": [{"description": "Failed while looking for jobs",
            "error_number": -1, "error": "Unspecified error", "source": "slurm_load_jobs"}],
            "jobs": []}"#;
        let e = parse(json).unwrap_err();
        assert!(e.contains("Failed while looking for jobs"), "{e}");
        assert!(parse(b"not json").is_err());
        assert!(parse(br#"{"jobs": [{"job_id": "seven"}]}"#).is_err());
    }

    #[test]
    fn terminal_bytes_in_a_name_are_made_visible() {
        let json =
            br#"{"jobs": [{"job_id": 1, "name": "a\u001b]0;x\u0007b", "job_state": "RUNNING"}]}"#;
        let jobs = parse(json).unwrap();
        assert!(!jobs[&1].name.contains('\u{1b}'), "{:?}", jobs[&1].name);
    }
}
