//! Accepting a spawn: checking its params, then recording the run durably
//! (folder, temp dir, its row and runner spec in the store) before anyone
//! is told its id.
//! A failure part-way removes what was made.
//!
//! The parts, in order: [`validate`] the params, [`plan`] what they
//! resolve to, the [`place`] where the run lives, its [`context`], its
//! [`deliver`]y, its [`sandbox`] and runner spec, and its run [`folder`].
//! The parts use nothing of this module; it uses them.

pub mod context;
pub mod deliver;
pub mod folder;
pub mod place;
pub mod plan;
pub mod sandbox;
pub mod validate;

use crate::engine::draft::RunDraft;
use crate::engine::error::{EngineError, InternalError};
use crate::engine::launch::Launched;
use crate::engine::state::Inner;
use crate::ids::RunId;
use crate::protocol::SpawnParams;
use crate::run::record::RunRecord;
use crate::store::Op;
use crate::uids::UidLease;
use context::{compose_input, observe_before, working_context, write_context_files};
use deliver::with_delivery;
use folder::{accepted_record, handed_files, lease_uid, publish, writes_into};
use plan::Plan;
use policy::rights::{OnBehalf, Requester};
use policy::sandbox::network::NetworkMode;
use sandbox::{check_writable_roots, limit_for_requester, runner_spec};

/// A run just recorded.
pub(crate) struct Created {
    /// Its record, as accepted.
    pub rec: RunRecord,
    /// Its uid lease, while no runner holds it.
    pub lease: Option<UidLease>,
    /// Its runner, when it was started at once (gate open).
    pub runner: Option<Launched>,
    /// Its runner spec, as committed: a queued run is launched from it.
    pub spec: Vec<u8>,
}

/// Records a new run: leases its uid (root daemons), makes its temp dir
/// (and worktree), writes its folder (context files) under a draft name,
/// commits its row and runner spec and renames the folder to the run id. With
/// `start_now` the runner is started while the records are made durable,
/// and let go once they are. What was made is removed if any step fails.
/// Blocking.
pub(crate) fn create_run(
    inner: &Inner,
    p: &SpawnParams,
    plan: &Plan,
    start_now: bool,
    on_behalf: Option<&OnBehalf>,
) -> Result<Created, EngineError> {
    check_writable_roots(inner, p, plan)?;
    let session = &p.session.id;
    let mut draft = RunDraft::begin(
        &inner.layout.drafts(),
        inner.layout.runs_dir(session),
        RunId::new(),
        lease_uid(inner)?,
    )?;
    let place = place::make(inner, p, &mut draft)?;
    let mut work = working_context(inner, p, &place.workdir, on_behalf.map(|o| &o.requester))?;
    let writable = writes_into(plan, p, &place.workdir);
    let before = observe_before(
        inner,
        &place.workdir,
        writable,
        (&work.git, std::mem::take(&mut work.status)),
    );
    let tools_json = inner
        .tools
        .tools_json(plan.tools.as_deref().unwrap_or_default());
    let input = compose_input(inner, p, plan, &place, tools_json, work.block);
    let staged = draft.staged();
    let system_text = write_context_files(&staged.context(), &input)?;
    // Only an observation depends on it: not fsynced (a lost one says so).
    let before = serde_json::to_vec(&before)
        .map_err(|e| EngineError::Unexpected(InternalError::Encode(e)))?;
    draft.write(&staged.observed_before(), &before)?;
    let max_attempts = input.max_attempts;
    let (plan, mut delivered) = with_delivery(inner, p, plan, &place, draft.uid(), &system_text)?;
    delivered.run.writes_project = Some(writable);
    let plan = &plan;
    let mut spec = runner_spec(inner, p, plan, &place, input, draft.uid(), &delivered)?;
    if let Some(ob) = on_behalf {
        limit_for_requester(&mut spec.sandbox, p, &place, &ob.requester);
    }
    // Compact: only the runner reads it (about 15 KB pretty-printed).
    let bytes =
        serde_json::to_vec(&spec).map_err(|e| EngineError::Unexpected(InternalError::Encode(e)))?;
    let mut rec = accepted_record(
        p,
        plan,
        place,
        work.git,
        max_attempts,
        draft.uid(),
        delivered.run,
    )?;
    rec.on_behalf = on_behalf.cloned();
    rec.backend = Some(crate::run::placement::Placement::new(
        inner.cfg.backend().kind,
    ));
    // The store holds the only durable copy; a runner gets it in a memfd.
    let handed = start_now.then(|| handed_files(&draft, &bytes)).flatten();
    let accept = Op::Accept {
        rec: Box::new(rec.clone()),
        spec: bytes.clone(),
        before: Some(before),
        session: work.session,
    };
    let egress = plan.network == NetworkMode::Allowlist;
    // Checked by `deliver`: a key named and not set refused the spawn.
    let gateway =
        crate::engine::drivers::gateway_setup(&inner.cfg.settings, &inner.daemon_env, plan.driver)
            .ok()
            .flatten();
    let (lease, runner) = publish(inner, draft, accept, handed, egress, gateway)?;
    Ok(Created {
        rec,
        lease,
        runner,
        spec: bytes,
    })
}

/// Plans and records a spawn whose params were checked: the rights its
/// requester must hold, the driver's key, the host's mechanisms, then the
/// run folder. Blocking.
pub(crate) fn accept(
    inner: &Inner,
    params: &SpawnParams,
    requester: Option<Requester>,
    start_now: bool,
) -> Result<Created, EngineError> {
    let plan = plan::plan(&inner.tools, &inner.cfg.settings, params)?;
    let on_behalf = requester.map(|who| plan::on_behalf(who, params, &plan));
    if let Some(ob) = &on_behalf {
        crate::rights::check(&ob.requester, &ob.needs)?;
    }
    crate::engine::drivers::gateway_setup(&inner.cfg.settings, &inner.daemon_env, plan.driver)
        .map_err(|why| EngineError::invalid("driver", why))?;
    validate::check_required(&inner.probe, &inner.cfg.required(plan.grants.network))?;
    validate::check_backend(
        inner.cfg.backend().kind,
        inner.services.is_some(),
        plan.network,
        plan.driver,
    )?;
    create_run(inner, params, &plan, start_now, on_behalf.as_ref())
}
