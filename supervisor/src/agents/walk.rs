//! Walking a definitions folder a child may have written. Every entry is
//! opened from the folder's descriptor with `openat2` and
//! `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`: symbolic links are followed,
//! but the kernel refuses any resolution that leaves the folder, in the
//! same call that opens the file, so a link swapped in meanwhile cannot
//! lead out either. What was opened is then checked on its descriptor: a
//! definition must be a regular file (not a FIFO, not a device).

use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use std::collections::HashSet;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use subagent_runner::safefile;

/// At most this many definition files of one folder are read, its
/// subfolders included.
pub const FILES_MAX: usize = 1_000;
/// At most this many folders of one folder are walked.
pub const DIRS_MAX: usize = 1_000;
/// Folders deeper than this are not walked.
pub const DEPTH_MAX: usize = 16;
/// At most this many entries of one folder are looked at, its subfolders'
/// included.
pub const ENTRIES_MAX: usize = 100_000;

/// Why an entry named like a definition was not read (said after its
/// path).
#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    /// A symbolic link on the way leads out of the folder.
    #[error("leads out of {root} (links are followed only within it)")]
    Escapes { root: String },
    /// A loop of symbolic links, or too many of them.
    #[error("too many levels of symbolic links")]
    Loop,
    /// A link to nothing, or an entry gone since it was listed.
    #[error("does not exist (a symbolic link to nothing?)")]
    Missing,
    /// A FIFO, a device or a socket.
    #[error("is {0}, not a regular file")]
    NotRegular(&'static str),
    /// Another failure of a system call.
    #[error("{op}: {source}")]
    Io {
        op: &'static str,
        source: std::io::Error,
    },
}

/// A file's identity, and its size (a hint: the content is read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Identity {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
}

impl Identity {
    fn of(m: &std::fs::Metadata) -> Identity {
        Identity {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
        }
    }
}

/// A definition file found: opened (and closed) only when it is read, so
/// that a walk holds no more than its folders' descriptors.
pub struct Found {
    /// Where it was found (through links, as they are named).
    pub path: PathBuf,
    /// Its path from the folder walked.
    rel: PathBuf,
}

/// What a walk found.
#[derive(Default)]
pub struct Walked {
    /// The definition files, by path.
    pub files: Vec<Found>,
    /// Entries named like definitions that could not be opened as one.
    pub errors: Vec<(PathBuf, WalkError)>,
    /// What was left out (links leading out, limits reached).
    pub notes: Vec<String>,
    /// A folder could not be opened or listed: a definition in it may be
    /// missing from `files`.
    pub incomplete: bool,
}

/// Whether `name` is a definition's: `*.md`, in any case.
fn is_md(name: &Path) -> bool {
    name.extension()
        .is_some_and(|x| x.eq_ignore_ascii_case("md"))
}

fn open_beneath(root: BorrowedFd<'_>, rel: &Path, flags: OFlag) -> Result<File, Errno> {
    // openat2 refuses any flag but these with O_PATH.
    let extra = if flags.contains(OFlag::O_PATH) {
        OFlag::O_CLOEXEC
    } else {
        OFlag::O_CLOEXEC | OFlag::O_NOCTTY
    };
    let how = OpenHow::new()
        .flags(flags | extra)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    openat2(root, rel, how).map(File::from)
}

fn kind_of(t: std::fs::FileType) -> &'static str {
    if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

fn walk_error(e: Errno, root: &Path) -> WalkError {
    match e {
        Errno::EXDEV => WalkError::Escapes {
            root: root.display().to_string(),
        },
        Errno::ELOOP => WalkError::Loop,
        Errno::ENOENT => WalkError::Missing,
        other => WalkError::Io {
            op: "open",
            source: other.into(),
        },
    }
}

struct Walker<'a> {
    root: BorrowedFd<'a>,
    shown: &'a Path,
    out: Walked,
    visited: HashSet<(u64, u64)>,
    dirs: usize,
    entries: usize,
    files_full: bool,
}

impl Walker<'_> {
    fn error(&mut self, rel: &Path, e: Errno) {
        let path = self.shown.join(rel);
        let err = walk_error(e, self.shown);
        if is_md(rel) {
            self.out.errors.push((path, err));
        } else if !matches!(e, Errno::ENOENT) {
            // A folder behind it may hold definitions; a link out is meant.
            self.out.incomplete |= matches!(err, WalkError::Io { .. });
            let shown = path.display();
            self.out.notes.push(format!("not walked: {shown}: {err}"));
        }
    }

    /// A folder that could not be opened or listed: the walk is
    /// incomplete.
    fn unread(&mut self, rel: &Path, e: &dyn std::fmt::Display) {
        self.out.incomplete = true;
        let shown = self.shown.join(rel);
        self.out
            .notes
            .push(format!("not walked: {}: {e}", shown.display()));
    }

    /// Looks at one entry: a folder is queued, a definition recorded.
    fn entry(&mut self, rel: PathBuf, depth: usize, queue: &mut Vec<(PathBuf, usize)>) {
        let probe = match open_beneath(self.root, &rel, OFlag::O_PATH) {
            Ok(f) => f,
            Err(e) => return self.error(&rel, e),
        };
        let Ok(meta) = probe.metadata() else { return };
        if meta.is_dir() {
            if depth < DEPTH_MAX {
                queue.push((rel, depth + 1));
            } else {
                let shown = self.shown.join(&rel);
                self.out.notes.push(format!(
                    "not walked: {} is deeper than {DEPTH_MAX} folders",
                    shown.display()
                ));
            }
            return;
        }
        if !is_md(&rel) {
            return;
        }
        if !meta.is_file() {
            let err = WalkError::NotRegular(kind_of(meta.file_type()));
            return self.out.errors.push((self.shown.join(&rel), err));
        }
        if self.out.files.len() == FILES_MAX {
            if !self.files_full {
                self.files_full = true;
                let root = self.shown.display();
                self.out.notes.push(format!(
                    "only the first {FILES_MAX} definition files of {root} are read"
                ));
            }
            return;
        }
        let path = self.shown.join(&rel);
        self.out.files.push(Found { path, rel });
    }

    /// Lists the folder `rel` (each folder once, however it is reached).
    fn dir(&mut self, rel: &Path, depth: usize, queue: &mut Vec<(PathBuf, usize)>) {
        let dir = match open_beneath(self.root, rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY) {
            Ok(d) => d,
            Err(Errno::ENOENT) => return,
            Err(e) => return self.unread(rel, &e),
        };
        let meta = match dir.metadata() {
            Ok(m) => m,
            Err(e) => return self.unread(rel, &e),
        };
        if !self.visited.insert((meta.dev(), meta.ino())) {
            return;
        }
        self.dirs += 1;
        if self.dirs > DIRS_MAX {
            if self.dirs == DIRS_MAX + 1 {
                let root = self.shown.display();
                self.out.notes.push(format!(
                    "only the first {DIRS_MAX} folders of {root} are walked"
                ));
            }
            return;
        }
        let left = ENTRIES_MAX - self.entries;
        let (mut names, more) = match safefile::names(dir.as_fd(), left) {
            Ok(n) => n,
            Err(e) => return self.unread(rel, &e),
        };
        drop(dir);
        self.entries += names.len();
        if more {
            let root = self.shown.display();
            self.out.notes.push(format!(
                "only the first {ENTRIES_MAX} entries of {root} are looked at"
            ));
        }
        names.sort();
        let mut subdirs = Vec::new();
        for name in names {
            let child = if rel == Path::new(".") {
                PathBuf::from(name)
            } else {
                rel.join(name)
            };
            self.entry(child, depth, &mut subdirs);
        }
        // Popped in name order.
        queue.extend(subdirs.into_iter().rev());
    }
}

/// Opens a definition found beneath `root` for reading; what was opened
/// must be a regular file.
pub fn open(root: BorrowedFd<'_>, shown: &Path, f: &Found) -> Result<(File, Identity), WalkError> {
    let file = open_beneath(root, &f.rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK)
        .map_err(|e| walk_error(e, shown))?;
    match file.metadata() {
        Ok(m) if m.is_file() => {
            let id = Identity::of(&m);
            Ok((file, id))
        }
        Ok(m) => Err(WalkError::NotRegular(kind_of(m.file_type()))),
        Err(source) => Err(WalkError::Io { op: "stat", source }),
    }
}

/// Every definition file beneath the folder `root` (shown as `shown`).
pub fn walk(root: BorrowedFd<'_>, shown: &Path) -> Walked {
    let mut w = Walker {
        root,
        shown,
        out: Walked::default(),
        visited: HashSet::new(),
        dirs: 0,
        entries: 0,
        files_full: false,
    };
    let mut queue = vec![(PathBuf::from("."), 0)];
    while let Some((rel, depth)) = queue.pop() {
        w.dir(&rel, depth, &mut queue);
    }
    w.out.files.sort_by(|a, b| a.path.cmp(&b.path));
    w.out
}
