//! Each session's working state as a row: its owner, project dir and
//! recent files.
//!
//! The rules (who owns a session, who may use or join it) are the pure
//! ones of `crate::sessions` and `policy::rights`; here they read rows.

use super::error::{Result, StoreError};
use super::runs::sql;
use crate::sessions::{absolute, SessionState};
use rusqlite::{params, Connection, OptionalExtension};
use std::path::{Path, PathBuf};

fn json_err(path: &Path, session: &str, source: serde_json::Error) -> StoreError {
    StoreError::Json {
        path: path.into(),
        run_id: format!("(session {session})"),
        what: "recent_files",
        source,
    }
}

/// The session's row, when it has one.
pub(super) fn read(conn: &Connection, path: &Path, session: &str) -> Result<Option<SessionState>> {
    let row: Option<(Option<u32>, Option<String>, String)> = conn
        .query_row(
            "SELECT owner_uid, project_dir, recent_files FROM sessions WHERE session_id = ?1",
            [session],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()
        .map_err(sql(path))?;
    let Some((owner_uid, project_dir, recent)) = row else {
        return Ok(None);
    };
    let recent_files: Vec<PathBuf> =
        serde_json::from_str(&recent).map_err(|e| json_err(path, session, e))?;
    Ok(Some(SessionState {
        owner_uid,
        project_dir: project_dir.map(PathBuf::from),
        recent_files,
    }))
}

/// Whose the session is: `None` for a new one; one without a recorded
/// owner is the daemon's.
pub(super) fn owner(conn: &Connection, path: &Path, session: &str) -> Result<Option<u32>> {
    let row: Option<Option<u32>> = conn
        .query_row(
            "SELECT owner_uid FROM sessions WHERE session_id = ?1",
            [session],
            |r| r.get(0),
        )
        .optional()
        .map_err(sql(path))?;
    Ok(row.map(|o| policy::rights::recorded_owner(o, crate::paths::uid())))
}

/// Writes the whole row (`or_ignore`: a row already there stays).
pub(super) fn put(
    conn: &Connection,
    path: &Path,
    session: &str,
    s: &SessionState,
    now: u64,
    or_ignore: bool,
) -> Result<()> {
    let recent = serde_json::to_string(&s.recent_files).map_err(|e| json_err(path, session, e))?;
    let verb = if or_ignore {
        "INSERT OR IGNORE"
    } else {
        "INSERT OR REPLACE"
    };
    conn.execute(
        &format!(
            "{verb} INTO sessions (session_id, owner_uid, project_dir, recent_files,
             updated_at_ms) VALUES (?1, ?2, ?3, ?4, ?5)"
        ),
        params![
            session,
            s.owner_uid,
            s.project_dir
                .as_ref()
                .map(|p| p.to_string_lossy().into_owned()),
            recent,
            now
        ],
    )
    .map_err(sql(path))?;
    Ok(())
}

/// Refused unless the session is `owner`'s (who may join it).
fn check_owner(conn: &Connection, path: &Path, session: &str, owner: u32) -> Result<()> {
    match self::owner(conn, path, session)? {
        Some(o) if o != owner => Err(StoreError::NotOwned {
            path: path.into(),
            session: session.to_owned(),
        }),
        _ => Ok(()),
    }
}

/// A spawn's session: a new one is inserted whole; an existing one gets
/// only the spawn's project dir (its owner and recent files stay). The
/// run's owner must be the session's: checked here, in the commit, so two
/// spawns into one new session for two uids never both join it.
pub(super) fn on_accept(
    conn: &Connection,
    path: &Path,
    session: &str,
    s: &SessionState,
    run_owner: u32,
    now: u64,
) -> Result<()> {
    put(conn, path, session, s, now, true)?;
    check_owner(conn, path, session, run_owner)?;
    if let Some(dir) = &s.project_dir {
        conn.execute(
            "UPDATE sessions SET project_dir = ?2, updated_at_ms = ?3 WHERE session_id = ?1",
            params![session, dir.to_string_lossy(), now],
        )
        .map_err(sql(path))?;
    }
    Ok(())
}

/// Puts `files` at the front of the session's recent files (relative ones
/// against its project dir); a new session is `owner_uid`'s. Refused when
/// `requester` (`None`: the daemon's uid or root) may not use the session:
/// checked here, in the commit, so that a session made meanwhile by
/// another uid is never taken over.
pub(super) fn touch(
    conn: &Connection,
    path: &Path,
    session: &str,
    files: &[PathBuf],
    owner_uid: u32,
    requester: Option<u32>,
    now: u64,
) -> Result<SessionState> {
    let existing = read(conn, path, session)?;
    if let (Some(e), Some(uid)) = (&existing, requester) {
        if policy::rights::recorded_owner(e.owner_uid, crate::paths::uid()) != uid {
            return Err(StoreError::NotOwned {
                path: path.into(),
                session: session.to_owned(),
            });
        }
    }
    let mut s = existing.unwrap_or_else(|| SessionState {
        owner_uid: Some(owner_uid),
        ..Default::default()
    });
    let base = s.project_dir.clone().unwrap_or_else(|| PathBuf::from("/"));
    s.recent_files = policy::workctx::touch(&s.recent_files, &absolute(&base, files));
    // A row already there keeps its owner and project dir.
    put(conn, path, session, &s, now, true)?;
    let recent = serde_json::to_string(&s.recent_files).map_err(|e| json_err(path, session, e))?;
    conn.execute(
        "UPDATE sessions SET recent_files = ?2, updated_at_ms = ?3 WHERE session_id = ?1",
        params![session, recent, now],
    )
    .map_err(sql(path))?;
    Ok(s)
}
