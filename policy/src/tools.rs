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
}
