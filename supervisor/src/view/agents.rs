//! The subagent definitions as JSON (`subagent agents --json` and the
//! MCP `list_agents` tool). Uses `crate::agents` and the tool policy.

/// `agents --json`: every field of each definition as read.
pub fn agents_json(
    found: &crate::agents::Found,
    policy: &policy::toolpolicy::ToolPolicy,
) -> serde_json::Value {
    use serde_json::json;
    let agents: Vec<serde_json::Value> = found
        .agents
        .iter()
        .map(|a| {
            let d = &a.definition;
            json!({"name": d.name, "description": d.description, "source": d.source,
                   "tools": a.shown_tools(policy), "disallowed_tools": a.tools.deny,
                   "tool_patterns": a.tools.patterns, "command": d.command,
                   "model": d.model, "permission_mode": d.permission_mode,
                   "max_turns": d.max_turns, "driver": d.driver, "color": d.color, "skills": d.skills,
                   "mcp_servers": d.mcp_servers, "hooks": d.hooks,
                   "body_chars": d.body.chars().count(), "warnings": a.warnings})
        })
        .collect();
    let duplicates: Vec<serde_json::Value> = found
        .duplicates
        .iter()
        .map(|d| json!({"name": d.name, "used": d.winner, "shadowed": d.shadowed, "over_user": d.over_user}))
        .collect();
    let errors: Vec<String> = found.errors.iter().map(|e| e.to_string()).collect();
    json!({"agents": agents, "duplicates": duplicates, "errors": errors, "notes": found.notes})
}
