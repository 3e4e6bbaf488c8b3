//! The config file (`subagentd.toml`), parsed from its text: the loader
//! does no I/O. Unknown keys and wrong types are errors with the line and
//! column. docs/config.md documents every key.

use crate::sandbox::Mechanism;
use serde::Deserialize;

/// The daemon's configuration; every key optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Run children as this unprivileged user: `"USER"` or `"UID:GID"`
    /// (root daemons only).
    #[serde(default)]
    pub run_as: Option<String>,
    /// The mechanisms that must hold for a run to start. Default:
    /// landlock, seccomp, capability_drop, and network_isolation (which
    /// applies to runs without network only).
    #[serde(default)]
    pub require: Option<Vec<Mechanism>>,
    /// At most this many runs at once (default: 2 × CPU cores).
    #[serde(default)]
    pub max_concurrent: Option<usize>,
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
