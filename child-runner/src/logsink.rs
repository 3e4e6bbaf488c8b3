//! child.log: the child's output, appended, cut at a cap with a marker.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The marker written where output is cut.
pub fn cut_marker(cap_bytes: u64) -> String {
    format!(
        "\n[subagentd: log cut at {} bytes (output_mb limit); further output discarded]\n",
        cap_bytes
    )
}

/// Where the child's output goes.
pub struct LogSink {
    file: File,
    cap: u64,
    written: u64,
    truncated: bool,
    error: Option<String>,
}

impl LogSink {
    /// Opens (creating, 0600) child.log for appending.
    pub fn open(path: &Path, cap: u64) -> std::io::Result<Self> {
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)?;
        Ok(LogSink {
            file,
            cap,
            written: 0,
            truncated: false,
            error: None,
        })
    }

    /// Appends output, honouring the cap. A failed write is remembered,
    /// later output is discarded, and the child keeps running.
    pub fn write(&mut self, buf: &[u8]) {
        if self.truncated || self.error.is_some() {
            return;
        }
        let room = self.cap.saturating_sub(self.written);
        let take = (buf.len() as u64).min(room) as usize;
        if take > 0 {
            self.put(&buf[..take]);
        }
        if take < buf.len() && self.error.is_none() {
            self.truncated = true;
            let marker = cut_marker(self.cap);
            self.put(marker.as_bytes());
        }
    }

    /// Writes a line of the runner's own (a note, not child output); not
    /// counted against the cap.
    pub fn note(&mut self, line: &str) {
        if self.error.is_none() {
            let _ = self.file.write_all(line.as_bytes());
        }
    }

    fn put(&mut self, bytes: &[u8]) {
        match self.file.write_all(bytes) {
            Ok(()) => self.written += bytes.len() as u64,
            Err(e) => self.error = Some(format!("write child.log: {e}")),
        }
    }

    /// Flushes child.log to disk; returns (bytes, truncated, error).
    pub fn finish(mut self) -> (u64, bool, Option<String>) {
        if let Err(e) = self.file.sync_all() {
            self.error.get_or_insert(format!("fsync child.log: {e}"));
        }
        (self.written, self.truncated, self.error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_past_the_cap_is_cut_with_a_marker() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("child.log");
        let mut sink = LogSink::open(&p, 10).unwrap();
        sink.write(b"12345");
        sink.write(b"67890abc");
        sink.write(b"more");
        let (written, truncated, err) = sink.finish();
        assert!(truncated);
        assert!(err.is_none());
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(
            text.starts_with("1234567890\n[subagentd: log cut at 10 bytes"),
            "{text}"
        );
        assert!(!text.contains("abc"));
        assert_eq!(written as usize, text.len());
    }
}
