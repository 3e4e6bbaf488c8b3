//! A definition's tool entries resolved against the catalog: our names
//! (the operator's too), Claude Code's names (in any case), their
//! `Tool(pattern)` forms (the pattern kept for the agent driver), and MCP
//! names and patterns (`mcp__server__tool`, `mcp__server`). An entry that
//! names nothing is dropped, with one warning for the definition: a
//! definition never makes a spawn fail because of a tool name.

use crate::definition::Definition;
use crate::toolpolicy::ToolPolicy;
use crate::tools::is_mcp_pattern;
use serde::Serialize;
use std::collections::HashSet;

/// Claude Code's tool names and ours (None: nothing a child of ours can
/// use; the entry is dropped without a warning).
pub const CLAUDE_TOOLS: &[(&str, Option<&str>)] = &[
    ("Read", Some("file_read")),
    ("NotebookRead", Some("file_read")),
    ("Write", Some("file_write")),
    ("Edit", Some("file_edit")),
    ("MultiEdit", Some("file_edit")),
    ("NotebookEdit", Some("file_edit")),
    ("Glob", Some("glob")),
    ("LS", Some("glob")),
    ("Grep", Some("grep")),
    ("Bash", Some("shell")),
    ("PowerShell", Some("shell")),
    // Background shells are part of `shell`; alone they grant nothing.
    ("BashOutput", None),
    ("KillShell", None),
    ("KillBash", None),
    ("TaskOutput", None),
    ("TaskStop", None),
    ("WebFetch", Some("web_fetch")),
    ("WebSearch", Some("web_search")),
    ("TodoWrite", Some("todo_write")),
    ("TodoRead", Some("todo_write")),
    ("TaskCreate", Some("todo_write")),
    ("TaskGet", Some("todo_write")),
    ("TaskUpdate", Some("todo_write")),
    ("TaskList", Some("todo_write")),
    // A child never delegates.
    ("Task", None),
    ("Agent", None),
    ("SendMessage", None),
    ("TeamCreate", None),
    ("TeamDelete", None),
    // A child runs unattended, in the mode and place it was given.
    ("AskUserQuestion", None),
    ("EnterPlanMode", None),
    ("ExitPlanMode", None),
    ("EnterWorktree", None),
    ("ExitWorktree", None),
    ("Skill", None),
    ("SlashCommand", None),
    ("CronCreate", None),
    ("CronDelete", None),
    ("CronList", None),
    ("RemoteTrigger", None),
    ("Sleep", None),
    ("ToolSearch", None),
    ("LSP", None),
    ("StructuredOutput", None),
    ("ListMcpResourcesTool", None),
    ("ReadMcpResourceTool", None),
];

/// A definition's tools, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct AgentTools {
    /// The names and MCP patterns it may use, each once, in the order
    /// written; None: any the parent may delegate (`tools` absent or `*`).
    pub allow: Option<Vec<String>>,
    /// The names and MCP patterns it may not use.
    pub deny: Vec<String>,
    /// The `Tool(pattern)` entries, for the agent driver. The sandbox
    /// grants the whole tool's rights; a pattern in `disallowedTools`
    /// does not take the tool away.
    pub patterns: Vec<ToolPattern>,
    /// The one warning about entries that name nothing, if any.
    pub warning: Option<String>,
}

/// One `Tool(pattern)` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolPattern {
    /// Our name of the tool.
    pub tool: String,
    /// What is between the parentheses, e.g. `git diff:*`.
    pub pattern: String,
    /// The entry as written, e.g. `Bash(git diff:*)`.
    pub written: String,
    /// From `disallowedTools`: what it matches is denied.
    pub deny: bool,
}

/// What one entry names.
enum Named {
    /// `*`: every tool.
    All,
    Tool(String),
    /// A Claude Code tool a child of ours has no use for.
    Nothing,
    Unknown,
}

/// Our name for Claude Code's `name` (matched in any case).
pub fn claude_tool(name: &str) -> Option<Option<&'static str>> {
    CLAUDE_TOOLS
        .iter()
        .find(|(c, _)| c.eq_ignore_ascii_case(name))
        .map(|(_, ours)| *ours)
}

fn named(policy: &ToolPolicy, name: &str) -> Named {
    if name == "*" {
        return Named::All;
    }
    if policy.tool(name).is_some() || is_mcp_pattern(name) {
        return Named::Tool(name.to_owned());
    }
    match claude_tool(name) {
        Some(Some(ours)) => Named::Tool(ours.to_owned()),
        Some(None) => Named::Nothing,
        None => Named::Unknown,
    }
}

/// `Tool(pattern)` → (`Tool`, `pattern`); any other entry as it is.
fn split_pattern(written: &str) -> (&str, Option<&str>) {
    match written.split_once('(') {
        Some((name, rest)) if rest.ends_with(')') && !name.trim().is_empty() => {
            (name.trim(), Some(&rest[..rest.len() - 1]))
        }
        _ => (written, None),
    }
}

/// Resolves `d`'s `tools` and `disallowedTools` against `policy`.
pub fn resolve(policy: &ToolPolicy, d: &Definition) -> AgentTools {
    let mut out = AgentTools::default();
    let mut unknown: Vec<&str> = Vec::new();
    let mut unknown_in_tools = false;
    let mut all = d.tools.is_none();
    let mut allow: Vec<String> = Vec::new();
    let mut seen = HashSet::new();
    for written in d.tools.iter().flatten() {
        let (name, pattern) = split_pattern(written);
        match named(policy, name) {
            Named::All => all = true,
            Named::Tool(t) => {
                if let Some(p) = pattern {
                    out.patterns.push(pattern_of(&t, p, written, false));
                }
                if seen.insert(t.clone()) {
                    allow.push(t);
                }
            }
            Named::Nothing => {}
            Named::Unknown => {
                unknown_in_tools = true;
                unknown.push(written);
            }
        }
    }
    let mut deny_all = false;
    let mut denied = HashSet::new();
    for written in &d.disallowed_tools {
        let (name, pattern) = split_pattern(written);
        match (named(policy, name), pattern) {
            (Named::All, _) => deny_all = true,
            (Named::Tool(t), Some(p)) => out.patterns.push(pattern_of(&t, p, written, true)),
            (Named::Tool(t), None) if denied.insert(t.clone()) => out.deny.push(t),
            (Named::Unknown, _) => unknown.push(written),
            _ => {}
        }
    }
    out.allow = match (deny_all, all) {
        (true, _) => Some(Vec::new()),
        (false, true) => None,
        (false, false) => Some(allow),
    };
    if !unknown.is_empty() {
        let key = if unknown_in_tools {
            "tools"
        } else {
            "disallowedTools"
        };
        let line = d.lines.get(key).copied().unwrap_or(1);
        out.warning = Some(format!(
            "{}:{line}: {key}: unknown tools dropped: {}",
            d.source.display(),
            unknown.join(", ")
        ));
    }
    out
}

fn pattern_of(tool: &str, pattern: &str, written: &str, deny: bool) -> ToolPattern {
    ToolPattern {
        tool: tool.to_owned(),
        pattern: pattern.to_owned(),
        written: written.to_owned(),
        deny,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn tools_of(front: &str) -> AgentTools {
        let text = format!("---\nname: a\ndescription: d\n{front}\n---\n");
        let d = crate::definition::parse(Path::new("/p/a.md"), &text).unwrap();
        resolve(&ToolPolicy::builtin(), &d)
    }

    fn allow(front: &str) -> Option<Vec<String>> {
        tools_of(front).allow
    }

    fn strs(v: &[&str]) -> Option<Vec<String>> {
        Some(v.iter().map(|s| (*s).to_owned()).collect())
    }

    #[test]
    fn every_claude_code_name_maps_to_a_catalog_tool_or_to_nothing() {
        let p = ToolPolicy::builtin();
        for (claude, ours) in CLAUDE_TOOLS {
            if let Some(ours) = ours {
                assert!(p.tool(ours).is_some(), "{claude} → {ours}");
            }
            let r = tools_of(&format!("tools: {claude}, {}", claude.to_lowercase()));
            assert_eq!(
                r.allow,
                Some(ours.iter().map(|s| (*s).to_owned()).collect()),
                "{claude}"
            );
            assert_eq!(r.warning, None, "{claude}");
        }
    }

    #[test]
    fn each_tool_once_and_star_and_absence_mean_all() {
        assert_eq!(
            allow("tools: LS, Glob, Read, file_read"),
            strs(&["glob", "file_read"])
        );
        assert_eq!(allow(""), None);
        assert_eq!(allow("tools: Read, *"), None);
        assert_eq!(allow("tools: []"), strs(&[]));
        assert_eq!(allow("tools: Task, Agent(worker), SendMessage"), strs(&[]));
    }

    #[test]
    fn patterns_are_kept_for_the_driver() {
        let r = tools_of("tools: Read, Bash(git diff:*), Bash(npm run test:*)\ndisallowedTools: Bash(rm:*), WebFetch");
        assert_eq!(r.allow, strs(&["file_read", "shell"]));
        assert_eq!(
            r.deny,
            ["web_fetch"],
            "a deny pattern does not take the tool away"
        );
        let got: Vec<(&str, &str, bool)> = r
            .patterns
            .iter()
            .map(|p| (p.tool.as_str(), p.pattern.as_str(), p.deny))
            .collect();
        assert_eq!(
            got,
            [
                ("shell", "git diff:*", false),
                ("shell", "npm run test:*", false),
                ("shell", "rm:*", true)
            ]
        );
        assert_eq!(r.patterns[0].written, "Bash(git diff:*)");
    }

    #[test]
    fn mcp_names_are_kept_and_unknown_names_dropped_with_one_warning() {
        let r = tools_of("tools: Read, mcp__context7__get-library-docs, mcp__github, teleport, Bash(\nmodel: x\ndisallowedTools: blink");
        assert_eq!(
            r.allow,
            strs(&[
                "file_read",
                "mcp__context7__get-library-docs",
                "mcp__github"
            ])
        );
        assert_eq!(
            r.warning.as_deref(),
            Some("/p/a.md:4: tools: unknown tools dropped: teleport, Bash(, blink")
        );
        let r = tools_of("disallowedTools: blink");
        assert_eq!(
            r.warning.as_deref(),
            Some("/p/a.md:4: disallowedTools: unknown tools dropped: blink")
        );
    }

    #[test]
    fn disallowing_everything_leaves_nothing() {
        let r = tools_of("tools: Read\ndisallowedTools: \"*\"");
        assert_eq!(r.allow, strs(&[]));
    }
}
