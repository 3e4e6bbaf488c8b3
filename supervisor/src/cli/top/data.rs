//! What `subagent top` shows of a run, read leniently from a
//! `sample_agent_runs` entry (a field this client does not know, or one a
//! daemon leaves out, leaves a blank, never an error), and the cells it is
//! drawn with. Every text that came from a run is shown escaped.

use crate::run::record::RunState;
use crate::sanitize::one_line;
use serde_json::Value;
use std::path::PathBuf;

/// A run's tokens and cost as its status's `usage` reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub turns: Option<u64>,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub cost_usd: Option<f64>,
}

/// A run's processes now, as the daemon sampled them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    pub cpu_ms: u64,
    pub memory_bytes: u64,
    pub processes: u64,
}

/// One run, as top draws it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    pub run_id: String,
    pub session_id: String,
    /// Its state, when this client knows the name.
    pub state: Option<RunState>,
    /// Its state as the daemon named it (escaped).
    pub state_name: String,
    pub created_ms: Option<u64>,
    pub started_ms: Option<u64>,
    pub ended_ms: Option<u64>,
    pub cancel_requested: bool,
    pub log_path: Option<PathBuf>,
    pub sample: Option<Sample>,
    /// CPU use over the last interval, in percent of one core.
    pub cpu_pct: Option<f64>,
    /// Egress attempts allowed and refused (allowlist runs).
    pub egress: Option<(u64, u64)>,
    pub usage: Usage,
    /// The log's last line (escaped again here, whatever the daemon did).
    pub last_line: Option<String>,
}

impl Row {
    /// The run from one entry of `sample_agent_runs`; `None` without a run id.
    pub fn from_json(v: &Value) -> Option<Row> {
        let text = |k: &str| v.get(k).and_then(Value::as_str);
        let time = |k: &str| text(k).and_then(crate::timefmt::parse_rfc3339_ms);
        let num = |o: &Value, k: &str| o.get(k).and_then(Value::as_u64);
        let state_name = text("state").unwrap_or("?");
        let sample = v.get("sample").filter(|s| s.is_object()).map(|s| Sample {
            cpu_ms: num(s, "cpu_ms").unwrap_or(0),
            memory_bytes: num(s, "memory_bytes").unwrap_or(0),
            processes: num(s, "processes").unwrap_or(0),
        });
        let egress = v.get("egress").filter(|e| e.is_object()).map(|e| {
            (
                num(e, "allowed").unwrap_or(0),
                num(e, "refused").unwrap_or(0),
            )
        });
        let usage = v.get("usage").filter(|u| u.is_object()).map(|u| Usage {
            turns: num(u, "turns"),
            input_tokens: num(u, "input_tokens"),
            output_tokens: num(u, "output_tokens"),
            cost_usd: u.get("cost_usd").and_then(Value::as_f64),
        });
        Some(Row {
            run_id: one_line(text("run_id")?),
            session_id: one_line(text("session_id").unwrap_or("")),
            state: crate::run::record::RunState::parse(state_name),
            state_name: one_line(state_name),
            created_ms: time("created_at"),
            started_ms: time("started_at"),
            ended_ms: time("ended_at"),
            cancel_requested: v.get("cancel_requested").and_then(Value::as_bool) == Some(true),
            log_path: text("log_path").map(PathBuf::from),
            sample,
            cpu_pct: None,
            egress,
            usage: usage.unwrap_or_default(),
            last_line: text("last_line").map(one_line),
        })
    }

    /// Whether it has not ended (or this client cannot tell).
    pub fn live(&self) -> bool {
        self.state.is_none_or(|s| !s.is_terminal())
    }

    /// The short id: the random part after the run id's time.
    pub fn short_id(&self) -> &str {
        self.run_id
            .rsplit_once('-')
            .map_or(self.run_id.as_str(), |(_, r)| r)
    }

    /// Time since it started (queued: since it was accepted) until it
    /// ended or `now_ms`.
    pub fn elapsed(&self, now_ms: u64) -> String {
        let Some(from) = self.started_ms.or(self.created_ms) else {
            return "-".into();
        };
        let to = self.ended_ms.unwrap_or(now_ms);
        crate::timefmt::human_duration(to.saturating_sub(from))
    }

    /// The state as shown: `cancelling` while a cancel is under way.
    pub fn state_cell(&self) -> String {
        if self.cancel_requested && self.live() {
            "cancelling".into()
        } else {
            self.state_name.clone()
        }
    }

    pub fn cpu_time_cell(&self) -> String {
        self.sample
            .map_or(String::new(), |s| crate::timefmt::human_duration(s.cpu_ms))
    }

    pub fn cpu_pct_cell(&self) -> String {
        self.cpu_pct.map_or(String::new(), |p| format!("{p:.0}%"))
    }

    pub fn memory_cell(&self) -> String {
        self.sample.map_or(String::new(), |s| bytes(s.memory_bytes))
    }

    pub fn processes_cell(&self) -> String {
        self.sample
            .map_or(String::new(), |s| s.processes.to_string())
    }

    pub fn egress_cell(&self) -> String {
        self.egress
            .map_or(String::new(), |(a, r)| format!("{a}/{r}"))
    }

    /// Input/output tokens; blank when the run reports none.
    pub fn tokens_cell(&self) -> String {
        match (self.usage.input_tokens, self.usage.output_tokens) {
            (None, None) => String::new(),
            (i, o) => format!("{}/{}", count(i), count(o)),
        }
    }

    pub fn cost_cell(&self) -> String {
        self.usage
            .cost_usd
            .map_or(String::new(), |c| format!("${c:.3}"))
    }
}

/// A count for a narrow column: `950`, `12.3k`, `4.5M`; `-` when unknown.
fn count(n: Option<u64>) -> String {
    match n {
        None => "-".into(),
        Some(n) if n < 1000 => n.to_string(),
        Some(n) if n < 1_000_000 => format!("{:.1}k", n as f64 / 1e3),
        Some(n) => format!("{:.1}M", n as f64 / 1e6),
    }
}

/// Bytes for a narrow column: `512B`, `12.0K`, `3.4G` (powers of 1024).
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["K", "M", "G", "T", "P"];
    if n < 1024 {
        return format!("{n}B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1}{}", UNITS[unit])
}

/// CPU use between two samples of a run `ms` apart, in percent of one core.
pub fn cpu_percent(before_cpu_ms: u64, now_cpu_ms: u64, ms: u64) -> Option<f64> {
    (ms > 0).then(|| now_cpu_ms.saturating_sub(before_cpu_ms) as f64 * 100.0 / ms as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_a_sampled_run_and_escapes_its_text() {
        let v = json!({
            "run_id": "20261201T070327.689340Z-3cdd0df8", "session_id": "s\u{1b}[2J",
            "state": "running", "created_at": "2026-12-01T07:03:27.689Z",
            "started_at": "2026-12-01T07:03:28.000Z", "ended_at": null,
            "cancel_requested": false, "log_path": "/s/child.log",
            "egress": {"allowed": 3, "refused": 1},
            "sample": {"cpu_ms": 1500, "memory_bytes": 3_145_728, "processes": 2},
            "usage": {"turns": 2, "input_tokens": 12_345, "output_tokens": 67, "cost_usd": 0.0123},
            "last_line": "hi \u{1b}]0;pwned\u{7}"
        });
        let r = Row::from_json(&v).unwrap();
        assert_eq!(r.short_id(), "3cdd0df8");
        assert_eq!(r.session_id, "s\\x1b[2J");
        assert_eq!(r.last_line.as_deref(), Some("hi \\x1b]0;pwned\\x07"));
        assert_eq!(r.state, Some(RunState::Running));
        assert_eq!(r.cpu_time_cell(), "1.5s");
        assert_eq!(r.memory_cell(), "3.0M");
        assert_eq!(r.processes_cell(), "2");
        assert_eq!(r.egress_cell(), "3/1");
        assert_eq!(r.tokens_cell(), "12.3k/67");
        assert_eq!(r.cost_cell(), "$0.012");
        let t0 = crate::timefmt::parse_rfc3339_ms("2026-12-01T07:03:28.000Z").unwrap();
        assert_eq!(r.elapsed(t0 + 4_000), "4.0s");
    }

    #[test]
    fn what_a_daemon_leaves_out_is_blank() {
        let r = Row::from_json(&json!({"run_id": "x", "state": "some_new_state"})).unwrap();
        assert_eq!(r.state, None);
        assert!(r.live(), "an unknown state is not taken for an end");
        for cell in [
            r.cpu_time_cell(),
            r.memory_cell(),
            r.egress_cell(),
            r.tokens_cell(),
            r.cost_cell(),
        ] {
            assert_eq!(cell, "");
        }
        let u = json!({"run_id": "x", "state": "succeeded",
            "usage": {"turns": null, "input_tokens": null, "output_tokens": 5, "cost_usd": null}});
        assert_eq!(Row::from_json(&u).unwrap().tokens_cell(), "-/5");
        assert_eq!(Row::from_json(&json!({"state": "running"})), None);
    }

    #[test]
    fn percent_and_sizes() {
        assert_eq!(cpu_percent(1000, 1500, 1000), Some(50.0));
        assert_eq!(cpu_percent(1500, 1000, 1000), Some(0.0));
        assert_eq!(cpu_percent(0, 10, 0), None);
        assert_eq!(bytes(512), "512B");
        assert_eq!(bytes(1536), "1.5K");
        assert_eq!(bytes(5 << 30), "5.0G");
    }
}
