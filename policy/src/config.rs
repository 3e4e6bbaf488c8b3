//! The config file (`subagentd.toml`), parsed from its text: the loader
//! does no I/O. Unknown keys and wrong types are errors with the line and
//! column. docs/config.md documents every key.

use crate::sandbox::Mechanism;
use crate::{Audience, Limits};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The daemon's configuration; every key optional.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Run children as this unprivileged user: `"USER"` or `"UID:GID"`
    /// (root daemons only).
    #[serde(default)]
    pub run_as: Option<String>,
    /// The uids a root daemon gives its runs, one each: `"FIRST-LAST"`
    /// (default 2130706432-2130771967; no user or group of the host may
    /// have an id in it).
    #[serde(default)]
    pub uid_range: Option<String>,
    /// The mechanisms that must hold for a run to start. Default:
    /// landlock, seccomp, capability_drop, and network_isolation (which
    /// applies to runs without network only).
    #[serde(default)]
    pub require: Option<Vec<Mechanism>>,
    /// At most this many runs at once (default: 2 × CPU cores).
    #[serde(default)]
    pub max_concurrent: Option<usize>,
    /// The agent program's argv when neither the request nor the subagent
    /// definition gives one.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// Default limits per audience (`[limits.team]`); a request's or a
    /// definition's own limits win.
    #[serde(default)]
    pub limits: BTreeMap<Audience, Limits>,
    /// More variables passed through from the daemon's environment: exact
    /// names, or prefixes ending in `*`.
    #[serde(default)]
    pub env_allow: Vec<String>,
    /// Extra read-only roots for every run (absolute, existing).
    #[serde(default)]
    pub read_paths: Vec<PathBuf>,
    /// Extra writable roots for every run (absolute, existing).
    #[serde(default)]
    pub write_paths: Vec<PathBuf>,
    /// The operator's own tools (`[[tools]]`: name, description, class,
    /// schema), added to the catalog.
    #[serde(default)]
    pub tools: Vec<crate::tools::Tool>,
    /// Audience tool sets (`[audiences.team] tools = [...]`), replacing the
    /// defaults.
    #[serde(default)]
    pub audiences: BTreeMap<Audience, AudienceConfig>,
    /// The operator's playbook, injected after the built-in operating rules.
    #[serde(default)]
    pub rules_file: Option<PathBuf>,
    /// Restarts after exit 75 (default 3); a spawn's own value wins.
    #[serde(default)]
    pub max_restarts: Option<u32>,
    /// Caps on the composed context (`[context]`).
    #[serde(default)]
    pub context: crate::compose::Caps,
    /// More uids allowed on the control socket (the daemon's own uid and
    /// root always are).
    #[serde(default)]
    pub allow_uids: Vec<u32>,
    /// At most this many connections served at once (default 256).
    #[serde(default)]
    pub max_connections: Option<usize>,
    /// A connection with nothing in flight, no subscription and no request
    /// for this long is closed (default 600).
    #[serde(default)]
    pub idle_timeout_s: Option<u64>,
}

/// One audience's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AudienceConfig {
    /// The tools the audience may hold.
    pub tools: Vec<String>,
}

/// The config text is not a valid config.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {message}")]
pub struct ConfigError {
    /// 1-based line of the problem (0 when unknown).
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// Parses config text.
pub fn parse(text: &str) -> Result<Config, ConfigError> {
    let config: Config = toml::from_str(text).map_err(|e| {
        let (line, column) = e.span().map_or((0, 0), |s| line_col(text, s.start));
        ConfigError {
            line,
            column,
            message: e.message().trim().to_owned(),
        }
    })?;
    let at = |key: &str| line_col(text, text.find(key).unwrap_or(0));
    for (key, paths) in [
        ("read_paths", &config.read_paths),
        ("write_paths", &config.write_paths),
    ] {
        if let Some(p) = paths.iter().find(|p| !p.is_absolute()) {
            let (line, column) = at(key);
            return Err(ConfigError {
                line,
                column,
                message: format!("{key}: {} is not an absolute path", p.display()),
            });
        }
    }
    for (audience, limits) in &config.limits {
        if let Err((field, why)) = limits.validate() {
            let (line, column) = at(&format!("limits.{}", audience.as_str()));
            return Err(ConfigError {
                line,
                column,
                message: format!("limits.{}.{field}: {why}", audience.as_str()),
            });
        }
    }
    if let Err(e) = config.tool_policy() {
        let (line, column) = at("tools");
        return Err(ConfigError {
            line,
            column,
            message: e.to_string(),
        });
    }
    if config.command.as_ref().is_some_and(|c| c.is_empty()) {
        let (line, column) = at("command");
        return Err(ConfigError {
            line,
            column,
            message: "command must not be empty".into(),
        });
    }
    if config.max_restarts.is_some_and(|n| n > crate::MAX_RESTARTS) {
        let (line, column) = at("max_restarts");
        return Err(ConfigError {
            line,
            column,
            message: format!("max_restarts must be at most {}", crate::MAX_RESTARTS),
        });
    }
    if config.context.max_file_chars == 0 || config.context.max_total_chars == 0 {
        let (line, column) = at("context");
        return Err(ConfigError {
            line,
            column,
            message: "context caps must be positive".into(),
        });
    }
    if config.rules_file.as_ref().is_some_and(|p| !p.is_absolute()) {
        let (line, column) = at("rules_file");
        return Err(ConfigError {
            line,
            column,
            message: "rules_file must be an absolute path".into(),
        });
    }
    for (key, zero) in [
        ("max_connections", config.max_connections == Some(0)),
        ("idle_timeout_s", config.idle_timeout_s == Some(0)),
    ] {
        if zero {
            let (line, column) = at(key);
            return Err(ConfigError {
                line,
                column,
                message: format!("{key} must be at least 1"),
            });
        }
    }
    if config.max_concurrent == Some(0) {
        let offset = text.find("max_concurrent").unwrap_or(0);
        let (line, column) = line_col(text, offset);
        return Err(ConfigError {
            line,
            column,
            message: "max_concurrent must be at least 1".into(),
        });
    }
    Ok(config)
}

impl Config {
    /// The tool policy this config describes.
    pub fn tool_policy(
        &self,
    ) -> Result<crate::toolpolicy::ToolPolicy, crate::toolpolicy::ToolError> {
        let overrides = self
            .audiences
            .iter()
            .map(|(a, c)| (*a, c.tools.clone()))
            .collect();
        crate::toolpolicy::ToolPolicy::new(&self.tools, &overrides)
    }

    /// The default limits of `audience` (built-in defaults where unset).
    pub fn audience_limits(&self, audience: Audience) -> Limits {
        self.limits.get(&audience).copied().unwrap_or_default()
    }

    /// The mechanisms a run must have: the configured list, else the
    /// default; network isolation only for runs without network.
    pub fn required(&self, network: bool) -> Vec<Mechanism> {
        match &self.require {
            Some(list) => list
                .iter()
                .copied()
                .filter(|m| !(network && *m == Mechanism::NetworkIsolation))
                .collect(),
            None => crate::sandbox::default_require(network),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_example_parses() {
        let c = parse(include_str!("../../examples/subagentd.toml")).unwrap();
        assert_eq!(c.run_as.as_deref(), Some("nobody"));
        assert!(c.tool_policy().unwrap().tool("db_query").is_some());
    }

    #[test]
    fn an_empty_file_is_the_defaults() {
        let c = parse("").unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.required(false), crate::sandbox::default_require(false));
    }

    #[test]
    fn keys_parse() {
        let c = parse(
            "run_as = \"nobody\"\nrequire = [\"landlock\", \"cgroup\"]\nmax_concurrent = 8\n",
        )
        .unwrap();
        assert_eq!(c.run_as.as_deref(), Some("nobody"));
        assert_eq!(
            c.required(true),
            vec![Mechanism::Landlock, Mechanism::Cgroup]
        );
        assert_eq!(c.max_concurrent, Some(8));
        let n = parse("require = [\"network_isolation\"]").unwrap();
        assert!(n.required(true).is_empty());
        assert_eq!(n.required(false), vec![Mechanism::NetworkIsolation]);
    }

    #[test]
    fn tools_audiences_limits_and_paths() {
        let text = r#"
command = ["my-agent", "--headless"]
env_allow = ["OPENAI_API_KEY", "MYCO_*"]
read_paths = ["/srv/docs"]

[limits.team]
wall_time_s = 600

[[tools]]
name = "db_query"
description = "Query the database."
class = "network"
schema = { type = "object", properties = { sql = { type = "string" } } }

[audiences.team]
tools = ["file_read", "db_query"]
"#;
        let c = parse(text).unwrap();
        assert_eq!(c.command.as_deref().unwrap()[0], "my-agent");
        assert_eq!(c.audience_limits(Audience::Team).wall_time_s, Some(600));
        assert_eq!(c.audience_limits(Audience::Personal), Limits::default());
        let p = c.tool_policy().unwrap();
        assert_eq!(
            p.tool("db_query").unwrap().schema["properties"]["sql"]["type"],
            "string"
        );
        assert_eq!(p.audience_tools(Audience::Team), ["db_query", "file_read"]);
        let e = parse("[audiences.team]\ntools = [\"warp\"]\n").unwrap_err();
        assert!(e.message.contains("warp"), "{e}");
        let e = parse("read_paths = [\"relative\"]\n").unwrap_err();
        assert_eq!(e.line, 1);
        let e = parse("[limits.team]\nwall_time_s = 0\n").unwrap_err();
        assert!(e.message.contains("limits.team.wall_time_s"), "{e}");
        let e =
            parse("[[tools]]\nname = \"x\"\ndescription = \"d\"\nclass = \"magic\"\n").unwrap_err();
        assert_eq!(e.line, 4, "{e}");
    }

    #[test]
    fn unknown_keys_and_wrong_types_name_line_and_column() {
        let e = parse("max_concurrent = 4\nrun_az = \"x\"\n").unwrap_err();
        assert_eq!((e.line, e.column), (2, 1), "{e}");
        assert!(e.message.contains("run_az"), "{e}");
        let e = parse("\n\nmax_concurrent = \"lots\"\n").unwrap_err();
        assert_eq!((e.line, e.column), (3, 18), "{e}");
        let e = parse("require = [\"landlock\", \"magic\"]").unwrap_err();
        assert_eq!(e.line, 1);
        assert!(e.message.contains("magic"), "{e}");
        let e = parse("max_concurrent = 0").unwrap_err();
        assert_eq!((e.line, e.column), (1, 1));
    }
}
