//! The config file (`subagentd.toml`), parsed from its text: the loader
//! does no I/O. Unknown keys and wrong types are errors with the line and
//! column. docs/config.md documents every key.

use crate::sandbox::Mechanism;
use crate::{Audience, Limits};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

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
    /// The uid of the daemon this config's clients talk to when it is
    /// neither theirs nor root (`--expect-uid` wins).
    #[serde(default)]
    pub expect_uid: Option<u32>,
    /// At most this many connections served at once (default 256).
    #[serde(default)]
    pub max_connections: Option<usize>,
    /// A connection with nothing in flight, no subscription and no request
    /// for this long is closed (default 600).
    #[serde(default)]
    pub idle_timeout_s: Option<u64>,
    /// Where the daemon serves its metrics over HTTP (`PORT` on loopback,
    /// or `HOST:PORT`); off when absent. `--metrics-listen` wins.
    #[serde(default)]
    pub metrics_listen: Option<String>,
    /// Destinations every run may reach through the proxy (`host:port`).
    #[serde(default)]
    pub network_allow: Vec<String>,
    /// What a network tool grants: the host's network (`"full"`, the
    /// default) or the run's allowlist only (`"allowlist"`).
    #[serde(default)]
    pub network_tools: crate::sandbox::network::NetworkTools,
    /// The driver of a run whose request and definition name none
    /// (default `command`).
    #[serde(default)]
    pub driver: Option<crate::driver::Driver>,
    /// Each driver's settings (`[drivers.claude-code]`, `[drivers.codex]`).
    #[serde(default)]
    pub drivers: crate::driver::Drivers,
    /// How much finished-run history is kept (`[retention]`).
    #[serde(default)]
    pub retention: Retention,
    /// Where runs are placed (`[backend]`).
    #[serde(default)]
    pub backend: crate::backend::Backend,
}

/// `[retention]`: the limits on finished runs, and how often the daemon
/// applies them. `None` is a limit set to `0`: off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Retention {
    /// Runs that ended longer ago are removed (default 30 days).
    #[serde(deserialize_with = "setting::max_age")]
    pub max_age: Option<Duration>,
    /// At most this many finished runs in all (default 20000).
    #[serde(deserialize_with = "setting::max_runs")]
    pub max_runs: Option<u64>,
    /// At most this many finished runs per session (default 2000).
    #[serde(deserialize_with = "setting::max_runs_per_session")]
    pub max_runs_per_session: Option<u64>,
    /// The finished runs' folders hold at most this much (default 10 GiB).
    #[serde(deserialize_with = "setting::max_bytes")]
    pub max_bytes: Option<u64>,
    /// How often the daemon prunes by itself (default 10 minutes).
    #[serde(deserialize_with = "setting::interval")]
    pub interval: Option<Duration>,
}

impl Default for Retention {
    fn default() -> Retention {
        Retention {
            max_age: Some(Duration::from_secs(30 * 86_400)),
            max_runs: Some(20_000),
            max_runs_per_session: Some(2_000),
            max_bytes: Some(10 << 30),
            interval: Some(Duration::from_secs(600)),
        }
    }
}

impl Retention {
    /// The limits a prune applies.
    pub fn limits(&self) -> crate::retention::Limits {
        crate::retention::Limits {
            max_age: self.max_age,
            max_runs: self.max_runs,
            max_runs_per_session: self.max_runs_per_session,
            max_bytes: self.max_bytes,
        }
    }
}

/// The readers of `[retention]`'s values, one per key so that an error
/// names it; `0` (a number or a string) is `None`.
mod setting {
    use crate::retention::{parse_duration, parse_size};
    use serde::{de::Error, Deserialize, Deserializer};
    use std::time::Duration;

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Number(i64),
        Text(String),
    }

    impl std::fmt::Display for Raw {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                Raw::Number(n) => write!(f, "{n}"),
                Raw::Text(t) => write!(f, "{t:?}"),
            }
        }
    }

    fn raw<'de, D: Deserializer<'de>>(d: D, key: &str) -> Result<Raw, D::Error> {
        Raw::deserialize(d).map_err(|_| {
            D::Error::custom(format!("retention.{key}: expected a number or a string"))
        })
    }

    fn duration<'de, D: Deserializer<'de>>(d: D, key: &str) -> Result<Option<Duration>, D::Error> {
        let value = raw(d, key)?;
        let parsed = match &value {
            Raw::Number(0) => Ok(Duration::ZERO),
            Raw::Text(t) => parse_duration(t).map_err(|e| e.to_string()),
            Raw::Number(_) => Err("a duration needs a unit: s, m, h or d (\"30d\"), or 0".into()),
        };
        match parsed {
            Ok(d) => Ok(Some(d).filter(|d| !d.is_zero())),
            Err(why) => Err(D::Error::custom(format!(
                "retention.{key} = {value}: {why}"
            ))),
        }
    }

    fn count<'de, D: Deserializer<'de>>(d: D, key: &str) -> Result<Option<u64>, D::Error> {
        match raw(d, key)? {
            Raw::Number(n) if n >= 0 => Ok(Some(n.unsigned_abs()).filter(|n| *n > 0)),
            value => Err(D::Error::custom(format!(
                "retention.{key} = {value}: expected a whole number of runs, or 0 for no limit"
            ))),
        }
    }

    fn size<'de, D: Deserializer<'de>>(d: D, key: &str) -> Result<Option<u64>, D::Error> {
        let value = raw(d, key)?;
        let parsed = match &value {
            Raw::Number(0) => Ok(0),
            Raw::Text(t) => parse_size(t).map_err(|e| e.to_string()),
            Raw::Number(_) => Err(
                "a size needs a unit: B, KiB, MiB, GiB or TiB, KB, MB or GB (\"10GiB\"), or 0"
                    .into(),
            ),
        };
        match parsed {
            Ok(n) => Ok(Some(n).filter(|n| *n > 0)),
            Err(why) => Err(D::Error::custom(format!(
                "retention.{key} = {value}: {why}"
            ))),
        }
    }

    pub fn max_age<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        duration(d, "max_age")
    }

    pub fn interval<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        duration(d, "interval")
    }

    pub fn max_runs<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        count(d, "max_runs")
    }

    pub fn max_runs_per_session<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        count(d, "max_runs_per_session")
    }

    pub fn max_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        size(d, "max_bytes")
    }
}

/// One audience's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AudienceConfig {
    /// The tools the audience may hold (the default set when absent).
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// A cap on the entries a parent (and a definition) of this audience
    /// may list in `network_allow`: each must fall within one of these.
    #[serde(default)]
    pub network_allow: Option<Vec<String>>,
}

/// The config text is not a valid config.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {message}")]
pub struct ConfigError {
    /// 1-based line of the problem (0 when unknown).
    pub line: usize,
    /// 1-based column.
    pub column: usize,
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
    config.check().map_err(|e| e.locate(text))?;
    Ok(config)
}

/// A value of the right type that the config's rules refuse: the key to
/// point at and what is wrong.
struct Refused {
    key: String,
    message: String,
}

impl Refused {
    fn new(key: impl Into<String>, message: impl Into<String>) -> Refused {
        Refused {
            key: key.into(),
            message: message.into(),
        }
    }

    /// The error at the first place `key` appears in the text (the start
    /// when it does not).
    fn locate(self, text: &str) -> ConfigError {
        let (line, column) = line_col(text, text.find(&self.key).unwrap_or(0));
        ConfigError {
            line,
            column,
            message: self.message,
        }
    }
}

impl Config {
    /// The rules the types cannot say, in a fixed order; the first broken
    /// one is reported.
    fn check(&self) -> Result<(), Refused> {
        self.check_paths()?;
        self.check_limits()?;
        self.tool_policy()
            .map_err(|e| Refused::new("tools", e.to_string()))?;
        self.check_values()?;
        self.check_network()?;
        self.check_drivers()?;
        self.backend
            .check()
            .map_err(|e| Refused::new(e.key, e.to_string()))?;
        self.check_counts()
    }

    fn check_drivers(&self) -> Result<(), Refused> {
        use crate::driver::Driver;
        for d in [Driver::ClaudeCode, Driver::Codex] {
            if let Some(c) = self.drivers.get(d) {
                c.check(d).map_err(|e| {
                    Refused::new(format!("[drivers.{}]", d.as_str()), e.to_string())
                })?;
            }
        }
        Ok(())
    }

    fn check_network(&self) -> Result<(), Refused> {
        let lists = std::iter::once(("network_allow".to_owned(), &self.network_allow)).chain(
            self.audiences.iter().filter_map(|(a, c)| {
                let key = format!("audiences.{}.network_allow", a.as_str());
                c.network_allow.as_ref().map(|l| (key, l))
            }),
        );
        for (key, list) in lists {
            if let Err((i, e)) = crate::sandbox::network::parse_list(list) {
                let at = if key == "network_allow" {
                    key.clone()
                } else {
                    "network_allow".to_owned()
                };
                return Err(Refused::new(at, format!("{key}[{i}]: {e}")));
            }
        }
        Ok(())
    }

    fn check_paths(&self) -> Result<(), Refused> {
        for (key, paths) in [
            ("read_paths", &self.read_paths),
            ("write_paths", &self.write_paths),
        ] {
            if let Some(p) = paths.iter().find(|p| !p.is_absolute()) {
                let message = format!("{key}: {} is not an absolute path", p.display());
                return Err(Refused::new(key, message));
            }
        }
        Ok(())
    }

    fn check_limits(&self) -> Result<(), Refused> {
        for (audience, limits) in &self.limits {
            if let Err((field, why)) = limits.validate() {
                let key = format!("limits.{}", audience.as_str());
                let message = format!("{key}.{field}: {why}");
                return Err(Refused::new(key, message));
            }
        }
        Ok(())
    }

    fn check_values(&self) -> Result<(), Refused> {
        if self.command.as_ref().is_some_and(|c| c.is_empty()) {
            return Err(Refused::new("command", "command must not be empty"));
        }
        if self.max_restarts.is_some_and(|n| n > crate::MAX_RESTARTS) {
            let message = format!("max_restarts must be at most {}", crate::MAX_RESTARTS);
            return Err(Refused::new("max_restarts", message));
        }
        if self.context.max_file_chars == 0 || self.context.max_total_chars == 0 {
            return Err(Refused::new("context", "context caps must be positive"));
        }
        if self.rules_file.as_ref().is_some_and(|p| !p.is_absolute()) {
            return Err(Refused::new(
                "rules_file",
                "rules_file must be an absolute path",
            ));
        }
        Ok(())
    }

    /// The counts that must be at least 1 when set.
    fn check_counts(&self) -> Result<(), Refused> {
        for (key, zero) in [
            ("max_connections", self.max_connections == Some(0)),
            ("idle_timeout_s", self.idle_timeout_s == Some(0)),
            ("max_concurrent", self.max_concurrent == Some(0)),
        ] {
            if zero {
                return Err(Refused::new(key, format!("{key} must be at least 1")));
            }
        }
        Ok(())
    }
}

impl Config {
    /// The tool policy this config describes.
    pub fn tool_policy(
        &self,
    ) -> Result<crate::toolpolicy::ToolPolicy, crate::toolpolicy::ToolError> {
        let overrides = self
            .audiences
            .iter()
            .filter_map(|(a, c)| Some((*a, c.tools.clone()?)))
            .collect();
        crate::toolpolicy::ToolPolicy::new(&self.tools, &overrides)
    }

    /// The cap on what `audience` may list in `network_allow`, if any.
    pub fn network_cap(
        &self,
        audience: Audience,
    ) -> Option<Vec<crate::sandbox::network::AllowEntry>> {
        let list = self.audiences.get(&audience)?.network_allow.as_ref()?;
        crate::sandbox::network::parse_list(list).ok()
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
        assert_eq!(c.retention, Retention::default());
    }

    #[test]
    fn a_slurm_backend_parses_and_its_errors_name_the_key() {
        let c = parse("[backend]\nkind = \"slurm\"\nshared_dir = \"/shared\"\npartition = \"p\"\n")
            .unwrap();
        assert_eq!(c.backend.kind, crate::backend::BackendKind::Slurm);
        assert_eq!(c.backend.partition.as_deref(), Some("p"));
        let e = parse("max_concurrent = 4\n[backend]\nkind = \"slurm\"\n").unwrap_err();
        assert!(e.message.contains("backend.shared_dir"), "{e}");
        let e = parse(
            "[backend]\nkind = \"slurm\"\nshared_dir = \"/s\"\nextra_args = [\"--export=ALL\"]\n",
        )
        .unwrap_err();
        assert_eq!(e.line, 4, "{e}");
        assert!(e.message.contains("--export"), "{e}");
        assert!(parse("[backend]\nkind = \"k8s\"\n").is_err());
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
    fn expect_uid_is_a_number() {
        assert_eq!(parse("expect_uid = 1001\n").unwrap().expect_uid, Some(1001));
        assert_eq!(parse("").unwrap().expect_uid, None);
        assert!(parse("expect_uid = \"someone\"\n").is_err());
    }

    #[test]
    fn network_keys_parse_and_bad_entries_are_named() {
        use crate::sandbox::network::NetworkTools;
        let c = parse(
            "network_allow = [\"api.example.com:443\"]\nnetwork_tools = \"allowlist\"\n\n[audiences.team]\nnetwork_allow = [\"*.example.com:443\"]\n",
        )
        .unwrap();
        assert_eq!(c.network_allow, ["api.example.com:443"]);
        assert_eq!(c.network_tools, NetworkTools::Allowlist);
        assert_eq!(c.network_cap(Audience::Team).unwrap().len(), 1);
        assert!(c.network_cap(Audience::Personal).is_none());
        // An audience with only a cap keeps the default tools.
        let p = c.tool_policy().unwrap();
        assert_eq!(
            p.audience_tools(Audience::Team),
            Config::default()
                .tool_policy()
                .unwrap()
                .audience_tools(Audience::Team)
        );
        assert_eq!(parse("").unwrap().network_tools, NetworkTools::Full);
        let e = parse("max_concurrent = 1\nnetwork_allow = [\"nope\"]\n").unwrap_err();
        assert_eq!(e.line, 2, "{e}");
        assert!(e.message.contains("network_allow[0]"), "{e}");
        let e = parse("[audiences.team]\nnetwork_allow = [\"*:1\"]\n").unwrap_err();
        assert!(e.message.contains("audiences.team.network_allow[0]"), "{e}");
        assert!(parse("network_tools = \"some\"").is_err());
    }

    #[test]
    fn drivers_parse_and_bad_urls_are_named() {
        use crate::driver::Driver;
        let c = parse(
            "driver = \"claude-code\"\n[drivers.claude-code]\nbase_url = \"http://127.0.0.1:9\"\napi_key_env = \"ANTHROPIC_KEY\"\nargs = [\"--x\"]\n[drivers.codex]\ncommand = \"/opt/codex\"\nmodel = \"m\"\n",
        )
        .unwrap();
        assert_eq!(c.driver, Some(Driver::ClaudeCode));
        assert_eq!(
            c.drivers
                .claude_code
                .as_ref()
                .and_then(|d| d.api_key_env.as_deref()),
            Some("ANTHROPIC_KEY")
        );
        assert_eq!(
            c.drivers.codex.as_ref().and_then(|d| d.model.as_deref()),
            Some("m")
        );
        let bare = parse("max_concurrent = 1\n").unwrap();
        assert_eq!(bare.drivers.get(crate::driver::Driver::Codex), None);
        let e = parse("max_concurrent = 1\n[drivers.codex]\nbase_url = \"nope\"\n").unwrap_err();
        assert_eq!(e.line, 2, "{e}");
        assert!(e.message.contains("drivers.codex.base_url"), "{e}");
        assert!(parse("driver = \"claude\"").is_err());
        assert!(parse("[drivers.claude-code]\nkey = \"x\"").is_err());
    }

    #[test]
    fn retention_has_defaults_units_and_zero_for_off() {
        let d = parse("").unwrap().retention;
        assert_eq!(d, Retention::default());
        assert_eq!(d.max_age, Some(Duration::from_secs(30 * 86_400)));
        assert_eq!(d.max_runs, Some(20_000));
        assert_eq!(d.max_runs_per_session, Some(2_000));
        assert_eq!(d.max_bytes, Some(10 << 30));
        assert_eq!(d.interval, Some(Duration::from_secs(600)));
        let c = parse(
            "[retention]\nmax_age = \"7d\"\nmax_runs = 5\nmax_runs_per_session = 0\nmax_bytes = \"500MB\"\ninterval = \"30s\"\n",
        )
        .unwrap()
        .retention;
        assert_eq!(
            c,
            Retention {
                max_age: Some(Duration::from_secs(7 * 86_400)),
                max_runs: Some(5),
                max_runs_per_session: None,
                max_bytes: Some(500_000_000),
                interval: Some(Duration::from_secs(30)),
            }
        );
        assert_eq!(c.limits().max_runs, Some(5));
        let off = parse("[retention]\nmax_age = 0\nmax_bytes = \"0\"\ninterval = \"0s\"\n")
            .unwrap()
            .retention;
        assert_eq!(
            (off.max_age, off.max_bytes, off.interval),
            (None, None, None)
        );
        // Unset keys keep their defaults.
        assert_eq!(off.max_runs, Some(20_000));
    }

    #[test]
    fn retention_errors_name_the_key_and_the_value() {
        let cases = [
            (
                "max_age = \"30x\"",
                "retention.max_age = \"30x\": \"30x\" is not a duration",
            ),
            (
                "max_age = 30",
                "retention.max_age = 30: a duration needs a unit",
            ),
            ("interval = \"1.5h\"", "retention.interval = \"1.5h\""),
            (
                "max_runs = -1",
                "retention.max_runs = -1: expected a whole number",
            ),
            (
                "max_runs_per_session = \"lots\"",
                "retention.max_runs_per_session = \"lots\"",
            ),
            (
                "max_bytes = \"10G\"",
                "retention.max_bytes = \"10G\": \"10G\" is not a size",
            ),
            (
                "max_bytes = 1024",
                "retention.max_bytes = 1024: a size needs a unit",
            ),
            ("max_bytes = \"99999999999TiB\"", "is too large"),
            (
                "max_age = true",
                "retention.max_age: expected a number or a string",
            ),
        ];
        for (line, want) in cases {
            let e = parse(&format!("[retention]\n{line}\n")).unwrap_err();
            assert_eq!(e.line, 2, "{line}: {e}");
            assert!(e.message.contains(want), "{line}: {e}");
        }
        let e = parse("[retention]\nmax_rusn = 3\n").unwrap_err();
        assert!(e.message.contains("max_rusn"), "{e}");
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
