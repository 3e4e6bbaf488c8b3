//! The store's error, with the database's path in each case, and its
//! result type.

use crate::run::record::RecordError;
use std::path::{Path, PathBuf};

/// The store could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file could not be opened or set up.
    #[error("state database {}: open: {source}", path.display())]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    /// A statement failed (the request's own work was rolled back).
    #[error("state database {}: {source}", path.display())]
    Sql {
        path: PathBuf,
        source: rusqlite::Error,
    },
    /// The batch's COMMIT failed (disk full, read-only, I/O): nothing of the
    /// batch was recorded. `errno` is the OS error behind it, when known.
    #[error(
        "state database {}: nothing was recorded: {source}{}",
        path.display(),
        os_cause(*errno)
    )]
    Commit {
        path: PathBuf,
        source: rusqlite::Error,
        errno: Option<i32>,
    },
    /// The file is not a database or is damaged.
    #[error(
        "state database {} is corrupt ({why}): the daemon will not start over it. \
         Move it away (with -wal and -shm) to start empty, or restore it from a backup; \
         sqlite3 {} '.recover' can salvage rows",
        path.display(),
        path.display()
    )]
    Corrupt { path: PathBuf, why: String },
    /// An SQLite file that is not subagentd's.
    #[error(
        "state database {} is an SQLite file of another program (its application_id is not \
         subagentd's): the daemon will not start over it. Move it away to start empty, or \
         point --state-dir elsewhere",
        path.display()
    )]
    Foreign { path: PathBuf },
    /// Written by a newer subagentd.
    #[error(
        "state database {} has schema version {found}, newer than the {supported} this \
         subagentd reads: run the newer subagentd, or restore a backup made by this one",
        path.display()
    )]
    Newer {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    /// A row does not make a record (a running run without its runner).
    #[error("state database {}: run {run_id}: {source}", path.display())]
    Record {
        path: PathBuf,
        run_id: String,
        source: RecordError,
    },
    /// A JSON column could not be read or written.
    #[error("state database {}: run {run_id}: {what}: {source}", path.display())]
    Json {
        path: PathBuf,
        run_id: String,
        what: &'static str,
        source: serde_json::Error,
    },
    /// An op names a run the database does not have.
    #[error("state database {}: no run {run_id}", path.display())]
    NoRun { path: PathBuf, run_id: String },
    /// The session is another uid's.
    #[error("permission denied: session {session} belongs to another user; use a session id of your own")]
    NotOwned { path: PathBuf, session: String },
    /// A file step failed (the database's folder, its mode, an old record).
    #[error("state database {}: {op} {}: {source}", path.display(), at.display())]
    Io {
        path: PathBuf,
        op: &'static str,
        at: PathBuf,
        source: std::io::Error,
    },
    /// The clean-stop mark was not written: the store met an I/O failure
    /// or damage while open.
    #[error("state database {}: not marked as cleanly stopped: it met an I/O failure or damage", path.display())]
    Tainted { path: PathBuf },
    /// The writer is gone, or the store was opened read-only.
    #[error("state database {}: not open for writing", path.display())]
    Closed { path: PathBuf },
}

/// The OS error of a failed commit, as the end of its message.
fn os_cause(errno: Option<i32>) -> String {
    match errno {
        Some(libc::EROFS) => ": its file system is read-only (os error 30)".to_owned(),
        Some(n) => format!(": {}", std::io::Error::from_raw_os_error(n)),
        None => String::new(),
    }
}

/// A result of the store.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Makes an I/O failure of `op` on `at` (a file of the database `path`'s)
/// into a [`StoreError::Io`].
pub(super) fn io_err(
    path: &Path,
    op: &'static str,
    at: &Path,
) -> impl FnOnce(std::io::Error) -> StoreError {
    let (path, at) = (path.to_path_buf(), at.to_path_buf());
    move |source| StoreError::Io {
        path,
        op,
        at,
        source,
    }
}
