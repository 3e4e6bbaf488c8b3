//! What a coding agent's JSON event stream reports (Claude Code's
//! `stream-json`, Codex's `exec --json`), read from the child's log: the
//! files it read, wrote and edited, the commands it ran, its final answer,
//! turns, tokens, cost and its own error flag. The log is child-written:
//! lines that are not JSON objects, or too long, are passed over, and
//! every list and text is capped.

use crate::driver::Driver;
use crate::usage::{self, Usage};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::HashMap;

/// The longest line parsed as an event.
pub const MAX_LINE: usize = 1 << 20;
/// The most entries kept in each list.
pub const MAX_ENTRIES: usize = 100;
/// The most characters kept of the final answer and of the error.
pub const MAX_TEXT: usize = 20_000;
/// The most characters kept of one path or command.
const MAX_ITEM: usize = 4096;

/// What the agent's events said.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentReport {
    /// The driver whose events these are.
    pub driver: Option<Driver>,
    /// The events parsed.
    pub events: u64,
    /// Whether its final event came (Claude Code's `result`, Codex's
    /// `turn.completed` or `turn.failed`).
    pub finished: bool,
    /// The agent's own error flag.
    pub is_error: bool,
    /// Its error message, when it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Its final answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_text: Option<String>,
    /// Model turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turns: Option<u64>,
    /// Input tokens, as reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    /// Output tokens, as reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    /// Cost in US dollars, as reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// Paths it read.
    pub read: Vec<String>,
    /// Paths it wrote (created or replaced), whose write succeeded.
    pub written: Vec<String>,
    /// Paths it edited, whose edit succeeded.
    pub edited: Vec<String>,
    /// Commands it ran.
    pub commands: Vec<String>,
    /// Writes and edits that succeeded.
    pub writes_ok: u64,
    /// Writes and edits that failed.
    pub writes_failed: u64,
}

fn cap(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

fn push(list: &mut Vec<String>, item: &str) {
    let item = cap(item, MAX_ITEM);
    if list.len() < MAX_ENTRIES && !list.contains(&item) {
        list.push(item);
    }
}

/// A tool call waiting for its result.
enum Pending {
    Write(String),
    Edit(String),
}

/// Reads the events in `log` (the child's output) as `driver` writes them.
pub fn parse(driver: Driver, log: &[u8]) -> AgentReport {
    let mut report = AgentReport {
        driver: Some(driver),
        ..Default::default()
    };
    let mut pending = HashMap::new();
    for line in log.split(|&b| b == b'\n') {
        if line.len() > MAX_LINE || !line.starts_with(b"{") {
            continue;
        }
        let Ok(Value::Object(event)) = serde_json::from_slice::<Value>(line) else {
            continue;
        };
        let event = Value::Object(event);
        report.events += 1;
        match driver {
            Driver::ClaudeCode => claude_event(&event, &mut report, &mut pending),
            Driver::Codex => codex_event(&event, &mut report),
            Driver::Command => {}
        }
    }
    report
}

fn claude_event(e: &Value, r: &mut AgentReport, pending: &mut HashMap<String, Pending>) {
    let blocks = e["message"]["content"].as_array().into_iter().flatten();
    match e["type"].as_str() {
        Some("assistant") => blocks.for_each(|b| claude_tool_use(b, r, pending)),
        Some("user") => {
            for b in blocks.filter(|b| b["type"] == "tool_result") {
                let Some(done) = b["tool_use_id"].as_str().and_then(|id| pending.remove(id)) else {
                    continue;
                };
                let failed = b["is_error"] == true;
                match (done, failed) {
                    (_, true) => r.writes_failed += 1,
                    (Pending::Write(p), false) => {
                        r.writes_ok += 1;
                        push(&mut r.written, &p);
                    }
                    (Pending::Edit(p), false) => {
                        r.writes_ok += 1;
                        push(&mut r.edited, &p);
                    }
                }
            }
        }
        Some("result") => claude_result(e, r),
        _ => {}
    }
}

fn claude_tool_use(b: &Value, r: &mut AgentReport, pending: &mut HashMap<String, Pending>) {
    if b["type"] != "tool_use" {
        return;
    }
    let input = &b["input"];
    let path = input["file_path"]
        .as_str()
        .or(input["notebook_path"].as_str())
        .or(input["path"].as_str());
    let id = b["id"].as_str().unwrap_or_default().to_owned();
    match (b["name"].as_str().unwrap_or_default(), path) {
        ("Read" | "NotebookRead", Some(p)) => push(&mut r.read, p),
        ("Write", Some(p)) if pending.len() < 10_000 => {
            pending.insert(id, Pending::Write(p.to_owned()));
        }
        ("Edit" | "MultiEdit" | "NotebookEdit", Some(p)) if pending.len() < 10_000 => {
            pending.insert(id, Pending::Edit(p.to_owned()));
        }
        ("Bash", _) => {
            if let Some(c) = input["command"].as_str() {
                push(&mut r.commands, c);
            }
        }
        _ => {}
    }
}

fn claude_result(e: &Value, r: &mut AgentReport) {
    r.finished = true;
    r.is_error = e["is_error"] == true;
    let text = e["result"].as_str().map(|t| cap(t, MAX_TEXT));
    if r.is_error {
        // A limit it stopped at (max turns, max budget) is in `errors`.
        let said = e["errors"][0].as_str().map(|t| cap(t, MAX_TEXT));
        let subtype = e["subtype"].as_str().unwrap_or("error");
        r.error = Some(text.clone().or(said).unwrap_or_else(|| subtype.to_owned()));
    }
    r.final_text = text;
    let u = usage::claude_result(e);
    r.turns = u.turns;
    r.input_tokens = u.input_tokens;
    r.output_tokens = u.output_tokens;
    r.cost_usd = u.cost_usd;
}

fn codex_event(e: &Value, r: &mut AgentReport) {
    match e["type"].as_str() {
        Some("item.completed") => codex_item(&e["item"], r),
        Some("turn.completed") => {
            r.finished = true;
            r.turns = Some(r.turns.unwrap_or(0).saturating_add(1));
            r.input_tokens = usage::add(r.input_tokens, &e["usage"]["input_tokens"]);
            r.output_tokens = usage::add(r.output_tokens, &e["usage"]["output_tokens"]);
        }
        Some("turn.failed") => {
            r.finished = true;
            r.is_error = true;
            let msg = e["error"]["message"].as_str().unwrap_or("the turn failed");
            r.error = Some(cap(msg, MAX_TEXT));
        }
        Some("error") if r.error.is_none() => {
            r.error = e["message"].as_str().map(|m| cap(m, MAX_TEXT));
        }
        _ => {}
    }
}

fn codex_item(item: &Value, r: &mut AgentReport) {
    match item["type"].as_str() {
        Some("command_execution") => {
            if let Some(c) = item["command"].as_str() {
                push(&mut r.commands, c);
            }
        }
        Some("file_change") => {
            let failed = item["status"] == "failed";
            for change in item["changes"].as_array().into_iter().flatten() {
                let Some(path) = change["path"].as_str() else {
                    continue;
                };
                if failed {
                    r.writes_failed += 1;
                    continue;
                }
                r.writes_ok += 1;
                match change["kind"].as_str() {
                    Some("add") => push(&mut r.written, path),
                    Some("update") => push(&mut r.edited, path),
                    _ => {}
                }
            }
        }
        Some("agent_message") => {
            r.final_text = item["text"].as_str().map(|t| cap(t, MAX_TEXT));
        }
        _ => {}
    }
}

impl AgentReport {
    /// Its turns, tokens and cost.
    pub fn usage(&self) -> Usage {
        Usage {
            turns: self.turns,
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            cost_usd: self.cost_usd,
        }
    }

    /// Why the run failed by the agent's own account, if it did: its error
    /// flag, or every write it tried failed.
    pub fn failure(&self) -> Option<String> {
        if self.is_error {
            // Its words quoted: one line that cannot pass for the supervisor's.
            return Some(match self.error.as_deref() {
                Some(why) => format!(
                    "the agent reported an error: {}",
                    crate::visible::quoted(why)
                ),
                None => "the agent reported an error (no message)".to_owned(),
            });
        }
        if self.writes_failed > 0 && self.writes_ok == 0 {
            return Some(format!(
                "every write the agent tried failed ({} of {})",
                self.writes_failed, self.writes_failed
            ));
        }
        None
    }

    /// The files it reported written or edited, most recent last.
    pub fn changed(&self) -> Vec<String> {
        let mut out = self.written.clone();
        for e in &self.edited {
            if !out.contains(e) {
                out.push(e.clone());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLAUDE: &str = r#"{"type":"system","subtype":"init","tools":["Read","Write"]}
{"type":"assistant","message":{"content":[{"id":"t1","name":"Write","type":"tool_use","input":{"file_path":"/p/a.txt","content":"x"}},{"id":"t2","name":"Read","type":"tool_use","input":{"file_path":"/p/b.txt"}},{"id":"t3","name":"Edit","type":"tool_use","input":{"file_path":"/p/c.txt"}}]}}
{"type":"user","message":{"content":[{"tool_use_id":"t1","type":"tool_result","content":"ok"},{"tool_use_id":"t3","type":"tool_result","is_error":true,"content":"EACCES"}]}}
not json at all
{"type":"assistant","message":{"content":[{"id":"t4","name":"Bash","type":"tool_use","input":{"command":"ls"}}]}}
{"type":"result","subtype":"success","is_error":false,"result":"wrote a.txt","num_turns":3,"total_cost_usd":0.0012,"usage":{"input_tokens":200,"output_tokens":40}}
"#;

    #[test]
    fn claude_code_tool_calls_results_and_totals() {
        let r = parse(Driver::ClaudeCode, CLAUDE.as_bytes());
        assert_eq!(r.events, 5);
        assert!(r.finished && !r.is_error);
        assert_eq!(r.written, ["/p/a.txt"]);
        assert!(
            r.edited.is_empty(),
            "a failed edit is not reported as edited"
        );
        assert_eq!(r.read, ["/p/b.txt"]);
        assert_eq!(r.commands, ["ls"]);
        assert_eq!((r.writes_ok, r.writes_failed), (1, 1));
        assert_eq!(r.final_text.as_deref(), Some("wrote a.txt"));
        assert_eq!(
            (r.turns, r.input_tokens, r.output_tokens),
            (Some(3), Some(200), Some(40))
        );
        assert_eq!(r.cost_usd, Some(0.0012));
        assert_eq!(r.failure(), None);
        assert_eq!(r.changed(), ["/p/a.txt"]);
    }

    #[test]
    fn an_error_flag_or_only_failed_writes_fail_the_run() {
        let err = r#"{"type":"result","is_error":true,"subtype":"success","result":"API Error: 400 nope"}"#;
        let r = parse(Driver::ClaudeCode, err.as_bytes());
        assert_eq!(
            r.failure().as_deref(),
            Some("the agent reported an error: \"API Error: 400 nope\"")
        );
        let limit = r#"{"type":"result","is_error":true,"subtype":"error_max_turns","errors":["Reached maximum number of turns (2)"]}"#;
        let r = parse(Driver::ClaudeCode, limit.as_bytes());
        assert_eq!(
            r.failure().as_deref(),
            Some("the agent reported an error: \"Reached maximum number of turns (2)\"")
        );
        let only_failed = r#"{"type":"assistant","message":{"content":[{"id":"t1","name":"Write","type":"tool_use","input":{"file_path":"/p/a"}}]}}
{"type":"user","message":{"content":[{"tool_use_id":"t1","type":"tool_result","is_error":true}]}}
{"type":"result","is_error":false,"result":"done"}"#;
        let r = parse(Driver::ClaudeCode, only_failed.as_bytes());
        assert!(r.failure().unwrap().contains("every write"), "{r:?}");
        assert!(r.written.is_empty());
    }

    #[test]
    fn codex_items_turns_and_failures() {
        let ok = r#"{"type":"thread.started","thread_id":"x"}
{"type":"item.completed","item":{"id":"item_0","type":"error","message":"Model metadata not found"}}
{"type":"item.completed","item":{"type":"command_execution","command":"/bin/bash -lc 'echo hi > f'","exit_code":0,"status":"completed"}}
{"type":"item.completed","item":{"type":"file_change","status":"completed","changes":[{"path":"/p/n.txt","kind":"add"},{"path":"/p/o.txt","kind":"update"}]}}
{"type":"item.completed","item":{"type":"agent_message","text":"codex done"}}
{"type":"turn.completed","usage":{"input_tokens":200,"output_tokens":40}}"#;
        let r = parse(Driver::Codex, ok.as_bytes());
        assert!(r.finished && !r.is_error, "{r:?}");
        assert_eq!(r.commands, ["/bin/bash -lc 'echo hi > f'"]);
        assert_eq!(r.written, ["/p/n.txt"]);
        assert_eq!(r.edited, ["/p/o.txt"]);
        assert_eq!(r.final_text.as_deref(), Some("codex done"));
        assert_eq!((r.turns, r.input_tokens), (Some(1), Some(200)));
        let failed = r#"{"type":"error","message":"unexpected status 401"}
{"type":"turn.failed","error":{"message":"unexpected status 401 Unauthorized"}}"#;
        let r = parse(Driver::Codex, failed.as_bytes());
        assert!(r.failure().unwrap().contains("401 Unauthorized"));
    }

    #[test]
    fn hostile_lines_are_bounded() {
        let mut log = Vec::new();
        log.extend_from_slice(b"{\"type\":\"result\",\"result\":\"");
        log.extend(std::iter::repeat_n(b'a', MAX_LINE));
        log.extend_from_slice(
            b"\"}\n[1,2]\n{\"type\":\"assistant\",\"message\":{\"content\":\"x\"}}\n",
        );
        for i in 0..(MAX_ENTRIES + 5) {
            log.extend_from_slice(format!("{{\"type\":\"assistant\",\"message\":{{\"content\":[{{\"type\":\"tool_use\",\"name\":\"Read\",\"input\":{{\"file_path\":\"/p/{i}\"}}}}]}}}}\n").as_bytes());
        }
        let r = parse(Driver::ClaudeCode, &log);
        assert!(!r.finished, "an over-long line is passed over");
        assert_eq!(r.read.len(), MAX_ENTRIES);
    }
}
