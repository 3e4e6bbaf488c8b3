//! child.log: the child's output, appended, cut at a cap with a marker.
//! The runner's own notes in it start a line with `[subagentd:`; a line of
//! the child's that starts so gets a backslash in front, so that no note
//! can be forged. When each line was captured goes to child.log.times
//! ([`crate::logtimes`]), so the log's bytes stay the child's.

use crate::logtimes::TimesWriter;
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
    /// When the bytes in `pending` were captured (ms since the epoch).
    pending_ms: u64,
    /// child.log's length: where the next byte goes.
    end: u64,
    /// child.log is empty or ends with a newline.
    end_at_line_start: bool,
    /// The capture time of the bytes being written.
    stamp_ms: u64,
    times: TimesWriter,
    /// The wall clock, in ms since the epoch.
    clock: fn() -> u64,
}

impl LogSink {
    /// Opens (creating, 0600) child.log for appending, and its index of
    /// line times (first, so that a reader who finds the log finds it).
    pub fn open(path: &Path, cap: u64) -> std::io::Result<Self> {
        let times = TimesWriter::open(&crate::logtimes::path_for(path));
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)?;
        let end = file.metadata()?.len();
        Ok(LogSink {
            file,
            cap,
            written: 0,
            truncated: false,
            error: None,
            at_line_start: true,
            pending: Vec::new(),
            pending_ms: 0,
            end,
            end_at_line_start: end == 0,
            stamp_ms: 0,
            times,
            clock: crate::now_unix_ms,
        })
    }

    /// Holds `bytes` of a line's start captured at `now`.
    fn hold(&mut self, bytes: &[u8], now: u64) {
        if self.pending.is_empty() {
            self.pending_ms = now;
        }
        self.pending.extend_from_slice(bytes);
    }

    /// Writes what is held, stamped with the time it came.
    fn flush_held(&mut self) {
        let held = std::mem::take(&mut self.pending);
        self.stamp_ms = self.pending_ms;
        self.write_capped(&held);
    }

    /// Appends the child's output, honouring the cap; a line that starts
    /// as a note gets a backslash in front.
    pub fn write(&mut self, buf: &[u8]) {
        let now = (self.clock)();
        self.stamp_ms = now;
        let mut seg = 0;
        let mut line = if self.pending.is_empty() {
            self.at_line_start.then_some(0)
        } else {
            // A start of the prefix held from the last chunk.
            let have = self.pending.len();
            let take = (NOTE_PREFIX.len() - have).min(buf.len());
            let line = if NOTE_PREFIX[have..have + take] != buf[..take] {
                self.flush_held();
                None
            } else if have + take < NOTE_PREFIX.len() {
                self.hold(&buf[..take], now);
                return;
            } else {
                self.pending.clear();
                self.stamp_ms = self.pending_ms;
                self.write_capped(b"\\");
                self.write_capped(NOTE_PREFIX);
                seg = take;
                None
            };
            self.stamp_ms = now;
            line
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
                        self.hold(&buf[ls..], now);
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
        self.flush_held();
        self.stamp_ms = (self.clock)();
        self.at_line_start = line.ends_with('\n');
        if self.error.is_none() {
            let _ = self.append(line.as_bytes());
        }
    }

    fn put(&mut self, bytes: &[u8]) {
        match self.append(bytes) {
            Ok(()) => self.written += bytes.len() as u64,
            Err(e) => self.error = Some(format!("write child.log: {e}")),
        }
    }

    /// Appends `bytes` to the file, its first line start (if any) entered
    /// in the index first.
    fn append(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let start = if self.end_at_line_start {
            (!bytes.is_empty()).then_some(0)
        } else {
            bytes
                .iter()
                .position(|&b| b == b'\n')
                .map(|i| i + 1)
                .filter(|&i| i < bytes.len())
        };
        if let Some(i) = start {
            self.times.mark(self.end + i as u64, self.stamp_ms);
        }
        self.file.write_all(bytes)?;
        self.end += bytes.len() as u64;
        if let Some(&last) = bytes.last() {
            self.end_at_line_start = last == b'\n';
        }
        Ok(())
    }

    /// Flushes child.log to disk; returns (bytes, truncated, error).
    pub fn finish(mut self) -> (u64, bool, Option<String>) {
        self.flush_held();
        if let Err(e) = self.file.sync_all() {
            self.error.get_or_insert(format!("fsync child.log: {e}"));
        }
        (self.written, self.truncated, self.error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logtimes::{path_for, TimesReader};
    use std::cell::Cell;

    thread_local! {
        static NOW: Cell<u64> = const { Cell::new(0) };
    }

    fn fake_clock() -> u64 {
        NOW.with(Cell::get)
    }

    fn at(ms: u64) {
        NOW.with(|n| n.set(ms));
    }

    fn times(log: &Path) -> Vec<(u64, u64)> {
        let r = TimesReader::open(&path_for(log)).unwrap().unwrap();
        assert!(r.damage().is_none());
        r.entries().iter().map(|e| (e.offset, e.ms)).collect()
    }

    #[test]
    fn each_line_start_is_timed_when_it_came_and_the_log_is_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("child.log");
        let mut sink = LogSink::open(&p, 1 << 20).unwrap();
        sink.clock = fake_clock;
        at(1_000);
        sink.write(b"one\ntwo"); // offsets 0 and 4, one entry: same time
        at(2_000);
        sink.write(b" more\nthree\n"); // "three" starts at 13
        at(2_050);
        sink.write(b"four\n"); // too soon after the last entry
        at(3_000);
        sink.write(b"[sub"); // held: a note's prefix, maybe
        at(9_000);
        sink.write(b"agentd: x]\n"); // escaped, timed when it came
        at(9_500);
        sink.note("[subagentd: attempt 2 of 3]\n");
        at(9_900);
        sink.write(b"partial");
        sink.finish();
        let log = std::fs::read_to_string(&p).unwrap();
        assert_eq!(
            log,
            "one\ntwo more\nthree\nfour\n\\[subagentd: x]\n[subagentd: attempt 2 of 3]\npartial"
        );
        assert_eq!(
            times(&p),
            [
                (0, 1_000),
                (13, 2_000),
                (24, 3_000),
                (40, 9_500),
                (68, 9_900)
            ]
        );
        assert_eq!(&log[13..19], "three\n");
        assert_eq!(&log[24..26], "\\[");
        assert_eq!(&log[40..44], "[sub");
        assert_eq!(&log[68..], "partial");
    }

    #[test]
    fn the_index_goes_on_past_the_cap_only_for_the_marker_and_notes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("child.log");
        let mut sink = LogSink::open(&p, 8).unwrap();
        sink.clock = fake_clock;
        at(1_000);
        sink.write(b"1234\n");
        at(2_000);
        sink.write(b"5678\nabc\n"); // cut after "567"
        for i in 0..100 {
            at(3_000 + i * 1_000);
            sink.write(b"more\nlines\n");
        }
        at(200_000);
        sink.note("[subagentd: late]\n");
        sink.finish();
        let log = std::fs::read_to_string(&p).unwrap();
        assert!(log.starts_with("1234\n567\n[subagentd: log cut"), "{log}");
        // The cut line (its marker came at the same time), then the note.
        let late = log.find("[subagentd: late").unwrap() as u64;
        assert_eq!(times(&p), [(0, 1_000), (5, 2_000), (late, 200_000)]);
    }

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
