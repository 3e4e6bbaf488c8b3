//! egress.log: one JSON line per connection attempt of a run, in its run
//! folder, within the run's disk budget; and the summary that
//! check_agent_run and result.md show.

use crate::run::egress::{EgressSummary, MAX_HOSTS};
use crate::runlog::{LineFile, RunLogError};
use serde::{Deserialize, Serialize};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// What became of one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Connected and relayed.
    Allowed,
    /// Refused by the run's list or the address rules; nothing was sent.
    Refused,
    /// Allowed, but the destination could not be resolved or reached.
    Failed,
}

/// One line of egress.log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// When the attempt began (RFC 3339 UTC).
    pub time: String,
    /// `CONNECT` or the plain request's method.
    pub method: String,
    /// The host asked for (empty when the request never named one).
    pub host: String,
    /// The port asked for (0 when none).
    pub port: u16,
    /// The address connected to, or the one refused.
    pub address: Option<String>,
    /// What became of it.
    pub verdict: Verdict,
    /// Why it was refused or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Bytes from the run to the destination (after the request head).
    pub bytes_up: u64,
    /// Bytes from the destination to the run.
    pub bytes_down: u64,
    /// From the connection's accept to its close.
    pub duration_ms: u64,
    /// The attempts this line stands for: more than 1 only on a line that
    /// counts refusals not written one by one.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub count: u64,
}

impl Entry {
    /// A refusal starting now, of nothing named yet: the proxy fills in what
    /// it learns.
    pub fn refused_now() -> Entry {
        Entry {
            time: crate::timefmt::rfc3339_ms(crate::timefmt::now_ms()),
            method: String::new(),
            host: String::new(),
            port: 0,
            address: None,
            verdict: Verdict::Refused,
            reason: None,
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
            count: 1,
        }
    }
}

fn one() -> u64 {
    1
}

fn is_one(n: &u64) -> bool {
    *n == 1
}

/// The most egress.log holds (less when the run's disk budget is smaller).
pub const MAX_LOG_BYTES: u64 = 16 << 20;
/// Refused attempts written one line each per second; the rest of that
/// second's are counted on one line.
pub const REFUSED_LINES_PER_S: u32 = 20;
/// The longest host a line or a summary shows, in bytes (a DNS name's).
pub const MAX_HOST_BYTES: usize = 253;

pub use crate::runlog::clip;

/// A child-chosen host as shown: at most [`MAX_HOST_BYTES`] of it, every
/// character but printable ASCII escaped.
pub fn shown_host(host: &str) -> String {
    crate::runlog::shown(host, MAX_HOST_BYTES)
}

/// egress.log could not be written.
pub type LogError = RunLogError;

/// The run's egress.log, appended to, never past `cap` bytes; refusals
/// over [`REFUSED_LINES_PER_S`] are counted, not written one by one.
pub struct EgressLog {
    state: Mutex<LogState>,
}

struct LogState {
    file: LineFile,
    /// The second refused lines are counted in, and how many it wrote.
    window: Option<std::time::Instant>,
    refused_lines: u32,
    /// Refusals not written yet, and the reason of the last one.
    held: u64,
    held_reason: String,
}

impl EgressLog {
    /// The log at `path`, holding at most `cap` bytes.
    pub fn new(path: PathBuf, cap: u64) -> EgressLog {
        EgressLog {
            state: Mutex::new(LogState {
                file: LineFile::new(path, cap),
                window: None,
                refused_lines: 0,
                held: 0,
                held_reason: String::new(),
            }),
        }
    }

    /// Whether another line may still be written.
    pub fn has_room(&self) -> bool {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.file.has_room()
    }

    /// Records one attempt: a line of its own, or, for a refusal over the
    /// rate, a count on a line to come.
    pub fn append(&self, entry: &Entry) -> Result<(), LogError> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = std::time::Instant::now();
        if st
            .window
            .is_none_or(|w| now.duration_since(w) >= std::time::Duration::from_secs(1))
        {
            self.write_held(&mut st)?;
            st.window = Some(now);
            st.refused_lines = 0;
        }
        if entry.verdict == Verdict::Refused {
            if st.refused_lines >= REFUSED_LINES_PER_S {
                st.held += entry.count;
                st.held_reason = entry.reason.clone().unwrap_or_default();
                return Ok(());
            }
            st.refused_lines += 1;
        }
        self.write(&mut st, entry)
    }

    /// Writes the line of the refusals counted but not written yet.
    pub fn flush(&self) -> Result<(), LogError> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.write_held(&mut st)
    }

    fn write_held(&self, st: &mut LogState) -> Result<(), LogError> {
        if st.held == 0 {
            return Ok(());
        }
        let entry = Entry {
            reason: Some(format!(
                "{} more refused (over {REFUSED_LINES_PER_S} lines a second), the last: {}",
                st.held,
                clip(&st.held_reason, 200)
            )),
            count: st.held,
            ..Entry::refused_now()
        };
        st.held = 0;
        self.write(st, &entry)
    }

    /// Appends one line; a line that does not fit is not written.
    fn write(&self, st: &mut LogState, entry: &Entry) -> Result<(), LogError> {
        let mut line = serde_json::to_vec(entry).unwrap_or_default();
        line.push(b'\n');
        st.file.append(&line)
    }
}

/// The most of egress.log a summary reads: all a log can hold.
pub const MAX_SUMMARY_BYTES: u64 = MAX_LOG_BYTES;

/// Sums up egress.log at `path` (None when there is none).
pub fn summarize(path: &Path) -> Option<EgressSummary> {
    use std::io::Read;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    f.take(MAX_SUMMARY_BYTES).read_to_end(&mut bytes).ok()?;
    let mut s = EgressSummary::default();
    for line in bytes.split(|&b| b == b'\n') {
        let Ok(e) = serde_json::from_slice::<Entry>(line) else {
            continue;
        };
        s.add(&e);
    }
    Some(s)
}

impl EgressSummary {
    fn add(&mut self, e: &Entry) {
        match e.verdict {
            Verdict::Allowed => self.allowed += e.count,
            Verdict::Failed => self.failed += e.count,
            Verdict::Refused => {
                self.refused += e.count;
                if e.host.is_empty() {
                    return self.add_bytes(e);
                }
                let hp = format!("{}:{}", shown_host(&e.host), e.port);
                if self.refused_hosts.len() < MAX_HOSTS && !self.refused_hosts.contains(&hp) {
                    self.refused_hosts.push(hp);
                }
            }
        }
        self.add_bytes(e);
    }

    fn add_bytes(&mut self, e: &Entry) {
        self.bytes_up += e.bytes_up;
        self.bytes_down += e.bytes_down;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn entry(host: &str, verdict: Verdict) -> Entry {
        Entry {
            time: "2026-01-01T00:00:00.000Z".into(),
            method: "CONNECT".into(),
            host: host.into(),
            port: 443,
            address: None,
            verdict,
            reason: None,
            bytes_up: 10,
            bytes_down: 20,
            duration_ms: 1,
            count: 1,
        }
    }

    #[test]
    fn refusals_over_the_rate_are_counted_on_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("egress.log");
        let log = EgressLog::new(path.clone(), 1 << 20);
        let long = "h".repeat(1000);
        for i in 0..500 {
            log.append(&entry(&format!("{i}{long}"), Verdict::Refused))
                .unwrap();
        }
        log.append(&entry("a.com", Verdict::Allowed)).unwrap();
        log.flush().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.lines().count() <= 2 * REFUSED_LINES_PER_S as usize + 2);
        let s = summarize(&path).unwrap();
        assert_eq!((s.refused, s.allowed), (500, 1));
        assert_eq!(s.refused_hosts.len(), MAX_HOSTS);
        assert!(s
            .refused_hosts
            .iter()
            .all(|h| h.len() <= MAX_HOST_BYTES + 4));
        assert_eq!(shown_host("a\nb\u{7f}é"), "a\\nb\\u{7f}\\u{e9}");
    }

    #[test]
    fn lines_are_appended_within_the_cap_and_summed_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("egress.log");
        let log = EgressLog::new(path.clone(), 1000);
        log.append(&entry("a.com", Verdict::Allowed)).unwrap();
        log.append(&entry("b.com", Verdict::Refused)).unwrap();
        log.append(&entry("b.com", Verdict::Refused)).unwrap();
        log.append(&entry("c.com", Verdict::Failed)).unwrap();
        let s = summarize(&path).unwrap();
        assert_eq!((s.allowed, s.refused, s.failed), (1, 2, 1));
        assert_eq!(s.refused_hosts, ["b.com:443"]);
        assert_eq!((s.bytes_up, s.bytes_down), (40, 80));
        while log.append(&entry("a.com", Verdict::Allowed)).is_ok() {}
        assert!(!log.has_room());
        assert!(std::fs::metadata(&path).unwrap().len() <= 1000);
        assert!(summarize(&dir.path().join("none")).is_none());
    }

    #[test]
    fn a_link_in_place_of_the_log_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "").unwrap();
        let path = dir.path().join("egress.log");
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        let log = EgressLog::new(path, 1000);
        assert!(log.append(&entry("a.com", Verdict::Allowed)).is_err());
        assert_eq!(std::fs::read(&victim).unwrap().len(), 0);
    }
}
