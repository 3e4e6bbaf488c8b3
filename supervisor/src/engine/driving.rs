//! A run's driver in the engine: which one a spawn gets, how its context
//! reaches the agent (the driver's argv and env, or a plain command's
//! placeholders and stdin), the model gateway's endpoint and key (the
//! key kept in the daemon, never in the run), and at the end the agent's event stream read from
//! child.log and the files it reported, checked on disk and merged.

use super::{EngineError, Inner};
use crate::record::{EndState, RunRecord, RunState};
use policy::agentstream::AgentReport;
use policy::driver::{Driver, DriverInputs};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The most of child.log read for the event stream (its end).
pub const MAX_STREAM_BYTES: u64 = 32 << 20;

/// How a run's agent was started and what it reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriverRun {
    /// The driver.
    pub driver: Driver,
    /// How the composed context reached the agent.
    pub delivered: Delivery,
    /// What its event stream said, once the run has ended (drivers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<AgentReport>,
    /// The files the stream reported written or edited, checked on disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported_files: Option<ReportedFiles>,
    /// Whether the run could write its project (what its observation
    /// needs too); `None` in records made before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writes_project: Option<bool>,
}

/// How the context reached the agent, besides the files in its context
/// dir.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// The context file on its stdin (`first_message.md`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// What its argv carries: placeholders expanded, or the driver's
    /// `system.md` option.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub argv: Vec<String>,
}

impl Delivery {
    /// One line: how the context was delivered.
    pub fn describe(&self) -> String {
        let mut ways = Vec::new();
        if let Some(s) = &self.stdin {
            ways.push(format!("{s} on stdin"));
        }
        if !self.argv.is_empty() {
            ways.push(format!("argv: {}", self.argv.join(", ")));
        }
        if ways.is_empty() {
            "files only (in $SUBAGENT_CONTEXT_DIR; the agent must read them itself)".into()
        } else {
            format!(
                "{}; the files are in $SUBAGENT_CONTEXT_DIR",
                ways.join("; ")
            )
        }
    }
}

/// The reported files, judged as a delta's claims are.
pub type ReportedFiles = super::workctx::DeltaReport;

/// The run's driver: the request's, else a user-level definition's, else
/// the config's, else `command`. A project definition (child-writable) may
/// not pick one: a driver adds its endpoint to the run's allowlist.
pub(crate) fn pick(
    settings: &policy::config::Config,
    requested: Option<Driver>,
    agent: Option<&crate::agents::Agent>,
    notes: &mut Vec<String>,
) -> Driver {
    if let Some(d) = requested {
        return d;
    }
    if let Some(a) = agent {
        match (a.definition.driver, a.project) {
            (Some(d), false) => return d,
            (Some(d), true) if d != Driver::Command => notes.push(format!(
                "the definition's driver ({}) is ignored: {} lies in a project folder; name the driver in the request",
                d.as_str(),
                a.definition.source.display()
            )),
            _ => {}
        }
    }
    settings.driver.unwrap_or_default()
}

/// The endpoint the driver's run must reach (from the config only).
pub(crate) fn endpoint(settings: &policy::config::Config, driver: Driver) -> Option<String> {
    let inputs = DriverInputs {
        config: settings.drivers.get(driver)?,
        program: "",
        system_path: "",
        system_text: "",
        tools: None,
        model: None,
        max_turns: None,
        uid0: false,
        temp_dir: "",
        allow: &[],
    };
    Some(policy::driver::invocation(driver, &inputs).ok()??.endpoint)
}

/// A driver's key is named by the config and not set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("drivers.{driver}.api_key_env names {var}, which is not set in the daemon's environment")]
pub struct KeyUnset {
    /// The driver's name.
    pub driver: &'static str,
    /// The daemon's variable the config names.
    pub var: String,
}

/// The model gateway of a `driver` run: the configured endpoint, and the
/// key from the daemon's environment when the config names one; `Ok(None)`
/// for the command driver (or a driver the config does not set up).
pub(crate) fn gateway_setup(
    settings: &policy::config::Config,
    daemon_env: &[(String, String)],
    driver: Driver,
) -> Result<Option<crate::gateway::Setup>, KeyUnset> {
    let Some(config) = settings.drivers.get(driver) else {
        return Ok(None);
    };
    if driver == Driver::Command {
        return Ok(None);
    }
    let Ok(upstream) = policy::driver::upstream(driver, config) else {
        return Ok(None);
    };
    let key = match policy::driver::key_var(driver, config) {
        None => None,
        Some(daemon) => match daemon_env.iter().find(|(k, _)| k == daemon) {
            Some((_, v)) if !v.is_empty() => Some(v.clone()),
            _ => {
                return Err(KeyUnset {
                    driver: driver.as_str(),
                    var: daemon.to_owned(),
                })
            }
        },
    };
    Ok(Some(crate::gateway::Setup { upstream, key }))
}

/// The absolute path of `driver`'s program: the configured `command` if
/// absolute, else that name (or the default) looked up in `path` (the
/// daemon's own PATH), never in the child's.
pub(crate) fn resolve_program(
    driver: Driver,
    config: &policy::driver::DriverConfig,
    path: Option<&std::ffi::OsStr>,
) -> Result<PathBuf, policy::driver::DriverError> {
    let default = match driver {
        Driver::ClaudeCode => "claude",
        _ => "codex",
    };
    let name = config.command.as_deref().unwrap_or(default);
    let executable = |p: &std::path::Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let candidate = std::path::Path::new(name);
    let found = if candidate.is_absolute() {
        Some(candidate.to_path_buf()).filter(|p| executable(p))
    } else if name.contains('/') || name.is_empty() {
        None
    } else {
        path.into_iter()
            .flat_map(std::env::split_paths)
            .filter(|d| d.is_absolute())
            .map(|d| d.join(name))
            .find(|p| executable(p))
    };
    found.ok_or_else(|| policy::driver::DriverError::Program {
        driver: driver.as_str(),
        program: name.to_owned(),
    })
}

/// What [`deliver`] decided: the argv, the variables over the child's
/// environment, whether first_message.md goes on stdin, and the record.
pub(crate) struct Delivered {
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub stdin: bool,
    pub run: DriverRun,
}

/// The run's facts a delivery depends on.
pub(crate) struct RunFacts<'a> {
    pub run_id: &'a str,
    pub context_dir: &'a Path,
    pub temp_dir: &'a Path,
    pub system_text: &'a str,
    pub uid0: bool,
}

/// How the run's context reaches its agent: for a driver, its invocation;
/// for a plain command, its placeholders expanded and, on request,
/// first_message.md on stdin.
pub(crate) fn deliver(
    inner: &Inner,
    plan: &super::accept::Plan,
    stdin_requested: bool,
    f: &RunFacts,
) -> Result<Delivered, EngineError> {
    match plan.driver {
        Driver::Command => Ok(deliver_command(plan, stdin_requested, f)),
        driver => deliver_driver(inner, plan, driver, f),
    }
}

fn show(p: &Path) -> String {
    p.display().to_string()
}

fn deliver_command(plan: &super::accept::Plan, stdin: bool, f: &RunFacts) -> Delivered {
    let values = [
        show(f.context_dir),
        show(&f.context_dir.join("first_message.md")),
        show(&f.context_dir.join("system.md")),
        f.run_id.to_owned(),
    ];
    let values = [&*values[0], &*values[1], &*values[2], &*values[3]];
    let (argv, used) = policy::driver::expand(&plan.command, values);
    let delivered = Delivery {
        stdin: stdin.then(|| "first_message.md".to_owned()),
        argv: used,
    };
    Delivered {
        argv,
        env: BTreeMap::new(),
        stdin,
        run: DriverRun {
            driver: Driver::Command,
            delivered,
            report: None,
            reported_files: None,
            writes_project: None,
        },
    }
}

fn deliver_driver(
    inner: &Inner,
    plan: &super::accept::Plan,
    driver: Driver,
    f: &RunFacts,
) -> Result<Delivered, EngineError> {
    let settings = &inner.cfg.settings;
    gateway_setup(settings, &inner.daemon_env, driver)
        .map_err(|why| EngineError::invalid("driver", why))?;
    let Some(config) = settings.drivers.get(driver) else {
        return Err(EngineError::invalid("driver", "the driver has no settings"));
    };
    let def = plan.agent.as_ref().map(|a| &a.definition);
    let (system, temp) = (show(&f.context_dir.join("system.md")), show(f.temp_dir));
    let program = plan.command.first().map_or("", String::as_str);
    // Checked when the run was planned.
    let allow = policy::sandbox::network::parse_list(&plan.network_allow).unwrap_or_default();
    let inputs = DriverInputs {
        config,
        program,
        system_path: &system,
        system_text: f.system_text,
        tools: plan.tools.as_deref(),
        model: def.and_then(|d| d.model.as_deref()),
        max_turns: def.and_then(|d| d.max_turns),
        uid0: f.uid0,
        temp_dir: &temp,
        allow: &allow,
    };
    let inv = policy::driver::invocation(driver, &inputs)
        .map_err(|e| EngineError::invalid("driver", e.to_string()))?
        .ok_or_else(|| EngineError::invalid("driver", "the driver has no invocation"))?;
    let carries = match driver {
        Driver::ClaudeCode => "system.md (--append-system-prompt-file)",
        _ => "system.md (-c developer_instructions)",
    };
    Ok(Delivered {
        argv: inv.argv,
        env: inv.env,
        stdin: true,
        run: DriverRun {
            driver,
            delivered: Delivery {
                stdin: Some("first_message.md".into()),
                argv: vec![carries.to_owned()],
            },
            report: None,
            reported_files: None,
            writes_project: None,
        },
    })
}

/// The agent's event stream, read from child.log (the runner wrote it
/// with what the child printed: read without following a link, as a
/// regular file, at most its last [`MAX_STREAM_BYTES`]). Blocking.
pub(crate) fn read_report(rec: &RunRecord) -> Option<AgentReport> {
    let run = rec.driver_run.as_ref()?;
    if !run.driver.streams() {
        return None;
    }
    let bytes = subagent_runner::safefile::read_tail(&rec.files().log(), MAX_STREAM_BYTES)
        .unwrap_or_default();
    Some(policy::agentstream::parse(run.driver, &bytes))
}

/// Records the agent's report; a run whose agent reports an error (or
/// only failed writes) is `failed` with that reason, even when it exited
/// 0.
pub(crate) fn apply_report(rec: &mut RunRecord, report: Option<AgentReport>) {
    let (Some(_), Some(report)) = (rec.driver_run.as_ref(), report) else {
        return;
    };
    // An agent's own error says more than its exit code.
    let by_exit = rec.state() == RunState::Failed && rec.exit_code().is_some();
    if rec.state() == RunState::Succeeded || by_exit {
        if let Some(why) = report.failure() {
            rec.reason = Some(match (by_exit, rec.reason.take()) {
                (true, Some(code)) => format!("{why} ({code})"),
                _ => why,
            });
            rec.end_as(EndState::Failed);
        }
    }
    if let Some(run) = rec.driver_run.as_mut() {
        run.report = Some(report);
    }
}

/// Whether the run failed only because every write its agent tried failed:
/// it exited 0 and reported no error of its own.
pub(crate) fn failed_only_by_writes(rec: &RunRecord) -> bool {
    let Some(report) = rec.driver_run.as_ref().and_then(|d| d.report.as_ref()) else {
        return false;
    };
    rec.state() == RunState::Failed
        && rec.exit_code() == Some(0)
        && rec.signal().is_none()
        && !report.is_error
        && report.writes_failed > 0
        && report.writes_ok == 0
}

/// Makes a run [`failed_only_by_writes`] whose project the supervisor saw
/// change `succeeded`: the agent wrote its files another way.
pub(crate) fn rescue(rec: &mut RunRecord) {
    rec.end_as(EndState::Succeeded);
    let why = rec.reason.take().unwrap_or_default();
    rec.notes.push(format!(
        "{why}, yet the supervisor saw the project change (the agent wrote another way): the run succeeded"
    ));
}

/// Checks the files the agent reported written or edited (inside the
/// project, a regular file, changed during the run) and merges those that
/// hold into the session's recent files, for a run that succeeded.
/// Blocking.
pub(crate) fn merge_reported(inner: &Inner, rec: &RunRecord) -> Option<ReportedFiles> {
    let report = rec.driver_run.as_ref()?.report.as_ref()?;
    let note = |why: String| ReportedFiles {
        note: Some(why),
        ..Default::default()
    };
    if let Some(why) = not_merged(rec) {
        return Some(note(why));
    }
    let claimed = report.changed();
    if claimed.is_empty() {
        return Some(note("the agent reported no file written or edited".into()));
    }
    // The stream lists them oldest first; recent files want the newest.
    Some(super::workctx::judge_and_merge(
        inner,
        rec,
        claimed.iter().rev().cloned(),
    ))
}

/// Why a run's reported files are not merged at all: it did not succeed,
/// or it could not write its project (a claim then names another's
/// change).
fn not_merged(rec: &RunRecord) -> Option<String> {
    if rec.state() != RunState::Succeeded {
        return Some(format!("nothing merged: the run {}", rec.state().as_str()));
    }
    let writes = rec.driver_run.as_ref().and_then(|d| d.writes_project);
    (writes == Some(false)).then(|| "not merged: the run could not write its project".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(driver: Option<Driver>, project: bool) -> crate::agents::Agent {
        let text = "---\nname: a\ndescription: d\n---\nBody.\n";
        let mut definition = policy::definition::parse(Path::new("/p/a.md"), text).unwrap();
        definition.driver = driver;
        crate::agents::Agent {
            definition,
            tools: Default::default(),
            warnings: Vec::new(),
            fresh: true,
            project,
        }
    }

    #[test]
    fn a_project_definition_never_picks_the_driver() {
        let mut settings = policy::config::Config::default();
        let mut notes = Vec::new();
        let project = agent(Some(Driver::Codex), true);
        assert_eq!(
            pick(&settings, None, Some(&project), &mut notes),
            Driver::Command
        );
        assert!(
            notes[0].contains("the definition's driver (codex) is ignored"),
            "{notes:?}"
        );
        let user = agent(Some(Driver::Codex), false);
        assert_eq!(
            pick(&settings, None, Some(&user), &mut notes),
            Driver::Codex
        );
        settings.driver = Some(Driver::ClaudeCode);
        assert_eq!(pick(&settings, None, None, &mut notes), Driver::ClaudeCode);
        let requested = Some(Driver::Command);
        assert_eq!(
            pick(&settings, requested, Some(&user), &mut notes),
            Driver::Command
        );
        assert_eq!(notes.len(), 1);
    }

    #[test]
    fn the_program_is_found_in_the_daemons_path_only() {
        let dir = tempfile::tempdir().unwrap();
        let prog = dir.path().join("claude");
        std::fs::write(&prog, "#!/bin/sh\n").unwrap();
        let path = std::ffi::OsString::from(format!("/nonexistent:{}", dir.path().display()));
        let none = policy::driver::DriverConfig::default();
        let found = resolve_program(Driver::ClaudeCode, &none, Some(&path));
        assert!(
            matches!(found, Err(policy::driver::DriverError::Program { .. })),
            "not executable: {found:?}"
        );
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            resolve_program(Driver::ClaudeCode, &none, Some(&path)).unwrap(),
            prog
        );
        assert!(resolve_program(Driver::Codex, &none, Some(&path)).is_err());
        assert!(resolve_program(Driver::ClaudeCode, &none, None).is_err());
        let rel = policy::driver::DriverConfig {
            command: Some("bin/claude".into()),
            ..Default::default()
        };
        assert!(resolve_program(Driver::ClaudeCode, &rel, Some(&path)).is_err());
        let abs = policy::driver::DriverConfig {
            command: Some(prog.display().to_string()),
            ..Default::default()
        };
        assert_eq!(resolve_program(Driver::Codex, &abs, None).unwrap(), prog);
    }

    #[test]
    fn keys_come_from_the_daemons_environment_only() {
        let mut settings = policy::config::Config::default();
        let setup = |s: &policy::config::Config, env: &[(String, String)], d| {
            gateway_setup(s, env, d).map(|g| g.map(|g| (g.upstream.authority(), g.key)))
        };
        assert_eq!(setup(&settings, &[], Driver::ClaudeCode), Ok(None));
        assert_eq!(endpoint(&settings, Driver::ClaudeCode), None);
        settings.drivers.claude_code = Some(policy::driver::DriverConfig {
            api_key_env: Some("K".into()),
            ..Default::default()
        });
        let env = vec![("K".to_owned(), "v".to_owned())];
        assert_eq!(
            setup(&settings, &env, Driver::ClaudeCode),
            Ok(Some(("api.anthropic.com:443".into(), Some("v".into()))))
        );
        let e = setup(
            &settings,
            &[("K".into(), String::new())],
            Driver::ClaudeCode,
        )
        .unwrap_err();
        assert!(e.to_string().contains("names K"), "{e}");
        assert_eq!(setup(&settings, &env, Driver::Command), Ok(None));
        let debug = format!("{:?}", gateway_setup(&settings, &env, Driver::ClaudeCode));
        assert!(
            !debug.contains("\"v\""),
            "the key is never printed: {debug}"
        );
        assert_eq!(
            endpoint(&settings, Driver::ClaudeCode).as_deref(),
            Some("api.anthropic.com:443")
        );
        assert_eq!(endpoint(&settings, Driver::Command), None);
    }

    fn rec(state: RunState, exit: Option<i32>) -> RunRecord {
        let mut r: RunRecord = serde_json::from_value(serde_json::json!({
            "format": 1, "run_id": "20261130T055552.123456Z-a1b2c3d4", "session_id": "s",
            "audience": "team", "project_dir": "/", "task": "t", "context": null,
            "command": ["x"], "env": {}, "limits": {}, "keep_temp": false,
            "state": state, "exit_code": exit, "signal": null, "reason": "exited with code 1",
            "cancel_requested": false, "created_at_ms": 1, "started_at_ms": 2,
            "ended_at_ms": 3, "temp_dir": "/tmp/x", "run_dir": "/state/r",
            "runner_pid": null, "runner_start_ticks": null, "log_truncated": false,
            "finalized": false, "finalize_error": null
        }))
        .unwrap();
        r.driver_run = Some(DriverRun {
            driver: Driver::ClaudeCode,
            delivered: Delivery::default(),
            report: None,
            reported_files: None,
            writes_project: None,
        });
        r
    }

    #[test]
    fn the_agents_own_error_fails_a_run_and_never_rescues_one() {
        let error = AgentReport {
            is_error: true,
            error: Some("API Error: 400".into()),
            ..Default::default()
        };
        let mut ok = rec(RunState::Succeeded, Some(0));
        apply_report(&mut ok, Some(error.clone()));
        assert_eq!(ok.state(), RunState::Failed);
        assert_eq!(
            ok.reason.as_deref(),
            Some("the agent reported an error: \"API Error: 400\"")
        );
        let mut exited = rec(RunState::Failed, Some(1));
        apply_report(&mut exited, Some(error.clone()));
        assert_eq!(
            exited.reason.as_deref(),
            Some("the agent reported an error: \"API Error: 400\" (exited with code 1)")
        );
        let mut cancelled = rec(RunState::Cancelled, None);
        apply_report(&mut cancelled, Some(error));
        assert_eq!(cancelled.state(), RunState::Cancelled);
        let mut failed = rec(RunState::Failed, Some(1));
        apply_report(&mut failed, Some(AgentReport::default()));
        assert_eq!(
            failed.state(),
            RunState::Failed,
            "a clean report never makes a run succeed"
        );
        assert!(failed.driver_run.unwrap().report.is_some());
    }

    #[test]
    fn reported_files_merge_only_for_a_run_that_could_write() {
        let mut r = rec(RunState::Succeeded, Some(0));
        assert_eq!(not_merged(&r), None, "an older record merges as before");
        if let Some(d) = r.driver_run.as_mut() {
            d.writes_project = Some(false);
        }
        assert_eq!(
            not_merged(&r).as_deref(),
            Some("not merged: the run could not write its project")
        );
        if let Some(d) = r.driver_run.as_mut() {
            d.writes_project = Some(true);
        }
        assert_eq!(not_merged(&r), None);
        r.end_as(crate::record::EndState::Failed);
        assert_eq!(
            not_merged(&r).as_deref(),
            Some("nothing merged: the run failed")
        );
    }

    #[test]
    fn only_a_run_failed_by_its_writes_alone_can_be_rescued() {
        let writes = AgentReport {
            writes_failed: 2,
            ..Default::default()
        };
        let mut r = rec(RunState::Succeeded, Some(0));
        apply_report(&mut r, Some(writes.clone()));
        assert!(failed_only_by_writes(&r));
        rescue(&mut r);
        assert_eq!(r.state(), RunState::Succeeded);
        assert_eq!(r.reason, None);
        assert!(r.notes[0].starts_with("every write the agent tried failed"));
        let mut exited = rec(RunState::Failed, Some(1));
        apply_report(&mut exited, Some(writes));
        assert!(!failed_only_by_writes(&exited), "its exit code failed it");
        let mut error = rec(RunState::Succeeded, Some(0));
        let report = AgentReport {
            is_error: true,
            writes_failed: 1,
            ..Default::default()
        };
        apply_report(&mut error, Some(report));
        assert!(!failed_only_by_writes(&error));
    }

    #[test]
    fn the_delivery_is_said_plainly() {
        assert!(Delivery::default().describe().starts_with("files only"));
        let d = Delivery {
            stdin: Some("first_message.md".into()),
            argv: vec!["{system}".into()],
        };
        assert!(d
            .describe()
            .starts_with("first_message.md on stdin; argv: {system}"));
    }
}
