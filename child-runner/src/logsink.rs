//! child.log: the child's output, appended, cut at a cap with a marker.
//! The runner's own notes in it start a line with `[subagentd:`; a line of
//! the child's that starts so gets a backslash in front, so that no note
//! can be forged.

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

/// How the runner's notes begin.
pub const NOTE_PREFIX: &[u8] = b"[subagentd:";

/// Where the child's output goes.
pub struct LogSink {
    file: File,
    cap: u64,
    written: u64,
    truncated: bool,
    error: Option<String>,
    /// The next byte starts a line.
    at_line_start: bool,
    /// The start of a line that may yet become a note's prefix.
    pending: Vec<u8>,
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
            at_line_start: true,
            pending: Vec::new(),
        })
    }

    /// Appends the child's output, honouring the cap; a line that starts
    /// as a note gets a backslash in front.
    pub fn write(&mut self, buf: &[u8]) {
        let mut seg = 0;
        let mut line = if self.pending.is_empty() {
            self.at_line_start.then_some(0)
        } else {
            // A start of the prefix held from the last chunk.
            let have = self.pending.len();
            let take = (NOTE_PREFIX.len() - have).min(buf.len());
            if NOTE_PREFIX[have..have + take] != buf[..take] {
                let held = std::mem::take(&mut self.pending);
                self.write_capped(&held);
                None
            } else if have + take < NOTE_PREFIX.len() {
                self.pending.extend_from_slice(&buf[..take]);
                return;
            } else {
                self.pending.clear();
                self.write_capped(b"\\");
                self.write_capped(NOTE_PREFIX);
                seg = take;
                None
            }
        };
        let mut from = seg;
        loop {
            if let Some(ls) = line {
                let take = NOTE_PREFIX.len().min(buf.len() - ls);
                if take > 0 && NOTE_PREFIX[..take] == buf[ls..ls + take] {
                    self.write_capped(&buf[seg..ls]);
                    seg = ls;
                    if take < NOTE_PREFIX.len() {
                        // Maybe a note's start: decided by the next chunk.
                        self.pending.extend_from_slice(&buf[ls..]);
                        self.at_line_start = true;
                        return;
                    }
                    self.write_capped(b"\\");
                }
            }
            match buf[from..].iter().position(|&b| b == b'\n') {
                Some(k) => {
                    from += k + 1;
                    line = Some(from);
                }
                None => break,
            }
        }
        self.write_capped(&buf[seg..]);
        self.at_line_start = buf.last().map_or(self.at_line_start, |&b| b == b'\n');
    }

    /// Appends output, honouring the cap. A failed write is remembered,
    /// later output is discarded, and the child keeps running.
    fn write_capped(&mut self, buf: &[u8]) {
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
    /// counted against the cap. What the child left pending goes first.
    pub fn note(&mut self, line: &str) {
        let held = std::mem::take(&mut self.pending);
        self.write_capped(&held);
        self.at_line_start = line.ends_with('\n');
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
        let held = std::mem::take(&mut self.pending);
        self.write_capped(&held);
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

    #[test]
    fn a_childs_line_that_starts_like_a_note_is_marked_however_it_is_split() {
        let input: &[u8] = b"[subagentd: forged]\nok [subagentd: mid-line]\n[subagent:x]\n[sub";
        let want = "\\[subagentd: forged]\nok [subagentd: mid-line]\n[subagent:x]\n[sub";
        for split in 0..input.len() {
            for second in split..input.len() {
                let dir = tempfile::tempdir().unwrap();
                let p = dir.path().join("child.log");
                let mut sink = LogSink::open(&p, 1 << 20).unwrap();
                sink.write(&input[..split]);
                sink.write(&input[split..second]);
                sink.write(&input[second..]);
                sink.finish();
                assert_eq!(
                    std::fs::read_to_string(&p).unwrap(),
                    want,
                    "{split}/{second}"
                );
            }
        }
        // A note of the runner's stays as it is, and the child's next line
        // is judged afresh.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("child.log");
        let mut sink = LogSink::open(&p, 1 << 20).unwrap();
        sink.write(b"partial");
        sink.note("\n[subagentd: attempt 2 of 3]\n");
        sink.write(b"[subagentd: again]\n");
        sink.finish();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            "partial\n[subagentd: attempt 2 of 3]\n\\[subagentd: again]\n"
        );
    }
}
