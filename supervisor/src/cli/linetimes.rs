//! `subagent logs --timestamps` and `--since`: child.log's lines with the
//! times the runner kept beside it, in child.log.times
//! ([`subagent_runner::logtimes`]). A line's time is that of the nearest
//! index entry at or before it; a line with none shows `-`.

use anyhow::{anyhow, bail, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use subagent_runner::logtimes::{path_for, TimesReader};

/// What `logs` was asked for.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stamping {
    /// Put each line's time in front of it.
    pub timestamps: bool,
    /// Start at the first line captured at or after this time (ms since
    /// the epoch).
    pub since_ms: Option<u64>,
}

impl Stamping {
    /// Whether the log is read through the index at all.
    pub fn any(&self) -> bool {
        self.timestamps || self.since_ms.is_some()
    }
}

/// An age before `now` (`90s`, `10m`, `2h`, `7d`) or an RFC 3339 time, as
/// ms since the epoch.
pub fn since_ms(w: &str, now: u64) -> Result<u64> {
    if let Some(t) = crate::paging::parse_time(w) {
        return Ok(t);
    }
    super::list::age_ms(w)
        .map(|age| now.saturating_sub(age))
        .ok_or_else(|| {
            anyhow!("--since {w:?} is neither an age (90s, 10m, 2h, 7d) nor an RFC 3339 time")
        })
}

/// The index of one run's log, opened when it is first there and read
/// again as the log grows; it says once on stderr when it is missing or
/// damaged.
pub struct LineTimes {
    path: PathBuf,
    reader: Option<TimesReader>,
    warned: bool,
}

impl LineTimes {
    /// The index of the log at `log` (read when there).
    pub fn of_log(log: &Path) -> LineTimes {
        let mut t = LineTimes {
            path: path_for(log),
            reader: None,
            warned: false,
        };
        t.refresh();
        t
    }

    /// Reads what was added to the index (opening it when it was not there
    /// yet).
    fn refresh(&mut self) {
        let got = match &mut self.reader {
            Some(r) => r.refresh(),
            None => TimesReader::open(&self.path).map(|r| self.reader = r),
        };
        if let Err(e) = got {
            self.warn(&format!("{e}; lines without a known time show `-`"));
        }
    }

    fn warn(&mut self, why: &str) {
        if !self.warned {
            self.warned = true;
            eprintln!("subagent: {}", crate::sanitize::for_terminal(why));
        }
    }

    /// The time of the line starting at `offset`, if the index knows one.
    fn time_at(&mut self, offset: u64) -> Option<u64> {
        let Some(r) = &self.reader else {
            let why = format!(
                "{} is missing, so the lines' times are not known; they show `-`",
                self.path.display()
            );
            self.warn(&why);
            return None;
        };
        let t = r.time_at(offset);
        let why = match r.damage() {
            Some(d) if r.entries().last().is_none_or(|e| offset > e.offset) => Some(format!(
                "{d}; the lines after the damage show the last time before it, or `-`"
            )),
            Some(_) => None,
            None => t.is_none().then(|| {
                format!(
                    "{} holds no time for the log's first lines; they show `-`",
                    self.path.display()
                )
            }),
        };
        if let Some(why) = why {
            self.warn(&why);
        }
        t
    }

    /// Where `--since` starts: the first line timed at or after `since`,
    /// else (a live run may write more) the last entry's line; an error
    /// when there is no index to tell.
    pub fn since_offset(&self, since: u64, log_exists: bool) -> Result<u64> {
        match &self.reader {
            Some(r) if r.entries().is_empty() && r.damage().is_some() => {
                let why = r.damage().map(|d| d.to_string()).unwrap_or_default();
                bail!("--since needs the log's line times: {why}")
            }
            Some(r) => Ok(r
                .first_since(since)
                .or_else(|| r.entries().last().copied())
                .map_or(0, |e| e.offset)),
            None if log_exists => bail!(
                "--since needs the log's line times, and {} is missing; without --since the whole log is printed",
                self.path.display()
            ),
            // Not started yet: its index comes with its log.
            None => Ok(0),
        }
    }
}

/// Writes child.log's bytes from a line start on, each line with its time
/// in front (`2026-12-06T19:19:38.123Z line`) and, with `since`, only the
/// lines timed at or after it.
pub struct Stamper<'a> {
    out: &'a mut dyn Write,
    times: LineTimes,
    how: Stamping,
    /// The log offset of the next byte written.
    offset: u64,
    at_line_start: bool,
    /// The line being written is printed.
    printing: bool,
    buf: Vec<u8>,
}

impl<'a> Stamper<'a> {
    /// A writer for the log's bytes from `from` (a line start) on.
    pub fn new(out: &'a mut dyn Write, times: LineTimes, how: Stamping, from: u64) -> Self {
        Stamper {
            out,
            times,
            how,
            offset: from,
            at_line_start: true,
            printing: how.since_ms.is_none(),
            buf: Vec::new(),
        }
    }

    /// The prefix and filter decision for the line starting at `offset`.
    fn start_line(&mut self, offset: u64) {
        let t = self.times.time_at(offset);
        if let Some(since) = self.how.since_ms {
            // Times never go back: once a line is in, the rest are.
            self.printing = self.printing || t.is_some_and(|t| t >= since);
        }
        if self.printing && self.how.timestamps {
            match t {
                Some(ms) => self
                    .buf
                    .extend_from_slice(crate::timefmt::rfc3339_ms(ms).as_bytes()),
                None => self.buf.push(b'-'),
            }
            self.buf.push(b' ');
        }
    }
}

impl Write for Stamper<'_> {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        // The runner enters a line's time before it writes the line: what
        // the index holds now covers these bytes.
        self.times.refresh();
        self.buf.clear();
        let mut i = 0;
        while i < data.len() {
            if self.at_line_start {
                self.start_line(self.offset + i as u64);
                self.at_line_start = false;
            }
            let end = data[i..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(data.len(), |k| i + k + 1);
            if self.printing {
                self.buf.extend_from_slice(&data[i..end]);
            }
            self.at_line_start = data[end - 1] == b'\n';
            i = end;
        }
        self.out.write_all(&self.buf)?;
        self.offset += data.len() as u64;
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(dir: &Path, entries: &[(u64, u64)]) {
        let mut b = subagent_runner::logtimes::MAGIC.to_vec();
        for &(o, t) in entries {
            b.extend_from_slice(&o.to_le_bytes());
            b.extend_from_slice(&t.to_le_bytes());
        }
        std::fs::write(dir.join("child.log.times"), b).unwrap();
    }

    fn stamped(dir: &Path, log: &[u8], how: Stamping, from: u64, chunk: usize) -> String {
        let times = LineTimes::of_log(&dir.join("child.log"));
        let mut out = Vec::new();
        let mut s = Stamper::new(&mut out, times, how, from);
        for c in log[from as usize..].chunks(chunk) {
            s.write_all(c).unwrap();
        }
        String::from_utf8(out).unwrap()
    }

    const T0: u64 = 1_796_584_778_123; // 2026-12-06T19:19:38.123Z

    #[test]
    fn each_line_gets_the_time_of_the_nearest_earlier_entry() {
        let dir = tempfile::tempdir().unwrap();
        let log = b"a\nb\nc\nno end";
        index(dir.path(), &[(2, T0), (4, T0 + 2_500)]);
        let how = Stamping {
            timestamps: true,
            since_ms: None,
        };
        for chunk in [1, 3, 100] {
            assert_eq!(
                stamped(dir.path(), log, how, 0, chunk),
                "- a\n2026-12-06T19:19:38.123Z b\n2026-12-06T19:19:40.623Z c\n2026-12-06T19:19:40.623Z no end",
                "{chunk}"
            );
        }
        // From a later line start (--tail).
        assert_eq!(
            stamped(dir.path(), log, how, 4, 2),
            "2026-12-06T19:19:40.623Z c\n2026-12-06T19:19:40.623Z no end"
        );
    }

    #[test]
    fn since_starts_at_the_first_line_timed_at_or_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let log = b"a\nb\nc\nd\n";
        index(dir.path(), &[(0, T0), (4, T0 + 3_000), (6, T0 + 4_000)]);
        let since = |ms| Stamping {
            timestamps: false,
            since_ms: Some(ms),
        };
        let times = LineTimes::of_log(&dir.path().join("child.log"));
        assert_eq!(times.since_offset(T0 + 1, true).unwrap(), 4);
        assert_eq!(times.since_offset(T0 + 9_000, true).unwrap(), 6);
        for chunk in [1, 100] {
            assert_eq!(
                stamped(dir.path(), log, since(T0), 0, chunk),
                "a\nb\nc\nd\n"
            );
            assert_eq!(stamped(dir.path(), log, since(T0 + 1), 0, chunk), "c\nd\n");
            assert_eq!(stamped(dir.path(), log, since(T0 + 3_001), 0, chunk), "d\n");
            assert_eq!(stamped(dir.path(), log, since(T0 + 4_001), 0, chunk), "");
        }
    }

    #[test]
    fn a_missing_or_damaged_index_still_prints_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = b"a\nb\n";
        let how = Stamping {
            timestamps: true,
            since_ms: None,
        };
        assert_eq!(stamped(dir.path(), log, how, 0, 100), "- a\n- b\n");
        let times = LineTimes::of_log(&dir.path().join("child.log"));
        let e = times.since_offset(T0, true).unwrap_err().to_string();
        assert!(e.contains("child.log.times is missing"), "{e}");
        assert_eq!(times.since_offset(T0, false).unwrap(), 0, "not started");
        // Not an index at all.
        std::fs::write(dir.path().join("child.log.times"), [7u8; 64]).unwrap();
        assert_eq!(stamped(dir.path(), log, how, 0, 100), "- a\n- b\n");
        let times = LineTimes::of_log(&dir.path().join("child.log"));
        let e = times.since_offset(T0, true).unwrap_err().to_string();
        assert!(e.contains("not a line-time index"), "{e}");
        // Damaged after its first entry: the lines after it keep that time.
        index(dir.path(), &[(0, T0), (2, T0 - 5)]);
        assert_eq!(
            stamped(dir.path(), log, how, 0, 100),
            "2026-12-06T19:19:38.123Z a\n2026-12-06T19:19:38.123Z b\n"
        );
    }

    #[test]
    fn since_takes_an_age_or_a_time() {
        let now = T0;
        assert_eq!(since_ms("10m", now).unwrap(), now - 600_000);
        assert_eq!(since_ms("90s", now).unwrap(), now - 90_000);
        assert_eq!(since_ms("2026-12-06T19:19:38.123Z", now).unwrap(), T0);
        assert_eq!(since_ms("2026-12-06T20:19:38.123+01:00", now).unwrap(), T0);
        for bad in ["", "10", "m", "ten minutes", "2026-12-06"] {
            assert!(since_ms(bad, now).is_err(), "{bad:?}");
        }
    }
}
