//! git's index file, read for the scan: the stage-0 entries' paths and
//! stat data, and the cached tree of the root (the `TREE` extension).
//!
//! Versions 2, 3 and 4 (prefix-compressed paths) of the SHA-1 format, as
//! described in git's `Documentation/gitformat-index.txt`. The trailing
//! checksum is verified (a zero trailer, `index.skipHash`, is accepted as
//! git accepts it). Anything the scan does not model is refused with the
//! reason, and the caller falls back to libgit2: unmerged entries,
//! assume-unchanged, skip-worktree and intent-to-add entries, submodules,
//! sparse directory entries, and split or sparse indexes.

use super::scan::Tracked;
use sha1::{Digest, Sha1};

/// Why an index file is not read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IndexError {
    /// The file does not follow the format.
    #[error("malformed index at byte {at}: {what}")]
    Malformed { at: usize, what: &'static str },
    /// The trailing checksum does not match the content.
    #[error("the index checksum does not match")]
    Checksum,
    /// The index uses something the scan does not model.
    #[error("the index has {0}")]
    Unsupported(&'static str),
}

/// What the scan needs from the index.
#[derive(Debug)]
pub struct IndexFile {
    /// The entries, in the index's order (sorted by path).
    pub entries: Vec<Tracked>,
    /// The root tree the cached tree names, when it is valid.
    pub root_tree: Option<[u8; 20]>,
}

const HEADER: usize = 12;
const HASH: usize = 20;
/// The fixed part of an entry: ten 32-bit stat fields, the object id and
/// the 16-bit flags.
const FIXED: usize = 40 + HASH + 2;

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn bad(&self, what: &'static str) -> IndexError {
        IndexError::Malformed { at: self.at, what }
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], IndexError> {
        let end = self.at.checked_add(n).ok_or_else(|| self.bad(what))?;
        let s = self.buf.get(self.at..end).ok_or_else(|| self.bad(what))?;
        self.at = end;
        Ok(s)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, IndexError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, IndexError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    /// Bytes up to the next NUL, which is consumed.
    fn until_nul(&mut self, what: &'static str) -> Result<&'a [u8], IndexError> {
        let rest = self.buf.get(self.at..).ok_or_else(|| self.bad(what))?;
        let n = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| self.bad(what))?;
        let s = &rest[..n];
        self.at += n + 1;
        Ok(s)
    }

    /// git's offset varint (`decode_varint`), used by version 4.
    fn varint(&mut self) -> Result<usize, IndexError> {
        let mut c = self.take(1, "path prefix length")?[0];
        let mut val = usize::from(c & 127);
        while c & 128 != 0 {
            c = self.take(1, "path prefix length")?[0];
            val = val
                .checked_add(1)
                .and_then(|v| v.checked_mul(128))
                .and_then(|v| v.checked_add(usize::from(c & 127)))
                .ok_or_else(|| self.bad("path prefix length overflows"))?;
        }
        Ok(val)
    }
}

const ASSUME_VALID: u16 = 0x8000;
const EXTENDED: u16 = 0x4000;
const STAGE: u16 = 0x3000;
const NAME_MASK: u16 = 0x0fff;
const SKIP_WORKTREE: u16 = 0x4000;
const INTENT_TO_ADD: u16 = 0x2000;

/// Parses an index file's content.
pub fn parse(buf: &[u8]) -> Result<IndexFile, IndexError> {
    if buf.len() < HEADER + HASH {
        return Err(IndexError::Malformed {
            at: 0,
            what: "shorter than a header and a checksum",
        });
    }
    let (body, trailer) = buf.split_at(buf.len() - HASH);
    if trailer.iter().any(|&b| b != 0) && Sha1::digest(body).as_slice() != trailer {
        return Err(IndexError::Checksum);
    }
    let mut r = Reader { buf: body, at: 0 };
    if r.take(4, "signature")? != b"DIRC" {
        return Err(r.bad("no DIRC signature"));
    }
    let version = r.u32("version")?;
    if !(2..=4).contains(&version) {
        return Err(r.bad("unknown version"));
    }
    let count = r.u32("entry count")? as usize;
    let mut entries = Vec::with_capacity(count.min(body.len() / FIXED));
    let mut prev: Vec<u8> = Vec::new();
    for _ in 0..count {
        let start = r.at;
        let mut f = [0u32; 10];
        for v in &mut f {
            *v = r.u32("stat data")?;
        }
        r.take(HASH, "object id")?;
        let flags = r.u16("flags")?;
        let extended = if flags & EXTENDED != 0 {
            if version < 3 {
                return Err(r.bad("extended flags before version 3"));
            }
            r.u16("extended flags")?
        } else {
            0
        };
        let path = if version == 4 {
            let strip = r.varint()?;
            let keep = prev
                .len()
                .checked_sub(strip)
                .ok_or_else(|| r.bad("path prefix longer than the previous path"))?;
            let mut p = prev[..keep].to_vec();
            p.extend_from_slice(r.until_nul("path")?);
            p
        } else {
            let name_len = usize::from(flags & NAME_MASK);
            let p = if name_len < usize::from(NAME_MASK) {
                let p = r.take(name_len, "path")?.to_vec();
                r.take(1, "path terminator")?;
                p
            } else {
                r.until_nul("path")?.to_vec()
            };
            // Padded with NULs to a multiple of 8 bytes.
            let len = r.at - start;
            r.take((8 - len % 8) % 8, "entry padding")?;
            p
        };
        if flags & STAGE != 0 {
            return Err(IndexError::Unsupported("unmerged entries"));
        }
        if flags & ASSUME_VALID != 0 || extended & (SKIP_WORKTREE | INTENT_TO_ADD) != 0 {
            return Err(IndexError::Unsupported(
                "assume-unchanged, skip-worktree or intent-to-add entries",
            ));
        }
        let mode = f[6];
        match mode {
            0o100_644 | 0o100_755 | 0o120_000 => {}
            0o160_000 => return Err(IndexError::Unsupported("submodules")),
            0o040_000 => return Err(IndexError::Unsupported("sparse directory entries")),
            _ => return Err(r.bad("unknown mode")),
        }
        entries.push(Tracked {
            ctime: (f[0] as i32, f[1]),
            mtime: (f[2] as i32, f[3]),
            ino: f[5],
            mode,
            uid: f[7],
            gid: f[8],
            size: f[9],
            path: path.clone(),
        });
        if version == 4 {
            prev = path;
        }
    }
    let mut root_tree = None;
    while r.at < body.len() {
        let sig = r.take(4, "extension signature")?;
        let len = r.u32("extension size")? as usize;
        let data = r.take(len, "extension data")?;
        match sig {
            b"TREE" => root_tree = cached_root(data),
            b"link" => return Err(IndexError::Unsupported("a split index")),
            b"sdir" => return Err(IndexError::Unsupported("a sparse index")),
            // Other extensions are optional for readers (their names
            // start with an upper-case letter) or do not matter here.
            _ => {}
        }
    }
    Ok(IndexFile { entries, root_tree })
}

/// The root's object id in a `TREE` extension, when it is valid: the first
/// record is the root, `"" NUL <entries> SP <subtrees> LF [<id>]`, and an
/// invalidated one has `-1` entries and no id.
fn cached_root(data: &[u8]) -> Option<[u8; 20]> {
    let mut r = Reader { buf: data, at: 0 };
    let path = r.until_nul("tree path").ok()?;
    if !path.is_empty() {
        return None;
    }
    let rest = data.get(r.at..)?;
    let nl = rest.iter().position(|&b| b == b'\n')?;
    let counts = std::str::from_utf8(&rest[..nl]).ok()?;
    let (entries, _) = counts.split_once(' ')?;
    if entries.parse::<i64>().ok()? < 0 {
        return None;
    }
    let id = rest.get(nl + 1..nl + 1 + HASH)?;
    let mut out = [0u8; 20];
    out.copy_from_slice(id);
    Some(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A version 2 index of one entry at `path`, with a valid checksum.
    fn one_entry(path: &[u8], flags_extra: u16) -> Vec<u8> {
        let mut b = b"DIRC".to_vec();
        b.extend_from_slice(&2u32.to_be_bytes());
        b.extend_from_slice(&1u32.to_be_bytes());
        let start = b.len();
        for v in [1u32, 2, 3, 4, 5, 6, 0o100_644, 7, 8, 9] {
            b.extend_from_slice(&v.to_be_bytes());
        }
        b.extend_from_slice(&[0xab; 20]);
        let name_len = u16::try_from(path.len().min(0xfff)).unwrap();
        b.extend_from_slice(&(name_len | flags_extra).to_be_bytes());
        b.extend_from_slice(path);
        b.push(0);
        while !(b.len() - start).is_multiple_of(8) {
            b.push(0);
        }
        let sum = Sha1::digest(&b);
        b.extend_from_slice(&sum);
        b
    }

    #[test]
    fn a_saturated_name_length_reads_to_the_nul() {
        let long = vec![b'x'; 5000];
        let f = parse(&one_entry(&long, 0)).unwrap();
        assert_eq!(f.entries.len(), 1);
        assert_eq!(f.entries[0].path, long);
        let e = &f.entries[0];
        assert_eq!(
            (e.ctime, e.mtime, e.ino, e.mode, e.uid, e.gid, e.size),
            ((1, 2), (3, 4), 6, 0o100_644, 7, 8, 9)
        );
        assert_eq!(f.root_tree, None);
    }

    #[test]
    fn what_the_scan_does_not_model_is_refused() {
        // Stage 2 (unmerged), assume-valid.
        for flag in [0x2000, ASSUME_VALID] {
            assert!(matches!(
                parse(&one_entry(b"a", flag)),
                Err(IndexError::Unsupported(_))
            ));
        }
        // Extended flags in version 2 are malformed.
        assert!(matches!(
            parse(&one_entry(b"a", EXTENDED)),
            Err(IndexError::Malformed { .. })
        ));
        // A zero trailer (index.skipHash) is accepted.
        let mut b = one_entry(b"a", 0);
        let n = b.len();
        b[n - 20..].fill(0);
        assert_eq!(parse(&b).unwrap().entries.len(), 1);
    }

    #[test]
    fn the_cached_root_needs_a_valid_count() {
        let mut valid = b"\x0012 3\n".to_vec();
        valid.extend_from_slice(&[7; 20]);
        assert_eq!(cached_root(&valid), Some([7; 20]));
        assert_eq!(cached_root(b"\x00-1 3\n"), None);
        assert_eq!(cached_root(b"sub\x001 0\n"), None);
    }
}
