//! The tool catalog: every tool a parent may hold, with a one-line
//! description, the JSON schema of its parameters, and the capability
//! class that says which OS rights it needs.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Which OS right a tool needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Capability {
    /// Reads the project.
    ReadProject,
    /// Writes the project.
    WriteProject,
    /// Runs other programs.
    Exec,
    /// Uses the network.
    Network,
    /// Delegates to subagents (never given to a child).
    Delegate,
    /// Attaches files to the parent's conversation (never given to a child).
    Attach,
    /// A tool of an MCP server the agent's own MCP client reaches
    /// (`mcp__<server>__<tool>`): no OS right of its own.
    Mcp,
    /// Needs no OS right.
    None,
}

impl Capability {
    /// Whether a child may ever hold a tool of this class.
    pub fn delegable(self) -> bool {
        !matches!(self, Capability::Delegate | Capability::Attach)
    }
}

/// One tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    /// Its name, e.g. `file_read`.
    pub name: String,
    /// One line saying what it does.
    pub description: String,
    /// The OS right a child holding it gets, or that no child may hold it.
    pub class: Capability,
    /// The JSON schema of its parameters.
    #[serde(default = "empty_schema")]
    pub schema: Value,
}

fn empty_schema() -> Value {
    json!({"type": "object", "properties": {}, "additionalProperties": false})
}

fn obj(props: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": props, "required": required, "additionalProperties": false})
}

fn tool(name: &str, class: Capability, description: &str, schema: Value) -> Tool {
    Tool {
        name: name.to_owned(),
        description: description.to_owned(),
        class,
        schema,
    }
}

/// The built-in catalog, in a fixed order.
pub fn builtin() -> Vec<Tool> {
    use Capability::*;
    let path =
        json!({"type": "string", "description": "a path, absolute or relative to the project"});
    vec![
        tool(
            "file_read",
            ReadProject,
            "Read a file of the project.",
            obj(
                json!({"path": path, "offset": {"type": "integer", "minimum": 0}, "limit": {"type": "integer", "minimum": 1}}),
                &["path"],
            ),
        ),
        tool(
            "file_write",
            WriteProject,
            "Create or overwrite a file of the project.",
            obj(
                json!({"path": path, "content": {"type": "string"}}),
                &["path", "content"],
            ),
        ),
        tool(
            "file_edit",
            WriteProject,
            "Replace an exact string in a file of the project.",
            obj(
                json!({"path": path, "old": {"type": "string"}, "new": {"type": "string"}}),
                &["path", "old", "new"],
            ),
        ),
        tool(
            "glob",
            ReadProject,
            "List project files matching a glob pattern.",
            obj(json!({"pattern": {"type": "string"}}), &["pattern"]),
        ),
        tool(
            "grep",
            ReadProject,
            "Search project files for a regular expression.",
            obj(
                json!({"pattern": {"type": "string"}, "path": path}),
                &["pattern"],
            ),
        ),
        tool(
            "shell",
            Exec,
            "Run a shell command in the project directory.",
            obj(
                json!({"command": {"type": "string"}, "timeout_s": {"type": "integer", "minimum": 1}}),
                &["command"],
            ),
        ),
        tool(
            "web_fetch",
            Network,
            "Fetch a URL and return its content.",
            obj(
                json!({"url": {"type": "string", "format": "uri"}}),
                &["url"],
            ),
        ),
        tool(
            "web_search",
            Network,
            "Search the web.",
            obj(json!({"query": {"type": "string"}}), &["query"]),
        ),
        tool(
            "memory_search",
            None,
            "Search the agent's memory.",
            obj(json!({"query": {"type": "string"}}), &["query"]),
        ),
        tool(
            "memory_write",
            None,
            "Store a fact in the agent's memory.",
            obj(json!({"text": {"type": "string"}}), &["text"]),
        ),
        tool(
            "todo_write",
            None,
            "Replace the agent's todo list.",
            obj(
                json!({"items": {"type": "array", "items": {"type": "string"}}}),
                &["items"],
            ),
        ),
        tool(
            "spawn_agent",
            Delegate,
            "Delegate a task to a subagent.",
            obj(
                json!({"task": {"type": "string"}, "context": {"type": "string"}, "agent": {"type": "string"}}),
                &["task"],
            ),
        ),
        tool(
            "check_agent_run",
            Delegate,
            "Check on a subagent run.",
            obj(json!({"run_id": {"type": "string"}}), &["run_id"]),
        ),
        tool(
            "attach_file",
            Attach,
            "Attach a file to the conversation.",
            obj(json!({"path": path}), &["path"]),
        ),
    ]
}

/// Names a child never gets, whatever its class says.
pub const NEVER_DELEGATED: &[&str] = &["spawn_agent", "check_agent_run", "attach_file"];

/// The longest MCP tool name or pattern.
pub const MCP_NAME_MAX: usize = 128;

fn mcp_part(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Whether `name` names one MCP tool: `mcp__<server>__<tool>`, ASCII
/// letters, digits, `_` and `-`.
pub fn is_mcp_tool(name: &str) -> bool {
    name.len() <= MCP_NAME_MAX
        && name
            .strip_prefix("mcp__")
            .and_then(|rest| rest.split_once("__"))
            .is_some_and(|(server, tool)| mcp_part(server) && mcp_part(tool))
}

/// Whether `p` names a set of MCP tools: `mcp__*` (all), `mcp__<server>`
/// or `mcp__<server>__*` (one server's).
pub fn is_mcp_pattern(p: &str) -> bool {
    let Some(rest) = p.strip_prefix("mcp__").filter(|_| p.len() <= MCP_NAME_MAX) else {
        return false;
    };
    let server = rest.strip_suffix("__*").unwrap_or(rest);
    rest == "*" || mcp_part(server) && !server.contains("__")
}

/// Whether the entry `entry` (a name or an MCP pattern) covers the tool
/// `name`.
pub fn covers(entry: &str, name: &str) -> bool {
    if entry == name {
        return true;
    }
    if !is_mcp_tool(name) || !is_mcp_pattern(entry) {
        return false;
    }
    let server = entry.strip_prefix("mcp__").unwrap_or_default();
    let server = server.strip_suffix("__*").unwrap_or(server);
    server == "*" || name.starts_with(&format!("mcp__{server}__"))
}

/// The catalog entry of the MCP tool `name` (see [`is_mcp_tool`]): its
/// parameters are the MCP server's, which the agent's client knows.
pub fn mcp_tool(name: &str) -> Tool {
    let (server, tool_name) = name
        .strip_prefix("mcp__")
        .and_then(|r| r.split_once("__"))
        .unwrap_or((name, name));
    Tool {
        name: name.to_owned(),
        description: format!(
            "The tool {tool_name} of the MCP server {server} (reached by the agent's own MCP client)."
        ),
        class: Capability::Mcp,
        schema: json!({"type": "object"}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_catalog_has_the_issue_tools_with_unique_names() {
        let names: Vec<String> = builtin().into_iter().map(|t| t.name).collect();
        for want in [
            "file_read",
            "file_write",
            "file_edit",
            "glob",
            "grep",
            "shell",
            "web_fetch",
            "web_search",
            "memory_search",
            "memory_write",
            "todo_write",
            "spawn_agent",
            "check_agent_run",
            "attach_file",
        ] {
            assert!(names.iter().any(|n| n == want), "{want}");
        }
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len());
        for t in builtin() {
            assert_eq!(t.schema["type"], "object", "{}", t.name);
            if NEVER_DELEGATED.contains(&t.name.as_str()) {
                assert!(!t.class.delegable(), "{}", t.name);
            }
        }
    }

    #[test]
    fn mcp_names_and_patterns() {
        for ok in ["mcp__context7__get-library-docs", "mcp__a_b__c"] {
            assert!(is_mcp_tool(ok), "{ok}");
            assert!(!is_mcp_pattern(ok), "{ok}");
        }
        for bad in [
            "mcp__",
            "mcp__x",
            "mcp____y",
            "mcp__x__",
            "mcp__x__y z",
            "mcp__x__*",
            "Read",
        ] {
            assert!(!is_mcp_tool(bad), "{bad}");
        }
        assert!(!is_mcp_tool(&format!(
            "mcp__s__{}",
            "t".repeat(MCP_NAME_MAX)
        )));
        for p in ["mcp__*", "mcp__github", "mcp__github__*"] {
            assert!(is_mcp_pattern(p), "{p}");
        }
        for p in [
            "mcp__",
            "mcp__git hub",
            "mcp__a__b",
            "mcp__a__b__*",
            "mcp__*__*",
        ] {
            assert!(!is_mcp_pattern(p), "{p}");
        }
        let t = "mcp__github__create_issue";
        for entry in [t, "mcp__*", "mcp__github", "mcp__github__*"] {
            assert!(covers(entry, t), "{entry}");
        }
        for entry in [
            "mcp__git",
            "mcp__gitlab__*",
            "mcp__github__create",
            "file_read",
        ] {
            assert!(!covers(entry, t), "{entry}");
        }
        let tool = mcp_tool(t);
        assert_eq!(
            (tool.class, tool.class.delegable()),
            (Capability::Mcp, true)
        );
        assert!(tool.description.contains("create_issue") && tool.description.contains("github"));
    }
}
