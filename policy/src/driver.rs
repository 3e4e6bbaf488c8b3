//! Drivers: how a run's composed context reaches a coding agent. The
//! `command` driver runs the parent's command as given; `claude-code` and
//! `codex` run that CLI headless, its prompt (first_message.md) on stdin,
//! system.md as its added system prompt, the child's tools mapped to the
//! agent's own, and its model endpoint (from the daemon's config only)
//! reached through the daemon's model gateway, which holds the key: the
//! agent gets a gateway URL inside its own network namespace and a
//! placeholder key.

use crate::sandbox::network::{self, AllowEntry};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How a run's agent is started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Driver {
    /// The command as given, its context in files (and, on request, on
    /// stdin or in its argv).
    #[default]
    Command,
    /// Claude Code (`claude -p`).
    ClaudeCode,
    /// Codex (`codex exec`).
    Codex,
}

impl Driver {
    /// The name used in requests, definitions and the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Driver::Command => "command",
            Driver::ClaudeCode => "claude-code",
            Driver::Codex => "codex",
        }
    }

    /// The driver named `s`.
    pub fn parse(s: &str) -> Option<Driver> {
        [Driver::Command, Driver::ClaudeCode, Driver::Codex]
            .into_iter()
            .find(|d| d.as_str() == s)
    }

    /// Whether the run's agent speaks a JSON event stream on stdout.
    pub fn streams(self) -> bool {
        self != Driver::Command
    }
}

/// One driver's settings (`[drivers.claude-code]`, `[drivers.codex]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriverConfig {
    /// The program: an absolute path, or a name (default `claude` /
    /// `codex`) the daemon looks up in its own PATH.
    #[serde(default)]
    pub command: Option<String>,
    /// The model endpoint (Claude Code: `ANTHROPIC_BASE_URL`; Codex: the
    /// provider's `base_url`, which it posts `/responses` under).
    #[serde(default)]
    pub base_url: Option<String>,
    /// The name of the daemon's variable holding the API key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// More arguments, after the driver's own.
    #[serde(default)]
    pub args: Vec<String>,
    /// The model when the definition names none (Claude Code), or always
    /// (Codex, whose models a Claude Code definition does not name).
    #[serde(default)]
    pub model: Option<String>,
    /// The variables a spawn request may set for this driver's agent
    /// (any other is refused).
    #[serde(default)]
    pub env_allow: Vec<String>,
}

/// The config's `[drivers]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Drivers {
    /// `[drivers.claude-code]`; without it the driver is not set up.
    #[serde(default, rename = "claude-code")]
    pub claude_code: Option<DriverConfig>,
    /// `[drivers.codex]`; without it the driver is not set up.
    #[serde(default)]
    pub codex: Option<DriverConfig>,
}

impl Drivers {
    /// The settings of `driver` (`None` for `command`, or a driver the
    /// config has no table for).
    pub fn get(&self, driver: Driver) -> Option<&DriverConfig> {
        match driver {
            Driver::Command => None,
            Driver::ClaudeCode => self.claude_code.as_ref(),
            Driver::Codex => self.codex.as_ref(),
        }
    }
}

/// A driver's settings or inputs cannot make an invocation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriverError {
    /// `base_url` is not an absolute http(s) URL with a host.
    #[error("drivers.{driver}.base_url: {url:?} is not an http:// or https:// URL with a host")]
    BaseUrl {
        /// The driver.
        driver: &'static str,
        /// The URL as configured.
        url: String,
    },
    /// `api_key_env` is not a variable name.
    #[error("drivers.{driver}.api_key_env: {name:?} is not a variable name")]
    KeyName {
        /// The driver.
        driver: &'static str,
        /// The name as configured.
        name: String,
    },
    /// An `env_allow` entry is not a variable name.
    #[error("drivers.{driver}.env_allow: {name:?} is not a variable name")]
    EnvName {
        /// The driver.
        driver: &'static str,
        /// The entry as configured.
        name: String,
    },
    /// `base_url` carries a query or fragment the gateway would drop.
    #[error("drivers.{driver}.base_url: {url:?} has a query or fragment; give scheme, host, port and path only")]
    BaseUrlQuery {
        /// The driver.
        driver: &'static str,
        /// The URL as configured.
        url: String,
    },
    /// A request names a variable the driver's `env_allow` does not.
    #[error("not with the driver {driver}: only the variables of [drivers.{driver}] env_allow reach its agent ({allowed})")]
    EnvNotAllowed {
        /// The driver.
        driver: &'static str,
        /// The variable.
        name: String,
        /// The allowed names, for the message.
        allowed: String,
    },
    /// The program is not an executable file the daemon can find.
    #[error("drivers.{driver}.command: {program:?} is not an executable file in the daemon's PATH; give its absolute path")]
    Program {
        /// The driver.
        driver: &'static str,
        /// The program as configured (or the default name).
        program: String,
    },
    /// A model name the agent's argv cannot carry safely.
    #[error("model {model:?} is not a model name (1 to {MODEL_MAX} of A-Z a-z 0-9 . _ : / -, not starting with -)")]
    Model {
        /// The name as given (by the definition or the config).
        model: String,
    },
    /// system.md is too large to pass to Codex as an argument.
    #[error(
        "system.md is {bytes} bytes; the codex driver passes it as one argument of at most {max}"
    )]
    SystemTooLarge {
        /// Its size.
        bytes: usize,
        /// The most an argument may hold.
        max: usize,
    },
}

/// Claude Code's endpoint when the config names none.
pub const ANTHROPIC_URL: &str = "https://api.anthropic.com";

/// Codex's endpoint when the config names none.
pub const OPENAI_URL: &str = "https://api.openai.com/v1";

/// The largest argument Linux passes (MAX_ARG_STRLEN is 128 KiB), less room
/// for the option's own name.
pub const MAX_ARG_BYTES: usize = 128 * 1024 - 64;

/// What a driver needs to know about a run.
#[derive(Debug, Clone)]
pub struct DriverInputs<'a> {
    /// The driver's settings.
    pub config: &'a DriverConfig,
    /// The program, resolved by the daemon (an absolute path).
    pub program: &'a str,
    /// system.md as the child sees it (its path).
    pub system_path: &'a str,
    /// system.md's text (Codex takes it as a setting).
    pub system_text: &'a str,
    /// The child's tools (our names); `None` without `session.tools`,
    /// which gives the agent no tool.
    pub tools: Option<&'a [String]>,
    /// The definition's `model`.
    pub model: Option<&'a str>,
    /// The run's turn limit (the request's or the definition's
    /// `maxTurns`, the lower of the two); Claude Code's `--max-turns`.
    pub max_turns: Option<u32>,
    /// The run's spending limit in US dollars; Claude Code's
    /// `--max-budget-usd`.
    pub max_budget_usd: Option<f64>,
    /// Whether the agent runs as uid 0.
    pub uid0: bool,
    /// The run's temp dir as the child sees it (Codex's home goes there).
    pub temp_dir: &'a str,
    /// The run's allowlist (empty without one): none of its hosts is left
    /// in `NO_PROXY`.
    pub allow: &'a [AllowEntry],
}

/// How the agent is started: its argv, the variables set over the child's
/// environment, and where its gateway forwards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// The argv.
    pub argv: Vec<String>,
    /// Variables set over the child's environment.
    pub env: BTreeMap<String, String>,
    /// The model endpoint, `host:port`, for the audience's cap.
    pub endpoint: String,
    /// Where the daemon's gateway forwards the agent's requests.
    pub upstream: Upstream,
}

/// The key the agent holds: a placeholder the gateway replaces.
pub const PLACEHOLDER_KEY: &str = "subagentd-gateway-placeholder";

/// How the vendor expects the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyHeader {
    /// `x-api-key: KEY` (Anthropic).
    XApiKey,
    /// `Authorization: Bearer KEY` (OpenAI).
    Bearer,
}

/// The configured endpoint the gateway forwards to, taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// TLS (`https`) or plain HTTP.
    pub https: bool,
    /// The host as written in the URL (brackets kept for IPv6), lowercase.
    pub host: String,
    /// The port (the scheme's when none is given).
    pub port: u16,
    /// The path the agent's requests must fall under (`/v1`, or empty).
    pub base_path: String,
    /// How the key goes upstream.
    pub key_header: KeyHeader,
}

impl Upstream {
    /// `host:port`, as the `Host` header and the log name it.
    pub fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// Whether an agent's request path (origin form, query included)
    /// falls under the base path.
    pub fn admits(&self, path: &str) -> bool {
        let p = path.split(['?', '#']).next().unwrap_or("");
        p.starts_with('/')
            && !p.split('/').any(is_dot_segment)
            && (self.base_path.is_empty()
                || p == self.base_path
                || p.strip_prefix(self.base_path.as_str())
                    .is_some_and(|rest| rest.starts_with('/')))
    }
}

/// Whether a path segment means `.` or `..` (also percent-encoded, as an
/// endpoint may decode it), or holds a backslash some servers read as `/`.
fn is_dot_segment(seg: &str) -> bool {
    let decoded = seg.to_ascii_lowercase().replace("%2e", ".");
    decoded == "."
        || decoded == ".."
        || seg.contains('\\')
        || seg.to_ascii_lowercase().contains("%5c")
}

/// The configured `base_url` taken apart (`None` unless it is an http(s)
/// URL with a host and no query or fragment).
pub fn upstream_of(url: &str, key_header: KeyHeader) -> Option<Upstream> {
    let endpoint = endpoint_of(url)?;
    let (scheme, rest) = url.split_once("://")?;
    if rest.contains(['?', '#']) {
        return None;
    }
    let path = rest.find('/').map_or("", |i| &rest[i..]);
    let (host, port) = endpoint.rsplit_once(':')?;
    Some(Upstream {
        https: scheme.eq_ignore_ascii_case("https"),
        host: host.to_owned(),
        port: port.parse().ok()?,
        base_path: path.trim_end_matches('/').to_owned(),
        key_header,
    })
}

/// The base URL the agent is given: the gateway in its own network
/// namespace, under the configured path.
pub fn gateway_url(upstream: &Upstream) -> String {
    use crate::sandbox::network::{GATEWAY_HOST, GATEWAY_PORT};
    format!("http://{GATEWAY_HOST}:{GATEWAY_PORT}{}", upstream.base_path)
}

/// Refuses a request's variables unless each is on the driver's
/// `env_allow` (the daemon sets every variable the driver itself needs).
pub fn check_request_env<'a>(
    driver: Driver,
    config: &DriverConfig,
    mut names: impl Iterator<Item = &'a str>,
) -> Result<(), DriverError> {
    match names.find(|n| !config.env_allow.iter().any(|a| a == n)) {
        None => Ok(()),
        Some(name) => Err(DriverError::EnvNotAllowed {
            driver: driver.as_str(),
            name: name.to_owned(),
            allowed: if config.env_allow.is_empty() {
                "none".to_owned()
            } else {
                config.env_allow.join(", ")
            },
        }),
    }
}

/// Claude Code's tools for one of ours (empty: it has none).
pub fn claude_tools(ours: &str) -> Vec<&str> {
    match ours {
        "file_read" => vec!["Read", "Grep", "Glob", "LS"],
        "glob" => vec!["Glob", "LS"],
        "grep" => vec!["Grep"],
        "file_write" => vec!["Write"],
        "file_edit" => vec!["Edit", "MultiEdit"],
        "shell" => vec!["Bash"],
        "web_fetch" => vec!["WebFetch"],
        "web_search" => vec!["WebSearch"],
        "todo_write" => vec!["TodoWrite"],
        mcp if crate::tools::is_mcp_tool(mcp) || crate::tools::is_mcp_pattern(mcp) => vec![mcp],
        _ => Vec::new(),
    }
}

/// The `--tools` value: each mapped tool once, sorted.
fn claude_tool_list(tools: Option<&[String]>) -> String {
    let mut names: Vec<&str> = tools
        .into_iter()
        .flatten()
        .flat_map(|t| claude_tools(t))
        .collect();
    names.sort_unstable();
    names.dedup();
    names.join(",")
}

/// `host:port` of an http(s) URL (the scheme's port when none is given).
pub fn endpoint_of(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    if authority.is_empty() || authority.contains('@') {
        return None;
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
            if h.contains(':') && !h.starts_with('[') {
                return None;
            }
            (h, p.parse::<u16>().ok()?)
        }
        _ => (authority, default_port),
    };
    if host.is_empty() || host == "[]" {
        return None;
    }
    Some(format!("{}:{port}", host.to_ascii_lowercase()))
}

/// The longest model name passed on.
pub const MODEL_MAX: usize = 128;

/// Whether `m` is a model name: short, of plain characters, and never
/// readable as an option.
pub fn valid_model(m: &str) -> bool {
    !m.is_empty()
        && m.len() <= MODEL_MAX
        && !m.starts_with('-')
        && m.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._:/-".contains(c))
}

/// The `--model=` argument for `m`, refused unless it is a model name.
fn model_arg(m: &str) -> Result<String, DriverError> {
    if valid_model(m) {
        Ok(format!("--model={m}"))
    } else {
        Err(DriverError::Model {
            model: m.to_owned(),
        })
    }
}

fn valid_var(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl DriverConfig {
    /// Checks the settings of `driver` (the config loader calls it).
    pub fn check(&self, driver: Driver) -> Result<(), DriverError> {
        if let Some(url) = &self.base_url {
            if endpoint_of(url).is_none() {
                return Err(DriverError::BaseUrl {
                    driver: driver.as_str(),
                    url: url.clone(),
                });
            }
            if url.contains(['?', '#']) {
                return Err(DriverError::BaseUrlQuery {
                    driver: driver.as_str(),
                    url: url.clone(),
                });
            }
        }
        if let Some(name) = self.env_allow.iter().find(|n| !valid_var(n)) {
            return Err(DriverError::EnvName {
                driver: driver.as_str(),
                name: name.clone(),
            });
        }
        if let Some(m) = self.model.as_deref() {
            model_arg(m)?;
        }
        if let Some(name) = self.api_key_env.as_ref().filter(|n| !valid_var(n)) {
            return Err(DriverError::KeyName {
                driver: driver.as_str(),
                name: name.clone(),
            });
        }
        Ok(())
    }
}

/// The invocation of `driver` (`None` for `command`).
pub fn invocation(driver: Driver, i: &DriverInputs) -> Result<Option<Invocation>, DriverError> {
    i.config.check(driver)?;
    let mut inv = match driver {
        Driver::Command => return Ok(None),
        Driver::ClaudeCode => claude_code(i)?,
        Driver::Codex => codex(i)?,
    };
    // A proxy-aware agent reaches its gateway directly, never by the
    // proxy, and a listed host never directly.
    let list = network::no_proxy(i.allow, &[network::GATEWAY_HOST]);
    inv.env.insert("NO_PROXY".into(), list.clone());
    inv.env.insert("no_proxy".into(), list);
    Ok(Some(inv))
}

/// The configured endpoint of `driver` (its default when none is set).
pub fn upstream(driver: Driver, c: &DriverConfig) -> Result<Upstream, DriverError> {
    let (default, header) = match driver {
        Driver::Codex => (OPENAI_URL, KeyHeader::Bearer),
        _ => (ANTHROPIC_URL, KeyHeader::XApiKey),
    };
    let url = c.base_url.as_deref().unwrap_or(default);
    upstream_of(url, header).ok_or_else(|| DriverError::BaseUrl {
        driver: driver.as_str(),
        url: url.to_owned(),
    })
}

fn claude_code(i: &DriverInputs) -> Result<Invocation, DriverError> {
    let c = i.config;
    let mut argv = vec![i.program.to_owned()];
    let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    argv.extend(s(&["-p", "--output-format", "stream-json", "--verbose"]));
    argv.extend(s(&["--append-system-prompt-file", i.system_path]));
    argv.extend(s(&["--tools", &claude_tool_list(i.tools)]));
    argv.extend(s(&["--permission-mode", "bypassPermissions"]));
    // The project's settings and MCP servers are child-writable.
    argv.extend(s(&["--setting-sources", "user", "--strict-mcp-config"]));
    let model = i.model.filter(|m| *m != "inherit").or(c.model.as_deref());
    if let Some(m) = model {
        argv.push(model_arg(m)?);
    }
    if let Some(n) = i.max_turns {
        argv.extend(["--max-turns".to_owned(), n.to_string()]);
    }
    if let Some(usd) = i.max_budget_usd {
        argv.extend(["--max-budget-usd".to_owned(), usd.to_string()]);
    }
    argv.extend(c.args.iter().cloned());
    let mut env: BTreeMap<String, String> = [
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ("DISABLE_AUTOUPDATER", "1"),
        ("DISABLE_TELEMETRY", "1"),
        ("DISABLE_ERROR_REPORTING", "1"),
        ("CLAUDE_CODE_MAX_RETRIES", "2"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    if i.uid0 {
        env.insert("IS_SANDBOX".into(), "1".into());
    }
    // Always set: the agent talks to its gateway only, with no real key.
    let up = upstream(Driver::ClaudeCode, c)?;
    env.insert("ANTHROPIC_BASE_URL".into(), gateway_url(&up));
    env.insert("ANTHROPIC_API_KEY".into(), PLACEHOLDER_KEY.into());
    Ok(Invocation {
        argv,
        env,
        endpoint: up.authority(),
        upstream: up,
    })
}

/// A TOML basic string holding `s`.
fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn codex(i: &DriverInputs) -> Result<Invocation, DriverError> {
    let c = i.config;
    if i.system_text.len() > MAX_ARG_BYTES {
        return Err(DriverError::SystemTooLarge {
            bytes: i.system_text.len(),
            max: MAX_ARG_BYTES,
        });
    }
    let mut argv = vec![i.program.to_owned()];
    for a in ["exec", "--json", "--skip-git-repo-check", "--ephemeral"] {
        argv.push(a.into());
    }
    // Project execpolicy rules are child-writable.
    argv.extend(["--ignore-user-config".into(), "--ignore-rules".into()]);
    argv.push("-s".into());
    argv.push("danger-full-access".into());
    let mut settings = vec![
        "approval_policy=\"never\"".to_owned(),
        "features.plugins=false".to_owned(),
        "features.multi_agent=false".to_owned(),
        "features.unbounded_connection_retries=false".to_owned(),
        "analytics.enabled=false".to_owned(),
        "check_for_update_on_startup=false".to_owned(),
        format!("developer_instructions={}", toml_string(i.system_text)),
    ];
    let web = i.tools.is_some_and(|t| t.iter().any(|t| t == "web_search"));
    if !web {
        settings.push("web_search=\"disabled\"".into());
    }
    // The agent's provider is the gateway, with a placeholder key.
    let up = upstream(Driver::Codex, c)?;
    let url = gateway_url(&up);
    settings.push("model_provider=\"subagentd\"".into());
    settings.push(format!(
        "model_providers.subagentd={{ name = \"subagentd\", base_url = {}, wire_api = \"responses\", request_max_retries = 2, stream_max_retries = 2, env_key = \"OPENAI_API_KEY\" }}",
        toml_string(&url)
    ));
    for s in settings {
        argv.extend(["-c".to_owned(), s]);
    }
    if let Some(m) = c.model.as_deref().or(i.model.filter(|m| *m != "inherit")) {
        argv.push(model_arg(m)?);
    }
    argv.extend(c.args.iter().cloned());
    // The prompt is read from stdin (first_message.md).
    argv.push("-".into());
    let mut env = BTreeMap::from([("CODEX_HOME".to_owned(), i.temp_dir.to_owned())]);
    // The built-in provider's endpoint too, so that no other is used.
    env.insert("OPENAI_BASE_URL".into(), url);
    env.insert("OPENAI_API_KEY".into(), PLACEHOLDER_KEY.into());
    Ok(Invocation {
        argv,
        env,
        endpoint: up.authority(),
        upstream: up,
    })
}

/// The placeholders a plain command's argv may hold.
pub const PLACEHOLDERS: &[&str] = &["{context_dir}", "{first_message}", "{system}", "{run_id}"];

/// `argv` with each placeholder replaced by its value (in the order of
/// [`PLACEHOLDERS`]), and the placeholders it held.
pub fn expand(argv: &[String], values: [&str; 4]) -> (Vec<String>, Vec<String>) {
    let mut used = Vec::new();
    let out = argv
        .iter()
        .map(|a| {
            let mut a = a.clone();
            for (name, value) in PLACEHOLDERS.iter().zip(values) {
                if a.contains(name) {
                    a = a.replace(name, value);
                    if !used.iter().any(|u| u == name) {
                        used.push((*name).to_owned());
                    }
                }
            }
            a
        })
        .collect();
    (out, used)
}

/// The daemon's variable holding `driver`'s key, if the config names one.
pub fn key_var(driver: Driver, config: &DriverConfig) -> Option<&str> {
    match driver {
        Driver::Command => None,
        _ => config.api_key_env.as_deref(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_expand_inside_arguments() {
        let argv: Vec<String> = [
            "agent",
            "--sys={system}",
            "{first_message}",
            "x{run_id}y{run_id}",
            "{other}",
        ]
        .map(String::from)
        .into();
        let (out, used) = expand(&argv, ["/c", "/c/first_message.md", "/c/system.md", "r1"]);
        assert_eq!(
            out,
            [
                "agent",
                "--sys=/c/system.md",
                "/c/first_message.md",
                "xr1yr1",
                "{other}"
            ]
        );
        assert_eq!(used, ["{system}", "{first_message}", "{run_id}"]);
    }

    fn inputs<'a>(config: &'a DriverConfig, tools: Option<&'a [String]>) -> DriverInputs<'a> {
        DriverInputs {
            config,
            program: "/bin/claude",
            system_path: "/ctx/system.md",
            system_text: "SYSTEM \"rules\"\n",
            tools,
            model: Some("sonnet"),
            max_turns: Some(7),
            max_budget_usd: Some(0.25),
            uid0: true,
            temp_dir: "/tmp/t/",
            allow: &[],
        }
    }

    fn after<'a>(argv: &'a [String], flag: &str) -> Option<&'a str> {
        let i = argv.iter().position(|a| a == flag)?;
        argv.get(i + 1).map(String::as_str)
    }

    #[test]
    fn claude_code_gets_only_the_mapped_tools_and_no_prompt() {
        let config = DriverConfig {
            base_url: Some("http://127.0.0.1:4567".into()),
            api_key_env: Some("MY_KEY".into()),
            args: vec!["--extra".into()],
            ..Default::default()
        };
        let tools = vec![
            "file_read".to_owned(),
            "file_write".into(),
            "mcp__gh__pr".into(),
        ];
        let inv = invocation(Driver::ClaudeCode, &inputs(&config, Some(&tools)))
            .unwrap()
            .unwrap();
        assert_eq!(inv.argv[0], "/bin/claude");
        assert_eq!(
            after(&inv.argv, "--tools"),
            Some("Glob,Grep,LS,Read,Write,mcp__gh__pr")
        );
        assert_eq!(
            after(&inv.argv, "--permission-mode"),
            Some("bypassPermissions")
        );
        assert_eq!(
            after(&inv.argv, "--append-system-prompt-file"),
            Some("/ctx/system.md")
        );
        assert_eq!(after(&inv.argv, "--output-format"), Some("stream-json"));
        assert_eq!(after(&inv.argv, "--setting-sources"), Some("user"));
        assert!(inv.argv.iter().any(|a| a == "--strict-mcp-config"));
        assert!(inv.argv.iter().any(|a| a == "--model=sonnet"));
        assert_eq!(after(&inv.argv, "--max-turns"), Some("7"));
        assert_eq!(after(&inv.argv, "--max-budget-usd"), Some("0.25"));
        assert_eq!(inv.argv.last().map(String::as_str), Some("--extra"));
        assert!(!inv.argv.iter().any(|a| a == "Bash"));
        assert_eq!(inv.env["ANTHROPIC_BASE_URL"], "http://127.0.0.2:3129");
        assert_eq!(inv.env["ANTHROPIC_API_KEY"], PLACEHOLDER_KEY);
        assert_eq!(inv.env["IS_SANDBOX"], "1");
        assert_eq!(inv.env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"], "1");
        assert_eq!(inv.env["DISABLE_AUTOUPDATER"], "1");
        assert_eq!(inv.env["NO_PROXY"], "localhost,127.0.0.1,::1,127.0.0.2");
        assert_eq!(inv.env["no_proxy"], "localhost,127.0.0.1,::1,127.0.0.2");
        assert_eq!(inv.endpoint, "127.0.0.1:4567");
        assert_eq!(
            inv.upstream,
            Upstream {
                https: false,
                host: "127.0.0.1".into(),
                port: 4567,
                base_path: String::new(),
                key_header: KeyHeader::XApiKey,
            }
        );
        assert!(!inv.env.values().any(|v| v.contains("MY_KEY")));
        assert_eq!(key_var(Driver::ClaudeCode, &config), Some("MY_KEY"));
    }

    #[test]
    fn a_driver_runs_no_proxy_leaves_out_every_listed_host() {
        let config = DriverConfig::default();
        let allow = [network::parse_entry("127.0.0.1:8080").unwrap()];
        let mut i = inputs(&config, None);
        i.allow = &allow;
        let inv = invocation(Driver::ClaudeCode, &i).unwrap().unwrap();
        assert_eq!(inv.endpoint, "api.anthropic.com:443");
        assert_eq!(inv.env["NO_PROXY"], "localhost,::1,127.0.0.2");
        assert_eq!(inv.env["no_proxy"], "localhost,::1,127.0.0.2");
    }

    #[test]
    fn no_tools_no_key_not_root_and_the_default_endpoint() {
        let config = DriverConfig::default();
        let mut i = inputs(&config, None);
        i.uid0 = false;
        i.model = Some("inherit");
        let inv = invocation(Driver::ClaudeCode, &i).unwrap().unwrap();
        assert_eq!(after(&inv.argv, "--tools"), Some(""));
        assert!(!inv.argv.iter().any(|a| a.starts_with("--model")));
        assert!(!inv.env.contains_key("IS_SANDBOX"));
        assert_eq!(inv.endpoint, "api.anthropic.com:443");
        assert!(inv.upstream.https);
        assert_eq!(inv.env["ANTHROPIC_BASE_URL"], "http://127.0.0.2:3129");
        assert_eq!(key_var(Driver::ClaudeCode, &config), None);
        assert_eq!(invocation(Driver::Command, &i).unwrap(), None);
    }

    #[test]
    fn codex_defers_to_the_outer_sandbox_and_reads_its_prompt_from_stdin() {
        let config = DriverConfig {
            command: Some("/opt/codex".into()),
            base_url: Some("http://127.0.0.1:9/v1".into()),
            api_key_env: Some("K".into()),
            model: Some("mock-model".into()),
            ..Default::default()
        };
        let mut i = inputs(&config, None);
        i.program = "/opt/codex";
        let inv = invocation(Driver::Codex, &i).unwrap().unwrap();
        let a = &inv.argv;
        assert_eq!(
            &a[..5],
            [
                "/opt/codex",
                "exec",
                "--json",
                "--skip-git-repo-check",
                "--ephemeral"
            ]
        );
        assert_eq!(after(a, "-s"), Some("danger-full-access"));
        assert!(a.iter().any(|x| x == "--ignore-rules"));
        assert!(a.iter().any(|x| x == "--model=mock-model"));
        assert_eq!(a.last().map(String::as_str), Some("-"));
        let settings: Vec<&str> = a
            .iter()
            .enumerate()
            .filter(|(_, x)| *x == "-c")
            .map(|(n, _)| a[n + 1].as_str())
            .collect();
        assert!(settings.contains(&"features.unbounded_connection_retries=false"));
        assert!(settings.contains(&"web_search=\"disabled\""));
        let provider = settings
            .iter()
            .find(|s| s.starts_with("model_providers.subagentd="))
            .unwrap();
        let parsed: toml::Table = toml::from_str(provider).unwrap();
        let p = &parsed["model_providers"]["subagentd"];
        assert_eq!(p["base_url"].as_str(), Some("http://127.0.0.2:3129/v1"));
        assert_eq!(p["env_key"].as_str(), Some("OPENAI_API_KEY"));
        let dev = settings
            .iter()
            .find(|s| s.starts_with("developer_instructions="))
            .unwrap();
        let parsed: toml::Table = toml::from_str(dev).unwrap();
        assert_eq!(
            parsed["developer_instructions"].as_str(),
            Some("SYSTEM \"rules\"\n")
        );
        assert_eq!(inv.env["CODEX_HOME"], "/tmp/t/");
        assert_eq!(inv.env["OPENAI_BASE_URL"], "http://127.0.0.2:3129/v1");
        assert_eq!(inv.env["OPENAI_API_KEY"], PLACEHOLDER_KEY);
        assert_eq!(inv.upstream.key_header, KeyHeader::Bearer);
        assert_eq!(inv.upstream.base_path, "/v1");
        assert_eq!(inv.endpoint, "127.0.0.1:9");
        let big = "x".repeat(MAX_ARG_BYTES + 1);
        let mut i = inputs(&config, None);
        i.system_text = &big;
        assert!(matches!(
            invocation(Driver::Codex, &i),
            Err(DriverError::SystemTooLarge { .. })
        ));
        let plain = DriverConfig::default();
        let inv = invocation(Driver::Codex, &inputs(&plain, None))
            .unwrap()
            .unwrap();
        assert_eq!(inv.env["OPENAI_BASE_URL"], "http://127.0.0.2:3129/v1");
        assert_eq!(inv.endpoint, "api.openai.com:443");
        assert!(inv.upstream.https);
    }

    #[test]
    fn a_drivers_request_env_is_an_allowlist() {
        let mut config = DriverConfig::default();
        let names = |v: &'static [&'static str]| v.iter().copied();
        let e = check_request_env(Driver::ClaudeCode, &config, names(&["BUN_OPTIONS"]));
        assert!(
            matches!(&e, Err(DriverError::EnvNotAllowed { name, .. }) if name == "BUN_OPTIONS"),
            "{e:?}"
        );
        assert!(check_request_env(Driver::Codex, &config, names(&[])).is_ok());
        config.env_allow = vec!["RUST_LOG".into(), "MY_VAR".into()];
        assert!(check_request_env(Driver::Codex, &config, names(&["MY_VAR", "RUST_LOG"])).is_ok());
        let e = check_request_env(Driver::Codex, &config, names(&["MY_VAR", "NODE_OPTIONS"]))
            .unwrap_err();
        assert!(e.to_string().contains("(RUST_LOG, MY_VAR)"), "{e}");
        config.env_allow.push("A-B".into());
        assert!(matches!(
            config.check(Driver::Codex),
            Err(DriverError::EnvName { .. })
        ));
    }

    #[test]
    fn the_upstream_admits_only_paths_under_its_base() {
        let up = upstream_of("https://Models.example.com:8443/api/v1/", KeyHeader::Bearer).unwrap();
        assert_eq!(up.authority(), "models.example.com:8443");
        assert_eq!(up.base_path, "/api/v1");
        assert_eq!(gateway_url(&up), "http://127.0.0.2:3129/api/v1");
        for ok in ["/api/v1/responses", "/api/v1", "/api/v1/models?x=1"] {
            assert!(up.admits(ok), "{ok}");
        }
        for bad in [
            "/api/v10/responses",
            "/other",
            "http://evil.example/api/v1/x",
            "/api/v1/../../admin",
            "/api/v1/%2e%2e/%2E%2e/admin",
            "/api/v1/.%2E/x",
            "/api/v1/..\\..\\admin",
            "/api/v1/%5c..%5cadmin",
            "",
            "*",
        ] {
            assert!(!up.admits(bad), "{bad}");
        }
        let root = upstream_of("http://127.0.0.1:9", KeyHeader::XApiKey).unwrap();
        assert!(root.admits("/v1/messages?beta=true"));
        assert!(!root.admits("evil.example:443"));
        assert_eq!(upstream_of("http://h:1/x?q", KeyHeader::XApiKey), None);
        let c = DriverConfig {
            base_url: Some("http://h:1/#f".into()),
            ..Default::default()
        };
        assert!(matches!(
            c.check(Driver::ClaudeCode),
            Err(DriverError::BaseUrlQuery { .. })
        ));
    }

    #[test]
    fn a_model_name_is_never_read_as_an_option() {
        let config = DriverConfig::default();
        for bad in ["--dangerously-skip-permissions", "-x", "a b", "a\nb", ""] {
            let mut i = inputs(&config, None);
            i.model = Some(bad);
            assert!(
                matches!(
                    invocation(Driver::ClaudeCode, &i),
                    Err(DriverError::Model { .. })
                ),
                "{bad:?}"
            );
        }
        let long = "m".repeat(MODEL_MAX + 1);
        assert!(!valid_model(&long));
        for good in ["claude-sonnet-4-5", "openai/gpt-5.5", "us.anthropic:v1_0"] {
            assert!(valid_model(good), "{good}");
        }
        let bad_config = DriverConfig {
            model: Some("-m".into()),
            ..Default::default()
        };
        assert!(bad_config.check(Driver::Codex).is_err());
    }

    #[test]
    fn endpoints_and_bad_settings() {
        assert_eq!(
            endpoint_of("https://API.example.com/v1").as_deref(),
            Some("api.example.com:443")
        );
        assert_eq!(
            endpoint_of("http://[::1]:8080/x").as_deref(),
            Some("[::1]:8080")
        );
        assert_eq!(endpoint_of("http://h:1?q").as_deref(), Some("h:1"));
        for bad in [
            "ftp://h",
            "http://",
            "http://u@h",
            "h:80",
            "http://h:99999",
            "http://a:b:1",
        ] {
            assert_eq!(endpoint_of(bad), None, "{bad}");
        }
        let c = DriverConfig {
            api_key_env: Some("A-B".into()),
            ..Default::default()
        };
        assert!(matches!(
            c.check(Driver::Codex),
            Err(DriverError::KeyName { .. })
        ));
        assert_eq!(Driver::parse("claude-code"), Some(Driver::ClaudeCode));
        assert_eq!(Driver::parse("claude"), None);
    }
}
