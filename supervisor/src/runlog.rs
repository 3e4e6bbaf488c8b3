//! A bounded JSON-lines log in a run folder (egress.log, gateway.log):
//! opened without following a link, 0600, appended to, never past its cap.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A run's log could not be written.
#[derive(Debug, thiserror::Error)]
pub enum RunLogError {
    /// Opening or writing failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The log.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The run's disk budget is used up.
    #[error("{} has reached the run's disk budget ({cap} bytes)", file_name(path))]
    Full {
        /// The log.
        path: PathBuf,
        /// Its cap.
        cap: u64,
    },
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .unwrap_or(path.as_os_str())
        .to_string_lossy()
        .into_owned()
}

/// A log file opened on its first line; what it already holds counts
/// against `cap` (a log served again after a restart stays bounded), and
/// lines past it are refused.
pub struct LineFile {
    path: PathBuf,
    cap: u64,
    file: Option<std::fs::File>,
    len: u64,
}

impl LineFile {
    /// The log at `path`, holding at most `cap` bytes.
    pub fn new(path: PathBuf, cap: u64) -> LineFile {
        LineFile {
            path,
            cap,
            file: None,
            len: 0,
        }
    }

    /// Whether another byte may still be written.
    pub fn has_room(&self) -> bool {
        self.len < self.cap
    }

    /// Whether a line of `n` bytes fits in what was counted so far.
    pub fn fits(&self, n: usize) -> bool {
        self.len + n as u64 <= self.cap
    }

    /// Appends `line` (whole, its newline included), opening the log
    /// first; a line that does not fit is not written and fills the log.
    pub fn append(&mut self, line: &[u8]) -> Result<(), RunLogError> {
        let io = |source| RunLogError::Io {
            path: self.path.clone(),
            source,
        };
        if self.file.is_none() {
            // The run folder is the daemon's; a link there is refused anyway.
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&self.path)
                .map_err(io)?;
            self.len = f.metadata().map_err(io)?.len();
            self.file = Some(f);
        }
        if !self.fits(line.len()) {
            self.len = self.cap;
            return Err(RunLogError::Full {
                path: self.path.clone(),
                cap: self.cap,
            });
        }
        if let Some(f) = self.file.as_mut() {
            f.write_all(line).map_err(io)?;
        }
        self.len += line.len() as u64;
        Ok(())
    }
}

/// `s` cut to at most `max` bytes, at a character boundary.
pub fn clip(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Child-chosen text as a line shows it: at most `max` bytes of it, every
/// character but printable ASCII escaped.
pub fn shown(s: &str, max: usize) -> String {
    let clipped = clip(s, max);
    let mut out = String::with_capacity(clipped.len());
    for c in clipped.chars() {
        match c {
            '!'..='~' => out.push(c),
            _ => out.extend(c.escape_default()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn what_the_file_holds_counts_against_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.log");
        std::fs::write(&path, "12345\n").unwrap();
        let mut counted = LineFile::new(path.clone(), 10);
        let err = counted.append(b"abcde\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "x.log has reached the run's disk budget (10 bytes)"
        );
        assert!(!counted.has_room());
        assert_eq!(std::fs::read(&path).unwrap(), b"12345\n");
        let mut fresh = LineFile::new(dir.path().join("y.log"), 10);
        fresh.append(b"abcde\n").unwrap();
        assert!(!fresh.fits(5));
    }
}
