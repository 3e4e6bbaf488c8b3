//! Restart with handoff: a child that exits 75 ("I ran out of room;
//! continue me") is started again under the same run, with a context
//! composed afresh that carries its handoff note.

use crate::spec::RestartSpec;
use policy::compose::{compose, ComposeInput};
use std::path::PathBuf;

/// The next attempt's context could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum RestartError {
    /// The runner spec names neither the inputs nor a file of them.
    #[error("the runner spec has no composition inputs")]
    NoInputs,
    /// The inputs' file could not be read.
    #[error("read {}: {source}", path.display())]
    ReadInputs {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The inputs' file holds no inputs.
    #[error("parse {}: {source}", path.display())]
    ParseInputs {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: serde_json::Error,
    },
    /// A context file could not be written.
    #[error(transparent)]
    Write(#[from] crate::atomic::AtomicError),
    /// A context file could not be shared with the run's group.
    #[error("{op} {}: {source}", path.display())]
    Share {
        /// `chown` or `chmod`.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// The exit code that asks for a restart.
pub const EXIT_CONTINUE: i32 = policy::compose::EXIT_CONTINUE;
/// The largest handoff note read.
pub const MAX_HANDOFF_BYTES: u64 = 64 * 1024;

/// Records the attempt in progress (for the status); best effort, and not
/// durable: it only informs a status read while the run is alive. Nothing
/// is written for the first attempt, which a missing file means.
pub fn record_attempt(r: &RestartSpec, attempt: u32) {
    if attempt <= 1 {
        return;
    }
    let text = format!(
        "{{\"attempt\": {attempt}, \"max_attempts\": {}}}\n",
        r.max_attempts
    );
    let _ = crate::atomic::write_replace(&r.attempt_file, text.as_bytes());
}

fn write(r: &RestartSpec, name: &str, text: &str) -> Result<(), RestartError> {
    let path = r.context_dir.join(name);
    crate::atomic::write_atomic(&path, text.as_bytes())?;
    if let Some(gid) = r.share_gid {
        let share = |op| {
            let path = path.clone();
            move |source| RestartError::Share { op, path, source }
        };
        std::os::unix::fs::chown(&path, None, Some(gid)).map_err(share("chown"))?;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o640))
            .map_err(share("chmod"))?;
    }
    Ok(())
}

/// Composes the context of `attempt` from the recorded inputs and the
/// child's handoff note (read by the caller from the run's scratch file
/// system), and writes it into the context dir.
pub fn prepare_next(
    r: &RestartSpec,
    attempt: u32,
    handoff: Option<&str>,
) -> Result<(), RestartError> {
    let input: ComposeInput = match (&r.compose, &r.compose_input) {
        (Some(c), _) => c.clone(),
        (None, Some(path)) => {
            let bytes = std::fs::read(path).map_err(|source| RestartError::ReadInputs {
                path: path.clone(),
                source,
            })?;
            serde_json::from_slice(&bytes).map_err(|source| RestartError::ParseInputs {
                path: path.clone(),
                source,
            })?
        }
        (None, None) => return Err(RestartError::NoInputs),
    };
    let c = compose(&input, attempt, handoff);
    write(r, "system.md", &c.system_md)?;
    write(r, "first_message.md", &c.first_message_md)?;
    write(r, &format!("plan-{attempt}.json"), &c.plan_json)?;
    write(r, "plan.json", &c.plan_json)
}

#[cfg(test)]
mod tests {
    use super::*;
    use policy::compose::{Caps, SessionPaths};
    use std::path::Path;

    fn input(dir: &Path) -> ComposeInput {
        ComposeInput {
            playbook: None,
            project_instructions: None,
            agent: None,
            tools: vec![],
            tools_json: "[]".into(),
            paths: SessionPaths {
                session_id: "s".into(),
                temp_dir: dir.join("tmp"),
                artifact_dir: dir.join("artifacts"),
                worktree_dir: None,
                log_path: dir.join("child.log"),
                delta_path: dir.join("delta/delta.json"),
            },
            task: "the task".into(),
            context: None,
            working_context: "[working-context]\n".into(),
            caps: Caps::default(),
            max_attempts: 3,
        }
    }

    fn spec(dir: &Path, ctx: &str) -> RestartSpec {
        std::fs::create_dir_all(dir.join(ctx)).unwrap();
        std::fs::create_dir_all(dir.join("artifacts")).unwrap();
        RestartSpec {
            max_attempts: 3,
            compose: None,
            compose_input: None,
            context_dir: dir.join(ctx),
            artifact_dir: dir.join("artifacts"),
            attempt_file: dir.join("attempt.json"),
            share_gid: None,
        }
    }

    #[test]
    fn inline_inputs_and_an_older_runners_compose_json_compose_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let mut inline = spec(d, "ctx-inline");
        inline.compose = Some(input(d));
        // A spec written by a daemon before the inputs moved into it
        // names a compose.json instead.
        let mut older = spec(d, "ctx-older");
        std::fs::write(
            d.join("compose.json"),
            serde_json::to_vec(&input(d)).unwrap(),
        )
        .unwrap();
        older.compose_input = Some(d.join("compose.json"));
        prepare_next(&inline, 2, None).unwrap();
        prepare_next(&older, 2, None).unwrap();
        for f in ["system.md", "first_message.md", "plan.json", "plan-2.json"] {
            let a = std::fs::read(d.join("ctx-inline").join(f)).unwrap();
            assert!(!a.is_empty(), "{f}");
            assert_eq!(
                a,
                std::fs::read(d.join("ctx-older").join(f)).unwrap(),
                "{f}"
            );
        }
        // Neither: refused with a reason.
        let none = spec(d, "ctx-none");
        let e = prepare_next(&none, 2, None).unwrap_err();
        assert!(matches!(e, RestartError::NoInputs), "{e:?}");
        assert_eq!(e.to_string(), "the runner spec has no composition inputs");
    }
}
