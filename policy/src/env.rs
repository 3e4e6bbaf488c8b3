//! The child's environment: an allowlist, never the daemon's environment.
//!
//! A child starts with only: PATH, LANG, LC_*, TZ and TERM taken from the
//! daemon's environment; HOME and TMPDIR set to its temp_dir; the request's
//! own entries; and the SUBAGENT_* variables naming its run and directories.

use std::collections::BTreeMap;

/// The variables passed through from the daemon's environment by exact name.
pub const PASSTHROUGH: &[&str] = &["PATH", "LANG", "TZ", "TERM"];
/// The prefix of locale variables passed through (LC_ALL, LC_CTYPE, ...).
pub const PASSTHROUGH_PREFIX: &str = "LC_";
/// PATH used when the daemon itself has none.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// Variables a request may not set, because the supervisor sets them.
pub const RESERVED: &[&str] = &["HOME", "TMPDIR"];
/// Prefix of the supervisor's own variables, which a request may not set.
pub const RESERVED_PREFIX: &str = "SUBAGENT_";

/// The run's identity and directories, as the child sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildPaths {
    /// SUBAGENT_RUN_ID.
    pub run_id: String,
    /// SUBAGENT_SESSION_ID.
    pub session_id: String,
    /// SUBAGENT_TEMP_DIR, also HOME and TMPDIR.
    pub temp_dir: String,
    /// SUBAGENT_ARTIFACT_DIR.
    pub artifact_dir: String,
    /// SUBAGENT_LOG_PATH.
    pub log_path: String,
    /// SUBAGENT_CONTEXT_DIR.
    pub context_dir: String,
    /// SUBAGENT_DELTA_PATH.
    pub delta_path: String,
}

/// A request's `env` entry that cannot be given to a child.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// The name is empty or holds `=` or NUL.
    #[error("env: invalid variable name {0:?}")]
    InvalidName(String),
    /// The value holds a NUL byte.
    #[error("env.{0}: value contains a NUL byte")]
    InvalidValue(String),
    /// The supervisor sets this variable itself.
    #[error("env.{0}: reserved, the supervisor sets it")]
    Reserved(String),
}

/// Checks a request's `env` entries without building anything.
pub fn validate_request_env(request: &BTreeMap<String, String>) -> Result<(), EnvError> {
    for (name, value) in request {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(EnvError::InvalidName(name.clone()));
        }
        if value.contains('\0') {
            return Err(EnvError::InvalidValue(name.clone()));
        }
        if RESERVED.contains(&name.as_str()) || name.starts_with(RESERVED_PREFIX) {
            return Err(EnvError::Reserved(name.clone()));
        }
    }
    Ok(())
}

fn passes_through(name: &str, extra: &[String]) -> bool {
    PASSTHROUGH.contains(&name)
        || name.starts_with(PASSTHROUGH_PREFIX)
        || extra.iter().any(|a| match a.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => a == name,
        })
}

/// Computes the child's whole environment, sorted by name.
///
/// `daemon_env` is the daemon's own environment; only the allowlisted names
/// (plus the operator's `extra_allow`: names, or prefixes ending in `*`)
/// are taken from it. Request entries override passed-through ones; the
/// supervisor's variables override everything.
pub fn child_env(
    daemon_env: &[(String, String)],
    extra_allow: &[String],
    request: &BTreeMap<String, String>,
    paths: &ChildPaths,
) -> Result<BTreeMap<String, String>, EnvError> {
    validate_request_env(request)?;
    let mut env: BTreeMap<String, String> = daemon_env
        .iter()
        .filter(|(name, _)| passes_through(name, extra_allow))
        .cloned()
        .collect();
    env.entry("PATH".to_owned())
        .or_insert_with(|| DEFAULT_PATH.to_owned());
    env.extend(request.iter().map(|(k, v)| (k.clone(), v.clone())));
    let own = [
        ("HOME", &paths.temp_dir),
        ("TMPDIR", &paths.temp_dir),
        ("SUBAGENT_RUN_ID", &paths.run_id),
        ("SUBAGENT_SESSION_ID", &paths.session_id),
        ("SUBAGENT_TEMP_DIR", &paths.temp_dir),
        ("SUBAGENT_ARTIFACT_DIR", &paths.artifact_dir),
        ("SUBAGENT_LOG_PATH", &paths.log_path),
        ("SUBAGENT_CONTEXT_DIR", &paths.context_dir),
        ("SUBAGENT_DELTA_PATH", &paths.delta_path),
    ];
    for (name, value) in own {
        env.insert(name.to_owned(), value.clone());
    }
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths() -> ChildPaths {
        ChildPaths {
            run_id: "r1".into(),
            session_id: "s1".into(),
            temp_dir: "/tmp/t".into(),
            artifact_dir: "/state/a".into(),
            log_path: "/state/child.log".into(),
            context_dir: "/state/context".into(),
            delta_path: "/state/delta/delta.json".into(),
        }
    }

    fn daemon() -> Vec<(String, String)> {
        [
            ("PATH", "/usr/bin"),
            ("LANG", "C.UTF-8"),
            ("LC_ALL", "C"),
            ("TZ", "UTC"),
            ("TERM", "xterm"),
            ("SECRET_TOKEN", "hunter2"),
            ("HOME", "/root"),
            ("SSH_AUTH_SOCK", "/run/ssh"),
            ("LD_PRELOAD", "/evil.so"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    #[test]
    fn only_allowlisted_daemon_variables_pass() {
        let env = child_env(&daemon(), &[], &BTreeMap::new(), &paths()).unwrap();
        let names: Vec<&str> = env.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "HOME",
                "LANG",
                "LC_ALL",
                "PATH",
                "SUBAGENT_ARTIFACT_DIR",
                "SUBAGENT_CONTEXT_DIR",
                "SUBAGENT_DELTA_PATH",
                "SUBAGENT_LOG_PATH",
                "SUBAGENT_RUN_ID",
                "SUBAGENT_SESSION_ID",
                "SUBAGENT_TEMP_DIR",
                "TERM",
                "TMPDIR",
                "TZ"
            ]
        );
        assert_eq!(env["HOME"], "/tmp/t");
        assert_eq!(env["TMPDIR"], "/tmp/t");
        assert_eq!(env["PATH"], "/usr/bin");
    }

    #[test]
    fn request_entries_are_added_and_override_passthrough() {
        let req: BTreeMap<String, String> = [
            ("PATH".to_string(), "/opt/bin".to_string()),
            ("MODEL".to_string(), "m1".to_string()),
        ]
        .into_iter()
        .collect();
        let env = child_env(&daemon(), &[], &req, &paths()).unwrap();
        assert_eq!(env["PATH"], "/opt/bin");
        assert_eq!(env["MODEL"], "m1");
    }

    #[test]
    fn the_operator_can_allow_more_names() {
        let extra = vec!["SECRET_TOKEN".to_owned(), "SSH_*".to_owned()];
        let env = child_env(&daemon(), &extra, &BTreeMap::new(), &paths()).unwrap();
        assert_eq!(env["SECRET_TOKEN"], "hunter2");
        assert_eq!(env["SSH_AUTH_SOCK"], "/run/ssh");
        assert!(!env.contains_key("LD_PRELOAD"));
    }

    #[test]
    fn default_path_when_daemon_has_none() {
        let env = child_env(&[], &[], &BTreeMap::new(), &paths()).unwrap();
        assert_eq!(env["PATH"], DEFAULT_PATH);
    }

    #[test]
    fn reserved_and_malformed_names_are_refused() {
        for (name, want) in [
            ("HOME", EnvError::Reserved("HOME".into())),
            (
                "SUBAGENT_RUN_ID",
                EnvError::Reserved("SUBAGENT_RUN_ID".into()),
            ),
            ("A=B", EnvError::InvalidName("A=B".into())),
            ("", EnvError::InvalidName(String::new())),
        ] {
            let req: BTreeMap<String, String> = [(name.to_string(), "x".to_string())].into();
            assert_eq!(child_env(&daemon(), &[], &req, &paths()), Err(want));
        }
        let req: BTreeMap<String, String> = [("A".to_string(), "x\0y".to_string())].into();
        assert_eq!(
            validate_request_env(&req),
            Err(EnvError::InvalidValue("A".into()))
        );
    }
}
