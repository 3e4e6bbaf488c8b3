//! Where the last lines of a log begin, read back from its end within a
//! bound, for both front ends (`subagent logs --tail` and the MCP log and
//! status tools). Uses only std.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// The byte offset where the last `n` lines of `path` begin, looking back
/// at most `limit` bytes: past that, `limit` bytes before the end.
pub fn tail_offset(path: &Path, n: usize, limit: u64) -> std::io::Result<u64> {
    let mut f = File::open(path)?;
    let len = f.metadata()?.len();
    tail_offset_in(&mut f, len, n, limit)
}

/// [`tail_offset`] on the open file `f`.
pub fn tail_offset_of(f: &mut File, n: usize, limit: u64) -> std::io::Result<u64> {
    let len = f.metadata()?.len();
    tail_offset_in(f, len, n, limit)
}

/// [`tail_offset`] on `f`, whose length is `len`.
fn tail_offset_in<F: Read + Seek>(
    f: &mut F,
    len: u64,
    n: usize,
    limit: u64,
) -> std::io::Result<u64> {
    if n == 0 {
        return Ok(len);
    }
    let floor = len.saturating_sub(limit);
    let mut pos = len;
    let mut newlines = 0;
    let mut buf = vec![0u8; (64 * 1024).min(len - floor) as usize];
    // A final newline ends the last line; it does not start a new one.
    let mut skip_last = true;
    while pos > floor {
        let take = ((pos - floor) as usize).min(buf.len());
        pos -= take as u64;
        f.seek(SeekFrom::Start(pos))?;
        f.read_exact(&mut buf[..take])?;
        for i in (0..take).rev() {
            if buf[i] == b'\n' {
                if skip_last && pos + i as u64 == len - 1 {
                    continue;
                }
                newlines += 1;
                if newlines == n {
                    return Ok(pos + i as u64 + 1);
                }
            }
            skip_last = false;
        }
    }
    Ok(floor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_offsets() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("l");
        std::fs::write(&p, "a\nb\nc\n").unwrap();
        assert_eq!(tail_offset(&p, 1, u64::MAX).unwrap(), 4);
        assert_eq!(tail_offset(&p, 2, u64::MAX).unwrap(), 2);
        assert_eq!(tail_offset(&p, 5, u64::MAX).unwrap(), 0);
        assert_eq!(tail_offset(&p, 0, u64::MAX).unwrap(), 6);
        std::fs::write(&p, "a\nb\nno newline").unwrap();
        assert_eq!(tail_offset(&p, 1, u64::MAX).unwrap(), 4);
        assert_eq!(tail_offset(&p, 2, 5).unwrap(), 9, "stops 5 bytes back");
    }

    /// A file that counts the bytes read from it.
    struct Counting {
        inner: std::io::Cursor<Vec<u8>>,
        read: u64,
    }

    impl Read for Counting {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.read += n as u64;
            Ok(n)
        }
    }

    impl Seek for Counting {
        fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
            self.inner.seek(to)
        }
    }

    #[test]
    fn a_log_without_newlines_is_read_only_up_to_the_limit() {
        let len = 8 * 1024 * 1024;
        let mut f = Counting {
            inner: std::io::Cursor::new(vec![b'x'; len]),
            read: 0,
        };
        let limit = 64 * 1024;
        let at = tail_offset_in(&mut f, len as u64, 20, limit).unwrap();
        assert_eq!(at, len as u64 - limit);
        assert!(f.read <= limit, "read {} bytes", f.read);
    }
}
