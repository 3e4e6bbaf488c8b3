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
    /// Unknown fields, tolerated.
    pub warnings: Vec<String>,
}

/// A definition file that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}:{line}: {}{message}", file.display(), field.as_ref().map(|f| format!("{f}: ")).unwrap_or_default())]
pub struct DefinitionError {
    /// The file.
    pub file: PathBuf,
    /// 1-based line (of the field, when one is at fault).
    pub line: usize,
    /// The field at fault, if any.
    pub field: Option<String>,
    /// What is wrong.
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
    let err = |line: usize, field: Option<&str>, message: String| DefinitionError {
        file: file.to_path_buf(),
        line,
        field: field.map(str::to_owned),
        message,
    };
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    if lines.next().map(str::trim_end) != Some("---") {
        return Err(err(
            1,
            None,
            "expected YAML front matter opening with ---".into(),
        ));
    }
    let mut front = String::new();
    let mut front_lines = Vec::new();
    let mut closed = false;
    let mut consumed = text.find('\n').map_or(text.len(), |i| i + 1);
    for l in lines.by_ref() {
        consumed += l.len();
        if l.trim_end() == "---" {
            closed = true;
            break;
        }
        front.push_str(l);
        front_lines.push(l.to_owned());
    }
    if !closed {
        return Err(err(
            1,
            None,
            "the front matter is not closed with ---".into(),
        ));
    }
    let body = text[consumed.min(text.len())..].trim().to_owned();
    // The line of a top-level key (front matter starts on line 2).
    let line_of = |key: &str| {
        front_lines
            .iter()
            .position(|l| l.starts_with(&format!("{key}:")))
            .map_or(1, |i| i + 2)
    };
    let map: serde_yaml::Mapping = match serde_yaml::from_str::<Value>(&front) {
        Ok(Value::Mapping(m)) => m,
        Ok(Value::Null) => serde_yaml::Mapping::new(),
        Ok(_) => {
            return Err(err(
                2,
                None,
                "the front matter must be a mapping of fields".into(),
            ))
        }
        Err(e) => {
            let line = e.location().map_or(2, |l| l.line() + 1);
            return Err(err(line, None, format!("invalid YAML: {e}")));
        }
    };
    let get = |k: &str| map.get(Value::String(k.to_owned()));
    let string = |k: &str| -> Result<Option<String>, DefinitionError> {
        match get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(err(line_of(k), Some(k), "expected a string".into())),
        }
    };
    let name = string("name")?.ok_or_else(|| err(2, Some("name"), "required".into()))?;
    if !valid_name(&name) {
        return Err(err(
            line_of("name"),
            Some("name"),
            format!("{name:?} must match [a-z0-9-]+"),
        ));
    }
    let description = string("description")?
        .filter(|d| !d.trim().is_empty())
        .ok_or_else(|| err(2, Some("description"), "required".into()))?;
    let tools = match get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(
            s.split(',')
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty())
                .collect(),
        ),
        Some(Value::Sequence(seq)) => Some(
            seq.iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<Vec<String>>>()
                .ok_or_else(|| {
                    err(
                        line_of("tools"),
                        Some("tools"),
                        "expected a list of tool names".into(),
                    )
                })?,
        ),
        Some(_) => {
            return Err(err(
                line_of("tools"),
                Some("tools"),
                "expected a list or a comma-separated string".into(),
            ))
        }
    };
    let tools = tools.map(|ts: Vec<String>| {
        if claude {
            ts.into_iter()
                .map(|t| {
                    CLAUDE_TOOLS
                        .iter()
                        .find(|(c, _)| *c == t)
                        .map_or(t, |(_, ours)| (*ours).to_owned())
                })
                .collect()
        } else {
            ts
        }
    });
    let command = match get("command") {
        None | Some(Value::Null) => None,
        Some(Value::Sequence(seq)) if !seq.is_empty() => Some(
            seq.iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect::<Option<Vec<String>>>()
                .ok_or_else(|| {
                    err(
                        line_of("command"),
                        Some("command"),
                        "expected a list of strings".into(),
                    )
                })?,
        ),
        Some(_) => {
            return Err(err(
                line_of("command"),
                Some("command"),
                "expected a non-empty list of strings".into(),
            ))
        }
    };
    let limits = match get("limits") {
        None | Some(Value::Null) => crate::Limits::default(),
        Some(v) => serde_yaml::from_value::<crate::Limits>(v.clone())
            .map_err(|e| err(line_of("limits"), Some("limits"), e.to_string()))?,
    };
    if limits.output_mb.is_some() {
        return Err(err(
            line_of("limits"),
            Some("limits"),
            "output_mb cannot be set by a definition".into(),
        ));
    }
    limits
        .validate()
        .map_err(|(f, why)| err(line_of("limits"), Some("limits"), format!("{f}: {why}")))?;
    let network = match get("network") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => {
            return Err(err(
                line_of("network"),
                Some("network"),
                "expected true or false".into(),
            ))
        }
    };
    let mut warnings = Vec::new();
    for k in map.keys() {
        let k = k.as_str().unwrap_or("?");
        if !KNOWN.contains(&k) {
            warnings.push(format!(
                "{}:{}: unknown field `{k}` ignored",
                file.display(),
                line_of(k)
            ));
        }
    }
    Ok(Definition {
        name,
        description,
        tools,
        command,
        limits,
        network,
        body,
        source: file.to_path_buf(),
        warnings,
    })
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
