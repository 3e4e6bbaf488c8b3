//! Parsed definitions, their tools resolved, kept per file and content: a
//! file is read on every discovery (a write through a shared mapping
//! changes no time stamp) and parsed and resolved again only when the hash
//! of its bytes (and of the catalog) changed, so its warnings are new once
//! per content, not once per spawn.

use policy::agenttools::{resolve, AgentTools};
use policy::definition::{parse, Definition, DefinitionError};
use policy::toolpolicy::ToolPolicy;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};

/// The largest definition file read.
pub const DEFINITION_MAX: u64 = 1 << 20;
/// The most bytes of definitions one discovery reads.
pub const READ_MAX: u64 = 16 << 20;
/// Past this many files, or this many bytes of them, the cache starts
/// again empty.
const ENTRIES_MAX: usize = 10_000;
const BYTES_MAX: u64 = 64 << 20;

type Parsed = Result<(Definition, AgentTools), DefinitionError>;
type Hash = [u8; 32];

/// The parses by path, with the hash of the bytes they came from.
#[derive(Default)]
struct Cache {
    entries: HashMap<PathBuf, (Hash, u64, Parsed)>,
    bytes: u64,
}

static CACHE: LazyLock<Mutex<Cache>> = LazyLock::new(|| Mutex::new(Cache::default()));

/// What a file is read into.
pub struct Source {
    pub path: PathBuf,
    pub file: std::fs::File,
    /// As its metadata says: a hint.
    pub size: u64,
}

/// The definition in `src`, its tools resolved against `tools`, and
/// whether it was parsed now (not cached). What is read is taken from
/// `budget`; a file that does not fit in it is not read.
pub fn parsed(src: Source, tools: &ToolPolicy, budget: &mut u64) -> (Parsed, bool) {
    let Source { path, file, size } = src;
    if size > *budget {
        let why = format!(
            "not read: the definitions one discovery reads are at most {} MiB together",
            READ_MAX >> 20
        );
        return (Err(DefinitionError::unreadable(&path, why)), true);
    }
    let bytes = match read(file, &path, size) {
        Ok(b) => b,
        Err(e) => return (Err(e), true),
    };
    *budget = budget.saturating_sub(bytes.len() as u64);
    let hash: Hash = Sha256::new()
        .chain_update(tools.catalog_hash())
        .chain_update(&bytes)
        .finalize()
        .into();
    if let Some(p) = cached(&path, &hash) {
        return (p, false);
    }
    // Parsed without the lock: one project's file never holds up another's.
    let p = String::from_utf8(bytes)
        .map_err(|_| DefinitionError::unreadable(&path, "not UTF-8"))
        .and_then(|text| parse(&path, &text))
        .map(|d| {
            let t = resolve(tools, &d);
            (d, t)
        });
    let weight = self::weight(&p);
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    if cache.entries.len() >= ENTRIES_MAX || cache.bytes + weight > BYTES_MAX {
        *cache = Cache::default();
    }
    cache.bytes += weight;
    if let Some((_, old, _)) = cache.entries.insert(path, (hash, weight, p.clone())) {
        cache.bytes = cache.bytes.saturating_sub(old);
    }
    (p, true)
}

/// The parse kept for `path`, if it came from the bytes hashed `hash`.
fn cached(path: &Path, hash: &Hash) -> Option<Parsed> {
    let cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    match cache.entries.get(path) {
        Some((h, _, p)) if h == hash => Some(p.clone()),
        _ => None,
    }
}

/// What a parse holds, roughly, in bytes.
fn weight(p: &Parsed) -> u64 {
    let n = match p {
        Ok((d, t)) => {
            t.warning.as_ref().map_or(0, String::len)
                + d.body.len()
                + d.description.len()
                + d.warnings.iter().map(String::len).sum::<usize>()
                + d.tools.iter().flatten().map(String::len).sum::<usize>()
                + d.disallowed_tools.iter().map(String::len).sum::<usize>()
        }
        Err(e) => e.message.len(),
    };
    n as u64 + 1024
}

/// The whole file, at most [`DEFINITION_MAX`] bytes (`size`, its
/// metadata's, spares reading one that says it is over).
fn read(file: std::fs::File, path: &Path, size: u64) -> Result<Vec<u8>, DefinitionError> {
    let fail = |m: String| DefinitionError::unreadable(path, m);
    let over = || fail(format!("over the limit of {DEFINITION_MAX} bytes"));
    if size > DEFINITION_MAX {
        return Err(over());
    }
    let mut buf = Vec::new();
    file.take(DEFINITION_MAX + 1)
        .read_to_end(&mut buf)
        .map_err(|e| fail(format!("read: {e}")))?;
    if buf.len() as u64 > DEFINITION_MAX {
        return Err(over());
    }
    Ok(buf)
}
