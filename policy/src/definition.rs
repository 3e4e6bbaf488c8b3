//! Subagent definitions: Markdown files with YAML front matter, whose body
//! is the subagent's own prompt. Parsed from text (the caller reads the
//! file) as leniently as Claude Code reads its `.claude/agents/` files
//! (see [`frontmatter`]). Tool entries are kept as written here; they are
//! resolved against the catalog by [`crate::agenttools`].

mod error;
mod frontmatter;
pub mod yaml;

pub use error::DefinitionError;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A parsed definition.
#[derive(Debug, Clone, PartialEq)]
pub struct Definition {
    /// 1 to [`NAME_MAX`] characters, no control character.
    pub name: String,
    /// What it is for.
    pub description: String,
    /// The `tools` entries as written (a string is split at commas); None
    /// when the field is absent: the parent's tools are not narrowed.
    pub tools: Option<Vec<String>>,
    /// The `disallowedTools` entries as written.
    pub disallowed_tools: Vec<String>,
    /// The agent program's argv.
    pub command: Option<Vec<String>>,
    /// Default limits for its runs.
    pub limits: crate::Limits,
    /// Whether it wants the network (narrows, never widens).
    pub network: Option<bool>,
    /// Claude Code's `model` (an alias such as `sonnet`, a model id, or
    /// `inherit`), for the agent driver.
    pub model: Option<String>,
    /// Claude Code's `permissionMode`, for the agent driver.
    pub permission_mode: Option<String>,
    /// Claude Code's `maxTurns`, for the agent driver.
    pub max_turns: Option<u32>,
    /// The driver its runs use (`command`, `claude-code`, `codex`) when the
    /// request names none: it changes how the agent starts, never its
    /// rights.
    pub driver: Option<crate::driver::Driver>,
    pub color: Option<String>,
    /// Claude Code's `skills`: skill names to preload.
    pub skills: Vec<String>,
    /// Claude Code's `mcpServers`, as written.
    pub mcp_servers: Option<serde_json::Value>,
    /// Claude Code's `hooks`, as written.
    pub hooks: Option<serde_json::Value>,
    /// Destinations its runs may reach through the proxy (`host:port`).
    pub network_allow: Vec<String>,
    /// The Markdown body: the subagent's own prompt.
    pub body: String,
    /// The file it came from.
    pub source: PathBuf,
    /// The file line of each top-level field.
    pub lines: BTreeMap<String, usize>,
    /// What was ignored or read leniently, as `file:line: ...`.
    pub warnings: Vec<String>,
}

/// The longest name.
pub const NAME_MAX: usize = 128;

/// The most entries of `tools`, and of `disallowedTools`.
pub const TOOLS_MAX: usize = 256;

/// The Claude Code permission modes.
pub const PERMISSION_MODES: &[&str] = &[
    "default",
    "acceptEdits",
    "dontAsk",
    "bypassPermissions",
    "plan",
];

const KNOWN: &[&str] = &[
    "name",
    "description",
    "tools",
    "disallowedTools",
    "command",
    "limits",
    "network",
    "network_allow",
    "model",
    "permissionMode",
    "maxTurns",
    "driver",
    "color",
    "skills",
    "mcpServers",
    "hooks",
];

/// Whether `s` may name a definition (Claude Code takes any string; a
/// control character could drive a terminal that lists it, an invisible
/// format character make a lookalike of another name).
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars().count() <= NAME_MAX
        && !s.chars().any(|c| c.is_control() || is_format(c))
}

/// Whether `c` is of Unicode's general category Cf (format): invisible,
/// or changing how the text around it shows.
fn is_format(c: char) -> bool {
    matches!(c,
        '\u{ad}'
        | '\u{600}'..='\u{605}'
        | '\u{61c}'
        | '\u{6dd}'
        | '\u{70f}'
        | '\u{890}'..='\u{891}'
        | '\u{8e2}'
        | '\u{180e}'
        | '\u{200b}'..='\u{200f}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2060}'..='\u{2064}'
        | '\u{2066}'..='\u{206f}'
        | '\u{feff}'
        | '\u{fff9}'..='\u{fffb}'
        | '\u{110bd}'
        | '\u{110cd}'
        | '\u{13430}'..='\u{1343f}'
        | '\u{1bca0}'..='\u{1bca3}'
        | '\u{1d173}'..='\u{1d17a}'
        | '\u{e0001}'
        | '\u{e0020}'..='\u{e007f}')
}

/// Parses a definition.
pub fn parse(file: &Path, text: &str) -> Result<Definition, DefinitionError> {
    let front = frontmatter::read(file, text)?;
    let fields = Fields {
        file,
        map: &front.map,
        lines: &front.lines,
    };
    let name = fields.name()?;
    let named = |mut e: DefinitionError| {
        e.name = Some(name.clone());
        e
    };
    let mut warnings = front.warnings.clone();
    let description = fields.description().map_err(named)?;
    let tools = fields.tool_list("tools", &mut warnings).map_err(named)?;
    let disallowed = fields
        .tool_list("disallowedTools", &mut warnings)
        .map_err(named)?;
    let d = Definition {
        name: name.clone(),
        description,
        tools,
        disallowed_tools: disallowed.unwrap_or_default(),
        command: fields.command().map_err(named)?,
        limits: fields.limits().map_err(named)?,
        network: fields.network().map_err(named)?,
        network_allow: fields.network_allow().map_err(named)?,
        model: fields.text("model", &mut warnings),
        permission_mode: fields.permission_mode(&mut warnings),
        max_turns: fields.max_turns(&mut warnings),
        driver: fields.driver(&mut warnings),
        color: fields.text("color", &mut warnings),
        skills: fields.skills(&mut warnings),
        mcp_servers: fields.json("mcpServers", Value::is_array, "a list", &mut warnings),
        hooks: fields.json("hooks", Value::is_object, "a mapping", &mut warnings),
        body: front.body,
        source: file.to_path_buf(),
        lines: front.lines.clone(),
        warnings,
    };
    let mut d = d;
    d.warnings.extend(fields.unknown());
    frontmatter::cap_warnings(&mut d.warnings, front.untold);
    Ok(d)
}

/// The front matter's fields, and where each is, to name it in errors.
struct Fields<'a> {
    file: &'a Path,
    map: &'a serde_json::Map<String, Value>,
    lines: &'a BTreeMap<String, usize>,
}

impl Fields<'_> {
    /// The line of a top-level key (1 when it is not found).
    fn line_of(&self, key: &str) -> usize {
        self.lines.get(key).copied().unwrap_or(1)
    }

    /// An error on the line of `key`.
    fn invalid(&self, key: &str, message: impl Into<String>) -> DefinitionError {
        DefinitionError::new(self.file, self.line_of(key), Some(key), message)
    }

    /// A warning on the line of `key`.
    fn warning(&self, key: &str, message: &str) -> String {
        format!(
            "{}:{}: {key}: {message}",
            self.file.display(),
            self.line_of(key)
        )
    }

    /// An absent key, naming it on the first line of the front matter.
    fn required(&self, key: &str) -> DefinitionError {
        DefinitionError::new(self.file, 2, Some(key), "required")
    }

    /// The value of `key`, null included.
    fn raw(&self, key: &str) -> Option<&Value> {
        self.map.get(key)
    }

    /// The value of `key`; a null value is treated as absent.
    fn get(&self, key: &str) -> Option<&Value> {
        self.raw(key).filter(|v| !v.is_null())
    }

    fn string(&self, key: &str) -> Result<Option<String>, DefinitionError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(self.invalid(key, "expected a string")),
        }
    }

    fn name(&self) -> Result<String, DefinitionError> {
        let name = self.string("name")?.ok_or_else(|| self.required("name"))?;
        let name = name.trim().to_owned();
        if !valid_name(&name) {
            return Err(self.invalid(
                "name",
                format!("{name:?} must be 1 to {NAME_MAX} characters without control or format characters"),
            ));
        }
        Ok(name)
    }

    /// Claude Code writes its newlines as `\n` in a one-line description.
    fn description(&self) -> Result<String, DefinitionError> {
        self.string("description")?
            .filter(|d| !d.trim().is_empty())
            .map(|d| d.replace("\\n", "\n"))
            .ok_or_else(|| self.required("description"))
    }

    /// A list of tool entries, or one string of them separated by commas;
    /// present but empty (`[]`, `""`, nothing) is no tools, as in Claude
    /// Code.
    fn tool_list(
        &self,
        key: &str,
        warnings: &mut Vec<String>,
    ) -> Result<Option<Vec<String>>, DefinitionError> {
        let list = match self.raw(key) {
            None => return Ok(None),
            Some(Value::Null) => Vec::new(),
            Some(Value::String(s)) => split_tools(s),
            Some(Value::Array(seq)) => {
                let mut out = Vec::new();
                let mut ignored = 0;
                for v in seq {
                    match v {
                        Value::String(s) => out.extend(split_tools(s)),
                        _ => ignored += 1,
                    }
                }
                if ignored == 1 {
                    warnings.push(self.warning(key, "an entry that is not a name is ignored"));
                } else if ignored > 1 {
                    let why = format!("{ignored} entries that are not names are ignored");
                    warnings.push(self.warning(key, &why));
                }
                out
            }
            Some(_) => return Err(self.invalid(key, "expected a list or a comma-separated string")),
        };
        if list.len() > TOOLS_MAX {
            return Err(self.invalid(key, format!("more than {TOOLS_MAX} entries")));
        }
        Ok(Some(list))
    }

    /// A string field the agent driver reads; anything else is ignored
    /// with a warning.
    fn text(&self, key: &str, warnings: &mut Vec<String>) -> Option<String> {
        match self.get(key) {
            None => None,
            Some(Value::String(s)) => Some(s.trim().to_owned()).filter(|s| !s.is_empty()),
            Some(_) => {
                warnings.push(self.warning(key, "expected a string; ignored"));
                None
            }
        }
    }

    fn permission_mode(&self, warnings: &mut Vec<String>) -> Option<String> {
        let key = "permissionMode";
        let mode = self.text(key, warnings)?;
        if PERMISSION_MODES.contains(&mode.as_str()) {
            return Some(mode);
        }
        let known = PERMISSION_MODES.join(", ");
        warnings.push(self.warning(key, &format!("{mode:?} is not one of {known}; ignored")));
        None
    }

    /// One of the driver names; anything else is ignored with a warning.
    fn driver(&self, warnings: &mut Vec<String>) -> Option<crate::driver::Driver> {
        let key = "driver";
        let name = self.text(key, warnings)?;
        let d = crate::driver::Driver::parse(&name);
        if d.is_none() {
            let why = format!("{name:?} is not one of command, claude-code, codex; ignored");
            warnings.push(self.warning(key, &why));
        }
        d
    }

    /// A positive integer, or a string of one (as Claude Code takes it).
    fn max_turns(&self, warnings: &mut Vec<String>) -> Option<u32> {
        let key = "maxTurns";
        let n = match self.get(key)? {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.trim().parse::<u64>().ok(),
            _ => None,
        };
        match n.and_then(|n| u32::try_from(n).ok()).filter(|&n| n > 0) {
            Some(n) => Some(n),
            None => {
                warnings.push(self.warning(key, "expected a positive integer; ignored"));
                None
            }
        }
    }

    /// Skill names: a list, or one string separated by commas.
    fn skills(&self, warnings: &mut Vec<String>) -> Vec<String> {
        let key = "skills";
        let names: Option<Vec<String>> = match self.get(key) {
            None => return Vec::new(),
            Some(Value::String(s)) => Some(s.split(',').map(|s| s.trim().to_owned()).collect()),
            Some(Value::Array(seq)) => strings(seq),
            Some(_) => None,
        };
        match names {
            Some(n) => n.into_iter().filter(|s| !s.is_empty()).collect(),
            None => {
                warnings.push(self.warning(key, "expected a list of names; ignored"));
                Vec::new()
            }
        }
    }

    /// A structured field kept as written (as JSON) for the agent driver,
    /// when `shape` holds.
    fn json(
        &self,
        key: &str,
        shape: fn(&Value) -> bool,
        what: &str,
        warnings: &mut Vec<String>,
    ) -> Option<serde_json::Value> {
        let v = self.get(key)?;
        match Some(v.clone()).filter(shape) {
            Some(j) => Some(j),
            None => {
                warnings.push(self.warning(key, &format!("expected {what}; ignored")));
                None
            }
        }
    }

    fn command(&self) -> Result<Option<Vec<String>>, DefinitionError> {
        match self.get("command") {
            None => Ok(None),
            Some(Value::Array(seq)) if !seq.is_empty() => strings(seq)
                .map(Some)
                .ok_or_else(|| self.invalid("command", "expected a list of strings")),
            Some(_) => Err(self.invalid("command", "expected a non-empty list of strings")),
        }
    }

    /// The limits, which may not set the output cap (the operator's alone).
    fn limits(&self) -> Result<crate::Limits, DefinitionError> {
        let limits = match self.get("limits") {
            None => crate::Limits::default(),
            Some(v) => serde_json::from_value::<crate::Limits>(v.clone())
                .map_err(|e| self.invalid("limits", e.to_string()))?,
        };
        if limits.output_mb.is_some() {
            return Err(self.invalid("limits", "output_mb cannot be set by a definition"));
        }
        limits
            .validate()
            .map_err(|(f, why)| self.invalid("limits", format!("{f}: {why}")))?;
        Ok(limits)
    }

    fn network(&self) -> Result<Option<bool>, DefinitionError> {
        match self.get("network") {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.invalid("network", "expected true or false")),
        }
    }

    /// A list of `host:port` entries, each checked.
    fn network_allow(&self) -> Result<Vec<String>, DefinitionError> {
        let list = match self.get("network_allow") {
            None => return Ok(Vec::new()),
            Some(Value::Array(seq)) => strings(seq),
            Some(_) => None,
        }
        .ok_or_else(|| self.invalid("network_allow", "expected a list of \"host:port\""))?;
        crate::sandbox::network::parse_list(&list)
            .map_err(|(_, e)| self.invalid("network_allow", e.to_string()))?;
        Ok(list)
    }

    /// A warning for each field this version does not know, in file
    /// order.
    fn unknown(&self) -> Vec<String> {
        let mut keys: Vec<&str> = self.map.keys().map(String::as_str).collect();
        keys.sort_by_key(|k| self.line_of(k));
        keys.into_iter()
            .filter(|k| !KNOWN.contains(k))
            .map(|k| {
                format!(
                    "{}:{}: unknown field `{k}` ignored",
                    self.file.display(),
                    self.line_of(k)
                )
            })
            .collect()
    }
}

/// The strings of `seq`, or None if one is not a string.
fn strings(seq: &[Value]) -> Option<Vec<String>> {
    seq.iter().map(|v| v.as_str().map(str::to_owned)).collect()
}

/// Tool entries separated by commas or spaces outside parentheses
/// (`Read, Bash(git add:*)` is two entries).
fn split_tools(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut depth = 0usize;
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' | ' ' | '\t' | '\n' | '\r' if depth == 0 => {
                if !cur.trim().is_empty() {
                    out.push(cur.trim().to_owned());
                }
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_owned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "---\nname: reviewer\ndescription: Reviews a diff.\ntools: [file_read, grep]\ncommand: [my-agent, --headless]\nlimits:\n  wall_time_s: 600\nnetwork: false\nflavour: blue\n---\nYou review code.\n\nBe brief.\n";

    fn parsed(text: &str) -> Definition {
        parse(Path::new("/p/a.md"), text).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn parses_every_field_and_keeps_the_body() {
        let d = parse(Path::new("/p/.subagents/reviewer.md"), GOOD).unwrap();
        assert_eq!(d.name, "reviewer");
        assert_eq!(
            d.tools.as_deref(),
            Some(&["file_read".to_owned(), "grep".to_owned()][..])
        );
        assert_eq!(
            d.command.as_deref(),
            Some(&["my-agent".to_owned(), "--headless".to_owned()][..])
        );
        assert_eq!(d.limits.wall_time_s, Some(600));
        assert_eq!(d.network, Some(false));
        assert!(d.network_allow.is_empty());
        let listed = parse(
            Path::new("a.md"),
            "---\nname: a\ndescription: d\nnetwork_allow: [\"api.example.com:443\"]\n---\n",
        )
        .unwrap();
        assert_eq!(listed.network_allow, ["api.example.com:443"]);
        let bad = parse(
            Path::new("a.md"),
            "---\nname: a\ndescription: d\nnetwork_allow: [\"nope\"]\n---\n",
        )
        .unwrap_err();
        assert_eq!(bad.field.as_deref(), Some("network_allow"));
        assert_eq!(d.body, "You review code.\n\nBe brief.");
        assert_eq!(d.lines["network"], 8);
        assert_eq!(
            d.warnings,
            vec!["/p/.subagents/reviewer.md:9: unknown field `flavour` ignored".to_owned()]
        );
    }

    #[test]
    fn claude_code_fields_are_recorded() {
        let d = parsed("---\nname: code-reviewer\ndescription: Expert reviewer\ntools: Read, Grep, Bash(git diff:*)\ndisallowedTools: [Write]\nmodel: sonnet\npermissionMode: plan\nmaxTurns: \"12\"\ncolor: blue\nskills: review, lint\nmcpServers:\n  - github\n  - db: {command: npx}\nhooks:\n  Stop: [{command: ./done.sh}]\n---\nReview.\n");
        assert_eq!(d.tools.unwrap(), ["Read", "Grep", "Bash(git diff:*)"]);
        assert_eq!(d.disallowed_tools, ["Write"]);
        assert_eq!(d.model.as_deref(), Some("sonnet"));
        assert_eq!(d.permission_mode.as_deref(), Some("plan"));
        assert_eq!(d.max_turns, Some(12));
        assert_eq!(d.color.as_deref(), Some("blue"));
        assert_eq!(d.skills, ["review", "lint"]);
        assert_eq!(
            d.mcp_servers,
            Some(serde_json::json!(["github", {"db": {"command": "npx"}}]))
        );
        assert_eq!(
            d.hooks,
            Some(serde_json::json!({"Stop": [{"command": "./done.sh"}]}))
        );
        assert!(d.warnings.is_empty(), "{:?}", d.warnings);
    }

    #[test]
    fn bad_claude_code_values_are_ignored_with_a_warning() {
        let d = parsed("---\nname: a\ndescription: d\npermissionMode: yolo\nmaxTurns: -3\nmodel: [x]\nhooks: [x]\nmemory: project\n---\n");
        assert_eq!(
            (d.permission_mode, d.max_turns, d.model, d.hooks),
            (None, None, None, None)
        );
        let w = d.warnings.join("\n");
        for want in [
            "/p/a.md:4: permissionMode: \"yolo\" is not one of",
            "/p/a.md:5: maxTurns: expected a positive integer; ignored",
            "/p/a.md:6: model: expected a string; ignored",
            "/p/a.md:7: hooks: expected a mapping; ignored",
            "/p/a.md:8: unknown field `memory` ignored",
        ] {
            assert!(w.contains(want), "{want}\n{w}");
        }
    }

    #[test]
    fn empty_tools_are_no_tools_and_absent_tools_no_narrowing() {
        let tools =
            |line: &str| parsed(&format!("---\nname: a\ndescription: d\n{line}\n---\n")).tools;
        assert_eq!(tools(""), None);
        for empty in ["tools: []", "tools: \"\"", "tools:"] {
            assert_eq!(tools(empty), Some(vec![]), "{empty}");
        }
        assert_eq!(
            tools("tools: Read Grep,Bash(npm run test:*) , mcp__ctx__docs"),
            Some(vec![
                "Read".into(),
                "Grep".into(),
                "Bash(npm run test:*)".into(),
                "mcp__ctx__docs".into()
            ])
        );
        let d = parsed("---\nname: a\ndescription: d\ntools: [Read, 5, \"Grep, LS\"]\n---\n");
        assert_eq!(d.tools.unwrap(), ["Read", "Grep", "LS"]);
        assert_eq!(
            d.warnings,
            ["/p/a.md:4: tools: an entry that is not a name is ignored"]
        );
    }

    #[test]
    fn what_strict_yaml_refuses_is_read_line_by_line_with_the_file_line() {
        let text = "---\nname: api-expert\ndescription: Use this agent when: the API changes. Examples: none\ntools: Read\nmodel: opus\n---\nBody.\n";
        let d = parsed(text);
        assert_eq!(
            d.description,
            "Use this agent when: the API changes. Examples: none"
        );
        assert_eq!(d.tools.unwrap(), ["Read"]);
        assert_eq!(d.model.as_deref(), Some("opus"));
        assert_eq!(d.warnings.len(), 1, "{:?}", d.warnings);
        assert!(
            d.warnings[0].starts_with("/p/a.md:3: `description` is not valid YAML ("),
            "{:?}",
            d.warnings
        );
        let d =
            parsed("---\nname: b\ndescription: **Bold** helper\n  that wraps\ncolor: red\n---\n");
        assert_eq!(d.description, "**Bold** helper that wraps");
        assert_eq!(d.color.as_deref(), Some("red"));
        assert!(
            d.warnings[0].starts_with("/p/a.md:3: `description`"),
            "{:?}",
            d.warnings
        );
    }

    #[test]
    fn an_anchor_refuses_the_file_for_its_name_and_line() {
        let bomb = "---\nname: bomb\ndescription: d\nx: &x [a, b]\ny: [*x, *x]\n---\n";
        let e = parse(Path::new("/p/bomb.md"), bomb).unwrap_err();
        assert!(e.message.contains("aliases"), "{e}");
        assert_eq!((e.line, e.name.as_deref()), (4, Some("bomb")), "{e}");
        // Also when another field sends the reading line by line.
        let text = "---\nname: bomb\ndescription: a: b\nx: &x [a]\ny: [*x]\n---\n";
        let e = parse(Path::new("/p/bomb.md"), text).unwrap_err();
        assert!(e.message.contains("aliases"), "{e}");
        assert_eq!((e.line, e.name.as_deref()), (4, Some("bomb")), "{e}");
        let d = parsed("---\nname: a\ndescription: *bold* helper\n---\n");
        assert_eq!(d.description, "*bold* helper");
    }

    #[test]
    fn a_key_given_twice_keeps_the_first_with_a_warning() {
        let d = parsed("---\nname: a\ndescription: one\ndescription: two\n---\n");
        assert_eq!(d.description, "one");
        assert_eq!(
            d.warnings,
            ["/p/a.md:4: `description` is given again; the first (line 3) is used"]
        );
    }

    #[test]
    fn warnings_are_capped_and_a_huge_front_matter_is_an_error_for_its_name() {
        let stray = "x\n".repeat(50);
        let d = parsed(&format!("---\nname: a\ndescription: d\n{stray}---\n"));
        assert_eq!(d.warnings.len(), 21, "{:?}", d.warnings);
        assert_eq!(d.warnings[20], "… and 30 more warnings");
        let unknown: String = (0..30).map(|i| format!("k{i}: v\n")).collect();
        let d = parsed(&format!("---\nname: a\ndescription: d\n{unknown}---\n"));
        assert_eq!(d.warnings.len(), 21);
        assert_eq!(d.warnings[20], "… and 10 more warnings");
        let huge = "x\n".repeat(40_000);
        let e = parse(
            Path::new("/p/a.md"),
            &format!("---\nname: junk\ndescription: d\n{huge}---\n"),
        )
        .unwrap_err();
        assert!(e.message.contains("over the limit of 65536 bytes"), "{e}");
        assert_eq!(e.name.as_deref(), Some("junk"));
        let keys: String = (0..101).map(|i| format!("k{i}: v\n")).collect();
        let e = parse(
            Path::new("/p/a.md"),
            &format!("---\nname: \"many\"\ndescription: d\n{keys}---\n"),
        )
        .unwrap_err();
        assert!(e.message.contains("more than 100 fields"), "{e}");
        assert_eq!(e.name.as_deref(), Some("many"));
        let d = parsed("---\nname: a\ndescription: d\ntools: [1, 2, Read, 3]\n---\n");
        assert_eq!(
            d.warnings,
            ["/p/a.md:4: tools: 3 entries that are not names are ignored"]
        );
    }

    #[test]
    fn invisible_format_characters_make_no_lookalike_names() {
        for c in [
            '\u{200b}', '\u{200c}', '\u{200d}', '\u{2060}', '\u{feff}', '\u{ad}',
        ] {
            let text = format!("---\nname: \"rev{c}iewer\"\ndescription: d\n---\n");
            let e = parse(Path::new("/p/a.md"), &text).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("name"), "{c:?}");
            assert!(!valid_name(&format!("a{c}b")), "{c:?}");
        }
        assert!(valid_name("réviewer ünïcode"));
    }

    #[test]
    fn names_are_taken_as_claude_code_takes_them() {
        for name in ["Code Reviewer", "api.v2-helper", "DB_Expert"] {
            assert_eq!(
                parsed(&format!("---\nname: {name}\ndescription: d\n---\n")).name,
                name
            );
        }
    }

    #[test]
    fn errors_name_the_file_the_line_and_the_field() {
        let cases = [
            (
                "---\nname: \"a\\u0007b\"\ndescription: d\n---\n",
                2,
                Some("name"),
            ),
            ("---\nname: ok\n---\n", 2, Some("description")),
            (
                "---\nname: ok\ndescription: d\ntools: 5\n---\n",
                4,
                Some("tools"),
            ),
            (
                "---\nname: ok\ndescription: d\nlimits:\n  wall_time_s: soon\n---\n",
                4,
                Some("limits"),
            ),
            (
                "---\nname: ok\ndescription: d\nnetwork: maybe\n---\n",
                4,
                Some("network"),
            ),
            ("---\ndescription: [unclosed\n---\n", 2, Some("name")),
            ("no front matter\n", 1, None),
            ("\n---\nname: ok\ndescription: d\n---\n", 1, None),
            ("---\nname: ok\n", 1, None),
        ];
        for (text, line, field) in cases {
            let e = parse(Path::new("/d/a.md"), text).unwrap_err();
            assert_eq!((e.line, e.field.as_deref()), (line, field), "{text:?}: {e}");
            assert!(
                e.to_string().starts_with(&format!("/d/a.md:{line}: ")),
                "{e}"
            );
        }
        let e = parse(
            Path::new("/d/a.md"),
            "---\nname: ok\ntools: 5\ndescription: d\n---\n",
        )
        .unwrap_err();
        assert_eq!(
            e.name.as_deref(),
            Some("ok"),
            "an error names the name it blocks"
        );
    }
}
