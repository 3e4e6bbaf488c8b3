//! Subagent definitions: Markdown files with YAML front matter, whose body
//! is the subagent's own prompt. Parsed from text (the caller reads the
//! file); Claude Code's `.claude/agents/` files are read as well, with its
//! tool names mapped to ours.

use serde_yaml::Value;
use std::path::{Path, PathBuf};

/// A parsed definition.
#[derive(Debug, Clone, PartialEq)]
pub struct Definition {
    /// `[a-z0-9-]+`.
    pub name: String,
    /// What it is for.
    pub description: String,
    /// The tools it may use (narrows the parent's); None: no restriction.
    pub tools: Option<Vec<String>>,
    /// The agent program's argv.
    pub command: Option<Vec<String>>,
    /// Default limits for its runs.
    pub limits: crate::Limits,
    /// Whether it wants the network (narrows, never widens).
    pub network: Option<bool>,
    /// The Markdown body: the subagent's own prompt.
    pub body: String,
    /// The file it came from.
    pub source: PathBuf,
    /// One message per unknown field, which is ignored.
    pub warnings: Vec<String>,
}

/// A definition file that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}:{line}: {}{message}", file.display(), field.as_ref().map(|f| format!("{f}: ")).unwrap_or_default())]
pub struct DefinitionError {
    pub file: PathBuf,
    /// 1-based line (of the field, when one is at fault).
    pub line: usize,
    /// The field at fault, if any.
    pub field: Option<String>,
    pub message: String,
}

/// Claude Code's tool names → ours.
pub const CLAUDE_TOOLS: &[(&str, &str)] = &[
    ("Read", "file_read"),
    ("Write", "file_write"),
    ("Edit", "file_edit"),
    ("MultiEdit", "file_edit"),
    ("Glob", "glob"),
    ("Grep", "grep"),
    ("LS", "glob"),
    ("Bash", "shell"),
    ("WebFetch", "web_fetch"),
    ("WebSearch", "web_search"),
    ("TodoWrite", "todo_write"),
    ("Task", "spawn_agent"),
];

const KNOWN: &[&str] = &[
    "name",
    "description",
    "tools",
    "command",
    "limits",
    "network",
];

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Parses a definition. `claude` maps Claude Code tool names.
pub fn parse(file: &Path, text: &str, claude: bool) -> Result<Definition, DefinitionError> {
    let front = FrontMatter::split(file, text)?;
    let fields = Fields::parse(file, &front.lines)?;
    let name = fields.name()?;
    let description = fields.description()?;
    let mut tools = fields.tools()?;
    if claude {
        tools = tools.map(|ts| ts.into_iter().map(claude_tool).collect());
    }
    Ok(Definition {
        name,
        description,
        tools,
        command: fields.command()?,
        limits: fields.limits()?,
        network: fields.network()?,
        body: front.body,
        source: file.to_path_buf(),
        warnings: fields.unknown(),
    })
}

impl DefinitionError {
    fn new(file: &Path, line: usize, field: Option<&str>, message: impl Into<String>) -> Self {
        DefinitionError {
            file: file.to_path_buf(),
            line,
            field: field.map(str::to_owned),
            message: message.into(),
        }
    }
}

/// A definition's text split at the `---` lines.
struct FrontMatter {
    /// The YAML between the `---` lines, which begins on line 2.
    lines: Vec<String>,
    body: String,
}

impl FrontMatter {
    fn split(file: &Path, text: &str) -> Result<FrontMatter, DefinitionError> {
        let fail = |message: &str| DefinitionError::new(file, 1, None, message);
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut lines = text.split_inclusive('\n');
        if lines.next().map(str::trim_end) != Some("---") {
            return Err(fail("expected YAML front matter opening with ---"));
        }
        let mut front = Vec::new();
        let mut consumed = text.find('\n').map_or(text.len(), |i| i + 1);
        for l in lines {
            consumed += l.len();
            if l.trim_end() == "---" {
                let body = text[consumed.min(text.len())..].trim().to_owned();
                return Ok(FrontMatter { lines: front, body });
            }
            front.push(l.to_owned());
        }
        Err(fail("the front matter is not closed with ---"))
    }
}

/// The front matter's fields, and where each is, to name it in errors.
struct Fields<'a> {
    file: &'a Path,
    map: serde_yaml::Mapping,
    lines: &'a [String],
}

impl<'a> Fields<'a> {
    fn parse(file: &'a Path, lines: &'a [String]) -> Result<Fields<'a>, DefinitionError> {
        let fail = |line, message: String| DefinitionError::new(file, line, None, message);
        let map = match serde_yaml::from_str::<Value>(&lines.concat()) {
            Ok(Value::Mapping(m)) => m,
            Ok(Value::Null) => serde_yaml::Mapping::new(),
            Ok(_) => {
                return Err(fail(
                    2,
                    "the front matter must be a mapping of fields".into(),
                ))
            }
            Err(e) => {
                let line = e.location().map_or(2, |l| l.line() + 1);
                return Err(fail(line, format!("invalid YAML: {e}")));
            }
        };
        Ok(Fields { file, map, lines })
    }

    /// The line of a top-level key (1 when it is not found).
    fn line_of(&self, key: &str) -> usize {
        self.lines
            .iter()
            .position(|l| l.starts_with(&format!("{key}:")))
            .map_or(1, |i| i + 2)
    }

    /// An error on the line of `key`.
    fn invalid(&self, key: &str, message: impl Into<String>) -> DefinitionError {
        DefinitionError::new(self.file, self.line_of(key), Some(key), message)
    }

    /// An absent key, naming it on the first line of the front matter.
    fn required(&self, key: &str) -> DefinitionError {
        DefinitionError::new(self.file, 2, Some(key), "required")
    }

    /// The value of `key`; a null value is treated as absent.
    fn get(&self, key: &str) -> Option<&Value> {
        self.map
            .get(Value::String(key.to_owned()))
            .filter(|v| !v.is_null())
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
        if !valid_name(&name) {
            return Err(self.invalid("name", format!("{name:?} must match [a-z0-9-]+")));
        }
        Ok(name)
    }

    fn description(&self) -> Result<String, DefinitionError> {
        self.string("description")?
            .filter(|d| !d.trim().is_empty())
            .ok_or_else(|| self.required("description"))
    }

    /// A list of names, or one string of comma-separated names.
    fn tools(&self) -> Result<Option<Vec<String>>, DefinitionError> {
        match self.get("tools") {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(
                s.split(',')
                    .map(|t| t.trim().to_owned())
                    .filter(|t| !t.is_empty())
                    .collect(),
            )),
            Some(Value::Sequence(seq)) => strings(seq)
                .map(Some)
                .ok_or_else(|| self.invalid("tools", "expected a list of tool names")),
            Some(_) => Err(self.invalid("tools", "expected a list or a comma-separated string")),
        }
    }

    fn command(&self) -> Result<Option<Vec<String>>, DefinitionError> {
        match self.get("command") {
            None => Ok(None),
            Some(Value::Sequence(seq)) if !seq.is_empty() => strings(seq)
                .map(Some)
                .ok_or_else(|| self.invalid("command", "expected a list of strings")),
            Some(_) => Err(self.invalid("command", "expected a non-empty list of strings")),
        }
    }

    /// The limits, which may not set the output cap (the operator's alone).
    fn limits(&self) -> Result<crate::Limits, DefinitionError> {
        let limits = match self.get("limits") {
            None => crate::Limits::default(),
            Some(v) => serde_yaml::from_value::<crate::Limits>(v.clone())
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

    /// A warning for each field this version does not know.
    fn unknown(&self) -> Vec<String> {
        self.map
            .keys()
            .map(|k| k.as_str().unwrap_or("?"))
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

/// Our name for a Claude Code tool name; other names pass unchanged.
fn claude_tool(name: String) -> String {
    CLAUDE_TOOLS
        .iter()
        .find(|(c, _)| *c == name)
        .map_or(name, |(_, ours)| (*ours).to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "---\nname: reviewer\ndescription: Reviews a diff.\ntools: [file_read, grep]\ncommand: [my-agent, --headless]\nlimits:\n  wall_time_s: 600\nnetwork: false\ncolor: blue\n---\nYou review code.\n\nBe brief.\n";

    #[test]
    fn parses_every_field_and_keeps_the_body() {
        let d = parse(Path::new("/p/.subagents/reviewer.md"), GOOD, false).unwrap();
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
        assert_eq!(d.body, "You review code.\n\nBe brief.");
        assert_eq!(
            d.warnings,
            vec!["/p/.subagents/reviewer.md:9: unknown field `color` ignored".to_owned()]
        );
    }

    #[test]
    fn claude_code_files_work_unchanged() {
        let text = "---\nname: code-reviewer\ndescription: Expert reviewer\ntools: Read, Grep, Glob, Bash\nmodel: sonnet\n---\nReview.\n";
        let d = parse(Path::new("x.md"), text, true).unwrap();
        assert_eq!(d.tools.unwrap(), ["file_read", "grep", "glob", "shell"]);
    }

    #[test]
    fn errors_name_the_file_the_line_and_the_field() {
        let cases = [
            (
                "---\nname: Bad_Name\ndescription: d\n---\n",
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
            ("---\nname: [unclosed\n---\n", 3, None),
            ("no front matter\n", 1, None),
            ("---\nname: ok\n", 1, None),
        ];
        for (text, line, field) in cases {
            let e = parse(Path::new("/d/a.md"), text, false).unwrap_err();
            assert_eq!((e.line, e.field.as_deref()), (line, field), "{text:?}: {e}");
            assert!(
                e.to_string().starts_with(&format!("/d/a.md:{line}: ")),
                "{e}"
            );
        }
    }
}
