//! gateway.log: one JSON line per request a driver's agent made to its
//! model gateway (method, path, status, bytes, time; never a header, so
//! never the key), in the run folder, within the run's disk budget.

use crate::runlog::{LineFile, RunLogError};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Mutex;

/// The most gateway.log holds (less when the run's disk budget is smaller).
pub const MAX_LOG_BYTES: u64 = 4 << 20;
/// The longest path a line shows, in bytes.
pub const MAX_PATH_BYTES: usize = 512;

/// One line of gateway.log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Line {
    /// When the request came (RFC 3339 UTC).
    pub time: String,
    /// Its method.
    pub method: String,
    /// Its target as the agent sent it (clipped, printable ASCII).
    pub path: String,
    /// The status the agent got (the endpoint's, or the gateway's own).
    pub status: u16,
    /// Where it went: `host:port` of the endpoint, or empty when refused.
    pub upstream: String,
    /// Why the gateway answered itself (refused or failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Request body bytes forwarded.
    pub bytes_up: u64,
    /// Response body bytes passed back.
    pub bytes_down: u64,
    /// From the request to the end of its answer.
    pub duration_ms: u64,
}

/// `s` as a line shows it: at most [`MAX_PATH_BYTES`], printable ASCII.
pub fn shown(s: &str) -> String {
    crate::runlog::shown(s, MAX_PATH_BYTES)
}

impl Line {
    /// A line for a request starting now.
    pub fn new(method: &str, target: &str) -> Line {
        Line {
            time: crate::timefmt::rfc3339_ms(crate::timefmt::now_ms()),
            method: shown(method),
            path: shown(target),
            status: 0,
            upstream: String::new(),
            reason: None,
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
        }
    }
}

/// gateway.log could not be written.
pub type LogError = RunLogError;

/// The run's gateway.log, appended to; lines past its cap are counted,
/// not written.
pub struct GatewayLog {
    state: Mutex<State>,
}

struct State {
    file: LineFile,
    dropped: u64,
}

impl GatewayLog {
    /// The log at `path`, holding at most `cap` bytes.
    pub fn new(path: PathBuf, cap: u64) -> GatewayLog {
        GatewayLog {
            state: Mutex::new(State {
                file: LineFile::new(path, cap),
                dropped: 0,
            }),
        }
    }

    /// Appends `line`, unless the log is full (then it is counted).
    pub fn append(&self, line: &Line) -> Result<(), LogError> {
        let mut text = serde_json::to_string(line).unwrap_or_default();
        text.push('\n');
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !st.file.fits(text.len()) {
            st.dropped += 1;
            return Ok(());
        }
        st.file.append(text.as_bytes())
    }

    /// How many lines did not fit.
    pub fn dropped(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).dropped
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn lines_past_the_cap_are_counted_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.log");
        let log = GatewayLog::new(path.clone(), 400);
        let mut line = Line::new("POST", "/v1/messages\n\u{1b}[31m");
        line.status = 200;
        for _ in 0..5 {
            log.append(&line).unwrap();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.len() <= 400, "{text}");
        assert!(log.dropped() > 0);
        let first: Line = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(first.path, "/v1/messages\\n\\u{1b}[31m");
    }
}
