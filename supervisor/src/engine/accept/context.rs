//! The run's context at spawn: the session's working context and git
//! snapshot, the first picture of its work dir, and the composed context
//! files. May use the engine's state, config, errors, draft and
//! instructions, gitsnap, observe, protocol and policy.

use super::place::RunPlace;
use super::plan::Plan;
use crate::engine::config::daemon_skip;
use crate::engine::draft::create_file;
use crate::engine::error::{EngineError, StorageError};
use crate::engine::state::Inner;
use crate::protocol::SpawnParams;
use policy::rights::Requester;
use policy::workctx::GitSnapshot;
use std::path::Path;
use subagent_runner::ioerr::at;

/// What the child is told of where it works.
pub(super) struct WorkingContext {
    /// The `[working-context]` block of its first message.
    pub(super) block: String,
    /// The git snapshot the block shows (kept in the record).
    pub(super) git: policy::workctx::GitSnapshot,
    /// The status's paths and HEAD with it, for the first picture.
    pub(super) status: crate::gitsnap::counts::Listing,
    /// The session's state with this spawn in it, recorded with the run.
    pub(super) session: crate::sessions::SessionState,
}

/// The session's working context with the spawn in it (refused when the
/// session is not `who`'s; recorded with the run) and the git snapshot of
/// where the child will work. Blocking.
pub(super) fn working_context(
    inner: &Inner,
    p: &SpawnParams,
    workdir: &Path,
    who: Option<&Requester>,
) -> Result<WorkingContext, EngineError> {
    let existing = inner.store.session(&p.session.id)?;
    let session = crate::sessions::on_spawn(
        &p.session.id,
        existing,
        &p.session.project_dir,
        p.session.recent_files.as_deref(),
        who,
    )?;
    let (git, status) = crate::gitsnap::snapshot_with_paths(workdir, inner.cfg.git_budget, None);
    let block = policy::workctx::render_block(workdir, &session.recent_files, &git);
    Ok(WorkingContext {
        block,
        git,
        status,
        session,
    })
}

/// What the composition of this run's context depends on (kept in the
/// runner spec, so that a restart can compose it again with a handoff
/// note).
pub(super) fn compose_input(
    inner: &Inner,
    p: &SpawnParams,
    plan: &Plan,
    place: &RunPlace,
    tools_json: String,
    working_context: String,
) -> policy::compose::ComposeInput {
    let settings = &inner.cfg.settings;
    let playbook = settings
        .rules_file
        .as_ref()
        .map(|path| policy::compose::Sourced {
            path: path.clone(),
            text: std::fs::read_to_string(path).unwrap_or_default(),
        });
    let tools = plan
        .tools
        .iter()
        .flatten()
        .filter_map(|n| inner.tools.tool(n))
        .map(|t| (t.name.clone(), t.description.clone()))
        .collect();
    let max_restarts = p
        .max_restarts
        .or(settings.max_restarts)
        .unwrap_or(policy::DEFAULT_MAX_RESTARTS);
    policy::compose::ComposeInput {
        playbook,
        project_instructions: crate::engine::instructions::project_instructions(&place.workdir),
        agent: plan.agent.as_ref().map(|a| policy::compose::Sourced {
            path: a.definition.source.clone(),
            text: a.definition.body.clone(),
        }),
        tools,
        tools_json,
        paths: policy::compose::SessionPaths {
            session_id: p.session.id.clone(),
            temp_dir: place.temp_dir.clone(),
            artifact_dir: place.files.artifacts(),
            worktree_dir: place.worktree.as_ref().map(|w| w.dir.clone()),
            log_path: place.files.log(),
            delta_path: place.files.delta(),
        },
        task: p.task.clone(),
        context: p.context.clone(),
        working_context,
        caps: settings.context,
        max_attempts: 1 + max_restarts,
    }
}

/// Composes the first attempt's context and writes it into `context_dir`:
/// system.md, first_message.md, tools.json, plan.json and plan-1.json.
pub(super) fn write_context_files(
    context_dir: &Path,
    input: &policy::compose::ComposeInput,
) -> Result<String, EngineError> {
    let composed = policy::compose::compose(input, 1, None);
    for (name, bytes) in [
        ("system.md", composed.system_md.as_bytes()),
        ("first_message.md", composed.first_message_md.as_bytes()),
        ("tools.json", input.tools_json.as_bytes()),
        ("plan.json", composed.plan_json.as_bytes()),
    ] {
        // Composed again from the runner spec's inputs: not fsynced.
        create_file(&context_dir.join(name), bytes)?;
    }
    // The first attempt's plan: a second name for plan.json's file (a
    // restart replaces plan.json and leaves this one).
    let plan_1 = context_dir.join("plan-1.json");
    std::fs::hard_link(context_dir.join("plan.json"), &plan_1)
        .map_err(|e| EngineError::StateDir(StorageError::Io(at("link", &plan_1)(e))))?;
    Ok(composed.system_md)
}

/// The first picture of what a run's `workdir` holds (see
/// [`crate::observe`]), taken with the spawn's git snapshot; none when the
/// run cannot write there. Blocking.
pub(crate) fn observe_before(
    inner: &Inner,
    workdir: &Path,
    writable: bool,
    git: (&GitSnapshot, crate::gitsnap::counts::Listing),
) -> crate::observe::Before {
    if !writable {
        return crate::observe::Before::No {
            why: "not observed: the run could not write its project".into(),
        };
    }
    crate::observe::before(
        workdir,
        git,
        &daemon_skip(&inner.cfg, workdir),
        inner.cfg.git_budget,
    )
}
