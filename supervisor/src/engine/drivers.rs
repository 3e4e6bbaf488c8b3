//! The configured drivers: which one a spawn gets, the endpoint its run
//! must reach, its model gateway's setup (the key kept in the daemon,
//! never in the run), and its program. May use agents, gateway and
//! policy; nothing of the engine's state.

use policy::driver::{Driver, DriverInputs};
use std::path::PathBuf;

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
        max_budget_usd: None,
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

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
}
