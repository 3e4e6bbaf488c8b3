//! egress.log: one JSON line per connection attempt of a run, in its run
//! folder, within the run's disk budget; and the summary that
//! check_agent_run and result.md show.

use serde::{Deserialize, Serialize};
use std::io::Write;
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
}

/// egress.log could not be written.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// Opening or writing failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// egress.log.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The run's disk budget is used up.
    #[error("egress.log has reached the run's disk budget ({0} bytes)")]
    Full(u64),
}

/// The run's egress.log, appended to, never past `cap` bytes.
pub struct EgressLog {
    path: PathBuf,
    cap: u64,
    state: Mutex<(Option<std::fs::File>, u64)>,
}

impl EgressLog {
    /// The log at `path`, holding at most `cap` bytes.
    pub fn new(path: PathBuf, cap: u64) -> EgressLog {
        EgressLog {
            path,
            cap,
            state: Mutex::new((None, 0)),
        }
    }

    /// Whether another line may still be written.
    pub fn has_room(&self) -> bool {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.1 < self.cap
    }

    /// Appends one line; a line that does not fit is not written.
    pub fn append(&self, entry: &Entry) -> Result<(), LogError> {
        let mut line = serde_json::to_vec(entry).unwrap_or_default();
        line.push(b'\n');
        let io = |source| LogError::Io {
            path: self.path.clone(),
            source,
        };
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.0.is_none() {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&self.path)
                .map_err(io)?;
            st.1 = f.metadata().map_err(io)?.len();
            st.0 = Some(f);
        }
        if st.1 + line.len() as u64 > self.cap {
            st.1 = self.cap;
            return Err(LogError::Full(self.cap));
        }
        if let Some(f) = st.0.as_mut() {
            f.write_all(&line).map_err(io)?;
        }
        st.1 += line.len() as u64;
        Ok(())
    }
}

/// The counts of a run's egress, for its status and result.md.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressSummary {
    /// Attempts allowed and relayed.
    pub allowed: u64,
    /// Attempts refused.
    pub refused: u64,
    /// Attempts allowed that could not reach their destination.
    pub failed: u64,
    /// The refused `host:port`s, each once, at most [`MAX_HOSTS`].
    pub refused_hosts: Vec<String>,
    /// Bytes from the run, over every attempt.
    pub bytes_up: u64,
    /// Bytes to the run.
    pub bytes_down: u64,
}

/// The most refused hosts a summary names.
pub const MAX_HOSTS: usize = 20;
/// The most of egress.log a summary reads.
pub const MAX_SUMMARY_BYTES: u64 = 16 << 20;

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
            Verdict::Allowed => self.allowed += 1,
            Verdict::Failed => self.failed += 1,
            Verdict::Refused => {
                self.refused += 1;
                let hp = format!("{}:{}", e.host, e.port);
                if self.refused_hosts.len() < MAX_HOSTS && !self.refused_hosts.contains(&hp) {
                    self.refused_hosts.push(hp);
                }
            }
        }
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
        }
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
