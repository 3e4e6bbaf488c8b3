//! How the run's context reaches its agent: a driver's argv and env, or
//! a plain command's placeholders and stdin. May use the engine's state,
//! errors and drivers, the run's data, protocol and policy.

use super::place::RunPlace;
use super::plan::Plan;
use crate::engine::drivers::gateway_setup;
use crate::engine::error::EngineError;
use crate::engine::state::Inner;
use crate::protocol::SpawnParams;
use crate::run::driver::{Delivery, DriverRun};
use policy::driver::{Driver, DriverInputs};
use std::collections::BTreeMap;
use std::path::Path;

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
    plan: &Plan,
    stdin_requested: bool,
    f: &RunFacts,
) -> Result<Delivered, EngineError> {
    match plan.driver {
        Driver::Command => Ok(deliver_command(plan, stdin_requested, f)),
        driver => deliver_driver(inner, plan, driver, f),
    }
}

pub(super) fn show(p: &Path) -> String {
    p.display().to_string()
}

pub(super) fn deliver_command(plan: &Plan, stdin: bool, f: &RunFacts) -> Delivered {
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
            budget: None,
        },
    }
}

pub(super) fn deliver_driver(
    inner: &Inner,
    plan: &Plan,
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
        max_turns: plan.budget.and_then(|b| b.max_turns),
        max_budget_usd: plan.budget.and_then(|b| b.max_budget_usd),
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
            budget: plan.budget,
        },
    })
}

/// The plan with the argv its delivery makes (a driver's, or a command's
/// placeholders expanded), and the delivery.
pub(super) fn with_delivery(
    inner: &Inner,
    p: &SpawnParams,
    plan: &Plan,
    place: &RunPlace,
    uid: Option<u32>,
    system_text: &str,
) -> Result<(Plan, super::deliver::Delivered), EngineError> {
    let run_id = place.id.to_string();
    let facts = RunFacts {
        run_id: &run_id,
        context_dir: &place.files.context(),
        temp_dir: &place.temp_dir,
        system_text,
        uid0: child_is_root(inner, uid),
    };
    let delivered = deliver(inner, plan, p.stdin.is_some(), &facts)?;
    let mut plan = plan.clone();
    plan.command.clone_from(&delivered.argv);
    Ok((plan, delivered))
}

/// Whether the agent runs as uid 0: with no uid of its own and no
/// `run_as` user, it runs as the daemon does.
pub(super) fn child_is_root(inner: &Inner, uid: Option<u32>) -> bool {
    match (uid, inner.cfg.run_as) {
        (Some(u), _) => u == 0,
        (None, Some(r)) => r.uid == 0,
        // SAFETY: geteuid cannot fail and touches no memory.
        (None, None) => unsafe { libc::geteuid() == 0 },
    }
}
