//! The copy of state.db made before a migration changes it: the way back
//! for an operator who must run the previous release again.

use super::error::{io_err as io, Result, StoreError};
use rusqlite::Connection;
use std::path::{Path, PathBuf};

/// `<db>.v<version>.bak`, or with `.tmp` after it while it is written.
fn named(db: &Path, version: i64, tmp: bool) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push(format!(".v{version}.bak"));
    if tmp {
        p.push(".tmp");
    }
    PathBuf::from(p)
}

/// Copies the file, at schema `version`, to `<db>.v<version>.bak` (0600,
/// complete or absent: written under a temporary name, fsynced, renamed).
/// A copy already there is replaced: the file as it is now is the one to
/// go back to (an older copy may predate runs made since). Blocking.
pub(super) fn before_migrating(conn: &Connection, db: &Path, version: i64) -> Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    let (bak, tmp) = (named(db, version, false), named(db, version, true));
    match std::fs::symlink_metadata(&bak) {
        Ok(m) if m.file_type().is_file() => {}
        Ok(_) => {
            return Err(StoreError::Corrupt {
                path: db.into(),
                why: format!("{} is not a regular file", bak.display()),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(db, "stat", &bak)(e)),
    }
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(io(db, "remove", &tmp)(e));
        }
        _ => {}
    }
    // VACUUM INTO fills an empty file: made here, so it is 0600 and new.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(io(db, "create", &tmp))?;
    let target = tmp.to_str().ok_or_else(|| StoreError::Corrupt {
        path: db.into(),
        why: format!("{} is not UTF-8: no backup can be named", tmp.display()),
    })?;
    conn.execute("VACUUM INTO ?1", [target])
        .map_err(|e| super::schema::classify(db, e))?;
    file.sync_all().map_err(io(db, "fsync", &tmp))?;
    std::fs::rename(&tmp, &bak).map_err(io(db, "rename", &tmp))?;
    let dir = db.parent().unwrap_or(Path::new("."));
    subagent_runner::atomic::fsync_dir(dir)
        .map_err(|e| io(db, "fsync", dir)(std::io::Error::other(e.to_string())))?;
    Ok(bak)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backup_is_a_private_complete_copy_of_the_file_now() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let conn = Connection::open(&db).unwrap();
        conn.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (7); PRAGMA user_version = 1;")
            .unwrap();
        std::fs::write(named(&db, 1, true), b"half a copy").unwrap();
        let bak = before_migrating(&conn, &db, 1).unwrap();
        assert_eq!(bak, dir.path().join("state.db.v1.bak"));
        assert!(!named(&db, 1, true).exists());
        let mode = std::fs::metadata(&bak).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let copy = Connection::open(&bak).unwrap();
        let x: i64 = copy.query_row("SELECT x FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(x, 7);
        let v: i64 = copy
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v, 1);
        // A later copy (a file gone back to and used since) replaces it.
        drop(copy);
        conn.execute("UPDATE t SET x = 8", []).unwrap();
        assert_eq!(before_migrating(&conn, &db, 1).unwrap(), bak);
        let copy = Connection::open(&bak).unwrap();
        let x: i64 = copy.query_row("SELECT x FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(x, 8);
    }

    #[test]
    fn a_backup_name_that_is_not_a_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state.db");
        let conn = Connection::open(&db).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", named(&db, 1, false)).unwrap();
        let e = before_migrating(&conn, &db, 1).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
}
