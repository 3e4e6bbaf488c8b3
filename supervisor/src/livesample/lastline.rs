//! The last lines of a run's child.log, read from its end within a bound
//! (opened without following a link, a regular file only) and escaped:
//! each line comes back on one line with every control character and
//! escape sequence shown visibly (`\x1b`), so it can be drawn on a
//! terminal as it is.

use std::path::Path;

/// The bytes read back from the end for [`last_line`].
pub const LAST_LINE_BYTES: u64 = 4096;
/// The longest line [`last_line`] returns, in characters (escapes
/// counted), `…` added where it was cut.
pub const LAST_LINE_CHARS: usize = 240;

/// `bytes` as one line of visible text (invalid UTF-8 as `\xNN`).
fn visible(bytes: &[u8]) -> String {
    crate::sanitize::one_line(&crate::sanitize::terminal_text(bytes))
}

/// The last `n` lines (empty ones kept, a final newline ending the last)
/// of the log at `path` found within its last `max_bytes`, each escaped
/// (see the module doc); the first may be the end of a longer line. An
/// error when the file cannot be opened as a regular file.
pub fn tail_lines(
    path: &Path,
    max_bytes: u64,
    n: usize,
) -> Result<Vec<String>, subagent_runner::safefile::SafeFileError> {
    let bytes = subagent_runner::safefile::read_tail(path, max_bytes)?;
    let body = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
    if body.is_empty() {
        return Ok(Vec::new());
    }
    let lines: Vec<&[u8]> = body.split(|&b| b == b'\n').collect();
    let skip = lines.len().saturating_sub(n);
    Ok(lines[skip..].iter().map(|l| visible(l)).collect())
}

/// The last line of the log at `path` that is not blank, escaped and cut
/// to [`LAST_LINE_CHARS`]; `None` when there is none (no file yet, or
/// nothing written) or the file is not a regular one.
pub fn last_line(path: &Path) -> Option<String> {
    let bytes = subagent_runner::safefile::read_tail(path, LAST_LINE_BYTES).ok()?;
    let line = bytes
        .split(|&b| b == b'\n')
        .rev()
        .find(|l| l.iter().any(|b| !b.is_ascii_whitespace()))?;
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = visible(line);
    if text.chars().count() <= LAST_LINE_CHARS {
        return Some(text);
    }
    let mut cut: String = text.chars().take(LAST_LINE_CHARS - 1).collect();
    cut.push('…');
    Some(cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_line_is_escaped_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("child.log");
        assert_eq!(last_line(&p), None, "no file");
        std::fs::write(&p, "").unwrap();
        assert_eq!(last_line(&p), None, "empty");
        std::fs::write(&p, "first\nsecond\n\n  \n").unwrap();
        assert_eq!(last_line(&p).as_deref(), Some("second"));
        std::fs::write(&p, b"a\n\x1b]0;pwned\x07\x1b[2J\xff\tx\r\n").unwrap();
        assert_eq!(
            last_line(&p).as_deref(),
            Some("\\x1b]0;pwned\\x07\\x1b[2J\\xff\\tx")
        );
        std::fs::write(&p, "y".repeat(10_000)).unwrap();
        let long = last_line(&p).unwrap();
        assert_eq!(long.chars().count(), LAST_LINE_CHARS);
        assert!(long.ends_with('…'));
    }

    #[test]
    fn a_link_or_a_fifo_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("secret");
        std::fs::write(&target, "secret line\n").unwrap();
        let link = dir.path().join("child.log");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert_eq!(last_line(&link), None);
        assert!(tail_lines(&link, 1024, 5).is_err());
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert_eq!(last_line(&fifo), None, "not opened blocking, not read");
    }

    #[test]
    fn tail_lines_keeps_the_last_n() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("child.log");
        std::fs::write(&p, "1\n2\n\n3\x1b[31m\n").unwrap();
        assert_eq!(tail_lines(&p, 1024, 2).unwrap(), ["", "3\\x1b[31m"]);
        assert_eq!(tail_lines(&p, 1024, 9).unwrap().len(), 4);
        assert_eq!(tail_lines(&p, 3, 9).unwrap(), ["1m"], "only the bound read");
    }
}
