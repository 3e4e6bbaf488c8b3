//! A run's driver as run.json records it: which one, how the context
//! reached the agent, and what its event stream reported.
//! Uses policy and serde only.

use policy::agentstream::AgentReport;
use policy::driver::Driver;
use serde::{Deserialize, Serialize};

/// How a run's agent was started and what it reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriverRun {
    /// The driver.
    pub driver: Driver,
    /// How the composed context reached the agent.
    pub delivered: Delivery,
    /// What its event stream said, once the run has ended (drivers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<AgentReport>,
    /// The files the stream reported written or edited, checked on disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported_files: Option<ReportedFiles>,
    /// Whether the run could write its project (what its observation
    /// needs too); `None` in records made before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writes_project: Option<bool>,
    /// The limits the agent was started with, enforced by the agent
    /// itself; `None` when it had none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
}

/// A run's own limits on what its agent spends, passed to the agent (Claude
/// Code's `--max-turns` and `--max-budget-usd`), which stops at them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    /// At most this many turns: the request's `max_turns` or the
    /// definition's `maxTurns`, the lower of the two.
    pub max_turns: Option<u32>,
    /// At most this many US dollars, as the agent computes its cost.
    pub max_budget_usd: Option<f64>,
}

impl Budget {
    /// One line: what the agent may spend.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(n) = self.max_turns {
            parts.push(format!("at most {n} turns"));
        }
        if let Some(usd) = self.max_budget_usd {
            parts.push(format!("at most ${usd}"));
        }
        parts.join(", ")
    }
}

/// How the context reached the agent, besides the files in its context
/// dir.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// The context file on its stdin (`first_message.md`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// What its argv carries: placeholders expanded, or the driver's
    /// `system.md` option.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub argv: Vec<String>,
}

impl Delivery {
    /// One line: how the context was delivered.
    pub fn describe(&self) -> String {
        let mut ways = Vec::new();
        if let Some(s) = &self.stdin {
            ways.push(format!("{s} on stdin"));
        }
        if !self.argv.is_empty() {
            ways.push(format!("argv: {}", self.argv.join(", ")));
        }
        if ways.is_empty() {
            "files only (in $SUBAGENT_CONTEXT_DIR; the agent must read them itself)".into()
        } else {
            format!(
                "{}; the files are in $SUBAGENT_CONTEXT_DIR",
                ways.join("; ")
            )
        }
    }
}

/// The reported files, judged as a delta's claims are.
pub type ReportedFiles = super::delta::DeltaReport;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_is_said_plainly() {
        let b = Budget {
            max_turns: Some(3),
            max_budget_usd: Some(0.5),
        };
        assert_eq!(b.describe(), "at most 3 turns, at most $0.5");
    }

    #[test]
    fn the_delivery_is_said_plainly() {
        assert!(Delivery::default().describe().starts_with("files only"));
        let d = Delivery {
            stdin: Some("first_message.md".into()),
            argv: vec!["{system}".into()],
        };
        assert!(d
            .describe()
            .starts_with("first_message.md on stdin; argv: {system}"));
    }
}
