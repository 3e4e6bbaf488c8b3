//! The MCP tools: their arguments (with the JSON schemas a model reads)
//! and their descriptions.

use rmcp::model::Tool;
use schemars::JsonSchema;
use serde::Deserialize;
use std::sync::Arc;

/// The longest `wait_agent_run` may block, in seconds: MCP clients give a
/// tool call about 60 s.
pub const MAX_WAIT_S: u64 = 50;
/// `wait_agent_run`'s timeout when none is given.
pub const DEFAULT_WAIT_S: u64 = 45;
/// The lines `read_agent_log` returns when neither `tail` nor `offset` is given.
pub const DEFAULT_TAIL_LINES: usize = 50;
/// The most lines `read_agent_log`'s `tail` asks for; more is read as this.
pub const MAX_TAIL_LINES: usize = 1000;

/// Arguments of `spawn_agent`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnArgs {
    /// What the subagent must do, stated completely: it sees nothing of this conversation but this text, `context` and the project's files.
    pub task: String,
    /// Background the subagent needs: decisions made, files that matter, constraints.
    #[serde(default)]
    pub context: Option<String>,
    /// A subagent definition to run, by name (see `list_agents`).
    #[serde(default)]
    pub agent: Option<String>,
    /// How the subagent is started, when the daemon offers drivers: `claude-code` (Claude Code), `codex` (Codex) or `command` (the program in `command`).
    #[serde(default)]
    pub driver: Option<String>,
    /// The program to run as the subagent, as an argv array (e.g. ["sh", "-c", "make test"]). Without it, the definition's or the daemon's configured command runs.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// Only these of your tools for the subagent (by catalog name); default: all you may delegate.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// Let the subagent write the project directory (default: read only, unless its tools grant writing).
    #[serde(default)]
    pub write_project: Option<bool>,
    /// Hosts the subagent may reach, as "host:port" (e.g. "api.github.com:443", "*.pypi.org:443"), each within the hosts this server was given; everything else stays unreachable.
    #[serde(default)]
    pub network_allow: Option<Vec<String>>,
    /// Wall-clock limit in seconds (default 3600); the run is killed after it.
    #[serde(default)]
    pub wall_time_s: Option<u64>,
    /// Work in a git worktree of its own on a new branch `subagent/<run_id>`, leaving your checkout untouched.
    #[serde(default)]
    pub worktree: Option<bool>,
}

/// Arguments naming one run.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunArgs {
    /// The run id `spawn_agent` returned.
    pub run_id: String,
}

/// Arguments of `wait_agent_run`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitArgs {
    /// The run id `spawn_agent` returned.
    pub run_id: String,
    /// Seconds to wait at most (default 45, at most 50). When it passes, the answer says the run is still running; call again to keep waiting.
    #[serde(default)]
    pub timeout_s: Option<u64>,
}

/// Arguments of `list_agent_runs`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// Whose runs: a session id, or "*" for every session; default: this conversation's.
    #[serde(default)]
    pub session: Option<String>,
    /// Only runs in this state: accepted, running, succeeded, failed, cancelled, timed_out or lost.
    #[serde(default)]
    pub state: Option<String>,
    /// At most this many runs (default 50, at most 1000).
    #[serde(default)]
    pub limit: Option<u64>,
    /// The `next_cursor` of the previous answer, to list the runs after it.
    #[serde(default)]
    pub cursor: Option<String>,
}

/// Arguments of `agent_usage`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UsageArgs {
    /// Whose runs: a session id, or "*" for every session; default: this conversation's.
    #[serde(default)]
    pub session: Option<String>,
    /// Only runs created at or after this RFC 3339 time (e.g. "2026-01-31T12:00:00Z").
    #[serde(default)]
    pub since: Option<String>,
    /// Only runs created at or before this RFC 3339 time.
    #[serde(default)]
    pub until: Option<String>,
}

/// Arguments of `read_agent_log`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogArgs {
    /// The run id `spawn_agent` returned.
    pub run_id: String,
    /// The last this many lines (default 50 when `offset` is not given; at most 1000, and at most 64 KiB).
    #[serde(default)]
    pub tail: Option<usize>,
    /// Read from this byte offset instead (use the `next_offset` of the previous answer to read on).
    #[serde(default)]
    pub offset: Option<u64>,
}

/// Arguments of the tools that take none.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

const SPAWN: &str = "Start a subagent: a separate, sandboxed process that works on `task` \
while you go on. Returns at once with its run_id, state, and the paths of its log and its \
result.md (written when it ends). It gets only the tools you may delegate, a read-only \
project unless allowed to write, and no network unless hosts are listed. Then call \
wait_agent_run (or check_agent_run) with the run_id.";
const WAIT: &str = "Wait for a run to end, at most timeout_s seconds (default 45, max 50). \
Returns its final status (state, exit code, reason, result.md path, the last log lines) \
when it ends, or says it is still running, with the elapsed time and the last log lines: \
then call again to keep waiting, or do other work first.";
const CHECK: &str = "A run's current status at once, without waiting: state, exit code, \
reason, paths, the last log lines.";
const CANCEL: &str = "Stop a run: a queued run is cancelled at once; a running one gets \
SIGTERM, then SIGKILL after 5 s. Returns the status after the request.";
const LIST: &str = "List runs, oldest first: by default this conversation's, optionally \
filtered by state; 50 at a time unless `limit` says otherwise, and `next_cursor` goes on.";
const LOG: &str = "Read a run's output (its stdout and stderr): the last `tail` lines (at \
most 1000), or from a byte `offset` on (up to 64 KiB per call; `next_offset` says where to \
go on). Works while the run goes on and after it ended.";
const USAGE: &str = "What runs spent, summed: by default this conversation's runs \
(`session: \"*\"` for every one), optionally within a time range. Returns how many runs, \
how many reported usage, and their turns, input and output tokens and cost in US dollars \
(as each agent reported them), in all and per driver. A run still going is counted once \
it ends; check_agent_run shows its figures so far.";
const NOTICES: &str = "Take the notices of runs of this conversation that ended since the \
last call (each notice is returned once): run_id, state, result.md path.";
const AGENTS: &str = "List the subagent definitions a run in this project can use by name \
(spawn_agent's `agent`), with their descriptions and tools.";
const WORKCTX: &str = "What a subagent spawned now would be told about the project: its \
directory, this conversation's recent files and a fresh git snapshot.";

/// Every tool, with its schema.
pub fn catalog() -> Vec<Tool> {
    vec![
        tool::<SpawnArgs>("spawn_agent", SPAWN),
        tool::<WaitArgs>("wait_agent_run", WAIT),
        tool::<RunArgs>("check_agent_run", CHECK),
        tool::<RunArgs>("cancel_agent_run", CANCEL),
        tool::<ListArgs>("list_agent_runs", LIST),
        tool::<LogArgs>("read_agent_log", LOG),
        tool::<UsageArgs>("agent_usage", USAGE),
        tool::<NoArgs>("take_notices", NOTICES),
        tool::<NoArgs>("list_agents", AGENTS),
        tool::<NoArgs>("working_context", WORKCTX),
    ]
}

fn tool<T: JsonSchema + 'static>(name: &'static str, description: &'static str) -> Tool {
    let schema = rmcp::handler::server::tool::schema_for_input::<T>().unwrap_or_else(|e| {
        tracing::warn!("the schema of {name} is not valid: {e}");
        Arc::new(serde_json::Map::from_iter([(
            "type".to_owned(),
            serde_json::json!("object"),
        )]))
    });
    Tool::new(name, description, schema)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_schema_is_an_object_with_described_properties() {
        for t in catalog() {
            let s = serde_json::Value::Object((*t.input_schema).clone());
            assert_eq!(s["type"], "object", "{}: {s}", t.name);
            for (name, p) in s["properties"].as_object().into_iter().flatten() {
                assert!(
                    p["description"].as_str().is_some_and(|d| d.len() > 10),
                    "{}.{name} has no description: {s}",
                    t.name
                );
            }
        }
    }

    #[test]
    fn spawn_requires_only_the_task() {
        let t = catalog().into_iter().next().unwrap();
        let s = serde_json::Value::Object((*t.input_schema).clone());
        assert_eq!(s["required"], serde_json::json!(["task"]));
    }
}
