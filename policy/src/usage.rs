//! What a coding agent spent, as its JSON event stream says: turns,
//! input and output tokens, and the cost it computed. [`UsageTally`]
//! reads it line by line while the run goes on (Claude Code's `assistant`
//! events carry each model response's tokens; Codex's `turn.completed`
//! carries a turn's); the final event's figures replace the running sums.
//! The log is child-written: a figure out of range is no figure.

use crate::driver::Driver;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The largest count taken as a figure (2^40): more is not a real run's,
/// and sums of many stay far from overflowing.
pub const MAX_COUNT: u64 = 1 << 40;
/// The largest cost taken as a figure, in US dollars.
pub const MAX_COST_USD: f64 = 1e9;
/// The longest message id remembered (Claude Code's are about 30 bytes).
const MAX_ID: usize = 256;

/// A run's usage as its agent reported it; `None`: not reported (yet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Model turns.
    pub turns: Option<u64>,
    /// Input tokens.
    pub input_tokens: Option<u64>,
    /// Output tokens.
    pub output_tokens: Option<u64>,
    /// Cost in US dollars, as the agent computed it.
    pub cost_usd: Option<f64>,
}

impl Usage {
    /// Whether any figure is known.
    pub fn any(&self) -> bool {
        self.turns.is_some()
            || self.input_tokens.is_some()
            || self.output_tokens.is_some()
            || self.cost_usd.is_some()
    }
}

/// A count in an event: a whole number up to [`MAX_COUNT`].
pub fn count(v: &Value) -> Option<u64> {
    v.as_u64().filter(|n| *n <= MAX_COUNT)
}

/// A cost in an event: a finite number from 0 to [`MAX_COST_USD`].
pub fn cost(v: &Value) -> Option<f64> {
    v.as_f64().filter(|c| (0.0..=MAX_COST_USD).contains(c))
}

/// The figures of Claude Code's `result` event (its totals for the run).
pub fn claude_result(e: &Value) -> Usage {
    Usage {
        turns: count(&e["num_turns"]),
        input_tokens: count(&e["usage"]["input_tokens"]),
        output_tokens: count(&e["usage"]["output_tokens"]),
        cost_usd: cost(&e["total_cost_usd"]),
    }
}

/// `a` plus `b`, when `b` is a count; `a` when it is not.
pub fn add(a: Option<u64>, b: &Value) -> Option<u64> {
    match count(b) {
        Some(b) => Some(a.unwrap_or(0).saturating_add(b)),
        None => a,
    }
}

/// The usage so far of one run's event stream, fed one complete line at
/// a time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageTally {
    /// The running sums.
    sums: Usage,
    /// The last model response counted (Claude Code repeats a response's
    /// usage on each of its content blocks' events): its id and figures.
    last: Option<(String, Option<u64>, Option<u64>)>,
    /// The final event's figures, once it came.
    last_word: Option<Usage>,
}

impl UsageTally {
    /// Reads one line of `driver`'s output (its newline left off): a JSON
    /// object of at most `max` bytes, else passed over.
    pub fn line(&mut self, driver: Driver, line: &[u8], max: usize) {
        if line.len() > max || !line.starts_with(b"{") {
            return;
        }
        if let Ok(e @ Value::Object(_)) = serde_json::from_slice::<Value>(line) {
            self.event(driver, &e);
        }
    }

    /// Counts one event.
    pub fn event(&mut self, driver: Driver, e: &Value) {
        match (driver, e["type"].as_str()) {
            (Driver::ClaudeCode, Some("assistant")) if e["parent_tool_use_id"].is_null() => {
                self.claude_message(&e["message"]);
            }
            (Driver::ClaudeCode, Some("result")) => self.last_word = Some(claude_result(e)),
            (Driver::Codex, Some("turn.completed")) => {
                let s = &mut self.sums;
                s.turns = Some(s.turns.unwrap_or(0).saturating_add(1));
                s.input_tokens = add(s.input_tokens, &e["usage"]["input_tokens"]);
                s.output_tokens = add(s.output_tokens, &e["usage"]["output_tokens"]);
                self.last_word = Some(self.sums);
            }
            _ => {}
        }
    }

    /// One model response of Claude Code's main thread: a turn, and its
    /// tokens (a response seen again replaces its earlier figures).
    fn claude_message(&mut self, m: &Value) {
        let id = m["id"].as_str().filter(|id| id.len() <= MAX_ID);
        let (tin, tout) = (
            count(&m["usage"]["input_tokens"]),
            count(&m["usage"]["output_tokens"]),
        );
        let s = &mut self.sums;
        match (&self.last, id) {
            (Some((last, pin, pout)), Some(id)) if last == id => {
                let minus = |a: Option<u64>, b: Option<u64>| a.map(|a| a - b.unwrap_or(0).min(a));
                s.input_tokens = minus(s.input_tokens, *pin);
                s.output_tokens = minus(s.output_tokens, *pout);
            }
            _ => s.turns = Some(s.turns.unwrap_or(0).saturating_add(1)),
        }
        let plus = |a: Option<u64>, b: Option<u64>| match b {
            Some(b) => Some(a.unwrap_or(0).saturating_add(b)),
            None => a,
        };
        s.input_tokens = plus(s.input_tokens, tin);
        s.output_tokens = plus(s.output_tokens, tout);
        self.last = id.map(|id| (id.to_owned(), tin, tout));
    }

    /// The usage so far: the final event's figures once it came, else the
    /// running sums (no cost: only the final event carries one).
    pub fn usage(&self) -> Usage {
        self.last_word.unwrap_or(self.sums)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn feed(driver: Driver, text: &str) -> UsageTally {
        let mut t = UsageTally::default();
        for l in text.lines() {
            t.line(driver, l.as_bytes(), 1 << 20);
        }
        t
    }

    fn u(t: u64, i: u64, o: u64, c: Option<f64>) -> Usage {
        Usage {
            turns: Some(t),
            input_tokens: Some(i),
            output_tokens: Some(o),
            cost_usd: c,
        }
    }

    #[test]
    fn claude_codes_responses_add_up_until_its_result_says() {
        let a = |id: &str, i: u64| {
            format!(
                r#"{{"type":"assistant","parent_tool_use_id":null,"message":{{"id":"{id}","usage":{{"input_tokens":{i},"output_tokens":20}}}}}}"#
            )
        };
        let mut log = [a("m0", 100), a("m1", 100), a("m1", 150)].join("\n");
        // A subagent's response, and a line that is not JSON.
        log.push_str("\n{\"type\":\"assistant\",\"parent_tool_use_id\":\"t1\",\"message\":{\"id\":\"s\",\"usage\":{\"input_tokens\":7}}}\nnot json\n");
        let t = feed(Driver::ClaudeCode, &log);
        assert_eq!(
            t.usage(),
            u(2, 250, 40, None),
            "m1 counted once, its last figures"
        );
        log.push_str(r#"{"type":"result","num_turns":3,"total_cost_usd":0.0024000000000000002,"usage":{"input_tokens":300,"output_tokens":60}}"#);
        let t = feed(Driver::ClaudeCode, &log);
        assert_eq!(t.usage(), u(3, 300, 60, Some(0.0024000000000000002)));
    }

    #[test]
    fn codex_counts_its_completed_turns() {
        let log = r#"{"type":"turn.started"}
{"type":"item.completed","item":{"type":"agent_message","text":"x"}}
{"type":"turn.completed","usage":{"input_tokens":300,"cached_input_tokens":0,"output_tokens":60}}"#;
        let t = feed(Driver::Codex, log);
        assert_eq!(t.usage(), u(1, 300, 60, None));
        assert_eq!(
            feed(Driver::Codex, "{\"type\":\"turn.started\"}").usage(),
            Usage::default()
        );
        assert!(!Usage::default().any());
    }

    #[test]
    fn figures_out_of_range_are_none() {
        let big = format!(
            r#"{{"type":"result","num_turns":{},"total_cost_usd":-1,"usage":{{"input_tokens":1e300,"output_tokens":5}}}}"#,
            MAX_COUNT + 1
        );
        let t = feed(Driver::ClaudeCode, &big);
        assert_eq!(
            t.usage(),
            Usage {
                output_tokens: Some(5),
                ..Default::default()
            }
        );
        let mut t = UsageTally::default();
        t.line(
            Driver::ClaudeCode,
            br#"{"type":"result","num_turns":1}"#,
            10,
        );
        assert_eq!(
            t.usage(),
            Usage::default(),
            "a line over the bound is passed over"
        );
    }
}
