//! Parsed definitions kept per file and content: a file is read and
//! parsed again only when its identity (device, inode, size, mtime,
//! ctime) changed, so its warnings are new once per content, not once per
//! spawn.

use super::walk::Identity;
use policy::definition::{parse, Definition, DefinitionError};
use std::collections::HashMap;
use std::io::Read;
use std::path::PathBuf;
use std::sync::{LazyLock, Mutex};

/// The largest definition file read.
pub const DEFINITION_MAX: u64 = 1 << 20;
/// Past this many files, or this many bytes of them, the cache starts
/// again empty.
const ENTRIES_MAX: usize = 10_000;
const BYTES_MAX: u64 = 64 << 20;

type Parsed = Result<Definition, DefinitionError>;

/// The parses by path, and the bytes of the files they came from.
#[derive(Default)]
struct Cache {
    entries: HashMap<PathBuf, (Identity, Parsed)>,
    bytes: u64,
}

static CACHE: LazyLock<Mutex<Cache>> = LazyLock::new(|| Mutex::new(Cache::default()));

/// The definition in `f`, and whether it was read now (not cached).
pub fn parsed(path: PathBuf, file: std::fs::File, fid: Identity) -> (Parsed, bool) {
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((id, p)) = cache.entries.get(&path) {
        if *id == fid {
            return (p.clone(), false);
        }
    }
    let p = read(file, &path).and_then(|text| parse(&path, &text));
    if cache.entries.len() >= ENTRIES_MAX || cache.bytes + fid.size > BYTES_MAX {
        *cache = Cache::default();
    }
    cache.bytes += fid.size;
    if let Some((old, _)) = cache.entries.insert(path, (fid, p.clone())) {
        cache.bytes = cache.bytes.saturating_sub(old.size);
    }
    (p, true)
}

/// The whole file as UTF-8, at most [`DEFINITION_MAX`] bytes.
fn read(file: std::fs::File, path: &std::path::Path) -> Result<String, DefinitionError> {
    let fail = |m: String| DefinitionError::unreadable(path, m);
    let mut buf = Vec::new();
    file.take(DEFINITION_MAX + 1)
        .read_to_end(&mut buf)
        .map_err(|e| fail(format!("read: {e}")))?;
    if buf.len() as u64 > DEFINITION_MAX {
        return Err(fail(format!("over the limit of {DEFINITION_MAX} bytes")));
    }
    String::from_utf8(buf).map_err(|_| fail("not UTF-8".into()))
}
