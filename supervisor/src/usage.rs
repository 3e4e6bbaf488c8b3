//! Usage: a running driver run's turns and tokens so far, read from its
//! child.log a little at a time, and what the `usage` method returns (runs'
//! figures summed, per driver). Uses the policy's event tally and the
//! runner's safe reads only.
//!
//! child.log is written with what the child printed: it is opened without
//! following a link, as a regular file, and each read takes at most
//! [`READ_MAX`] bytes past where the last one stopped, so a status never
//! reads the whole log again.

use policy::agentstream::MAX_LINE;
use policy::driver::Driver;
use policy::usage::{Usage, UsageTally};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The most of child.log one look reads (more than a line may hold, so a
/// line that fits the bound always ends within one read).
pub const READ_MAX: u64 = 2 * MAX_LINE as u64;

/// A live run's usage so far: how far its log was read, and the tally of
/// the complete lines before that.
#[derive(Debug, Clone)]
pub struct LogUsage {
    driver: Driver,
    /// Bytes of child.log counted (always at a line's start, or inside a
    /// line being passed over).
    offset: u64,
    /// Inside a line over [`MAX_LINE`], passed over up to its newline.
    skipping: bool,
    tally: UsageTally,
}

impl LogUsage {
    /// Nothing read yet of a run of `driver`.
    pub fn new(driver: Driver) -> LogUsage {
        LogUsage {
            driver,
            offset: 0,
            skipping: false,
            tally: UsageTally::default(),
        }
    }

    /// Reads what `log` gained since the last look (at most [`READ_MAX`])
    /// and returns the usage so far; a log that cannot be read adds
    /// nothing. Blocking (a bounded read).
    pub fn update(&mut self, log: &Path) -> Usage {
        if let Ok(bytes) = read_from(log, self.offset) {
            self.feed(&bytes);
        }
        self.tally.usage()
    }

    /// Counts the complete lines of `buf` (which starts at `offset`), and
    /// moves `offset` past them; an unfinished line is read again next
    /// time, unless it is already too long to count.
    fn feed(&mut self, buf: &[u8]) {
        let mut start = 0;
        while let Some(n) = buf[start..].iter().position(|&b| b == b'\n') {
            let line = &buf[start..start + n];
            if !std::mem::take(&mut self.skipping) {
                self.tally.line(self.driver, line, MAX_LINE);
            }
            start += n + 1;
        }
        let rest = buf.len() - start;
        if self.skipping || rest > MAX_LINE {
            self.skipping = true;
            start = buf.len();
        }
        self.offset += start as u64;
    }
}

/// At most [`READ_MAX`] bytes of the regular file `log` from `offset`.
fn read_from(log: &Path, offset: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let opened = subagent_runner::safefile::open(log).map_err(std::io::Error::other)?;
    let len = opened.metadata().len();
    if len <= offset {
        return Ok(Vec::new());
    }
    let mut f = opened.into_file();
    f.seek(SeekFrom::Start(offset))?;
    let mut buf = Vec::with_capacity(usize::try_from((len - offset).min(READ_MAX)).unwrap_or(0));
    f.take(READ_MAX).read_to_end(&mut buf)?;
    Ok(buf)
}

/// Runs' figures added up: how many runs, how many reported usage, and
/// the sums of what they reported (`None` when none reported that figure).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageTotals {
    /// The runs counted.
    pub runs: u64,
    /// Those that reported any figure (their agent's final event came).
    pub reported: u64,
    /// Turns.
    pub turns: Option<u64>,
    /// Input tokens.
    pub input_tokens: Option<u64>,
    /// Output tokens.
    pub output_tokens: Option<u64>,
    /// Cost in US dollars, as each agent computed it.
    pub cost_usd: Option<f64>,
}

impl UsageTotals {
    /// `self` with `other` added.
    pub fn add(&mut self, other: &UsageTotals) {
        let sum = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.saturating_add(b)),
            (a, b) => a.or(b),
        };
        self.runs += other.runs;
        self.reported += other.reported;
        self.turns = sum(self.turns, other.turns);
        self.input_tokens = sum(self.input_tokens, other.input_tokens);
        self.output_tokens = sum(self.output_tokens, other.output_tokens);
        self.cost_usd = match (self.cost_usd, other.cost_usd) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
    }
}

/// What the `usage` method returns: the totals, and the same per driver.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageSummary {
    /// The session summed, or null for every one the caller may see.
    pub session_id: Option<String>,
    /// The time range's start, as given.
    pub since: Option<String>,
    /// The time range's end, as given.
    pub until: Option<String>,
    /// Every run counted.
    #[serde(flatten)]
    pub totals: UsageTotals,
    /// The same, per driver (`command`, `claude-code`, `codex`).
    pub by_driver: BTreeMap<String, UsageTotals>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::io::Write;

    const RESP: &str = r#"{"type":"assistant","parent_tool_use_id":null,"message":{"id":"ID","usage":{"input_tokens":100,"output_tokens":20}}}"#;

    fn append(path: &Path, text: &[u8]) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .unwrap();
        f.write_all(text).unwrap();
    }

    #[test]
    fn only_new_complete_lines_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("child.log");
        let mut u = LogUsage::new(Driver::ClaudeCode);
        assert_eq!(u.update(&log), Usage::default(), "no log yet");
        let first = RESP.replace("ID", "m0");
        append(&log, format!("{first}\n").as_bytes());
        let second = RESP.replace("ID", "m1");
        let (head, tail) = second.split_at(40);
        append(&log, head.as_bytes());
        assert_eq!(u.update(&log).turns, Some(1), "half a line waits");
        assert_eq!(u.offset, first.len() as u64 + 1);
        append(&log, format!("{tail}\n").as_bytes());
        let got = u.update(&log);
        assert_eq!(
            (got.turns, got.input_tokens, got.output_tokens),
            (Some(2), Some(200), Some(40))
        );
        assert_eq!(u.offset, std::fs::metadata(&log).unwrap().len());
        assert_eq!(u.update(&log), got, "nothing new: the same");
    }

    #[test]
    fn an_overlong_line_is_passed_over_and_a_link_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("child.log");
        let mut u = LogUsage::new(Driver::ClaudeCode);
        let long = format!("{{\"x\":\"{}", "a".repeat(MAX_LINE + 10));
        append(&log, long.as_bytes());
        assert_eq!(u.update(&log).turns, None);
        assert!(u.skipping, "the line is too long already");
        let rest = RESP.replace("ID", "m9");
        append(&log, format!("\"}}\n{rest}\n").as_bytes());
        assert_eq!(u.update(&log).turns, Some(1), "the line after it counts");
        let link = dir.path().join("link.log");
        std::os::unix::fs::symlink(&log, &link).unwrap();
        let mut via = LogUsage::new(Driver::ClaudeCode);
        assert_eq!(via.update(&link), Usage::default());
        assert_eq!(via.offset, 0);
    }

    #[test]
    fn totals_add_and_keep_unknown_figures_unknown() {
        let mut a = UsageTotals {
            runs: 2,
            reported: 1,
            turns: Some(3),
            cost_usd: None,
            ..Default::default()
        };
        let b = UsageTotals {
            runs: 1,
            reported: 1,
            turns: Some(1),
            cost_usd: Some(0.5),
            ..Default::default()
        };
        a.add(&b);
        assert_eq!(
            (a.runs, a.reported, a.turns, a.cost_usd),
            (3, 2, Some(4), Some(0.5))
        );
        assert_eq!(a.input_tokens, None);
        let s = UsageSummary {
            totals: a,
            ..Default::default()
        };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["runs"], 3);
        assert!(v["input_tokens"].is_null() && v.get("input_tokens").is_some());
    }
}
