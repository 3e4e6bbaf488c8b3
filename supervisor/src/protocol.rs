//! The wire protocol: JSON-RPC 2.0, one JSON object per line, both ways.
//! docs/protocol.md describes it for client authors; keep the two in step.

use policy::{Audience, Limits};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The longest request line accepted, newline excluded: 1 MiB.
pub const MAX_LINE: usize = 1 << 20;
/// The largest `task` accepted: 64 KiB.
pub const MAX_TASK: usize = 64 * 1024;

/// Error codes. The JSON-RPC ones, then ours from -32000 down.
pub mod codes {
    /// The line is not valid JSON (or not UTF-8).
    pub const PARSE_ERROR: i64 = -32700;
    /// Valid JSON that is not a request object, or a line over the limit.
    pub const INVALID_REQUEST: i64 = -32600;
    /// No such method.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// A param is missing, of the wrong type, or out of range.
    pub const INVALID_PARAMS: i64 = -32602;
    /// A bug or an unexpected failure inside the daemon.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// No run has this id.
    pub const RUN_NOT_FOUND: i64 = -32000;
    /// The session's audience may not spawn subagents (Public).
    pub const AUDIENCE_REFUSED: i64 = -32001;
    /// The state dir could not record the run; nothing was started.
    pub const STORAGE: i64 = -32002;
    /// The run's directories could not be made safely (e.g. a symlink in
    /// the temp dir's path); nothing was started.
    pub const WORKSPACE: i64 = -32003;
    /// A mechanism the run requires cannot be enforced on this host; the
    /// message names it and says why. Nothing was started.
    pub const SANDBOX_UNAVAILABLE: i64 = -32005;
    /// The caller is a process inside a run: subagents cannot use the
    /// control socket (and so cannot spawn their own subagents).
    pub const NOT_PERMITTED: i64 = -32006;
    /// The connecting uid may not use this daemon (only its own uid, root
    /// and the config's `allow_uids` may).
    pub const UID_NOT_ALLOWED: i64 = -32007;
    /// The session belongs to another uid: a caller of another uid than
    /// the daemon's and root may use only its own sessions.
    pub const SESSION_NOT_OWNED: i64 = -32008;
    /// The daemon is shutting down: it accepts no new runs, and a pending
    /// `wait_agent_run` is answered with this.
    pub const SHUTTING_DOWN: i64 = -32004;
    /// The run existed and was removed by retention; `data` says when and
    /// why ([`super::PrunedData`]).
    pub const RUN_PRUNED: i64 = -32009;
}

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcError {
    /// One of [`codes`].
    pub code: i64,
    /// A sentence for people; names the field or path concerned.
    pub message: String,
    /// More, for programs: only some codes carry it (`-32009`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// -32009: `run` was pruned at `pruned_at_ms` for `reason`.
    pub fn run_pruned(run: &str, pruned_at_ms: u64, reason: policy::retention::Reason) -> RpcError {
        let data = PrunedData {
            run_id: run.to_owned(),
            pruned_at: crate::timefmt::rfc3339_ms(pruned_at_ms),
            reason,
        };
        let message = format!(
            "run {run} was pruned at {} (retention: {})",
            data.pruned_at,
            reason.as_str()
        );
        RpcError {
            code: codes::RUN_PRUNED,
            message,
            data: serde_json::to_value(&data).ok(),
        }
    }

    /// -32602 naming the offending field.
    pub fn invalid_params(field: &str, problem: impl std::fmt::Display) -> RpcError {
        RpcError::new(
            codes::INVALID_PARAMS,
            format!("invalid params: {field}: {problem}"),
        )
    }
}

/// The params of `spawn_agent`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpawnParams {
    /// The parent session.
    pub session: SessionParams,
    /// The task: non-empty, at most 64 KiB.
    pub task: String,
    /// Background for the task.
    #[serde(default)]
    pub context: Option<String>,
    /// The agent program's argv; when absent or empty, the agent
    /// definition's command, else the config's.
    #[serde(default)]
    pub command: Vec<String>,
    /// A subagent definition to run, by name.
    #[serde(default)]
    pub agent: Option<String>,
    /// `worktree`: the child works in a git worktree of its own (on branch
    /// `subagent/<run_id>`), not in project_dir.
    #[serde(default)]
    pub isolation: Option<Isolation>,
    /// Restarts after exit 75 (0–10; default: the config's, else 3).
    #[serde(default)]
    pub max_restarts: Option<u32>,
    /// Extra environment for the child.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Resource limits; one left unset comes from the config's audience
    /// defaults, lowered by the agent definition's.
    #[serde(default)]
    pub limits: Limits,
    /// Keep temp_dir after the run ends (default: removed).
    #[serde(default)]
    pub keep_temp: bool,
    /// Sandbox switches (default: project read only, no network).
    #[serde(default)]
    pub sandbox: policy::sandbox::SandboxRequest,
    /// How the agent starts: `command` (the default), `claude-code` or
    /// `codex`; absent: the definition's, else the config's.
    #[serde(default)]
    pub driver: Option<policy::driver::Driver>,
    /// The `command` driver's stdin: `first_message` (first_message.md);
    /// absent: /dev/null.
    #[serde(default)]
    pub stdin: Option<StdinSource>,
    /// At most this many turns, enforced by the agent (the `claude-code`
    /// driver only).
    #[serde(default)]
    pub max_turns: Option<u32>,
    /// At most this many US dollars, enforced by the agent as it computes
    /// its cost (the `claude-code` driver only).
    #[serde(default)]
    pub max_budget_usd: Option<f64>,
}

/// What a plain command reads on its stdin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StdinSource {
    /// first_message.md of the run's context.
    FirstMessage,
}

/// Where a child works.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Isolation {
    /// In project_dir itself (the default).
    None,
    /// In a git worktree of its own under the session folder.
    Worktree,
}

/// The params of `touch_files`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TouchParams {
    pub session_id: String,
    /// Files the parent read or wrote, most recent first (absolute, or
    /// relative to the session's project_dir).
    pub files: Vec<PathBuf>,
}

/// The parent session as `spawn_agent` names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionParams {
    /// 1–64 characters of `[A-Za-z0-9._-]`, not "." or "..".
    pub id: String,
    /// `personal` or `team`; `public` is refused.
    pub audience: Audience,
    /// An absolute, existing directory: the child's working directory.
    pub project_dir: PathBuf,
    /// The parent's tools. The child gets those its audience allows (and
    /// its definition lists), never delegation or attach tools, and its OS
    /// rights follow from them. Absent: no tool policy (rights from
    /// `sandbox` switches alone).
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// The parent's recent files (absolute, or relative to project_dir);
    /// they seed the session's list on its first contact.
    #[serde(default)]
    pub recent_files: Option<Vec<PathBuf>>,
}

/// `{run_id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunParams {
    pub run_id: String,
}

/// The params of `check_agent_run`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckParams {
    pub run_id: String,
    /// Also cancel it.
    #[serde(default)]
    pub cancel: bool,
}

/// The params of `wait_agent_run`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitParams {
    pub run_id: String,
    /// Give up after this long and return the current status; absent =
    /// wait until the run ends.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// The params of `list_agent_runs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// Only this session's runs.
    #[serde(default)]
    pub session_id: Option<String>,
    /// Only runs in this state.
    #[serde(default)]
    pub state: Option<crate::run::record::RunState>,
    /// At most this many runs (default 100, at most 1000).
    #[serde(default)]
    pub limit: Option<u64>,
    /// The previous page's `next_cursor`: this page starts after it.
    #[serde(default)]
    pub cursor: Option<String>,
    /// Only runs created at or after this RFC 3339 time.
    #[serde(default)]
    pub since: Option<String>,
    /// Only runs created at or before this RFC 3339 time.
    #[serde(default)]
    pub until: Option<String>,
    /// By run id (creation time): oldest first (`asc`) or newest first.
    #[serde(default)]
    pub order: ListOrder,
}

/// The params of `usage`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageParams {
    /// Only this session's runs.
    #[serde(default)]
    pub session_id: Option<String>,
    /// Only runs created at or after this RFC 3339 time.
    #[serde(default)]
    pub since: Option<String>,
    /// Only runs created at or before this RFC 3339 time.
    #[serde(default)]
    pub until: Option<String>,
}

/// The order of a `list_agent_runs` page.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ListOrder {
    /// Oldest first.
    #[default]
    Asc,
    /// Newest first.
    Desc,
}

/// The params of `sample_agent_runs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SampleParams {
    /// Only this session's runs.
    #[serde(default)]
    pub session_id: Option<String>,
    /// Only runs in this state.
    #[serde(default)]
    pub state: Option<crate::run::record::RunState>,
}

/// The params of `subscribe`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscribeParams {
    /// Only this session's runs; absent = all sessions.
    #[serde(default)]
    pub session_id: Option<String>,
}

/// The params of `take_notices`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TakeParams {
    /// The session whose notices to take.
    pub session_id: String,
}

/// The params of `prune_runs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PruneParams {
    /// Only this session's runs.
    #[serde(default)]
    pub session_id: Option<String>,
    /// Also every run that ended at least this long ago (`"7d"`, `"0s"`).
    #[serde(default)]
    pub older_than: Option<String>,
    /// Say what would be removed, and remove nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// The result of `prune_runs`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PruneResult {
    /// The runs removed (with `dry_run`: that would be), oldest first.
    pub removed: Vec<PrunedRun>,
    /// The runs a rule wanted that are kept, and why, oldest first.
    pub kept: Vec<KeptRun>,
    /// Nothing was removed.
    pub dry_run: bool,
}

/// A run `prune_runs` removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrunedRun {
    pub run_id: String,
    pub session_id: String,
    /// When it ended (RFC 3339 UTC).
    pub ended_at: String,
    /// Its run folder's size.
    pub bytes: u64,
    /// The rule that chose it.
    pub reason: policy::retention::Reason,
}

/// A run `prune_runs` kept although a rule wanted it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeptRun {
    pub run_id: String,
    /// Why, as a sentence (`worktree … exists (subagent worktree rm)`).
    pub why: String,
}

/// The `data` of a `-32009` error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrunedData {
    pub run_id: String,
    /// When it was removed (RFC 3339 UTC).
    pub pruned_at: String,
    /// The rule that removed it.
    pub reason: policy::retention::Reason,
}

/// `{}`: methods without params.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoParams {}

/// A decoded call.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    /// Start a subagent run.
    SpawnAgent(Box<SpawnParams>),
    /// A run's status, optionally cancelling it.
    CheckAgentRun(CheckParams),
    /// Wait for a run to end.
    WaitAgentRun(WaitParams),
    /// Cancel a run.
    CancelAgentRun(RunParams),
    /// List runs.
    ListAgentRuns(ListParams),
    /// The live runs (and those just ended), each with a sample of its
    /// processes and its log's last line.
    SampleAgentRuns(SampleParams),
    /// Receive `agent_run_finished` notifications on this connection.
    Subscribe(SubscribeParams),
    /// Take a session's pending notices.
    TakeNotices(TakeParams),
    /// Put files at the front of a session's recent files.
    TouchFiles(TouchParams),
    /// A session's working context and its `[working-context]` block.
    WorkingContext(TakeParams),
    /// Remove finished runs by the retention rules.
    PruneRuns(PruneParams),
    /// Runs' usage summed.
    Usage(UsageParams),
    /// Liveness and version.
    Ping,
    /// The daemon's metrics, as Prometheus text.
    Metrics(MetricsParams),
}

/// The params of `metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsParams {
    /// `prometheus` (text 0.0.4, the default) or `openmetrics` (1.0.0).
    #[serde(default)]
    pub format: crate::metrics::Format,
}

/// A request: a call and the id to answer with (`None` for a JSON-RPC
/// notification, which gets no response).
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The request id; `None` when the request had no `id` member.
    pub id: Option<Value>,
    /// The method and its params.
    pub call: Call,
}

/// What a line decodes to: a request, or the error to answer with.
#[derive(Debug, Clone, PartialEq)]
pub enum Decoded {
    /// A valid request.
    Request(Box<Request>),
    /// An invalid one: answer `error` with `id` (null when unknown).
    Error {
        /// The id to answer with.
        id: Value,
        error: RpcError,
        /// False for a well-formed notification (no `id` member) whose
        /// method or params are bad: JSON-RPC forbids answering those.
        reply: bool,
    },
    /// A blank line: ignored.
    Blank,
}

fn params<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, RpcError> {
    let value = match value {
        Value::Null => json!({}),
        v @ Value::Object(_) => v,
        _ => {
            return Err(RpcError::new(
                codes::INVALID_PARAMS,
                "invalid params: params must be an object",
            ))
        }
    };
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            RpcError::new(codes::INVALID_PARAMS, format!("invalid params: {inner}"))
        } else {
            RpcError::invalid_params(&path, inner)
        }
    })
}

/// Decodes one line (without its newline). Never fails: a bad line turns
/// into the error to answer with.
pub fn decode(line: &[u8]) -> Decoded {
    if line.iter().all(u8::is_ascii_whitespace) {
        return Decoded::Blank;
    }
    let envelope = match Envelope::parse(line) {
        Ok(e) => e,
        Err(Rejected { id, error }) => {
            return Decoded::Error {
                id,
                error,
                reply: true,
            }
        }
    };
    match Call::parse(&envelope.method, envelope.params) {
        Ok(call) => Decoded::Request(Box::new(Request {
            id: envelope.id,
            call,
        })),
        Err(error) => Decoded::Error {
            reply: envelope.id.is_some(),
            id: envelope.id.unwrap_or(Value::Null),
            error,
        },
    }
}

/// A request object whose members are valid, its params not yet decoded.
struct Envelope {
    /// `None` when the object had no `id` member (a notification).
    id: Option<Value>,
    method: String,
    params: Value,
}

/// A line that is not a valid request object, and the id to answer with
/// (null until the id itself was found valid).
struct Rejected {
    id: Value,
    error: RpcError,
}

impl Rejected {
    fn new(id: Value, code: i64, message: impl Into<String>) -> Rejected {
        Rejected {
            id,
            error: RpcError::new(code, message),
        }
    }

    fn invalid(id: Value, message: impl Into<String>) -> Rejected {
        Rejected::new(id, codes::INVALID_REQUEST, message)
    }
}

impl Envelope {
    fn parse(line: &[u8]) -> Result<Envelope, Rejected> {
        let mut obj = object(line)?;
        let id = obj.remove("id");
        let reply_id = match &id {
            None => Value::Null,
            Some(v @ (Value::Null | Value::String(_) | Value::Number(_))) => v.clone(),
            Some(_) => {
                let message = "invalid request: id must be a string, a number or null";
                return Err(Rejected::invalid(Value::Null, message));
            }
        };
        if obj.get("jsonrpc") != Some(&Value::String("2.0".to_owned())) {
            let message = "invalid request: jsonrpc must be \"2.0\"";
            return Err(Rejected::invalid(reply_id, message));
        }
        let Some(Value::String(method)) = obj.remove("method") else {
            let message = "invalid request: method must be a string";
            return Err(Rejected::invalid(reply_id, message));
        };
        let params = obj.remove("params").unwrap_or(Value::Null);
        if let Some(extra) = obj.keys().find(|k| k.as_str() != "jsonrpc") {
            let message = format!("invalid request: unknown member `{extra}`");
            return Err(Rejected::invalid(reply_id, message));
        }
        Ok(Envelope { id, method, params })
    }
}

/// The line as a JSON object, within the size limit.
fn object(line: &[u8]) -> Result<serde_json::Map<String, Value>, Rejected> {
    if line.len() > MAX_LINE {
        let message = format!("request line exceeds the limit of {MAX_LINE} bytes (1 MiB)");
        return Err(Rejected::invalid(Value::Null, message));
    }
    let value: Value = serde_json::from_slice(line)
        .map_err(|e| Rejected::new(Value::Null, codes::PARSE_ERROR, format!("parse error: {e}")))?;
    match value {
        Value::Object(obj) => Ok(obj),
        Value::Array(_) => Err(Rejected::invalid(
            Value::Null,
            "invalid request: batch requests are not supported; send one object per line",
        )),
        _ => Err(Rejected::invalid(
            Value::Null,
            "invalid request: expected a JSON object",
        )),
    }
}

impl Call {
    /// The call `method` names, with its params decoded.
    fn parse(method: &str, p: Value) -> Result<Call, RpcError> {
        match method {
            "spawn_agent" => params(p).map(|p| Call::SpawnAgent(Box::new(p))),
            "check_agent_run" => params(p).map(Call::CheckAgentRun),
            "wait_agent_run" => params(p).map(Call::WaitAgentRun),
            "cancel_agent_run" => params(p).map(Call::CancelAgentRun),
            "list_agent_runs" => params(p).map(Call::ListAgentRuns),
            "sample_agent_runs" => params(p).map(Call::SampleAgentRuns),
            "subscribe" => params(p).map(Call::Subscribe),
            "take_notices" => params(p).map(Call::TakeNotices),
            "touch_files" => params(p).map(Call::TouchFiles),
            "working_context" => params(p).map(Call::WorkingContext),
            "prune_runs" => params(p).map(Call::PruneRuns),
            "usage" => params(p).map(Call::Usage),
            "ping" => params::<NoParams>(p).map(|_| Call::Ping),
            "metrics" => params(p).map(Call::Metrics),
            other => Err(RpcError::new(
                codes::METHOD_NOT_FOUND,
                format!("method not found: {other}"),
            )),
        }
    }
}

/// A success response line (newline included).
pub fn response(id: &Value, result: &Value) -> Vec<u8> {
    line(&json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

/// An error response line (newline included).
pub fn error_response(id: &Value, error: &RpcError) -> Vec<u8> {
    line(&json!({"jsonrpc": "2.0", "id": id, "error": error}))
}

/// A notification line (newline included).
pub fn notification(method: &str, params: &Value) -> Vec<u8> {
    line(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
}

fn line(v: &Value) -> Vec<u8> {
    let mut out = serde_json::to_vec(v).unwrap_or_default();
    out.push(b'\n');
    out
}

/// A finished-run notice: sent as the params of `agent_run_finished` and
/// returned by `take_notices`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    pub run_id: String,
    pub session_id: String,
    /// Its terminal state.
    pub state: crate::run::record::RunState,
    /// Its result.md.
    pub result_path: PathBuf,
    /// When it ended (RFC 3339 UTC).
    pub ended_at: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(line: &str) -> (Value, i64, String) {
        match decode(line.as_bytes()) {
            Decoded::Error { id, error, reply } => {
                assert!(reply);
                (id, error.code, error.message)
            }
            other => panic!("decoded {other:?}"),
        }
    }

    #[test]
    fn decodes_a_spawn() {
        let line = r#"{"jsonrpc":"2.0","id":7,"method":"spawn_agent","params":{"session":{"id":"s","audience":"team","project_dir":"/tmp"},"task":"t","command":["true"],"limits":{"wall_time_s":5}}}"#;
        let Decoded::Request(r) = decode(line.as_bytes()) else {
            panic!()
        };
        assert_eq!(r.id, Some(json!(7)));
        let Call::SpawnAgent(p) = r.call else {
            panic!()
        };
        assert_eq!(p.session.audience, Audience::Team);
        assert_eq!(p.limits.wall_time_s, Some(5));
    }

    #[test]
    fn errors_have_the_documented_codes() {
        assert_eq!(code("{nope").1, codes::PARSE_ERROR);
        assert_eq!(code("\u{0}").1, codes::PARSE_ERROR);
        assert_eq!(code("[1]").1, codes::INVALID_REQUEST);
        assert_eq!(
            code(r#"{"id":1,"method":"ping"}"#).1,
            codes::INVALID_REQUEST
        );
        assert_eq!(
            code(r#"{"jsonrpc":"2.0","id":1,"method":"nope"}"#),
            (
                json!(1),
                codes::METHOD_NOT_FOUND,
                "method not found: nope".into()
            )
        );
        let (_, c, m) = code(
            r#"{"jsonrpc":"2.0","id":"a","method":"spawn_agent","params":{"session":{"id":"s","audience":"team"},"task":"t","command":["x"]}}"#,
        );
        assert_eq!(c, codes::INVALID_PARAMS);
        assert!(m.contains("session") && m.contains("project_dir"), "{m}");
        let (_, c, m) = code(
            r#"{"jsonrpc":"2.0","id":"a","method":"spawn_agent","params":{"session":{"id":"s","audience":"team","project_dir":"/"},"task":"t","command":"x"}}"#,
        );
        assert_eq!(c, codes::INVALID_PARAMS);
        assert!(m.starts_with("invalid params: command:"), "{m}");
        let (_, c, m) = code(
            r#"{"jsonrpc":"2.0","id":1,"method":"check_agent_run","params":{"run_id":"x","bogus":1}}"#,
        );
        assert_eq!(c, codes::INVALID_PARAMS);
        assert!(m.contains("bogus"), "{m}");
        let big = format!("\"{}\"", "a".repeat(MAX_LINE + 1));
        assert_eq!(code(&big).1, codes::INVALID_REQUEST);
    }

    #[test]
    fn bad_notifications_get_no_reply_and_blank_lines_are_ignored() {
        let Decoded::Error { reply, error, .. } = decode(br#"{"jsonrpc":"2.0","method":"nope"}"#)
        else {
            panic!()
        };
        assert!(!reply);
        assert_eq!(error.code, codes::METHOD_NOT_FOUND);
        assert_eq!(decode(b"  \r"), Decoded::Blank);
        assert_eq!(decode(b""), Decoded::Blank);
    }

    #[test]
    fn prune_runs_decodes_and_the_pruned_error_says_when_and_why() {
        let Decoded::Request(r) = decode(
            br#"{"jsonrpc":"2.0","id":1,"method":"prune_runs","params":{"session_id":"s","older_than":"7d","dry_run":true}}"#,
        ) else {
            panic!()
        };
        let want = PruneParams {
            session_id: Some("s".into()),
            older_than: Some("7d".into()),
            dry_run: true,
        };
        assert_eq!(r.call, Call::PruneRuns(want));
        let Decoded::Request(r) = decode(br#"{"jsonrpc":"2.0","id":1,"method":"prune_runs"}"#)
        else {
            panic!()
        };
        assert_eq!(r.call, Call::PruneRuns(PruneParams::default()));
        let (_, c, m) =
            code(r#"{"jsonrpc":"2.0","id":1,"method":"prune_runs","params":{"all":true}}"#);
        assert_eq!(c, codes::INVALID_PARAMS);
        assert!(m.contains("all"), "{m}");
        let id = "20261201T070317.792757Z-5fe54002";
        let e = RpcError::run_pruned(id, 1_764_572_597_123, policy::retention::Reason::MaxRuns);
        assert_eq!(e.code, -32009);
        assert_eq!(
            e.message,
            format!("run {id} was pruned at 2025-12-01T07:03:17.123Z (retention: max_runs)")
        );
        let line = error_response(&json!(3), &e);
        let v: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(
            v["error"]["data"],
            json!({"pruned_at": "2025-12-01T07:03:17.123Z", "reason": "max_runs", "run_id": id})
        );
        // Other errors carry no data member.
        let plain = error_response(&json!(3), &RpcError::new(codes::RUN_NOT_FOUND, "x"));
        let v: Value = serde_json::from_slice(&plain).unwrap();
        assert!(v["error"].get("data").is_none(), "{v}");
    }

    #[test]
    fn notifications_have_no_id() {
        let Decoded::Request(r) = decode(br#"{"jsonrpc":"2.0","method":"ping"}"#) else {
            panic!()
        };
        assert_eq!(r.id, None);
        assert_eq!(r.call, Call::Ping);
    }
}
