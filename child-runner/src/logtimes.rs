//! child.log.times: when child.log's lines were captured, kept beside the
//! log so that child.log holds exactly the bytes written to it. A sparse
//! index of (offset, time) entries: an entry says that the line starting
//! at `offset` was captured at `time`; a line without an entry was
//! captured at most [`spacing_ms`] after the nearest earlier entry's time.
//!
//! The file: a 16-byte header ([`MAGIC`]), then records of 16 bytes each,
//! the offset and the time (ms since the Unix epoch), both u64 little
//! endian. Offsets strictly increase; times never decrease (a clock set
//! back repeats the last time). At most [`MAX_ENTRIES`] records, so the
//! file never exceeds [`MAX_BYTES`] whatever the log's size. Entries are
//! written before the log's bytes, so a reader that has a line of the log
//! can also read its entry. Best effort: never fsynced (after a crash of
//! the host it may lack its last entries, which its readers take in
//! their stride); a failed write stops the index for the run, never the
//! run.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// What the index file starts with (it names the format and its version).
pub const MAGIC: [u8; 16] = *b"subagentd.times1";
/// The size of the header and of each record.
pub const RECORD: u64 = 16;
/// The most entries an index holds.
pub const MAX_ENTRIES: u64 = 65_536;
/// The largest index file: the header and [`MAX_ENTRIES`] records (1 MiB
/// and 16 bytes).
pub const MAX_BYTES: u64 = RECORD * (MAX_ENTRIES + 1);
/// The least time between two entries while the index is young.
pub const BASE_SPACING_MS: u64 = 100;
/// How many entries are written at each spacing before it doubles.
pub const TIER_ENTRIES: u64 = 4_096;

/// The index beside the log at `log` (`child.log` → `child.log.times`).
pub fn path_for(log: &Path) -> PathBuf {
    let mut p = log.as_os_str().to_owned();
    p.push(".times");
    PathBuf::from(p)
}

/// The least time, in ms, between the last entry and the next when the
/// index holds `entries`: 100 ms for the first 4096, doubling every 4096
/// more (the last of the 16 tiers at about 55 minutes), so that the
/// entries of even a 30-day run of steady output fit in [`MAX_ENTRIES`].
pub fn spacing_ms(entries: u64) -> u64 {
    BASE_SPACING_MS << (entries / TIER_ENTRIES).min(15)
}

/// One entry: the line starting at `offset` was captured at `ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// A byte offset in child.log where a line starts.
    pub offset: u64,
    /// Milliseconds since the Unix epoch.
    pub ms: u64,
}

impl Entry {
    fn encode(&self) -> [u8; RECORD as usize] {
        let mut b = [0u8; RECORD as usize];
        b[..8].copy_from_slice(&self.offset.to_le_bytes());
        b[8..].copy_from_slice(&self.ms.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Entry> {
        let offset = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
        let ms = u64::from_le_bytes(b.get(8..16)?.try_into().ok()?);
        Some(Entry { offset, ms })
    }
}

/// Why (part of) an index was not used.
#[derive(Debug, thiserror::Error)]
pub enum LogTimesError {
    /// The file could not be opened as a regular file.
    #[error(transparent)]
    Open(#[from] crate::safefile::SafeFileError),
    /// Reading it failed.
    #[error("read {path}: {source}")]
    Read {
        /// The index.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// It does not start with [`MAGIC`]: not an index of this format.
    #[error("{path} is not a line-time index")]
    BadHeader {
        /// The index.
        path: String,
    },
    /// Record `index` (from 0) goes back in offset or time.
    #[error("{path} is damaged at entry {index}: it goes back in offset or time")]
    OutOfOrder {
        /// The index.
        path: String,
        /// The record.
        index: u64,
    },
    /// It holds more than [`MAX_BYTES`].
    #[error("{path} is over the limit of {MAX_BYTES} bytes")]
    TooLarge {
        /// The index.
        path: String,
    },
}

/// Checks `next` against the entries before it (the last is `last`).
fn in_order(last: Option<&Entry>, next: &Entry) -> bool {
    last.is_none_or(|l| next.offset > l.offset && next.ms >= l.ms)
}

/// Writes the index as the log is written.
pub struct TimesWriter {
    /// `None` once a write failed or when the file could not be used.
    file: Option<File>,
    entries: u64,
    last: Option<Entry>,
}

impl TimesWriter {
    /// Opens (creating, 0600) the index at `path` for appending. An index
    /// already there is continued when it is whole, else left as it is and
    /// not written; a failure leaves the writer idle (the run goes on
    /// without line times).
    pub fn open(path: &Path) -> TimesWriter {
        let idle = TimesWriter {
            file: None,
            entries: 0,
            last: None,
        };
        let Ok(mut file) = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(path)
        else {
            return idle;
        };
        let Ok(meta) = file.metadata() else {
            return idle;
        };
        if !meta.is_file() {
            return idle;
        }
        if meta.len() == 0 {
            if file.write_all(&MAGIC).is_err() {
                return idle;
            }
            return TimesWriter {
                file: Some(file),
                ..idle
            };
        }
        // Continue an index a runner wrote before, when it is whole.
        let mut bytes = vec![0u8; meta.len().min(MAX_BYTES + 1) as usize];
        if file.read_exact_at(&mut bytes, 0).is_err()
            || !(bytes.len() as u64).is_multiple_of(RECORD)
        {
            return idle;
        }
        match parse(&bytes, &path.display().to_string()) {
            Ok(entries) => TimesWriter {
                file: Some(file),
                entries: entries.len() as u64,
                last: entries.last().copied(),
            },
            Err(_) => idle,
        }
    }

    /// Records that the line starting at `offset` was captured at `ms`,
    /// unless the last entry is less than [`spacing_ms`] older, the index
    /// is full, or `offset` is not past the last entry's. Call it before
    /// the line's bytes are written.
    pub fn mark(&mut self, offset: u64, ms: u64) {
        if self.file.is_none() || self.entries >= MAX_ENTRIES {
            return;
        }
        let ms = self.last.map_or(ms, |l| ms.max(l.ms));
        let entry = Entry { offset, ms };
        if !in_order(self.last.as_ref(), &entry) {
            return;
        }
        if let Some(l) = &self.last {
            if ms - l.ms < spacing_ms(self.entries) {
                return;
            }
        }
        let Some(file) = self.file.as_mut() else {
            return;
        };
        if file.write_all(&entry.encode()).is_err() {
            // A short write leaves a torn record, which readers pass over.
            self.file = None;
            return;
        }
        self.entries += 1;
        self.last = Some(entry);
    }
}

/// The entries of a whole index file's `bytes` (header included); a torn
/// last record is left out.
fn parse(bytes: &[u8], path: &str) -> Result<Vec<Entry>, LogTimesError> {
    let mut r = Parsing::default();
    r.feed(bytes, path)?;
    Ok(r.entries)
}

/// What has been read of an index so far.
#[derive(Debug, Default)]
struct Parsing {
    header: bool,
    entries: Vec<Entry>,
}

impl Parsing {
    /// Takes the whole records at the start of `bytes` (the header first,
    /// when not yet read); returns how many bytes it took.
    fn feed(&mut self, bytes: &[u8], path: &str) -> Result<u64, LogTimesError> {
        let mut used = 0usize;
        for rec in bytes.chunks_exact(RECORD as usize) {
            if !self.header {
                if rec != MAGIC {
                    return Err(LogTimesError::BadHeader {
                        path: path.to_owned(),
                    });
                }
                self.header = true;
            } else {
                let Some(e) = Entry::decode(rec) else { break };
                if !in_order(self.entries.last(), &e) {
                    return Err(LogTimesError::OutOfOrder {
                        path: path.to_owned(),
                        index: self.entries.len() as u64,
                    });
                }
                if self.entries.len() as u64 >= MAX_ENTRIES {
                    return Err(LogTimesError::TooLarge {
                        path: path.to_owned(),
                    });
                }
                self.entries.push(e);
            }
            used += RECORD as usize;
        }
        Ok(used as u64)
    }
}

/// Reads an index, from a log's reader: at open, then again as the log
/// grows ([`TimesReader::refresh`]). The runner writes the index in a run
/// folder no child can reach, but it is read as the input of another
/// program: opened without following a link or blocking, a regular file
/// only, at most [`MAX_BYTES`] read, every record checked. A damaged index
/// keeps the entries before the damage, and says what it was.
#[derive(Debug)]
pub struct TimesReader {
    file: File,
    path: String,
    read: Parsing,
    /// Bytes taken so far.
    taken: u64,
    damage: Option<LogTimesError>,
}

impl TimesReader {
    /// Opens the index at `path` and reads what it holds; `Ok(None)` when
    /// there is none.
    pub fn open(path: &Path) -> Result<Option<TimesReader>, LogTimesError> {
        let opened = match crate::safefile::open(path) {
            Ok(o) => o,
            Err(e) if e.is_missing() => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let mut r = TimesReader {
            file: opened.into_file(),
            path: path.display().to_string(),
            read: Parsing::default(),
            taken: 0,
            damage: None,
        };
        r.refresh()?;
        Ok(Some(r))
    }

    /// Reads the whole records added since the last read. Damage stops the
    /// reading for good (see [`TimesReader::damage`]); only a failed read
    /// is an error.
    pub fn refresh(&mut self) -> Result<(), LogTimesError> {
        if self.damage.is_some() {
            return Ok(());
        }
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let room = (MAX_BYTES + RECORD).saturating_sub(self.taken);
            let want = (buf.len() as u64).min(room) as usize;
            if want < RECORD as usize {
                self.damage = Some(LogTimesError::TooLarge {
                    path: self.path.clone(),
                });
                return Ok(());
            }
            let n =
                read_records_at(&self.file, &mut buf[..want], self.taken).map_err(|source| {
                    LogTimesError::Read {
                        path: self.path.clone(),
                        source,
                    }
                })?;
            if n == 0 {
                return Ok(());
            }
            match self.read.feed(&buf[..n], &self.path) {
                Ok(used) => self.taken += used,
                Err(e) => {
                    self.damage = Some(e);
                    return Ok(());
                }
            }
        }
    }

    /// The entries read, in order.
    pub fn entries(&self) -> &[Entry] {
        &self.read.entries
    }

    /// What stopped the reading of the index, if anything did.
    pub fn damage(&self) -> Option<&LogTimesError> {
        self.damage.as_ref()
    }

    /// The time of the line starting at `offset`: that of the nearest
    /// entry at or before it; `None` before the first.
    pub fn time_at(&self, offset: u64) -> Option<u64> {
        let e = self.entries();
        let i = e.partition_point(|x| x.offset <= offset);
        i.checked_sub(1).map(|i| e[i].ms)
    }

    /// The first entry whose time is at or after `ms`.
    pub fn first_since(&self, ms: u64) -> Option<Entry> {
        let e = self.entries();
        e.get(e.partition_point(|x| x.ms < ms)).copied()
    }
}

/// Reads whole records at `at` into `buf` (its length a multiple of
/// [`RECORD`]); returns the bytes read, a multiple of [`RECORD`] (a
/// partial record at the end is left for the next read).
fn read_records_at(file: &File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], at + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(got - got % RECORD as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(path: &Path) -> TimesReader {
        TimesReader::open(path).unwrap().unwrap()
    }

    fn offsets(r: &TimesReader) -> Vec<(u64, u64)> {
        r.entries().iter().map(|e| (e.offset, e.ms)).collect()
    }

    fn index_of(entries: &[(u64, u64)]) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        for &(offset, ms) in entries {
            b.extend_from_slice(&Entry { offset, ms }.encode());
        }
        b
    }

    #[test]
    fn entries_are_spaced_and_never_go_back() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("child.log.times");
        let mut w = TimesWriter::open(&p);
        w.mark(0, 1_000);
        w.mark(10, 1_050); // too soon
        w.mark(20, 1_100); // 100 ms on
        w.mark(20, 5_000); // not a later line
        w.mark(30, 900); // the clock went back: the last time again, too soon
        w.mark(40, 1_250);
        w.mark(50, 1_300); // too soon
        w.mark(60, 2_000);
        drop(w);
        assert_eq!(
            offsets(&read(&p)),
            [(0, 1_000), (20, 1_100), (40, 1_250), (60, 2_000)]
        );
        assert_eq!(std::fs::read(&p).unwrap()[..16], MAGIC);
    }

    #[test]
    fn the_spacing_doubles_per_tier_and_the_file_stays_within_its_bound() {
        assert_eq!(spacing_ms(0), 100);
        assert_eq!(spacing_ms(TIER_ENTRIES - 1), 100);
        assert_eq!(spacing_ms(TIER_ENTRIES), 200);
        assert_eq!(spacing_ms(3 * TIER_ENTRIES), 800);
        assert_eq!(spacing_ms(MAX_ENTRIES), 100 << 15);
        // 16 tiers of 4096 cover more than the longest wall time (30 days).
        let covered: u64 = (0..16).map(|t| TIER_ENTRIES * (BASE_SPACING_MS << t)).sum();
        assert!(covered > 30 * 86_400_000, "{covered}");

        // A line every half spacing for as long as it takes: every other
        // one gets an entry until the index is full; then none does.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        let mut w = TimesWriter::open(&p);
        let (mut t, mut off) = (1u64, 0u64);
        while w.entries < MAX_ENTRIES {
            w.mark(off, t);
            off += 7;
            t += spacing_ms(w.entries) / 2;
        }
        for _ in 0..1000 {
            w.mark(off, t);
            off += 7;
            t += 10_000_000;
        }
        drop(w);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), MAX_BYTES);
        let r = read(&p);
        assert_eq!(r.entries().len() as u64, MAX_ENTRIES);
        assert!(r.damage().is_none());
        // The 4097th entry came 200 ms after the 4096th, the last 55 min
        // after the one before.
        let e = r.entries();
        let tier = TIER_ENTRIES as usize;
        assert_eq!(e[tier - 1].ms - e[tier - 2].ms, 100);
        assert_eq!(e[tier].ms - e[tier - 1].ms, 200);
        assert_eq!(e[e.len() - 1].ms - e[e.len() - 2].ms, 100 << 15);
    }

    #[test]
    fn an_index_is_continued_by_a_second_writer_and_a_damaged_one_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        let mut w = TimesWriter::open(&p);
        w.mark(0, 1_000);
        drop(w);
        let mut w = TimesWriter::open(&p);
        w.mark(5, 1_010); // too soon after the first writer's
        w.mark(9, 2_000);
        drop(w);
        assert_eq!(offsets(&read(&p)), [(0, 1_000), (9, 2_000)]);

        let bad = index_of(&[(10, 5), (3, 6)]);
        std::fs::write(&p, &bad).unwrap();
        let mut w = TimesWriter::open(&p);
        w.mark(20, 10_000);
        drop(w);
        assert_eq!(std::fs::read(&p).unwrap(), bad, "not written to");
    }

    #[test]
    fn times_are_looked_up_by_the_nearest_earlier_entry() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        std::fs::write(&p, index_of(&[(4, 100), (10, 200), (30, 200), (40, 900)])).unwrap();
        let r = read(&p);
        assert_eq!(r.time_at(0), None);
        assert_eq!(r.time_at(4), Some(100));
        assert_eq!(r.time_at(9), Some(100));
        assert_eq!(r.time_at(35), Some(200));
        assert_eq!(r.time_at(1 << 40), Some(900));
        assert_eq!(r.first_since(0).unwrap().offset, 4);
        assert_eq!(r.first_since(150).unwrap().offset, 10);
        assert_eq!(r.first_since(201).unwrap().offset, 40);
        assert_eq!(r.first_since(901), None);
    }

    #[test]
    fn damaged_short_and_disordered_indexes_keep_what_came_before() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        let good = index_of(&[(0, 100), (10, 200), (20, 300)]);
        // A torn last record is left out, and read once it is whole.
        std::fs::write(&p, &good[..good.len() - 5]).unwrap();
        let mut r = read(&p);
        assert_eq!(offsets(&r), [(0, 100), (10, 200)]);
        assert!(r.damage().is_none());
        std::fs::write(&p, &good).unwrap();
        r.refresh().unwrap();
        assert_eq!(r.entries().len(), 3);
        // Shorter than a header: no entries, no damage (a writer may be
        // about to write it).
        std::fs::write(&p, &MAGIC[..7]).unwrap();
        let r = read(&p);
        assert!(r.entries().is_empty() && r.damage().is_none());
        // Not an index.
        std::fs::write(&p, b"0123456789abcdef0123456789abcdef").unwrap();
        let r = read(&p);
        assert!(r.entries().is_empty());
        assert!(matches!(r.damage(), Some(LogTimesError::BadHeader { .. })));
        // Back in offset, back in time, the same offset twice.
        for bad in [
            [(0, 100), (10, 200), (5, 300), (40, 400)],
            [(0, 100), (10, 200), (20, 150), (40, 400)],
            [(0, 100), (10, 200), (10, 300), (40, 400)],
        ] {
            std::fs::write(&p, index_of(&bad)).unwrap();
            let r = read(&p);
            assert_eq!(offsets(&r), [(0, 100), (10, 200)], "{bad:?}");
            let e = r.damage().unwrap().to_string();
            assert!(e.contains("damaged at entry 2"), "{e}");
        }
    }

    #[test]
    fn an_oversized_index_is_read_only_to_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        let n = MAX_ENTRIES + 10;
        let entries: Vec<(u64, u64)> = (0..n).map(|i| (i, i)).collect();
        std::fs::write(&p, index_of(&entries)).unwrap();
        let r = read(&p);
        assert_eq!(r.entries().len() as u64, MAX_ENTRIES);
        assert!(matches!(r.damage(), Some(LogTimesError::TooLarge { .. })));
    }

    #[test]
    fn only_a_regular_file_is_read_and_never_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("real");
        std::fs::write(&target, index_of(&[(0, 1)])).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(TimesReader::open(&link).is_err());
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = TimesReader::open(&fifo).unwrap_err().to_string();
        assert!(e.contains("FIFO"), "{e}");
        assert!(TimesReader::open(&dir.path().join("none"))
            .unwrap()
            .is_none());
        // The writer does not follow a link either.
        let mut w = TimesWriter::open(&link);
        w.mark(100, 100);
        drop(w);
        assert_eq!(std::fs::read(&target).unwrap(), index_of(&[(0, 1)]));
    }
}
